"""The elementwise solver against the libraries' own inverses.

Every NumPyro, distrax and TFP bijector of the peers harness
(`tests/peers/`) that `inverse` solves numerically (`explain_inverse` names
an "elementwise solve"), timed compiled on `n` elements against the
library's own inverse, compiled, in the same process: the issue's target is
a ratio of at most 3. Needs the peers libraries (`nox -s bench_peers`).

    python benchmarks/peers_solver.py [--sizes 100000 1000000] [--only NAME]
        [--method piecewise --method "linear-fractional formula"]

Each figure is the minimum over `--repeat` calls (after a warm-up call) of
`block_until_ready`, the two sides alternated; the ratio is ours over the
library's. The `y` are the forward map of points drawn from each case's own
sampler, tiled to `n` elements (the cases' parameters broadcast along the
last axis).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "peers"))


def _bench_common() -> Any:
    """`benchmarks/_common.py`, loaded by path: the peers harness has a
    `_common` module of its own on `sys.path`."""
    spec = importlib.util.spec_from_file_location(
        "_bench_common", os.path.join(HERE, "_common.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bench = _bench_common()
add_record_flag, record_at_exit = _bench.add_record_flag, _bench.record_at_exit
report, section = _bench.report, _bench.section

import jaxinterp  # noqa: E402


def solver_cases(only: list[str], methods: list[str] | None = None) -> list:
    """The cases whose inverse `explain_inverse` reports with one of
    `methods` (by default the numerical solve)."""
    from check_peers import load_cases

    methods = methods or ["elementwise solve"]
    cases, missing = load_cases(["numpyro", "distrax", "tfp"])
    if missing:
        raise SystemExit(f"peer libraries missing (`nox -s bench_peers`): {missing}")
    picked = []
    for case in cases:
        if only and not any(o in case.name for o in only):
            continue
        try:
            x = case.sample(np.random.default_rng(0))
            text = str(jaxinterp.explain_inverse(case.forward, x))
        except Exception:  # noqa: BLE001 - a case that does not trace
            continue
        named = any(f"({m})" in text for m in methods)
        if named and case.inverse is not None:
            picked.append(case)
    return picked


def tiled(case, n: int):
    """`n` elements: the case's sample tiled along a new leading axis (and
    jittered a little, so that the elements differ), or `None` when the
    forward map does not take a batch."""
    x = np.asarray(case.sample(np.random.default_rng(1)), np.float32)
    copies = max(1, n // x.size)
    rng = np.random.default_rng(2)
    big = np.tile(x[None], (copies,) + (1,) * x.ndim)
    big = big * (1 + 1e-3 * rng.uniform(-1, 1, big.shape)).astype(np.float32)
    try:
        return jax.block_until_ready(jax.jit(case.forward)(jnp.asarray(big)))
    except Exception:  # noqa: BLE001
        return None


def best(f, y, repeat: int) -> float:
    jax.block_until_ready(f(y))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(f(y))
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument(
        "--method",
        action="append",
        default=[],
        help="time the cases inverted by this method instead (explain_inverse's"
        " name: 'piecewise', 'linear-fractional formula'); repeatable",
    )
    add_record_flag(parser)
    args = parser.parse_args(argv)
    record_at_exit(args.record)
    # The numerical solve has a target; the exact methods are timed for
    # information.
    section("exact" if args.method else "solve")
    target = None if args.method else 3.0
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}")
    for case in solver_cases(args.only, args.method):
        for n in args.sizes:
            label = f"{case.library} `{case.name}`, {n:.0e} elements"
            y = tiled(case, n)
            if y is None:
                print(f"{label}: the forward map takes no batch")
                continue
            ours = jax.jit(jaxinterp.inverse(case.forward))
            theirs = jax.jit(case.inverse)
            try:
                got = np.asarray(ours(y))
                want = np.asarray(theirs(y))
            except Exception as err:  # noqa: BLE001 - reported, not timed
                print(f"{label}: {type(err).__name__}: {err}")
                continue
            a, b = [], []
            for _ in range(3):
                a.append(best(ours, y, args.repeat))
                b.append(best(theirs, y, args.repeat))
            t_ours, t_lib = min(a), min(b)
            finite = np.isfinite(got).mean()
            err = float(np.nanmax(np.abs(got - want) / (1 + np.abs(want))))
            print(
                f"  {label}: ours {1e3 * t_ours:.3f} ms, the library's "
                f"{1e3 * t_lib:.3f} ms; finite {finite:.3f}, largest error {err:.1e}"
            )
            report(f"{label}: time ratio", t_ours / t_lib, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
