"""Helpers shared by the benchmark scripts: timing, reporting and the CLI.

Every benchmark compares jaxinterp with a reference measured in the same run,
so the figures are ratios and hold across machines. Timings follow `timeit`:
warm up first, then repeat in rounds, each running every contender back to
back (alternating which goes first). A figure is the median over rounds of
the ratio within a round (`paired_ratio`): a load that comes and goes on a
shared machine hits both sides of a round alike, where the two fastest runs
(`ratio`, printed as a cross-check) may come from different moments. Like
`timeit`, a timed run has the garbage collector off (it
collects just before): Python's full collections, which scan every object
alive, otherwise land at arbitrary points of long runs and make their cost
look super-linear, for `jax.core.eval_jaxpr` as much as for the walker. Pass
`--gc` to time with the collector on.

The clock is `time.perf_counter`. On a machine shared with other work, pass
`--cpu` to time with `time.process_time` instead (CPU seconds of every thread
of the process), which ignores the time the process waits for a core.

Every figure goes through `report`. With `--record`, a script also writes
its figures, with the JAX version and the machine, to
`benchmarks/results/<script>.jax-<version>.json` when it exits;
`benchmarks/tables.py` turns those files into the tables of
`docs/benchmarks.md` (`nox -s bench` does both).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

# Whether timed runs keep the garbage collector on (`--gc`).
_KEEP_GC = False
# The clock of timed runs (`--cpu` picks `time.process_time`).
_CLOCK: Callable[[], float] = time.perf_counter
# The figures `report` printed, in order: written out with `--record`.
_FIGURES: list[dict[str, Any]] = []
# The section now running (`--only SECTION`), stored with each figure.
_SECTION: str | None = None
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(description: str) -> argparse.Namespace:
    """Parse the flags every benchmark takes (`--quick`, `--gc`, `--cpu`)."""
    global _KEEP_GC, _CLOCK
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, for a smoke test"
    )
    parser.add_argument(
        "--gc", action="store_true", help="keep the garbage collector on in timings"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="time CPU seconds, not wall-clock ones"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="SECTION",
        help="run only these sections (where a benchmark has several)",
    )
    add_record_flag(parser)
    args = parser.parse_args()
    _KEEP_GC = args.gc
    _CLOCK = time.process_time if args.cpu else time.perf_counter
    record_at_exit(args.record)
    return args


def add_record_flag(parser: argparse.ArgumentParser) -> None:
    """Add `--record [FOLDER]` (the figures written out at exit)."""
    parser.add_argument(
        "--record",
        nargs="?",
        const=RESULTS,
        metavar="FOLDER",
        help="write the figures to FOLDER/<script>.jax-<version>.json at exit "
        "(default folder: benchmarks/results)",
    )


def record_at_exit(folder: str | None) -> None:
    """Write the figures `report` printed to `folder` when the script exits."""
    if folder:
        atexit.register(_write_record, folder, sys.argv[1:])


def machine() -> str:
    """Describe the machine: CPU model, cores, memory and JAX's device."""
    model = platform.processor() or platform.machine()
    memory = ""
    try:
        with open("/proc/cpuinfo") as f:
            names = [
                ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")
            ]
        model = names[0] if names else model
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    device = jax.devices()[0]
    kind = device.platform
    if device.device_kind.lower() != kind:
        kind += f" ({device.device_kind})"
    return f"{model}, {os.cpu_count()} cores{memory}, JAX on {kind}"


def section(name: str) -> None:
    """Name the section whose figures `report` records next."""
    global _SECTION
    _SECTION = name


def _options(argv: list[str], folder: str) -> list[str]:
    """The command line a figure was taken with, `--record` left out."""
    kept, skipping = [], False
    for arg in argv:
        if arg.startswith("--"):
            skipping = arg == "--record"
        if not (skipping or arg == folder):
            kept.append(arg)
    return kept


