"""The benchmark scripts run, and `docs/benchmarks.md` shows what they
recorded. `nox -s bench` is outside the suite, so each section of
`benchmarks/bench_inverse.py` runs here at its `--quick` size in a fresh
process and must print its figures; a run with `--record` must leave the
figures it printed, and `benchmarks/tables.py` must put them in the page's
tables unchanged."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import tables  # noqa: E402


def _run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `benchmarks/<script>` at its `--quick` size in a fresh process;
    it must exit 0."""
    run = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--quick", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    "section, lines",
    [
        ("tracing", ["chain of 1000 equations: ratio", "wide graph", "first call"]),
        (
            "blocks",
            [
                "piecewise, linear-fractional cases (softsign)",
                "elementwise solve (softsign as",
                "piecewise (leaky ReLU)",
            ],
        ),
        (
            "compile",
            [
                "spline, parameters closed over: compile",
                "spline, parameters as arguments: compile",
                "spline, parameters as arguments: time ratio",
            ],
        ),
        ("runtime", ["new a each call, 1000 elements", "same a each call"]),
        (
            "first",
            [
                "first call, numerically solved over exact elementwise",
                "first call, 5-bin spline, searchsorted over coupling layer",
            ],
        ),
    ],
)
def test_bench_inverse_section_runs(section, lines):
    run = _run_script("bench_inverse.py", "--only", section)
    for line in lines:
        assert line in run.stdout, run.stdout


def test_the_page_shows_the_recorded_figures():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    records = tables.load(str(ROOT / "benchmarks" / "results"))
    assert tables.rewrite(page, records) == page, "run python benchmarks/tables.py"
    marked = {m["script"] for m in tables.MARKED.finditer(page)}
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert marked == {s for s in scripts if s.startswith(("bench_", "peers_"))}
    for runs in records.values():
        for run in runs:
            for figure in run["figures"]:
                assert f"| {figure['label']} |" in page, figure["label"]


def _figure(label, value, target, section=None):
    return {
        "label": label,
        "value": value,
        "unit": "",
        "target": target,
        "section": section,
        "options": ["--cpu"],
        "date": "2026-01-02",
    }


def _run(jax_version, figures):
    return {
        "script": "bench_x.py",
        "jax": jax_version,
        "python": "3.12.1",
        "machine": "a test machine",
        "figures": figures,
    }


def test_a_table_has_a_column_per_jax_version_and_judges_each():
    runs = [
        _run("0.10.2", [_figure("ratio", 1.04, 1.1), _figure("count", 7, 6)]),
        _run("0.12.0", [_figure("ratio", 1.2, 1.1), _figure("info", 0.5, None)]),
    ]
    page = "text\n<!-- figures: bench_x.py -->\nold\n<!-- /figures -->\nmore\n"
    new = tables.rewrite(page, {"bench_x.py": runs})
    assert new.startswith("text\n<!-- figures: bench_x.py -->\n| Figure |")
    assert new.endswith("<!-- /figures -->\nmore\n")
    rows = {row.split(" | ")[0][2:]: row for row in new.splitlines() if row[:2] == "| "}
    assert rows["ratio"] == "| ratio | 1.04 | 1.20 | ≤ 1.1 | 0.10.2 yes; 0.12.0 no |"
    assert rows["count"] == "| count | 7 | — | ≤ 6 | no |"
    assert rows["info"] == "| info | — | 0.50 | none | — |"
    assert "`python benchmarks/bench_x.py --cpu`, 2026-01-02; a test machine." in new


def test_a_section_marker_takes_only_its_sections_figures():
    runs = [
        _run("0.12.0", [_figure("a", 1.0, None, "one"), _figure("b", 2.0, 3, "two")])
    ]
    page = "<!-- figures: bench_x.py two -->\n<!-- /figures -->\n"
    new = tables.rewrite(page, {"bench_x.py": runs})
    assert "| b | 2.00 | ≤ 3 | yes |" in new and "| a |" not in new
    assert "`python benchmarks/bench_x.py --cpu`" in new


@pytest.mark.slow
def test_a_recorded_run_keeps_the_figures_it_printed(tmp_path):
    run = _run_script("bench_memory.py", "--record", str(tmp_path))
    (path,) = tmp_path.glob("bench_memory.jax-*.json")
    figures = json.loads(path.read_text())["figures"]
    printed = re.findall(
        r"^(.*): ([\d.]+) \(target <= ([\d.]+)\) (OK|MISSED)$", run.stdout, re.MULTILINE
    )
    assert [(f["label"], f"{f['value']:.2f}") for f in figures] == [
        (label, value) for label, value, _, _ in printed
    ]
    table = tables.render(tables.load(str(tmp_path))["bench_memory.py"])
    for label, value, _, verdict in printed:
        met = "yes" if verdict == "OK" else "no"
        assert re.search(rf"\| {re.escape(label)} \| {value} \| .* \| {met} \|", table)
