"""Helpers shared by the benchmark scripts: timing, reporting and the CLI.

Every benchmark compares jaxinterp with a reference measured in the same run,
so the figures are ratios and hold across machines. Timings follow `timeit`:
warm up first, repeat, interleave the contenders (so a slow spell on a shared
machine hits both) and keep the minimum, the run least disturbed by the rest
of the machine. Garbage collection stays on, since users run with it, but
`gc.freeze()` moves everything alive before a run out of the collector's
reach: a run pays for collecting what it allocates, not for the rest of the
process.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def parse_args(description: str) -> argparse.Namespace:
    """Parse the flags every benchmark takes (`--quick`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, for a smoke test"
    )
    return parser.parse_args()


def print_header(title: str) -> None:
    """Print what ran where: the benchmark, JAX's version and the machine."""
    device = jax.devices()[0]
    print(
        f"# {title}: JAX {jax.__version__}, {device.platform} "
        f"({device.device_kind}), Python {platform.python_version()}"
    )


def time_once(fn: Callable[[], Any]) -> float:
    """Run `fn` once, blocking on its result; return the seconds it took."""
    gc.collect()
    gc.freeze()
    try:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - start
    finally:
        gc.unfreeze()


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


def describe(times: list[float], *, per: float = 1.0, unit: str = "us") -> str:
    """Summarise timings as `min / median` per item, in `unit`."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    low = min(times) / per * scale
    mid = statistics.median(times) / per * scale
    return f"min {low:.2f} {unit}, median {mid:.2f} {unit} ({len(times)} runs)"


def report(label: str, value: float, target: float) -> bool:
    """Print one figure against its target (`<=`); return whether it is met.

    A missed target is reported, never hidden; the script still exits 0.
    """
    met = value <= target
    print(f"{label}: {value:.2f} (target <= {target:.2f}) {'OK' if met else 'MISSED'}")
    return met
