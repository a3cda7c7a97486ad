"""The grid on which the elementwise solver checks that a map does not turn
(`monotone_on_grid`): a map that turns is not injective, so a preimage the
solver finds for it may not be the one meant (`_solve.py`, `_turning.py`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax_compat as compat


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
    kinks: Callable[[Any], Sequence[Any]] | None = None,
) -> Any:
    """Per element, whether `g` (elementwise) never turns on `grid`: its
    finite values either never decrease or never increase, also on the
    samples approaching each place where it stops or starts being finite
    (`_Edges`), and across at most one hole, which they must continue (a
    map finite on both sides of a pole may take a value on each side: `x -
    1 / x`). A map that turns is not injective (a continuous one takes a
    value twice), so a preimage found for it may not be the one meant.
    Inside a `shard_map` body the loops' carries vary as `like` (`g`'s
    values) does.

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
    uniform map.) `kinks`: `choices` with the places where a value may
    turn too (`_turning.choices_of`'s `kinks`): a uniform map's choices
    are then searched again between the switches found, where one may
    change and change back between grid points."""
    points = grid(dtype)
    uniform = uniform and math.prod(shape) > 0
    if uniform and len(extra):
        points = np.unique(np.concatenate([points, np.asarray(extra, dtype)]))

    # One program, with the grid its argument: on a map whose operands are
    # known (under `ensure_compile_time_eval`) each array operation would
    # otherwise compile and run on its own, a hundred programs.
    def check(points: Any) -> Any:
        return _monotone(g, shape, dtype, uniform, like, choices, kinks, points)

    return jax.jit(check)(points)


def _monotone(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    uniform: bool,
    like: Any,
    choices: Callable[[Any], Sequence[Any]] | None,
    kinks: Callable[[Any], Sequence[Any]] | None,
    points: Any,
) -> Any:
    eps = jnp.finfo(dtype).eps
    if choices is not None and not list(choices(jnp.zeros(shape, dtype))):
        choices = None  # (no discrete choices: a map that cannot jump)
    if uniform:
        checked = _monotone_uniform(g, shape, dtype, like, points, choices, kinks)
        return jnp.broadcast_to(checked, shape)
    if choices is not None:
        columns = _columns(choices, shape, dtype)
        which = np.broadcast_to(
            np.arange(columns).reshape((columns,) + (1,) * len(shape)),
            (columns, *shape),
        )

    # A `while_loop`, not `fori_loop`: under `jax_scan3` a fixed-length loop
    # stages a `Scan3`, which JAX 0.12 cannot batch (the solver runs under
    # the `vmap` of an inverse).
    def step(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, *checks = state[:width]
        before = state[width:]
        x = jnp.full(shape, points[i], dtype)
        samples = [g(x)]
        now = []
        if choices is not None:
            now = list(choices(x))
            # Either side of where the choices change since the last point
            # (both the last point where they do not).
            # Either side of each choice's switch (each on its own), in the
            # order of `x`.
            lo = jnp.full((columns, *shape), points[jnp.maximum(i - 1, 0)], dtype)
            hi = jnp.broadcast_to(x, lo.shape)
            changed = jnp.broadcast_to(~_same(before, now) & (i > 0), lo.shape)
            a, b = _each_choice(choices, lo, hi, which, changed, like)
            at = jnp.concatenate([a, b])
            order = jnp.argsort(at, axis=0, stable=True)
            sides = jnp.take_along_axis(_each(g)(at), order, axis=0)
            samples = [*sides, *samples]
        for v in samples:
            checks = list(_compared(tuple(checks), i, v, eps))
        return i + 1, *checks, *now

    start: tuple[Any, ...] = (
        jnp.int32(0),
        jnp.full(shape, jnp.nan, dtype),
        jnp.ones(shape, bool),
        jnp.ones(shape, bool),
        *_Marks.begin(shape),
    )
    width = len(start)
    if choices is not None:
        start = (*start, *choices(jnp.zeros(shape, dtype)))
    if like is not None:
        start = compat.vary_like(start, like)
    count = points.shape[0]
    state = lax.while_loop(lambda s: s[0] < count, step, start)
    _, _, rising, falling, *marks = state[:width]
    edges = _Marks(*marks).edges(points)
    return edges.verdict(g, rising, falling, shape, like)


def _compared(state: tuple[Any, ...], i: Any, value: Any, eps: Any) -> tuple[Any, ...]:
    """`monotone_on_grid`'s state after the sample `value` at grid point
    `i`: the last finite value, whether the values so far never decrease /
    never increase, and where the map stopped or started being finite
    (`_Marks`)."""
    prev, rising, falling, *marks = state
    seen = jnp.isfinite(prev)
    finite = jnp.isfinite(value)
    both = finite & seen
    # Rounding may wobble a map by a few ulps of its intermediates between
    # close points (those near +-1): not a turn.
    noise = _noise(value, prev, eps)
    rising = rising & ~(both & (value < prev - noise))
    falling = falling & ~(both & (value > prev + noise))
    after = _Marks(*marks).then(i, finite, seen)
    return jnp.where(finite, value, prev), rising, falling, *after


def _noise(value: Any, prev: Any, eps: Any) -> Any:
    """How far two close samples may differ the wrong way by rounding."""
    return 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(prev)), 1)


# The places where a map stops or starts being finite (`_Edges`): where its
# finite values start, the two sides of a hole, where they end.
_START, _HOLE_LEFT, _HOLE_RIGHT, _END = range(4)


class _Marks(NamedTuple):
    """`monotone_on_grid`'s record, per element, of the grid steps (`i`:
    between `points[i - 1]` and `points[i]`) where the map stopped or
    started being finite, -1 for none: `start`, `hole_left`, `hole_right`,
    `end` (`_Edges`); `count`: holes closed; `started`, `finite`: a sample
    came before, and it was finite. Kept small: it changes at every
    sample."""

    started: Any
    finite: Any
    count: Any
    start: Any
    hole_left: Any
    hole_right: Any
    end: Any

    @staticmethod
    def begin(shape: Any) -> _Marks:
        none = jnp.full(shape, -1, jnp.int32)
        false = jnp.zeros(shape, bool)
        return _Marks(false, false, jnp.zeros(shape, jnp.int32), none, none, none, none)

    def then(self, i: Any, finite: Any, seen: Any) -> _Marks:
        """After a sample at step `i` (`seen`: a finite one came before)."""
        starts = finite & ~self.finite & self.started
        closes = starts & seen
        ends = ~finite & self.finite
        return _Marks(
            jnp.ones_like(self.started),
            finite,
            self.count + closes.astype(jnp.int32),
            jnp.where(starts & ~seen, i, self.start),
            jnp.where(closes, self.end, self.hole_left),
            jnp.where(closes, i, self.hole_right),
            jnp.where(ends, i, jnp.where(closes, -1, self.end)),
        )

    def edges(self, points: Any) -> _Edges:
        """The places as intervals between grid points, values unknown."""
        steps = jnp.stack([self.start, self.hole_left, self.hole_right, self.end])
        # (A hole's sides count only if it is the one hole.)
        sides = jnp.asarray([False, True, True, False])
        sides = sides.reshape((4,) + (1,) * self.count.ndim)
        on = jnp.where(sides, self.count == 1, steps >= 0)
        lo = compat.take_at(points, jnp.maximum(steps - 1, 0))
        hi = compat.take_at(points, jnp.maximum(steps, 0))
        nan = jnp.full(lo.shape, jnp.nan, lo.dtype)
        return _Edges(self.count, lo, hi, nan, nan, on, known=False)


class _Edges(NamedTuple):
    """Where a map sampled in increasing order stops or starts being finite
    (a pole, an overflow, a point or an interval outside its domain): four
    places (`_START` ... `_END`) stacked along a first axis, each as two
    samples around it, `lo < hi`, with values `v_lo`, `v_hi` (one finite,
    one not; `known=False`: not evaluated yet), and whether it was found
    (`on`); `count`: the holes.

    Between the last finite sample and the next one that is not, the map
    may go anywhere before it stops (`x - 1e-30 / x` reaches 8.5e7 just
    left of 0, where the grid sees `x`): `verdict` locates the place by
    bisection and requires the map to keep its direction on the samples
    approaching it. One hole (its two sides `_HOLE_LEFT` and
    `_HOLE_RIGHT`) is accepted when the map continues the same way across
    it (the removable singularity of `expm1(x) / x` at 0); more fail the
    check (the values either side of a pole may overlap: `x - 1 / x` takes
    every value on each side of 0)."""

    count: Any
    lo: Any
    hi: Any
    v_lo: Any
    v_hi: Any
    on: Any
    known: bool = True

    def verdict(
        self,
        g: Callable[[Any], Any],
        rising: Any,
        falling: Any,
        shape: Any,
        like: Any = None,
    ) -> Any:
        """Whether the map never turns: `rising` or `falling` on the grid's
        samples, and the same way on the samples approaching each place
        and across the hole; never with more than one hole. Known values
        (a `uniform` map's, scalars) are searched with one point per
        element per step (`_locate`), else element by element."""
        eps = jnp.finfo(jnp.result_type(self.lo)).eps
        found, ups, downs, bad = _locate(self, g, rising, falling, shape, like)
        # Across the hole: the last finite float before it, the first after.
        u, v = found.v_lo[_HOLE_LEFT], found.v_hi[_HOLE_RIGHT]
        hole = self.count == 1
        noise = _noise(u, v, eps)
        ups = ups & (~hole | (v >= u - noise))
        downs = downs & (~hole | (v <= u + noise))
        return ((rising & ups) | (falling & downs)) & (self.count <= 1) & ~bad


def _track(
    ups: Any,
    downs: Any,
    left: Any,
    right: Any,
    value: Any,
    v_lo: Any,
    v_hi: Any,
    eps: Any,
) -> tuple[Any, Any]:
    """`ups`, `downs` after a finite sample `value` that moved the low end
    (`left`, after `v_lo`) or the high end (`right`, before `v_hi`) of a
    place's interval on its finite side."""
    u = jnp.where(left, v_lo, value)
    v = jnp.where(left, value, v_hi)
    noise = _noise(u, v, eps)
    moved = left | right
    return ups & ~(moved & (v < u - noise)), downs & ~(moved & (v > u + noise))


def _needed(on: Any, v_lo: Any, v_hi: Any, near: Any, rising: Any, falling: Any) -> Any:
    """Per place (rows `_START` ... `_END`), whether it must be located
    (`v_lo`, `v_hi`: the map at its interval's ends; `near`: at the float
    next to the end where it is not finite, on the finite side). A hole's
    sides always; where the finite values start or end, unless the map
    overflows there towards the infinity its direction leads to: both that
    end and the float next to it are that infinity (`exp` beyond 88.7). A
    single float that is not finite is no overflow: at a pole the value
    there need not be the limit the map approaches (`x + 1e-30 / x` is
    `+inf` at 0 and falls to `-inf` left of it)."""
    row = jnp.arange(4).reshape((4,) + (1,) * (jnp.ndim(on) - 1))
    lo_finite = jnp.isfinite(v_lo)
    other = jnp.where(lo_finite, v_hi, v_lo)
    lead = jnp.where(lo_finite, 1.0, -1.0)
    towards = (rising & (other == lead * jnp.inf)) | (
        falling & (other == -lead * jnp.inf)
    )
    overflow = towards & (near == other)
    side = (row == _HOLE_LEFT) | (row == _HOLE_RIGHT)
    return on & (side | ~overflow)


def _each(g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`g` (on values of one shape) over a stack of such values: one
    batched copy of `g` (`vmap`), or a call per value where a step does not
    batch."""

    def each(xs: Any) -> Any:
        try:
            return jax.vmap(g)(xs)
        except NotImplementedError:
            outs = [g(x) for x in xs]
            return jax.tree_util.tree_map(lambda *v: jnp.stack(v), *outs)

    return each


def _locate(
    edges: _Edges,
    g: Callable[[Any], Any],
    rising: Any,
    falling: Any,
    shape: Any,
    like: Any,
) -> tuple[_Edges, Any, Any, Any]:
    """`edges` with each place's interval narrowed to neighbouring floats
    where the map's finiteness changes (where `_needed`), all four places
    at once (a batched call of `g` per step). Element by element: `g` at
    the intervals' ends, then bisection on the floats' order. With known
    values (a `uniform` map's places, scalars): each step samples up to
    `_SPREAD` points of each interval, one per element, and keeps the two
    around the first whose finiteness differs from the interval's low
    end. The samples on the finite side approach the place about
    geometrically; also returned: whether their values never decrease /
    never increase in the order of `x`, and where an interval's ends are
    both finite or both not (the change lay between samples around a
    switch: not judged, the element fails)."""
    dtype = jnp.result_type(edges.lo)
    eps = jnp.finfo(dtype).eps
    spread = edges.known
    each = _each(g)
    a, b = _ordered(edges.lo), _ordered(edges.hi)
    size = math.prod(shape)
    # Known values: each place's points laid over a quarter of the elements
    # (one call of `g` on `shape` per step), or one point per place.
    quarter = size // 4
    k = min(quarter, _SPREAD) if spread and quarter else 1
    if spread:
        v_lo, v_hi = edges.v_lo, edges.v_hi
        bad = jnp.asarray(False)
        evaluate = _laid_out(g, shape, dtype, k)
    else:
        v_lo, v_hi = jnp.split(each(jnp.concatenate([edges.lo, edges.hi])), 2)
        bad = jnp.any(edges.on & (jnp.isfinite(v_lo) == jnp.isfinite(v_hi)), axis=0)
    inner = jnp.where(jnp.isfinite(v_lo), b - 1, a + 1)
    if spread:
        near = evaluate(jnp.broadcast_to(inner[:, None], (4, k)))[:, 0]
    else:
        near = each(_unordered(inner, dtype))
    need = _needed(edges.on, v_lo, v_hi, near, rising, falling)
    steps = jnp.arange(1, k + 1, dtype=a.dtype)[None, :]

    def going(state: tuple[Any, ...]) -> Any:
        a, b = state[:2]
        return need & (b - a > 1)

    def body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        a, b, v_lo, v_hi, ups, downs = state
        move = going(state)
        width = b - a
        if spread:
            # Each place's k evenly spaced points inside its interval.
            lo, hi, w = a[:, None], b[:, None], width[:, None]
            # (`lo + w * step // (k + 1)` without overflow.)
            point = lo + w // (k + 1) * steps + w % (k + 1) * steps // (k + 1)
            point = jnp.where(move[:, None] & (point < hi), point, lo)
            value = evaluate(point)
        else:
            point = a + width // 2
            value = each(_unordered(point, dtype))
        if not spread:
            same = jnp.isfinite(value) == jnp.isfinite(v_lo)
            low, high = move & same, move & ~same
            finite = jnp.isfinite(value)
            ups, downs = _track(
                ups, downs, low & finite, high & finite, value, v_lo, v_hi, eps
            )
            ends = (low, point, value), (high, point, value)
            return _narrowed(state, *ends, ups, downs)
        flat, pts = value, point
        differ = (jnp.isfinite(flat) != jnp.isfinite(v_lo)[:, None]) & (pts > lo)
        # The first point that differs (else `hi`), and the one before it.
        first = jnp.min(jnp.where(differ, pts, hi), axis=1)
        last = jnp.max(jnp.where(~differ & (pts < first[:, None]), pts, lo), axis=1)
        pick = lambda m: jnp.max(jnp.where(m, flat, -jnp.inf), axis=1)  # noqa: E731
        at_first = pick(differ & (pts == first[:, None]))
        at_last = pick(~differ & (pts == last[:, None]))
        # The finite values in the order of `x` (the first k elements).
        seq = jnp.concatenate([v_lo[:, None], flat, v_hi[:, None]], axis=1)
        both = jnp.isfinite(seq[:, 1:]) & jnp.isfinite(seq[:, :-1]) & move[:, None]
        noise = _noise(seq[:, 1:], seq[:, :-1], eps)
        ups = ups & ~jnp.any(both & (seq[:, 1:] < seq[:, :-1] - noise), axis=1)
        downs = downs & ~jnp.any(both & (seq[:, 1:] > seq[:, :-1] + noise), axis=1)
        ends = (move & (last > a), last, at_last), (move & (first < b), first, at_first)
        return _narrowed(state, *ends, ups, downs)

    true = jnp.ones(jnp.shape(v_lo), bool)
    start = (a, b, v_lo, v_hi, true, true)
    if like is not None:
        start = compat.vary_like(start, like)
    cond = lambda s: jnp.any(going(s))  # noqa: E731
    a, b, v_lo, v_hi, ups, downs = lax.while_loop(cond, body, start)
    found = edges._replace(
        lo=_unordered(a, dtype), hi=_unordered(b, dtype), v_lo=v_lo, v_hi=v_hi
    )
    return found, jnp.all(ups, axis=0), jnp.all(downs, axis=0), bad


def _narrowed(
    state: tuple[Any, ...],
    low: tuple[Any, Any, Any],
    high: tuple[Any, Any, Any],
    ups: Any,
    downs: Any,
) -> tuple[Any, ...]:
    """`_locate`'s loop state with the intervals' low ends moved where
    `low = (where, to, value there)` says, the high ends by `high`."""
    a, b, v_lo, v_hi = state[:4]
    (at_lo, to_lo, lo_value), (at_hi, to_hi, hi_value) = low, high
    return (
        jnp.where(at_lo, to_lo, a),
        jnp.where(at_hi, to_hi, b),
        jnp.where(at_lo, lo_value, v_lo),
        jnp.where(at_hi, hi_value, v_hi),
        ups,
        downs,
    )


def _laid_out(
    g: Callable[[Any], Any], shape: Any, dtype: Any, k: int
) -> Callable[[Any], Any]:
    """`g` at four places' `k` points each (ordered integers `(4, k)`),
    laid over the elements of one value of `shape` (place `r`'s at
    `r * size // 4` on, the rest filled with the first point), or, with
    fewer than four elements, one batched call on four values."""
    size = math.prod(shape)
    quarter = size // 4
    if not quarter:

        def stacked(points: Any) -> Any:
            x = jnp.broadcast_to(
                points[:, :1].reshape((4,) + (1,) * len(shape)), (4, *shape)
            )
            out = _each(g)(_unordered(x, dtype))
            return jnp.reshape(out, (4, -1))[:, :1]

        return stacked
    at = (np.arange(4)[:, None] * quarter + np.arange(k)[None, :]).reshape(-1)

    def laid(points: Any) -> Any:
        flat = jnp.full((size,), points[0, 0]).at[at].set(points.reshape(-1))
        out = g(_unordered(flat, dtype).reshape(shape))
        return jnp.reshape(out, (-1,))[at].reshape(4, k)

    return laid


# Points sampled per step of `_locate` with known values (at most a quarter
# of the elements per place).
_SPREAD = 4096


def _same(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """Per element, whether two evaluations' discrete choices agree (NaN
    agrees with NaN)."""
    same: Any = True
    for u, v in zip(a, b, strict=True):
        same = same & jnp.all(_agree(u, v), axis=-1)
    return same


def _agree(u: Any, v: Any) -> Any:
    """Elementwise, whether two choices agree (NaN agrees with NaN)."""
    return (u == v) | ((u != u) & (v != v))


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
    same_as_lo: Callable[[Any], Any],
    lo: Any,
    hi: Any,
    active: Any,
    like: Any = None,
) -> tuple[Any, Any]:
    """Per `active` element, neighbouring floats `a < b` in `[lo, hi]` where
    its discrete choice changes from the one at `lo` (`same_as_lo(x)`:
    per element, whether the choice at `x` is still that one): bisection on
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
        same = same_as_lo(_unordered(mid, dtype))
        a = jnp.where(going & same, mid, a)
        b = jnp.where(going & ~same, mid, b)
        return a, b

    # (Inside a `shard_map` body the carry varies as `like` does.)
    start = (a, b) if like is None else compat.vary_like((a, b), like)
    a, b = lax.while_loop(cond, body, start)
    return _unordered(a, dtype), _unordered(b, dtype)


def _columns(choices: Callable[[Any], Sequence[Any]], shape: Any, dtype: Any) -> int:
    """How many discrete choices `choices` makes per element (its arrays'
    columns after the elements' axes)."""
    found = choices(jnp.zeros(shape, dtype))
    return sum(int(np.prod(jnp.shape(c)[len(shape) :])) for c in found)


def _each_choice(
    choices: Callable[[Any], Sequence[Any]],
    lo: Any,
    hi: Any,
    which: Any,
    active: Any,
    like: Any = None,
) -> tuple[Any, Any]:
    """`_switch` on a stack of values `(stack, *shape)` (each a value of the
    shape `choices` takes), each element searching for where its own
    choice, column `which` (the same shape, static), changes between `lo`
    and `hi`: `(lo, lo)` where it does not, or where not `active`. Each
    choice on its own: a `floor` that changes often does not hide the one
    switch of a comparison."""
    each = _each(lambda x: list(choices(x)))
    column = jnp.asarray(which)[..., None]

    def chosen(xs: Any) -> list[Any]:
        return [jnp.reshape(c, (*jnp.shape(lo), -1)) for c in each(xs)]

    def same(u: Sequence[Any], v: Sequence[Any]) -> Any:
        # Per element, whether its own column agrees.
        eq = [_agree(a, b) for a, b in zip(u, v, strict=True)]
        agree = jnp.concatenate(eq, axis=-1)
        return jnp.take_along_axis(agree, column, axis=-1)[..., 0]

    at_lo = chosen(lo)
    active = active & ~same(at_lo, chosen(hi))
    return _switch(lambda x: same(at_lo, chosen(x)), lo, hi, active, like)


def _switch_sides(
    g: Callable[[Any], Any],
    choices: Callable[[Any], Sequence[Any]],
    lo: Any,
    hi: Any,
    shape: Any,
    dtype: Any,
    like: Any = None,
) -> tuple[Any, Any]:
    """For a map that is the same for every element: per segment `[lo[s],
    hi[s]]` (1-D arrays of its ends), the places where each of its
    discrete choices changes there, one per choice (`_each_choice`).
    Returns `(segments, 2 * columns)` positions and values: the
    neighbouring floats either side of each switch found (the segment's low
    end for a choice that does not change there). The (segment, choice)
    searches are laid over the elements of values of `shape`, as many
    stacked as they need."""
    size = math.prod(shape)
    count = int(jnp.shape(lo)[0])
    columns = _columns(choices, shape, dtype)
    total = count * columns
    stack = -(-total // size)
    flat = np.arange(stack * size)
    search = np.where(flat < total, flat, 0)
    segment, column = search % count, search // count
    lay = lambda v: jnp.reshape(v, (stack, *shape))  # noqa: E731
    index = jnp.asarray(segment)
    starts = lay(jnp.asarray(lo, dtype)[index])
    stops = lay(jnp.asarray(hi, dtype)[index])
    a, b = _each_choice(
        choices,
        starts,
        stops,
        column.reshape(starts.shape),
        lay(jnp.asarray(flat < total)),
        like,
    )
    each_g = _each(g)

    def per_segment(v: Any) -> Any:
        # (stack, *shape) -> (segments, columns)
        return jnp.reshape(v, (-1,))[:total].reshape(columns, count).T

    xs = jnp.concatenate([per_segment(a), per_segment(b)], axis=1)
    vs = jnp.concatenate([per_segment(each_g(a)), per_segment(each_g(b))], axis=1)
    return xs, vs


def _monotone_uniform(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    like: Any,
    points: Any,
    choices: Callable[[Any], Sequence[Any]] | None = None,
    kinks: Callable[[Any], Sequence[Any]] | None = None,
) -> Any:
    """`monotone_on_grid` of a map that is the same for every element: the
    grid laid out over the elements, a call of `g` per `size` points (in a
    loop: one copy of `g` in the program however small `shape` is). With
    `choices`, the map is also sampled either side of each choice's switch
    in each pair of neighbouring points where that choice differs
    (`_switch_sides`: the searches laid out over the elements)."""
    size = math.prod(shape)
    count = points.shape[0]
    chunks = -(-count // size)
    # The last chunk is padded with repeated points, dropped below.
    xs = points[np.arange(chunks * size) % count].reshape((chunks, *shape))
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
    at = points  # (the point of each value)
    if choices is not None:
        # Per pair of neighbouring points, the map either side of each
        # choice's switch, in the order of `x` (`_switch_sides`); then
        # again between those switches, where a choice the same at both
        # ends of the pair may change and change back (`abs(x - c) < w`:
        # the window's comparison, about the kink of `abs` at `c`).
        pairs = count - 1
        found = kinks or choices
        xs, vs = _switch_sides(g, found, at[:-1], at[1:], shape, dtype, like)
        if kinks is not None:
            cuts = jnp.sort(
                jnp.concatenate([at[:-1, None], xs, at[1:, None]], axis=1), axis=1
            )
            more, more_v = _switch_sides(
                g, found, cuts[:, :-1].ravel(), cuts[:, 1:].ravel(), shape, dtype, like
            )
            xs = jnp.concatenate([xs, more.reshape(pairs, -1)], axis=1)
            vs = jnp.concatenate([vs, more_v.reshape(pairs, -1)], axis=1)
        xs = jnp.concatenate([at[:-1, None], xs], axis=1)
        vs = jnp.concatenate([values[:-1, None], vs], axis=1)
        # (The pair's low end first: a search that found no switch sits
        # there, with its value.)
        order = jnp.argsort(xs, axis=1, stable=True)
        xs = jnp.take_along_axis(xs, order, axis=1)
        vs = jnp.take_along_axis(vs, order, axis=1)
        values = jnp.concatenate([vs.reshape(-1), values[-1:]])
        at = jnp.concatenate([xs.reshape(-1), at[-1:]])
    eps = jnp.finfo(dtype).eps
    # The same tests as `monotone_on_grid`'s loop: neighbouring finite
    # values, then where the map stops or starts being finite (`_Edges`).
    finite = jnp.isfinite(values)
    prev, value = values[:-1], values[1:]
    compare = finite[1:] & finite[:-1]
    noise = _noise(value, prev, eps)
    rising = ~jnp.any(compare & (value < prev - noise))
    falling = ~jnp.any(compare & (value > prev + noise))
    n = values.shape[0]
    index = jnp.arange(n)
    some = jnp.any(finite)
    first = jnp.argmax(finite)
    last = n - 1 - jnp.argmax(finite[::-1])
    # The non-finite values between the first finite one and the last: one
    # hole if they are contiguous.
    inside = ~finite & (index > first) & (index < last)
    left = jnp.argmax(inside)
    right = n - 1 - jnp.argmax(inside[::-1])
    holes = jnp.sum(inside)
    count = jnp.where(holes == 0, 0, jnp.where(holes == right - left + 1, 1, 2))

    def around(i: Any) -> list[Any]:
        # The samples `i` and `i + 1` (clipped): `lo, hi, v_lo, v_hi`.
        i = jnp.clip(i, 0, n - 2)
        return [at[i], at[i + 1], values[i], values[i + 1]]

    rows = [around(first - 1), around(left - 1), around(right), around(last)]
    on = [some & (first > 0), count == 1, count == 1, some & (last < n - 1)]
    lo, hi, v_lo, v_hi = (jnp.stack([row[k] for row in rows]) for k in range(4))
    edges = _Edges(count, lo, hi, v_lo, v_hi, jnp.stack(on))
    return edges.verdict(g, rising, falling, shape, like)
