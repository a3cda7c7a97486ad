"""Write the figures tables of `docs/benchmarks.md` from recorded runs.

Each benchmark script run with `--record` leaves
`benchmarks/results/<script>.jax-<version>.json`: its figures, targets, the
JAX version, the machine and the date. This script renders one table per
script (one column per JAX version recorded) and puts it in
`docs/benchmarks.md` between the script's markers:

    <!-- figures: bench_walker.py -->
    ...
    <!-- /figures -->

(or `<!-- figures: bench_inverse.py compiled -->` for one section of a
script that has several).
Everything outside the markers is prose and stays as written. `--check`
writes nothing and exits 1 if the page's tables differ from the records
(the test suite runs it, so a figure edited by hand is caught).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, os.pardir, "docs", "benchmarks.md")
MARKED = re.compile(
    r"(?P<start><!-- figures: (?P<script>[\w.]+)(?: (?P<section>\w+))? -->\n)"
    r"(?P<body>.*?)(?P<end><!-- /figures -->)",
    re.DOTALL,
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def load(folder: str) -> dict[str, list[dict[str, Any]]]:
    """Return the records in `folder` by script, oldest JAX first."""
    records: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            record = json.load(f)
        records.setdefault(record["script"], []).append(record)
    for runs in records.values():
        runs.sort(key=lambda r: _version_key(r["jax"]))
    return records


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "—"
    value = figure["value"]
    text = str(value) if isinstance(value, int) else f"{value:.2f}"
    return text + figure.get("unit", "")


def _verdict(figures: list[dict[str, Any] | None], versions: list[str]) -> str:
    judged = [
        (v, round(f["value"], 2) <= f["target"])
        for v, f in zip(versions, figures, strict=True)
        if f is not None and f["target"] is not None
    ]
    if not judged:
        return "—"
    if all(met for _, met in judged):
        return "yes"
    if not any(met for _, met in judged):
        return "no"
    return "; ".join(f"{v} {'yes' if met else 'no'}" for v, met in judged)


def _command(script: str, options: list[str]) -> str:
    return shlex.join(["python", f"benchmarks/{script}", *options])


def render(runs: list[dict[str, Any]], section: str | None = None) -> str:
    """Render one script's (or section's) figures as a Markdown table: a
    column per JAX version, then the target and whether it is met, and
    below it where and how each column was taken."""
    picked = [[f for f in r["figures"] if f.get("section") == section] for r in runs]
    runs = [r for r, figures in zip(runs, picked, strict=True) if figures]
    picked = [figures for figures in picked if figures]
    versions = [r["jax"] for r in runs]
    by_run = [{f["label"]: f for f in figures} for figures in picked]
    labels: list[str] = []
    for figures in by_run:
        labels += [label for label in figures if label not in labels]
    head = "| Figure | " + " | ".join(f"JAX {v}" for v in versions)
    lines = [head + " | Target | Met |", "|" + " --- |" * (len(versions) + 3)]
    for label in labels:
        figures = [run.get(label) for run in by_run]
        targets = sorted(
            {f["target"] for f in figures if f and f["target"] is not None}
        )
        target = " / ".join(f"≤ {t:g}" for t in targets) or "none"
        cells = " | ".join(_cell(f) for f in figures)
        lines.append(
            f"| {label} | {cells} | {target} | {_verdict(figures, versions)} |"
        )
    lines.append("")
    for run, figures in zip(runs, picked, strict=True):
        taken = sorted({(f["date"], tuple(f["options"])) for f in figures})
        how = "; ".join(f"`{_command(run['script'], list(o))}`, {d}" for d, o in taken)
        lines.append(
            f"JAX {run['jax']}, Python {run['python']}: {how}; {run['machine']}.  "
        )
    return "\n".join(lines).rstrip() + "\n"


def rewrite(page: str, records: dict[str, list[dict[str, Any]]]) -> str:
    """Return `page` with each marked table replaced by its rendering."""

    def table(match: re.Match[str]) -> str:
        runs = records.get(match["script"])
        body = render(runs, match["section"]) if runs else match["body"]
        return match["start"] + body + match["end"]

    return MARKED.sub(table, page)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(HERE, "results"))
    parser.add_argument("--page", default=PAGE)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the page is out of date"
    )
    args = parser.parse_args()
    with open(args.page) as f:
        page = f.read()
    new = rewrite(page, load(args.results))
    if args.check:
        if new != page:
            print(f"{args.page}: tables differ from {args.results}; run tables.py")
            return 1
        return 0
    if new != page:
        with open(args.page, "w") as f:
            f.write(new)
        print(f"{args.page}: tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
