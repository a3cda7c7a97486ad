"""The grid on which the elementwise solver checks that a map does not turn
(`monotone_on_grid`): a map that turns is not injective, so a preimage the
solver finds for it may not be the one meant (`_solve.py`, `_turning.py`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat


def grid(dtype: Any) -> np.ndarray:
    """Points where `monotone_on_grid` samples a map: zero, powers of two
    from 2**-12 to 2**14, then every fourth power of two (every sixteenth in
    float64) up to the dtype's largest, and points approaching +-1, both
    signs, sorted. (The far points catch a map that turns beyond 2**14,
    `x - 1e-6 x**2`; a value that overflows there splits the map's
    stretches as a pole does.)"""
    finfo = jnp.finfo(dtype)
    nmant = int(finfo.nmant)
    top = int(finfo.maxexp) - 1
    magnitudes = [2.0**k for k in range(-12, 15)]
    magnitudes += [2.0**k for k in range(18, top + 1, 4 if top < 200 else 16)]
    magnitudes += [1.0 - 2.0**-k for k in range(2, min(nmant, 24))]
    points = {0.0, *magnitudes, *(-m for m in magnitudes)}
    return np.asarray(sorted(points), dtype)


def monotone_on_grid(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    *,
    uniform: bool = False,
    like: Any = None,
    extra: Sequence[float] = (),
) -> Any:
    """Per element, whether `g` (elementwise) never turns on `grid`: its
    finite values either never decrease or never increase, on every stretch
    between values that are not finite (poles, holes in the domain). A map
    that turns is not injective (a continuous one takes a value twice), so a
    preimage found for it may not be the one meant. Inside a `shard_map`
    body the loop's carry varies as `like` (`g`'s values) does.

    `uniform`: `g` is the same map for every element (its known operands are
    scalars), so one call of `g` on `shape` samples many grid points at once
    (one per element) instead of one call per point; `extra` points are
    sampled too (either side of a piecewise map's switches)."""
    eps = jnp.finfo(dtype).eps
    size = math.prod(shape)
    if uniform and size:
        checked = _monotone_uniform(g, shape, dtype, like, extra)
        return jnp.broadcast_to(checked, shape)
    points = jnp.asarray(grid(dtype))

    # A `while_loop`, not `fori_loop`: under `jax_scan3` a fixed-length loop
    # stages a `Scan3`, which JAX 0.12 cannot batch (the solver runs under
    # the `vmap` of an inverse).
    def step(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, prev, rising, falling = state
        value = g(jnp.full(shape, points[i], dtype))
        # A pole or a hole in the domain (a value that is not finite) starts
        # a new stretch: `x / (1 - x)` rises on both sides of 1.
        finite = jnp.isfinite(value)
        compare = finite & jnp.isfinite(prev)
        # Rounding may wobble a map by a few ulps of its intermediates
        # between close points (those near +-1): not a turn.
        noise = 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(prev)), 1)
        rising = rising & ~(compare & (value < prev - noise))
        falling = falling & ~(compare & (value > prev + noise))
        return i + 1, jnp.where(finite, value, jnp.nan), rising, falling

    start = (
        jnp.int32(0),
        jnp.full(shape, jnp.nan, dtype),
        jnp.ones(shape, bool),
        jnp.ones(shape, bool),
    )
    if like is not None:
        start = compat.vary_like(start, like)
    count = points.shape[0]
    _, _, rising, falling = lax.while_loop(lambda s: s[0] < count, step, start)
    return rising | falling


def _monotone_uniform(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    like: Any = None,
    extra: Sequence[float] = (),
) -> Any:
    """`monotone_on_grid` of a map that is the same for every element: the
    grid laid out over the elements, a call of `g` per `size` points (in a
    loop: one copy of `g` in the program however small `shape` is)."""
    points = grid(dtype)
    if len(extra):
        points = np.unique(np.concatenate([points, np.asarray(extra, dtype)]))
    size = math.prod(shape)
    count = points.shape[0]
    chunks = -(-count // size)
    # The last chunk is padded with repeated points, dropped below.
    xs = jnp.asarray(np.resize(points, chunks * size).reshape((chunks, *shape)), dtype)
    if chunks == 1:
        values = jnp.reshape(g(xs[0]), (-1,))
    else:

        def step(state: tuple[Any, Any]) -> tuple[Any, Any]:
            i, done = state
            value = g(lax.dynamic_index_in_dim(xs, i, keepdims=False))
            return i + 1, lax.dynamic_update_index_in_dim(done, value, i, 0)

        # (`g` maps `dtype` values of `shape` to the same, as in the loop of
        # `monotone_on_grid`.)
        start = (jnp.int32(0), jnp.zeros((chunks, *shape), dtype))
        if like is not None:
            start = compat.vary_like(start, like)
        _, done = lax.while_loop(lambda s: s[0] < chunks, step, start)
        values = jnp.reshape(done, (-1,))
    values = values[:count]
    eps = jnp.finfo(dtype).eps
    # The same tests as `monotone_on_grid`'s loop, on neighbouring points.
    prev, value = values[:-1], values[1:]
    compare = jnp.isfinite(value) & jnp.isfinite(prev)
    noise = 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(prev)), 1)
    rising = ~jnp.any(compare & (value < prev - noise))
    falling = ~jnp.any(compare & (value > prev + noise))
    return rising | falling
