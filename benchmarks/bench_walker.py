"""Walker cost per equation against `jax.core.eval_jaxpr`, and its scaling.

Both walkers evaluate the same staged chain of equations while being traced
again by `jax.make_jaxpr`, so each equation costs one bind into a new Jaxpr:
the ratio is jaxinterp's walking overhead on top of JAX's own. The chain
cycles through `sin`, a multiplication by a literal, `cos` and an addition of
a second, long-lived input, one equation each.

Figures (targets from the performance issue):

* `walker/eval_jaxpr ratio, N eqns` for N = 1,000 and 10,000: <= 1.10;
* `walker scaling, 100000/10000 eqns`: the time for 100,000 equations over
  the time for 10,000, <= 11 (no super-linear cost).

Run with `python benchmarks/bench_walker.py` (`--quick` for smaller sizes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from _common import (
    compare,
    describe,
    paired_ratio,
    parse_args,
    print_header,
    ratio,
    report,
)
from jax import lax

import jaxinterp

SPECS = (jax.ShapeDtypeStruct((8,), jnp.float32),) * 2


# Chains are built from blocks of this many equations.
BLOCK = 1_000


def chain(n: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Return a function of `(x, y)` that stages to exactly `n` equations."""

    def fn(x: jax.Array, y: jax.Array) -> jax.Array:
        for i in range(n):
            step = i % 4
            if step == 0:
                x = lax.sin(x)
            elif step == 1:
                x = x * 1.5
            elif step == 2:
                x = lax.cos(x)
            else:
                x = x + y
        return x

    return fn


def stage_chain(n: int) -> Any:
    """Stage an `n`-equation chain into a `ClosedJaxpr`, checking its length.

    A long chain repeats a staged block of `BLOCK` equations through
    `jax.core.eval_jaxpr`, which binds each equation directly: three to four
    times faster than tracing `jnp` and `lax` calls again.
    """
    start = time.perf_counter()
    size = min(n, BLOCK)
    assert n % size == 0, (n, size)
    block = jax.make_jaxpr(chain(size))(*SPECS).jaxpr

    def repeat(x: jax.Array, y: jax.Array) -> jax.Array:
        for _ in range(n // size):
            (x,) = jax.core.eval_jaxpr(block, [], x, y)
        return x

    closed = jax.make_jaxpr(repeat)(*SPECS)
    assert len(closed.jaxpr.eqns) == n, len(closed.jaxpr.eqns)
    print(f"  staged {n} eqns in {time.perf_counter() - start:.1f} s")
    return closed


def retrace_reference(closed: Any) -> Callable[[], Any]:
    """Trace `jax.core.eval_jaxpr` walking `closed` (a fresh function each run)."""
    jaxpr, consts = closed.jaxpr, closed.consts

    def run() -> None:
        jax.make_jaxpr(lambda x, y: jax.core.eval_jaxpr(jaxpr, consts, x, y))(*SPECS)

    return run


def retrace_walker(closed: Any) -> Callable[[], Any]:
    """Trace `jaxinterp.eval_closed_jaxpr` walking `closed` (a fresh function each run).

    A fresh function per run keeps `jax.make_jaxpr` from answering from its
    tracing cache.
    """

    def run() -> None:
        jax.make_jaxpr(lambda x, y: jaxinterp.eval_closed_jaxpr(closed, x, y))(*SPECS)

    return run


def per_equation(sizes: tuple[int, ...], repeats: dict[int, int]) -> dict[int, Any]:
    """Report the walker/reference ratio per size; return the staged chains."""
    staged = {}
    for n in sizes:
        staged[n] = closed = stage_chain(n)
        times = compare(
            {
                "jax.core.eval_jaxpr": retrace_reference(closed),
                "jaxinterp.eval_closed_jaxpr": retrace_walker(closed),
            },
            repeats=repeats[n],
        )
        for name, ts in times.items():
            print(f"  {name}, {n} eqns: {describe(ts, per=n)} per eqn")
        names = ("jaxinterp.eval_closed_jaxpr", "jax.core.eval_jaxpr")
        print(f"  ratio of the fastest runs: {ratio(times, *names):.2f}")
        report(f"walker/eval_jaxpr ratio, {n} eqns", paired_ratio(times, *names), 1.10)
    return staged


def scaling(small: Any, large_n: int, repeats: int) -> None:
    """Report how the walker's time grows from `small`'s length to `large_n`.

    The 10x longer chain runs the walker `repeats` times and the reference
    once, for context (each run of it takes seconds); the shorter chain is
    already warm from the per-equation figures.
    """
    small_n = len(small.jaxpr.eqns)
    large = stage_chain(large_n)
    chains = {str(small_n): small, str(large_n): large}
    walker = compare(
        {n: retrace_walker(closed) for n, closed in chains.items()},
        repeats=repeats,
        warmup=0,
    )
    reference = compare(
        {n: retrace_reference(closed) for n, closed in chains.items()},
        repeats=1,
        warmup=0,
    )
    for n in chains:
        print(f"  walker, {n} eqns: {describe(walker[n], per=int(n))} per eqn")
        print(f"  reference, {n} eqns: {describe(reference[n], per=int(n))} per eqn")
    context = ratio(reference, str(large_n), str(small_n))
    print(f"  (jax.core.eval_jaxpr scales by {context:.2f} on the same chains)")
    print(
        f"  ratio of the fastest runs: {ratio(walker, str(large_n), str(small_n)):.2f}"
    )
    growth = paired_ratio(walker, str(large_n), str(small_n))
    target = 1.1 * large_n / small_n
    report(f"walker scaling, {large_n}/{small_n} eqns", growth, target)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    print_header("bench_walker")
    if args.quick:
        staged = per_equation((300, 1_000), {300: 15, 1_000: 9})
        scaling(staged[1_000], 10_000, repeats=3)
    else:
        staged = per_equation((1_000, 10_000), {1_000: 31, 10_000: 11})
        scaling(staged[10_000], 100_000, repeats=3)


if __name__ == "__main__":
    main()
