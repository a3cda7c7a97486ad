"""Repeated eager calls of `jaxinterp.evaluate(f)` against calling `f` itself.

`f` is a small model step: a jitted layer (matrix product and `tanh`), then a
bias, a square, a sum and a scale run eagerly, six equations in all. After
the first call `evaluate(f)` finds `f`'s Jaxpr in the staging cache, so a
call costs a cache lookup and a walk of the six equations: the `jit` one
calls the rebuilt `jax.jit`, compiled once; the others re-bind their
primitive, which JAX dispatches op by op, as `jax.core.eval_jaxpr` does.

The step runs at two sizes: a batch of 128 rows of 512 features, where the
layer's work is a good part of a call, and 8 rows of 32, where a call is all
dispatch. A third figure compares `evaluate(f)` with `jax.core.eval_jaxpr`
walking `f`'s Jaxpr, staged beforehand: JAX's own interpreter with a perfect
staging cache, the floor for any interpreter that re-binds primitives.

Figures (target from the performance issue: <= 1.2, the staging cache works):

* `evaluate/eager ratio, per call, f32[128,512]`;
* `evaluate/eager ratio, per call, f32[8,32]` (dispatch-bound);
* `evaluate/jax.core.eval_jaxpr ratio, per call, f32[8,32]` (no target).

First calls (`_first_call.py`, target <= 1.5): `evaluate(f)`'s first call
against `jax.core.eval_jaxpr(jax.make_jaxpr(f))`'s, each in fresh processes
prepared alike, for a CNN train step and a transformer block:

* `evaluate/jax.core.eval_jaxpr ratio, first call, <model>`.

Run with `python benchmarks/bench_eager.py` (`--quick` for fewer calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import _first_call
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
from jax.extend.core import jaxpr_as_fun

import jaxinterp

# How many times `step` was traced (it runs as Python on every eager call).
traces = 0


@jax.jit
def _layer(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


def step(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """A small model step: a jitted layer, then eager elementwise work."""
    global traces
    if isinstance(x, jax.core.Tracer):
        traces += 1
    h = _layer(x, w) + b
    return jnp.sum(h * h, axis=-1) * 0.5


def calls(fn: Callable[..., Any], args: tuple[Any, ...], n: int) -> Callable[[], None]:
    """Return a zero-argument callable making `n` blocking calls of `fn`."""

    def run() -> None:
        for _ in range(n):
            jax.block_until_ready(fn(*args))

    return run


def inputs(rows: int, features: int) -> tuple[jax.Array, ...]:
    """Random `(x, w, b)` for a batch of `rows` and `features` features."""
    keys = jax.random.split(jax.random.key(0), 3)
    return (
        jax.random.normal(keys[0], (rows, features)),
        jax.random.normal(keys[1], (features, features)) / features**0.5,
        jax.random.normal(keys[2], (features,)),
    )


def measure(rows: int, features: int, n_calls: int, repeats: int) -> float:
    """Report `evaluate(step)` against `step`; return it over `eval_jaxpr`."""
    args = inputs(rows, features)
    shape = f"f32[{rows},{features}]"
    evaluated = jaxinterp.evaluate(step)
    closed = jaxinterp.stage(step, *args).closed_jaxpr
    walk = jaxpr_as_fun(closed)
    start = time.perf_counter()
    jax.block_until_ready(evaluated(*args))
    first = time.perf_counter() - start
    print(f"  {shape}: first call of evaluate(step), staged: {first * 1e3:.1f} ms")
    assert jnp.array_equal(evaluated(*args), step(*args))

    before = traces
    times = compare(
        {
            "step": calls(step, args, n_calls),
            "evaluate(step)": calls(evaluated, args, n_calls),
            "jax.core.eval_jaxpr": calls(walk, args, n_calls),
        },
        repeats=repeats,
    )
    for name, ts in times.items():
        print(f"  {shape}: {name}: {describe(ts, per=n_calls)} per call")
    print(f"  {shape}: `step` traced {traces - before} times in these calls")
    fastest = ratio(times, "evaluate(step)", "step")
    print(f"  {shape}: ratio of the fastest runs: {fastest:.2f}")
    suffix = " (dispatch-bound)" if rows * features < 10_000 else ""
    report(
        f"evaluate/eager ratio, per call, {shape}{suffix}",
        paired_ratio(times, "evaluate(step)", "step"),
        1.2,
    )
    return paired_ratio(times, "evaluate(step)", "jax.core.eval_jaxpr")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    print_header("bench_eager")
    n_calls, repeats = (100, 5) if args.quick else (300, 15)
    measure(128, 512, n_calls, repeats)
    floor = measure(8, 32, n_calls, repeats)
    report("evaluate/jax.core.eval_jaxpr ratio, per call, f32[8,32]", floor)
    first_calls(1 if args.quick else 5)


def first_calls(repeats: int) -> None:
    """Report first calls of `evaluate(f)` against `jax.core.eval_jaxpr`."""
    for model in _first_call.MODELS:
        ours, reference = _first_call.measure(model, repeats)
        print(
            f"  {model}: first call, median of {repeats} fresh processes: "
            f"evaluate {ours * 1e3:.0f} ms, jax.core.eval_jaxpr "
            f"{reference * 1e3:.0f} ms"
        )
        report(
            f"evaluate/jax.core.eval_jaxpr ratio, first call, {model}",
            ours / reference,
            1.5,
        )


if __name__ == "__main__":
    main()
