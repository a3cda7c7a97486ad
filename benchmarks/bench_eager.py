"""Repeated eager calls of `jaxinterp.evaluate(f)` against calling `f` itself.

`f` is a small, realistic step: a jitted matrix product with a `tanh`, then a
few eager `jnp` operations around it. After the first call, `evaluate(f)`
finds `f`'s Jaxpr in the staging cache, so each call costs a cache lookup, a
walk of a handful of equations (the `jit` one calling the rebuilt, cached
`jax.jit`) and the same dispatches `f` makes.

Figure (target from the performance issue):

* `evaluate/eager ratio, per call`: the time of one call of `evaluate(f)`
  over one call of `f`, both eager, <= 1.2 (the staging cache works).

Run with `python benchmarks/bench_eager.py` (`--quick` for fewer calls).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from _common import compare, describe, parse_args, print_header, report

import jaxinterp


@jax.jit
def _layer(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


def step(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """A small model step: a jitted layer, then eager elementwise work."""
    h = _layer(x, w) + b
    return jnp.sum(h * h, axis=-1) * 0.5


def calls(fn, x: jax.Array, w: jax.Array, b: jax.Array, n: int):  # noqa: ANN001
    """Return a zero-argument callable making `n` blocking calls of `fn`."""

    def run() -> None:
        for _ in range(n):
            jax.block_until_ready(fn(x, w, b))

    return run


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    print_header("bench_eager")
    n_calls, repeats = (200, 5) if args.quick else (1_000, 15)
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (16, 64))
    w = jax.random.normal(keys[1], (64, 64))
    b = jax.random.normal(keys[2], (64,))

    evaluated = jaxinterp.evaluate(step)
    start = time.perf_counter()
    jax.block_until_ready(evaluated(x, w, b))
    first = time.perf_counter() - start
    n_eqns = len(jaxinterp.stage(step, x, w, b).jaxpr.eqns)
    print(f"  first call of evaluate(step) ({n_eqns} eqns, staged): {first * 1e3:.1f} ms")
    assert jnp.allclose(evaluated(x, w, b), step(x, w, b))

    times = compare(
        {
            "step": calls(step, x, w, b, n_calls),
            "evaluate(step)": calls(evaluated, x, w, b, n_calls),
        },
        repeats=repeats,
    )
    for name, ts in times.items():
        print(f"  {name}: {describe(ts, per=n_calls)} per call")
    ratio = min(times["evaluate(step)"]) / min(times["step"])
    report("evaluate/eager ratio, per call", ratio, 1.2)


if __name__ == "__main__":
    main()
