"""A numerical solver for elementwise equations `g(x, *known) = y`.

`inverse` uses it when no formula recovers a value: the unknown is used more
than once, every operation between it and a known result is elementwise, so
each element is a scalar equation of one unknown. Per element:

1. start from the best of a few points where `g` is defined (`y` itself, 0,
   +-1/2, +-1, +-2);
2. bracket a root: step away from the start, doubling the step while the
   residual keeps its sign and halving it where `g` is undefined (NaN), until
   the residual changes sign;
3. safeguarded Newton inside the bracket: a Newton step when it stays inside
   and halves the residual, else bisection (geometric when the bracket spans
   orders of magnitude), until the bracket is a few ulps wide;
4. check the residual: an element whose `g(x)` is not within rounding of `y`
   (or, once the bracket is a few ulps wide, within `sqrt(eps) * (1 + |y|)`
   of it, for maps that round intermediates larger than `y`) is NaN (a `y`
   outside the image, a jump of a discontinuous `g`), never a
   plausible wrong number; so is one where many `x` give `y`: on a plateau
   (`g'(x) == 0` and `g` flat on a side of `x`: a constant branch, a
   saturated clamp) or at an extremum (`g(x - d)` and `g(x + d)` both above or both
   below `g(x)` beyond rounding, for `d` from `16 eps |x|` to
   `sqrt(eps) |x|`).

A map that turns (not monotone on a grid of points from `2**-12` to `2**14`
in magnitude, `monotone_on_grid`) is not injective: its elements are NaN, or,
when its known operands are constants, the block is refused before solving.

All elements are solved at once (the loops run until every element is done),
so the solver composes with `jax.jit` and `jax.vmap`. Derivatives come from the
implicit function theorem (`jax.custom_jvp`), not from the iterations:
`dx = (dy - dg/dknown . dknown) / g'(x)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat

# Where the search starts (besides `y` itself): small numbers first, so that a
# map defined on (0, 1) or on the positive reals has a point to start from.
_STARTS = (0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0)

Elementwise = Callable[..., Any]  # g(x, *known) -> y, elementwise in x


def solver(g: Elementwise, *, check_grid: bool = True) -> Callable[..., Any]:
    """`solve(y, *known)`: `x` with `g(x, *known) == y` elementwise (NaN where
    none is found, and with `check_grid` where `g` is not monotone on
    `grid`), differentiable in `y` and `known` by the implicit function
    theorem."""

    @jax.custom_jvp
    def solve(y: Any, *known: Any) -> Any:
        x = _find_roots(lambda x: g(x, *known), y)
        if check_grid:
            shape, dtype = jnp.shape(y), jnp.result_type(y)
            ok = monotone_on_grid(lambda x: g(x, *known), shape, dtype, like=y)
            x = jnp.where(ok, x, jnp.nan)
        return x

    @solve.defjvp
    def _solve_jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
        y, *known = primals
        dy, *dknown = tangents
        x = solve(y, *known)
        slope = derivative(g, x, known)
        if known:
            _, dg = jax.jvp(lambda *k: g(x, *k), tuple(known), tuple(dknown))
            dy = dy - dg
        return x, dy / slope

    return solve


def grid(dtype: Any) -> np.ndarray:
    """Points where `monotone_on_grid` samples a map: zero, powers of two
    from 2**-12 to 2**14 and points approaching +-1, both signs, sorted."""
    nmant = int(jnp.finfo(dtype).nmant)
    magnitudes = [2.0**k for k in range(-12, 15)]
    magnitudes += [1.0 - 2.0**-k for k in range(2, min(nmant, 24))]
    points = {0.0, *magnitudes, *(-m for m in magnitudes)}
    return np.asarray(sorted(points), dtype)


def monotone_on_grid(
    g: Callable[[Any], Any], shape: Any, dtype: Any, like: Any = None
) -> Any:
    """Per element, whether `g` (elementwise) never turns on `grid`: its
    finite values either never decrease or never increase, on every stretch
    between values that are not finite (poles, holes in the domain). A map
    that turns is not injective (a continuous one takes a value twice), so a
    preimage found for it may not be the one meant. Inside a `shard_map`
    body the loop's carry varies as `like` (`g`'s values) does."""
    points = jnp.asarray(grid(dtype))
    eps = jnp.finfo(dtype).eps

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


def derivative(g: Elementwise, x: Any, known: Sequence[Any]) -> Any:
    """`g'(x)`, elementwise (`g` is elementwise in `x`)."""
    return jax.jvp(lambda x_: g(x_, *known), (x,), (jnp.ones_like(x),))[1]


def _finite(v: Any) -> Any:
    return ~jnp.isnan(v)


def _find_roots(g: Callable[[Any], Any], y: Any) -> Any:
    dtype = jnp.result_type(y)
    finfo = jnp.finfo(dtype)
    eps, tiny = finfo.eps, finfo.tiny

    def residual(x: Any) -> Any:
        return g(x) - y

    # 1. A start where the residual is a number (NaN marks a point outside
    # the domain; +-inf still tells which side the root is on).
    starts = [y, *(jnp.full_like(y, s) for s in _STARTS)]
    best_x = jnp.full_like(y, jnp.nan)
    best_f = jnp.full_like(y, jnp.inf)
    for s in starts:
        fs = residual(s)
        better = _finite(fs) & ~(jnp.abs(fs) >= jnp.abs(best_f)) & jnp.isfinite(s)
        best_x = jnp.where(better, s, best_x)
        best_f = jnp.where(better, fs, best_f)
    started = ~jnp.isnan(best_x)
    best_x = jnp.where(started, best_x, 0.0)

    # The direction in which the residual moves towards zero, from the slope
    # at the start (a monotone `g` has one sign of slope throughout).
    _, slope = jax.jvp(g, (best_x,), (jnp.ones_like(best_x),))
    slope_sign = jnp.sign(jnp.where(jnp.isnan(slope), 0.0, slope))
    direction = -jnp.sign(best_f) * slope_sign
    direction = jnp.where(direction == 0, 1.0, direction).astype(dtype)

    # 2. Bracket: step away from `a` until the residual changes sign.
    exp_range = int(finfo.maxexp - finfo.minexp)
    max_expand = 2 * exp_range + 2 * int(finfo.nmant) + 8
    is_root = best_f == 0

    def expand_cond(state: tuple[Any, ...]) -> Any:
        i, _, _, _, _, _, active, _ = state
        return (i < max_expand) & jnp.any(active)

    def expand_body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, a, fa, b, fb, step, active, flips = state
        xb = a + direction * step * jnp.where(flips > 0, -1.0, 1.0).astype(dtype)
        f_new = residual(xb)
        undefined = jnp.isnan(f_new) | ~jnp.isfinite(xb)
        crossed = ~undefined & ((jnp.sign(f_new) != jnp.sign(fa)) | (f_new == 0))
        # Further from zero on the same side: the step jumped a pole or an
        # extremum, or the slope at the start misled. Shrink the step like
        # where `g` is undefined; once it is tiny, turn round (once).
        worse = ~undefined & ~crossed & (jnp.abs(f_new) > jnp.abs(fa))
        go_on = active & ~undefined & ~crossed & ~worse
        shrink = active & (undefined | worse)
        new_step = jnp.where(go_on, step * 2, jnp.where(shrink, step / 2, step))
        tiny_step = new_step <= eps * jnp.maximum(jnp.abs(a), tiny)
        turn = shrink & tiny_step & (flips == 0)
        give_up = shrink & tiny_step & (flips > 0)
        new_step = jnp.where(turn, jnp.maximum(jnp.abs(a), 1.0), new_step)
        a = jnp.where(go_on, xb, a)
        fa = jnp.where(go_on, f_new, fa)
        b = jnp.where(active & crossed, xb, b)
        fb = jnp.where(active & crossed, f_new, fb)
        flips = jnp.where(turn, flips + 1, flips)
        still = active & ~crossed & ~give_up
        return i + 1, a, fa, b, fb, new_step, still, flips

    # First step: twice Newton's, at most the start's magnitude (or 1).
    newton_step = 2 * jnp.abs(best_f / slope)
    step0 = jnp.maximum(jnp.abs(best_x), 1.0)
    step0 = jnp.where(
        jnp.isfinite(newton_step) & (newton_step > 0),
        jnp.minimum(newton_step, step0),
        step0,
    )
    nan = jnp.full_like(y, jnp.nan)
    state = (
        jnp.int32(0),
        best_x,
        best_f,
        jnp.where(is_root, best_x, nan),
        jnp.where(is_root, best_f, nan),
        step0,
        started & ~is_root,
        jnp.zeros(jnp.shape(y), jnp.int32),
    )
    # Inside a `shard_map` body every carry varies as `y` does.
    state = compat.vary_like(state, y)
    _, a, fa, b, fb, _, _, _ = lax.while_loop(expand_cond, expand_body, state)
    bracketed = ~jnp.isnan(b)

    # 3. Safeguarded Newton between `neg` (residual < 0) and `pos` (> 0).
    neg = jnp.where(fa < 0, a, b)
    pos = jnp.where(fa < 0, b, a)
    max_refine = 4 * (int(finfo.nmant) + 16)

    def width_small(neg: Any, pos: Any) -> Any:
        scale = jnp.maximum(jnp.maximum(jnp.abs(neg), jnp.abs(pos)), tiny)
        return jnp.abs(pos - neg) <= 4 * eps * scale

    def value_and_slope(x: Any) -> tuple[Any, Any]:
        gx, dgx = jax.jvp(g, (x,), (jnp.ones_like(x),))
        return gx - y, dgx

    x0 = jnp.where(jnp.abs(fa) <= jnp.abs(fb), a, b)
    x0 = jnp.where(bracketed, x0, 0.0)
    f0, d0 = value_and_slope(x0)

    def refine_cond(state: tuple[Any, ...]) -> Any:
        i, *_, active = state
        return (i < max_refine) & jnp.any(active)

    def refine_body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, x, fx, dfx, neg, pos, bisect, active = state
        x_old = x
        lo, hi = jnp.minimum(neg, pos), jnp.maximum(neg, pos)
        newton = x - fx / dfx
        use_newton = ~bisect & (newton > lo) & (newton < hi)
        same_sign = (lo > 0) | (hi < 0)
        ratio_big = same_sign & (jnp.abs(hi) > 8 * jnp.abs(lo))
        mag = jnp.exp(0.5 * (jnp.log(jnp.abs(lo)) + jnp.log(jnp.abs(hi))))
        geometric = jnp.sign(hi) * mag
        arithmetic = lo / 2 + hi / 2
        mid = jnp.where(ratio_big, geometric, arithmetic)
        mid = jnp.where((mid > lo) & (mid < hi), mid, arithmetic)
        x_new = jnp.where(use_newton, newton, mid)
        f_new, d_new = value_and_slope(x_new)
        neg = jnp.where(active & (f_new < 0), x_new, neg)
        pos = jnp.where(active & (f_new > 0), x_new, pos)
        slow = ~(jnp.abs(f_new) <= 0.5 * jnp.abs(fx))
        take = active & (jnp.abs(f_new) <= jnp.abs(fx)) | active & jnp.isnan(fx)
        x = jnp.where(take, x_new, x)
        fx = jnp.where(take, f_new, fx)
        dfx = jnp.where(take, d_new, dfx)
        # Newton's steps shrink the bracket from one side only: stop once a
        # step no longer moves `x` beyond rounding.
        settled = use_newton & (
            jnp.abs(x_new - x_old) <= 4 * eps * jnp.maximum(jnp.abs(x_old), tiny)
        )
        # ... or once the residual is down to rounding.
        floor = 2 * eps * (jnp.abs(y) + jnp.abs(x_new * d_new))
        settled = settled | (jnp.abs(f_new) <= floor)
        done = (f_new == 0) | width_small(neg, pos) | jnp.isnan(f_new) | settled
        return i + 1, x, fx, dfx, neg, pos, slow, active & ~done

    state = (
        jnp.int32(0),
        x0,
        f0,
        d0,
        neg,
        pos,
        jnp.zeros(jnp.shape(y), bool),
        bracketed & (f0 != 0) & ~width_small(neg, pos),
    )
    state = compat.vary_like(state, y)
    _, x, fx, dfx, neg, pos, _, _ = lax.while_loop(refine_cond, refine_body, state)
    # The bracket's ends: keep whichever fits best.
    for end in (neg, pos):
        f_end = residual(end)
        better = jnp.abs(f_end) < jnp.abs(fx)
        x = jnp.where(better, end, x)
        fx = jnp.where(better, f_end, fx)

    # 4. Accept only a root within rounding: of `y`, and of `x` through g';
    # or, where `g` rounds intermediates larger than `y`, a sign change of
    # the residual across a few ulps of `x` with a residual below
    # `sqrt(eps) * (1 + |y|)` (a jump of a discontinuous `g` is larger).
    _, slope = jax.jvp(g, (x,), (jnp.ones_like(x),))
    scale = jnp.abs(y) + jnp.abs(x * jnp.where(jnp.isfinite(slope), slope, 0.0))
    close = jnp.abs(fx) <= 16 * eps * scale + 16 * tiny
    tight = width_small(neg, pos) & ~jnp.isnan(neg) & ~jnp.isnan(pos)
    small = jnp.abs(fx) <= jnp.sqrt(eps) * (1 + jnp.abs(y))
    ok = bracketed & (close | (tight & small))
    # ... and not where many `x` share `y`: on a plateau (a constant branch,
    # a saturated clamp: `g'(x) == 0` and `g` flat on a side) or at an
    # extremum (both neighbours on one side of `g(x)`, beyond rounding, for
    # steps of three sizes; a neighbour outside the domain, NaN, counts as
    # neither).
    at = g(x)
    noise = 4 * eps * jnp.abs(at) + tiny
    extremum = jnp.zeros(jnp.shape(y), bool)
    flat_below = flat_above = jnp.ones(jnp.shape(y), bool)
    magnitude = jnp.maximum(jnp.abs(x), 1.0)
    for rel in (jnp.sqrt(eps), eps**0.75, 16 * eps):
        below = g(x - rel * magnitude) - at
        above = g(x + rel * magnitude) - at
        extremum = extremum | ((below > noise) & (above > noise))
        extremum = extremum | ((below < -noise) & (above < -noise))
        flat_below = flat_below & ~(jnp.abs(below) > noise)
        flat_above = flat_above & ~(jnp.abs(above) > noise)
    single = ((slope != 0) | ~(flat_below | flat_above)) & ~extremum
    return jnp.where(ok & single, x, jnp.nan)
