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
    choices: Callable[[Any], Sequence[Any]] | None = None,
) -> Any:
    """Per element, whether `g` (elementwise) never turns on `grid`: its
    finite values either never decrease or never increase, and they form
    one stretch (a map finite on both sides of a pole or a hole in its
    domain may take a value on each side: `x - 1 / x`). A map that turns is
    not injective (a continuous one takes a value twice), so a preimage
    found for it may not be the one meant. Inside a `shard_map`
    body the loop's carry varies as `like` (`g`'s values) does.

    `uniform`: `g` is the same map for every element (its known operands are
    scalars), so one call of `g` on `shape` samples many grid points at once
    (one per element) instead of one call per point; `extra` points are
    sampled too (either side of a piecewise map's switches).

    `choices(x)`: the map's discrete choices at `x` (`_turning.choices_of`),
    where it may jump. Element by element (not `uniform`), where they differ
    between two grid points, the place where they change is found by
    bisection (`_switch`) and the map sampled either side of it too: a
    piecewise map whose cases overlap (`where(x > a, x * x, 2 * x)`, `a`
    per element or traced) jumps back there, between grid points. (One
    switch per pair of grid points; `switch_points` finds up to 16 for a
    uniform map.)"""
    eps = jnp.finfo(dtype).eps
    size = math.prod(shape)
    if choices is not None and not list(choices(jnp.zeros(shape, dtype))):
        choices = None  # (no discrete choices: a map that cannot jump)
    # (With choices, the uniform layout needs an element per pair of
    # neighbouring grid points; fewer elements are cheap one by one.)
    if uniform and size and (choices is None or size >= len(grid(dtype)) - 1):
        checked = _monotone_uniform(g, shape, dtype, like, extra, choices)
        return jnp.broadcast_to(checked, shape)
    points = jnp.asarray(grid(dtype))

    def compare(
        prev: Any, value: Any, rising: Any, falling: Any, seen: Any, gap: Any
    ) -> tuple[Any, ...]:
        # A pole or a hole in the domain (a value that is not finite) ends a
        # stretch, and a second stretch of finite values fails the check:
        # `x - 1 / x` rises on each side of 0 and takes every value on each.
        # (`seen`: a finite value so far; `gap`: one that is not after it.)
        finite = jnp.isfinite(value)
        both = finite & jnp.isfinite(prev)
        second = gap & finite
        # Rounding may wobble a map by a few ulps of its intermediates
        # between close points (those near +-1): not a turn.
        noise = 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(prev)), 1)
        rising = rising & ~second & ~(both & (value < prev - noise))
        falling = falling & ~second & ~(both & (value > prev + noise))
        value = jnp.where(finite, value, jnp.nan)
        return value, rising, falling, seen | finite, gap | (seen & ~finite)

    # A `while_loop`, not `fori_loop`: under `jax_scan3` a fixed-length loop
    # stages a `Scan3`, which JAX 0.12 cannot batch (the solver runs under
    # the `vmap` of an inverse).
    def step(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, *checks = state[:6]
        before = state[6:]
        x = jnp.full(shape, points[i], dtype)
        value = g(x)
        samples, now = [value], []
        if choices is not None:
            now = list(choices(x))
            # Either side of where the choices change since the last point
            # (both the last point where they do not).
            lo = jnp.full(shape, points[jnp.maximum(i - 1, 0)], dtype)
            changed = ~_same(before, now) & (i > 0)
            a, b = _switch(choices, lo, x, before, changed, like)
            samples = [g(a), g(b), value]
        for v in samples:
            checks = list(compare(checks[0], v, *checks[1:]))
        return i + 1, *checks, *now

    start: tuple[Any, ...] = (
        jnp.int32(0),
        jnp.full(shape, jnp.nan, dtype),
        jnp.ones(shape, bool),
        jnp.ones(shape, bool),
        jnp.zeros(shape, bool),
        jnp.zeros(shape, bool),
    )
    if choices is not None:
        start = (*start, *choices(jnp.zeros(shape, dtype)))
    if like is not None:
        start = compat.vary_like(start, like)
    count = points.shape[0]
    _, _, rising, falling, *_ = lax.while_loop(lambda s: s[0] < count, step, start)
    return rising | falling


def _same(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """Per element, whether two evaluations' discrete choices agree (NaN
    agrees with NaN)."""
    same: Any = True
    for u, v in zip(a, b, strict=True):
        same = same & jnp.all((u == v) | ((u != u) & (v != v)), axis=-1)
    return same


def _ordered(x: Any) -> Any:
    """The floats `x` as integers in the same order (adjacent floats are
    adjacent integers; `-0.0` and `0.0` both 0)."""
    itype = jnp.int32 if jnp.finfo(jnp.result_type(x)).bits == 32 else jnp.int64
    bits = lax.bitcast_convert_type(jnp.abs(x), itype)
    return jnp.where(jnp.signbit(x), -bits, bits)


def _unordered(k: Any, dtype: Any) -> Any:
    """The inverse of `_ordered`."""
    x = lax.bitcast_convert_type(jnp.abs(k), dtype)
    return jnp.where(k < 0, -x, x)


def _switch(
    choices: Callable[[Any], Sequence[Any]],
    lo: Any,
    hi: Any,
    at_lo: Sequence[Any],
    active: Any,
    like: Any = None,
) -> tuple[Any, Any]:
    """Per `active` element, neighbouring floats `a < b` in `[lo, hi]` where
    the discrete choices change from `at_lo` (those at `lo`): bisection on
    the floats' order (at most the dtype's bits of steps, and none where no
    element is `active`). Elsewhere `(lo, lo)`. `like`: as in
    `monotone_on_grid`."""
    dtype = jnp.result_type(lo)
    a, b = _ordered(lo), _ordered(hi)
    b = jnp.where(active, b, a)

    def cond(state: tuple[Any, Any]) -> Any:
        a, b = state
        return jnp.any(b - a > 1)

    def body(state: tuple[Any, Any]) -> tuple[Any, Any]:
        a, b = state
        going = b - a > 1
        mid = a + (b - a) // 2
        same = _same(at_lo, list(choices(_unordered(mid, dtype))))
        a = jnp.where(going & same, mid, a)
        b = jnp.where(going & ~same, mid, b)
        return a, b

    # (Inside a `shard_map` body the carry varies as `like` does.)
    start = (a, b) if like is None else compat.vary_like((a, b), like)
    a, b = lax.while_loop(cond, body, start)
    return _unordered(a, dtype), _unordered(b, dtype)


def _monotone_uniform(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    like: Any = None,
    extra: Sequence[float] = (),
    choices: Callable[[Any], Sequence[Any]] | None = None,
) -> Any:
    """`monotone_on_grid` of a map that is the same for every element: the
    grid laid out over the elements, a call of `g` per `size` points (in a
    loop: one copy of `g` in the program however small `shape` is). With
    `choices` (and at least as many elements as pairs of neighbouring
    points), the pairs are laid out over the elements too, and the map is
    sampled either side of the switch found in each pair whose choices
    differ (`_switch`)."""
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
    if choices is not None:
        # Per pair of neighbouring points, the map either side of its
        # switch (both `g` at the pair's low end where it has none),
        # between the pair's values.
        pairs = count - 1
        lo = jnp.asarray(np.resize(points[:-1], size).reshape(shape), dtype)
        hi = jnp.asarray(np.resize(points[1:], size).reshape(shape), dtype)
        at_lo = list(choices(lo))
        differ = ~_same(at_lo, list(choices(hi)))
        differ = differ & jnp.asarray((np.arange(size) < pairs).reshape(shape))
        a, b = _switch(choices, lo, hi, at_lo, differ, like)
        sides = [jnp.reshape(g(v), (-1,))[:pairs] for v in (a, b)]
        inner = jnp.stack([values[:-1], *sides], axis=1).reshape(-1)
        values = jnp.concatenate([inner, values[-1:]])
    eps = jnp.finfo(dtype).eps
    # The same tests as `monotone_on_grid`'s loop, on neighbouring points.
    prev, value = values[:-1], values[1:]
    compare = jnp.isfinite(value) & jnp.isfinite(prev)
    noise = 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(prev)), 1)
    rising = ~jnp.any(compare & (value < prev - noise))
    falling = ~jnp.any(compare & (value > prev + noise))
    # Finite values on both sides of one that is not (a pole, a hole in the
    # domain): two stretches, whose values may overlap (`x - 1 / x` takes
    # every value on each side of 0). Not accepted here; a map with
    # constant operands is then inverted where `y` is in one stretch's
    # values only (`_turning.py`).
    finite = jnp.isfinite(values)
    starts = jnp.sum(finite[1:] & ~finite[:-1]) + finite[0]
    return (rising | falling) & (starts <= 1)