def _write_record(folder: str, argv: list[str]) -> None:
    """Write the figures of this run; a run of some sections keeps the
    figures an earlier run recorded for the others."""
    script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    path = os.path.join(folder, f"{script}.jax-{jax.__version__}.json")
    options, today = _options(argv, folder), datetime.date.today().isoformat()
    for figure in _FIGURES:
        figure.update(options=options, date=today)
    earlier = []
    if os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)["figures"]
    ran = {f["section"] for f in _FIGURES}
    record = {
        "script": f"{script}.py",
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": machine(),
        "figures": [f for f in earlier if f["section"] not in ran] + _FIGURES,
    }
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"figures written to {path}")


def print_header(title: str, *, timed: bool = True) -> None:
    """Print what ran where: the benchmark, JAX's version and the machine.

    With `timed`, also say how timings are taken (clock, garbage collector).
    """
    device = jax.devices()[0]
    line = (
        f"# {title}: JAX {jax.__version__}, {device.platform} "
        f"({device.device_kind}), Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    if timed:
        line += (
            f"; timings: {_CLOCK.__name__}, garbage collector "
            f"{'on' if _KEEP_GC else 'off'}"
        )
    print(line)


def time_once(fn: Callable[[], Any]) -> float:
    """Run `fn` once, blocking on its result; return the seconds it took."""
    gc.collect()
    if not _KEEP_GC:
        gc.disable()
    try:
        start = _CLOCK()
        jax.block_until_ready(fn())
        return _CLOCK() - start
    finally:
        gc.enable()


def compare(
    contenders: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each contender `repeats` times, interleaved; return the seconds.

    Each contender is a zero-argument callable; the order alternates between
    rounds so neither side always runs first.
    """
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            jax.block_until_ready(contenders[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            times[name].append(time_once(contenders[name]))
    return times


def compare_steady(
    contenders: dict[str, Callable[[], Any]], *, calls: int, rounds: int
) -> dict[str, list[float]]:
    """Time each contender in steady state: per round, `calls` calls back to
    back (each blocking on its result, no collection between them), the
    seconds per call; rounds interleaved as in `compare`.

    `time_once` collects before every call, which leaves the caches cold
    and costs a small kernel (one pass over an array) as much as the pass
    itself; back to back, its buffers and the arrays it reads stay in the
    caches, as in a loop that calls it. The two can differ several-fold
    for a kernel of a millisecond (docs/benchmarks.md, "How timings are
    taken")."""
    names = list(contenders)
    for name in names:
        jax.block_until_ready(contenders[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            fn = contenders[name]
            gc.collect()
            gc.disable()
            try:
                start = _CLOCK()
                for _ in range(calls):
                    jax.block_until_ready(fn())
                times[name].append((_CLOCK() - start) / calls)
            finally:
                gc.enable()
    return times


def describe(times: list[float], *, per: float = 1.0, unit: str = "us") -> str:
    """Summarise timings as `min / median` per item, in `unit`."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    low = min(times) / per * scale
    mid = statistics.median(times) / per * scale
    return f"min {low:.2f} {unit}, median {mid:.2f} {unit} ({len(times)} runs)"


def ratio(times: dict[str, list[float]], ours: str, reference: str) -> float:
    """Return the ratio of the fastest runs of `ours` and of `reference`."""
    return min(times[ours]) / min(times[reference])


def paired_ratio(times: dict[str, list[float]], ours: str, reference: str) -> float:
    """Return the median over rounds of `ours` / `reference` in the same round."""
    return statistics.median(
        a / b for a, b in zip(times[ours], times[reference], strict=True)
    )


def report(
    label: str, value: float, target: float | None = None, unit: str = ""
) -> bool:
    """Print one figure against its target (`<=`); return whether it is met.

    The figure is compared as printed, to two decimals; without a target it
    is printed for information (and counts as met). A missed target is
    reported, never hidden; the script still exits 0. `unit` follows the
    value (`" ms"`); a ratio has none.
    """
    met = target is None or round(value, 2) <= target
    figure = {"label": label, "value": value, "unit": unit, "target": target}
    _FIGURES.append(figure | {"section": _SECTION})
    text = f"{value}{unit}" if isinstance(value, int) else f"{value:.2f}{unit}"
    if target is None:
        print(f"{label}: {text} (no target)")
    else:
        verdict = "OK" if met else "MISSED"
        print(f"{label}: {text} (target <= {target:g}) {verdict}")
    return met
