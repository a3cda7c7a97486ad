"""Elementwise maps that turn: inverted where `y` has a single preimage.

A map that is not monotone takes some values more than once, but often not
all of them: TFP's shifted Gompertz CDF is negative and turns for `x < 0`
(outside the distribution's support) and increasing for `x > 0`, so every
`y` in `(0, 1)` has one preimage; `x exp(x)` turns at `x = -1`, and every
`y >= 0` has one. The numerical solver finds a root; it is the only one when
`y` lies in the range of values of exactly one monotone stretch of the map.

The stretches are found on the solver's grid (`_solve.grid`), when the map
is the same for every element and its known operands are constants (so now,
at trace time): the grid's values split where the map turns and where it is
not finite (poles, holes in its domain); the extreme value at each turn is
refined by sampling between the grid points around it (it lies between
them, usually beyond the grid's values). Each stretch covers the values
between its ends; a stretch that reaches the end of the grid and still
moves there is taken to go on to infinity. An element whose `y` is in the
range of no stretch, or of two, is NaN, and so is one whose root the solver
found outside the stretch that holds `y`. A map with no value taken once on
the grid is refused.

Turns between two grid points that the values at the grid do not show (a
fold) are found by enclosing the map's slope (`_enclose.py`), and their
places sampled too (`more`); a map with a primitive the enclosures have no
rule for relies on the grid, as the monotonicity check does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _traits as tr
from . import _solve

# Points sampled between the grid points around a turn, twice (the second
# time around the best of the first).
_REFINE = 513


@dataclasses.dataclass(frozen=True)
class Stretches:
    """Monotone stretches of a map: per stretch, the interval of `x` it
    spans and the closed interval of values it takes (NumPy arrays)."""

    x_lo: np.ndarray
    x_hi: np.ndarray
    v_lo: np.ndarray
    v_hi: np.ndarray

    def single(self, y: Any) -> Any:
        """Per element of `y`: whether exactly one stretch takes the value."""
        count = sum(held.astype(jnp.int32) for held in self._holding(y))
        return count == 1

    def holds(self, y: Any, x: Any) -> Any:
        """Per element: whether `x` lies in a stretch that takes `y`."""
        dtype = jnp.result_type(x)
        lo, hi = _cast(self.x_lo, dtype), _cast(self.x_hi, dtype)
        out: Any = False
        for k, held in enumerate(self._holding(y)):
            out = out | (held & (x >= lo[k]) & (x <= hi[k]))
        return out

    def _holding(self, y: Any) -> list[Any]:
        """Per stretch, whether it takes `y`, elementwise. (One comparison
        per stretch with scalar bounds: the same on a new axis of the
        stretches, reduced, compiles on XLA's CPU backend to code as slow as
        the whole solve.)"""
        dtype = jnp.result_type(y)
        lo, hi = _cast(self.v_lo, dtype), _cast(self.v_hi, dtype)
        return [(y >= lo[k]) & (y <= hi[k]) for k in range(len(lo))]

    def pieces(self) -> list[tuple[float, float, float, float]]:
        """Per stretch, `(x_lo, x_hi, v_lo, v_hi)`."""
        return list(
            zip(
                self.x_lo.tolist(),
                self.x_hi.tolist(),
                self.v_lo.tolist(),
                self.v_hi.tolist(),
                strict=True,
            )
        )

    def any_single(self) -> bool:
        """Whether some value is taken by exactly one stretch."""
        ends = np.unique(np.concatenate([self.v_lo, self.v_hi]))
        ends = ends[np.isfinite(ends)]
        probes = [*ends]
        probes += [(a + b) / 2 for a, b in zip(ends[:-1], ends[1:], strict=True)]
        if ends.size:
            probes += [ends[0] - 1 - abs(ends[0]), ends[-1] + 1 + abs(ends[-1])]
        for p in probes:
            count = np.sum((p >= self.v_lo) & (p <= self.v_hi))
            if count == 1:
                return True
        return False


def _cast(bounds: np.ndarray, dtype: Any) -> np.ndarray:
    """Float64 bounds as `dtype`, those beyond its range as its largest
    magnitude (the same comparisons with its values, without overflow)."""
    top = float(jnp.finfo(dtype).max)
    return np.clip(bounds, -top, top).astype(dtype)


def stretches(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...] = (),
    extra: Sequence[float] = (),
    more: Sequence[float] = (),
    turns: Sequence[tuple[float, float, int]] = (),
) -> Stretches | None:
    """The monotone stretches of `g` (elementwise, the same map for every
    element; evaluated now, with concrete values), or `None` if it turns
    more often than the grid resolves (two turns between neighbouring grid
    points, or several where one was refined). `g` is called on values of
    `shape` (its equations may be written for that shape); `extra`: more
    points to sample (either side of a piecewise map's switches); `more`:
    more points to sample (about turns between grid points); `turns`: turns
    proven there, `(lo, hi, peak)` (`_enclose.Turns`), split at even where
    the values move by less than the samplers' rounding allowance."""
    try:
        return _stretches(g, dtype, shape, extra, more, turns)
    except _Wiggles:
        return None


def values_on(
    g: Callable[[Any], Any], points: np.ndarray, shape: tuple[int, ...], dtype: Any
) -> np.ndarray:
    """`g` at `points` (now, as float64), laid over calls on values of
    `shape` (the last call padded with the last point)."""
    out = []
    with jax.ensure_compile_time_eval():
        for xs in _chunks(points, shape, dtype):
            out.append(np.ravel(np.asarray(g(xs), np.float64)))
    return np.concatenate(out)[: len(points)]


def _chunks(points: np.ndarray, shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """`points` laid over values of `shape`, the last padded with the last
    point."""
    size = max(math.prod(shape), 1)
    n = len(points)
    chunks = -(-n // size)
    padded = np.concatenate([points, np.full(chunks * size - n, points[-1])])
    return [
        jnp.asarray(padded[c * size : (c + 1) * size].reshape(shape), dtype)
        for c in range(chunks)
    ]


def _stretches(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    extra: Sequence[float],
    more: Sequence[float] = (),
    turns: Sequence[tuple[float, float, int]] = (),
) -> Stretches:
    points = _solve.grid(dtype)
    if len(extra) or len(more):
        added = np.asarray([*extra, *more], dtype)
        points = np.unique(np.concatenate([points, added]))
    values = values_on(g, points, shape, dtype)
    top = float(jnp.finfo(dtype).max)
    ends = values_on(g, np.asarray([-top, top], dtype), shape, dtype)
    points, values = _with_edges(g, dtype, shape, points, values)
    points, values, jumps = _with_jumps(g, dtype, shape, points, values)
    eps = float(jnp.finfo(dtype).eps)
    finite = np.isfinite(values)
    # `extra` holds pairs of neighbouring values either side of a switch,
    # `jumps` pairs of neighbouring floats across which the map jumps where
    # it seems to turn: nothing lies between them, so a jump there is no
    # turn to refine but a break between stretches (as a pole is).
    pairs = np.concatenate([np.asarray(extra, dtype).reshape(-1, 2), jumps])
    index = {float(p): k for k, p in enumerate(points)}
    cut = {index[float(lo)] for lo, _ in pairs if float(lo) in index}
    x_lo: list[float] = []
    x_hi: list[float] = []
    v_lo: list[float] = []
    v_hi: list[float] = []
    n = len(points)
    i = 0
    while i < n:
        if not finite[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and finite[j + 1] and j not in cut:
            j += 1
        # A stretch of finite values, points[i..j]; split where it turns.
        pieces = _monotone_pieces(g, dtype, shape, points, values, i, j)
        pieces = _split_at(g, dtype, shape, points, values, pieces, turns)
        for a, b, turn_lo, turn_hi in pieces:
            left = (
                -np.inf
                if a == 0
                else points[a]
                if a - 1 in cut
                else points[a - 1]
                if not finite[a - 1]
                else None
            )
            right = (
                np.inf
                if b == n - 1
                else points[b]
                if b in cut
                else points[b + 1]
                if not finite[b + 1]
                else None
            )
            lo_x = turn_lo[0] if turn_lo is not None else left
            hi_x = turn_hi[0] if turn_hi is not None else right
            seen = list(values[a : b + 1])
            seen += [t[1] for t in (turn_lo, turn_hi) if t is not None]
            lo_v, hi_v = min(seen), max(seen)
            # Still moving at an end of the grid: on to the value at the
            # end of the floats that way.
            if b == n - 1 and b > a:
                lo_v, hi_v = _beyond(values[b - 1], values[b], ends[1], lo_v, hi_v, eps)
            if a == 0 and b > a:
                lo_v, hi_v = _beyond(values[a + 1], values[a], ends[0], lo_v, hi_v, eps)
            x_lo.append(-np.inf if lo_x is None else float(lo_x))
            x_hi.append(np.inf if hi_x is None else float(hi_x))
            v_lo.append(lo_v - _margin(lo_v, dtype))
            v_hi.append(hi_v + _margin(hi_v, dtype))
        i = j + 1
    found = Stretches(
        np.asarray(x_lo), np.asarray(x_hi), np.asarray(v_lo), np.asarray(v_hi)
    )
    if np.any(found.x_lo > found.x_hi):
        raise _Wiggles  # turns closer than the grid's points
    return found


def _with_edges(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    points: np.ndarray,
    values: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`points` and `values` with samples added where the map stops or starts
    being finite between two of them (a pole, an overflow, an end of its
    domain): located by bisection on the floats' order (a call of `g` per
    step, one point per element), down to neighbouring floats. Between the
    last finite sample and such a place the map may go anywhere (`x - 1e-30
    / x` rises to 8.5e7 just left of 0, where the grid sees about `x`): the
    samples of the bisection approach it about geometrically, so the
    stretch there holds the values it reaches."""
    finite = np.isfinite(values)
    new_x: list[np.ndarray] = []
    new_v: list[np.ndarray] = []
    flips = np.flatnonzero(finite[1:] != finite[:-1])
    if len(flips) > _MAX_EDGES:
        raise _Wiggles  # (holes everywhere: `log(sin(x))`; refused)
    for i in map(int, flips):
        flip = functools.partial(_flips, bool(finite[i]))
        *_, seen_x, seen_v = _bisect(g, dtype, shape, points[i], points[i + 1], flip)
        new_x += seen_x
        new_v += seen_v
    if not new_x:
        return points, values
    xs = np.concatenate([points, *new_x])
    vs = np.concatenate([values, *new_v])
    xs, first = np.unique(xs, return_index=True)
    return xs.astype(points.dtype), vs[first]


def _bisect(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    lo: float,
    hi: float,
    past: Callable[[np.ndarray], np.ndarray],
) -> tuple[int, int, list[np.ndarray], list[np.ndarray]]:
    """Neighbouring floats `a < b` between `lo` and `hi` (as `ordered_np`
    integers) where the map's values first pass `past`, on the floats'
    order, assuming they pass it at `hi` and not at `lo`: a call of `g`
    per step, `shape`'s elements (at most 4,096) points apart each; and the
    points sampled on the way, and their values."""
    k = min(max(math.prod(shape), 1), 4096)
    a, b = int(ordered_np(lo, dtype)), int(ordered_np(hi, dtype))
    xs_seen: list[np.ndarray] = []
    vs_seen: list[np.ndarray] = []
    while b - a > 1:
        ks = sorted({a + (b - a) * j // (k + 1) for j in range(1, k + 1)} - {a})
        xs = unordered_np(ks, dtype).astype(dtype)
        vs = values_on(g, xs, shape, dtype)
        xs_seen.append(xs)
        vs_seen.append(vs)
        passed = np.flatnonzero(past(vs))
        j = int(passed[0]) if passed.size else len(ks)
        if j < len(ks):
            b = ks[j]
        if j > 0:
            a = ks[j - 1]
    return a, b, xs_seen, vs_seen


def _flips(finite: bool, v: np.ndarray) -> np.ndarray:
    """Whether each value is finite where `finite` is false, or not."""
    return np.isfinite(v) != finite


def _crosses(mid: float, rising: bool, v: np.ndarray) -> np.ndarray:
    """Whether each value is past `mid` (above it if `rising`) or not a
    number."""
    return ~np.isfinite(v) | ((v > mid) == rising)


def _with_jumps(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    points: np.ndarray,
    values: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`points` and `values` with neighbouring floats added where the map
    jumps between two samples on either side of a turn, and those pairs
    (`(k, 2)`): `x / sqrt(1 + x**2)` is 1 up to where `x**2` overflows, and
    0 past it, which the samples show as a turn. Where the values of two
    samples move one way and the map turns round next to them, the place
    where it crosses the middle of their values is located by bisection on
    the floats' order (as `_with_edges` does); if the neighbouring floats
    there differ by more than half the move, the map takes no value between
    them, and the stretches part there (at most `_MAX_EDGES` such
    intervals)."""
    eps = float(jnp.finfo(dtype).eps)
    steps = np.diff(values)
    with np.errstate(invalid="ignore"):
        noise = 16 * eps * np.fmax(np.fmax(np.abs(values[:-1]), np.abs(values[1:])), 1)
        sign = np.where(np.isfinite(steps) & (np.abs(steps) > noise), np.sign(steps), 0)
    moving = np.flatnonzero(sign)
    turning = moving[:-1][sign[moving[1:]] != sign[moving[:-1]]]
    after = moving[1:][sign[moving[1:]] != sign[moving[:-1]]]
    candidates = np.unique(np.concatenate([turning, after]))
    none = np.zeros((0, 2), np.float64)
    if candidates.size == 0 or candidates.size > _MAX_EDGES:
        return points, values, none
    found: list[tuple[float, float, float, float]] = []
    for i in map(int, candidates):
        mid = (values[i] + values[i + 1]) / 2
        rising = values[i + 1] > values[i]
        cross = functools.partial(_crosses, float(mid), bool(rising))
        a, b, _, _ = _bisect(g, dtype, shape, points[i], points[i + 1], cross)
        x_a, x_b = unordered_np([a, b], dtype)
        v_a, v_b = values_on(g, np.asarray([x_a, x_b]), shape, dtype)
        move = abs(values[i + 1] - values[i])
        if np.isfinite(v_a) and np.isfinite(v_b) and abs(v_b - v_a) > move / 2:
            found.append((float(x_a), float(x_b), float(v_a), float(v_b)))
    if not found:
        return points, values, none
    jumps = np.asarray(found)
    xs = np.concatenate([points, jumps[:, 0], jumps[:, 1]])
    vs = np.concatenate([values, jumps[:, 2], jumps[:, 3]])
    xs, first = np.unique(xs, return_index=True)
    return xs.astype(points.dtype), vs[first], jumps[:, :2]


# At most this many places where a map stops or starts being finite are
# located (`_with_edges`); a map with more is refused.
_MAX_EDGES = 16


def ordered_np(x: Any, dtype: Any) -> np.ndarray:
    """Floats of `dtype` as integers in the floats' order (int64; NumPy,
    as `_grid._ordered` does under JAX)."""
    itype = np.int32 if np.dtype(dtype).itemsize == 4 else np.int64
    bits = np.asarray(np.abs(np.asarray(x, dtype))).view(itype).astype(np.int64)
    return np.where(np.signbit(np.asarray(x, dtype)), -bits, bits)


def unordered_np(k: Any, dtype: Any) -> np.ndarray:
    """`ordered_np`'s inverse, as float64."""
    k = np.asarray(k, np.int64)
    itype = np.int32 if np.dtype(dtype).itemsize == 4 else np.int64
    x = np.abs(k).astype(itype).view(dtype).astype(np.float64)
    return np.where(k < 0, -x, x)


class _Wiggles(Exception):
    """The map turns more often than the grid and its refinement resolve."""


def _margin(bound: float, dtype: Any) -> float:
    """Rounding allowed at a value bound of a stretch."""
    finfo = jnp.finfo(dtype)
    return 64 * float(finfo.eps) * abs(bound) + 16 * float(finfo.tiny)


def _beyond(
    inner: float, end: float, last: float, lo: float, hi: float, eps: float
) -> tuple:
    """The value range of a stretch at the end of the grid, where the map
    still moves (beyond rounding) from `inner` to `end`: on to `last`, its
    value at the largest float that way (monotone from the grid's last point
    on, as between any two grid points), or unbounded where that is not
    finite or does not go on the same way (`x / (1 + x)` approaching 1 from
    below: to 1; `asinh(x)`: to its value at the largest float)."""
    noise = 16 * eps * max(abs(inner), abs(end), 1.0)
    rising = end > inner + noise
    if not rising and not end < inner - noise:
        return lo, hi
    if np.isfinite(last) and (last >= end if rising else last <= end):
        return (lo, max(hi, last)) if rising else (min(lo, last), hi)
    return (lo, np.inf) if rising else (-np.inf, hi)


def _monotone_pieces(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    points: np.ndarray,
    values: np.ndarray,
    first: int,
    last: int,
) -> list[tuple[int, int, Any, Any]]:
    """`points[first..last]` (all finite) split where the values turn:
    `(a, b, turn_lo, turn_hi)` per piece, the turns `(x, extreme value)`
    refined between the grid points (`None` at a stretch's end)."""
    eps = float(jnp.finfo(dtype).eps)
    pieces: list[tuple[int, int, Any, Any]] = []
    start, direction, turn_lo = first, 0, None
    k = first
    while k < last:
        step = values[k + 1] - values[k]
        noise = 16 * eps * max(abs(values[k]), abs(values[k + 1]), 1.0)
        sign = 0 if abs(step) <= noise else (1 if step > 0 else -1)
        if sign and direction and sign != direction:
            # It turned between the last move and this one: the extreme sample
            # since the piece's start, then the extreme between its neighbours.
            span = values[start : k + 1]
            t = start + int(np.argmax(span) if direction > 0 else np.argmin(span))
            turn = _refine(
                g, dtype, shape, points, max(t - 1, first), min(t + 1, last), direction
            )
            pieces.append((start, t, turn_lo, turn))
            start, turn_lo = t, turn
        if sign:
            direction = sign
        k += 1
    pieces.append((start, last, turn_lo, None))
    return pieces


def _split_at(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    points: np.ndarray,
    values: np.ndarray,
    pieces: list[tuple[int, int, Any, Any]],
    turns: Sequence[tuple[float, float, int]],
) -> list[tuple[int, int, Any, Any]]:
    """`pieces` also split at each proven turn `(lo, hi, peak)` inside one
    of them that no split already lies near: a fold too shallow for the
    samples' rounding allowance (`x**3 - 1e-6 x` in float32 folds by 4e-10)
    that the slope's enclosure shows beyond the map's rounding."""
    for lo, hi, peak in turns:
        for n, (a, b, turn_lo, turn_hi) in enumerate(pieces):
            if not (points[a] < lo and hi < points[b]):
                continue
            # (A turn the samples showed already, refined near this one.)
            seen = [t[0] for t in (turn_lo, turn_hi) if t is not None]
            if any(points[a] <= x <= points[b] and lo <= x <= hi for x in seen):
                break
            ka = int(np.searchsorted(points, lo, side="right")) - 1
            kb = int(np.searchsorted(points, hi, side="left"))
            ka, kb = max(ka, a), min(kb, b)
            span = values[ka : kb + 1]
            t = ka + int(np.argmax(span) if peak > 0 else np.argmin(span))
            t = min(max(t, a + 1), b - 1) if b - a >= 2 else t
            turn = _refine(g, dtype, shape, points, ka, kb, peak)
            pieces[n : n + 1] = [(a, t, turn_lo, turn), (t, b, turn, turn_hi)]
            break
    return pieces


def _refine(
    g: Callable[[Any], Any],
    dtype: Any,
    shape: tuple[int, ...],
    points: np.ndarray,
    a: int,
    b: int,
    peak: int,
) -> tuple[float, float]:
    """`(x, value)` of the map's extreme between `points[a]` and `points[b]`
    (a maximum if `peak > 0`), by sampling twice, the second time between
    the best sample's neighbours; the value is pushed out by how much the
    best sample differs from its neighbours (the extreme may lie between
    samples)."""
    lo, hi = float(points[a]), float(points[b])
    eps = float(jnp.finfo(dtype).eps)
    best_x, best_v = lo, 0.0
    for _ in range(2):
        xs = np.linspace(lo, hi, _REFINE).astype(dtype)
        vs = values_on(g, xs, shape, dtype)
        vs_ = np.where(np.isfinite(vs), vs, -np.inf if peak > 0 else np.inf)
        if _turns(vs_, eps) > 1:
            raise _Wiggles
        k = int(np.argmax(vs_) if peak > 0 else np.argmin(vs_))
        best_x, best_v = float(xs[k]), float(vs_[k])
        lo = float(xs[max(k - 1, 0)])
        hi = float(xs[min(k + 1, len(xs) - 1)])
        near = vs_[max(k - 1, 0) : k + 2]
        spread = float(np.max(np.abs(near - best_v)))
    return best_x, best_v + spread if peak > 0 else best_v - spread


def _turns(values: np.ndarray, eps: float) -> int:
    """How many times a sequence of values changes direction (beyond
    rounding)."""
    steps = np.diff(values)
    noise = (
        16 * eps * np.maximum(np.maximum(np.abs(values[:-1]), np.abs(values[1:])), 1.0)
    )
    signs = np.where(np.abs(steps) <= noise, 0, np.sign(steps))
    signs = signs[np.isfinite(steps) & (signs != 0)]
    return int(np.sum(signs[1:] != signs[:-1]))


# Primitives whose float results are discrete choices of their operand: a
# map built from them jumps where they change.
_STEPS = tr.having(tr.STEP)
# Primitives that pick between continuous pieces (`choices_of`'s `kinks`).
_KINKS = tr.having(tr.KINK)


def choices_of(
    steps: Sequence[tuple[Any, Sequence[Any], Sequence[Any]]],
    shape: tuple[int, ...],
    kinks: bool = False,
) -> list[Any]:
    """The discrete choices among a block's evaluated `steps` (`(eqn, ins,
    outs)`, `jit` bodies included), each as an array `(*shape, k)`: every
    boolean or integer value with the unknown's elements as its leading axes
    (a comparison of the unknown, a bin index), the results of `floor`,
    `ceil`, `round` and `sign`, and the quotient of a `rem` (which jumps
    back where it passes a multiple of its divisor). A map may jump only
    where one of them changes. With `kinks`, also which operand a `max` or
    `min` takes, the sign of an `abs`'s operand, and which bound a `clamp`
    holds to: no jumps, but where a value may turn (`abs(x - c)`), so that
    a comparison of it may change and change back between grid points
    (`switch_points`)."""
    found = []
    for eqn, ins, outs in steps:
        name = eqn.primitive.name
        vals: list[Any]
        if (
            kinks
            and name in _KINKS
            and all(jnp.issubdtype(jnp.result_type(v), jnp.floating) for v in ins)
        ):
            if name == "abs":
                vals = [ins[0] >= 0]
            elif name == "clamp":
                low, value, high = ins
                vals = [value >= low, value <= high]
            else:
                vals = [ins[0] >= ins[1]]
            vals = [jnp.broadcast_to(v, jnp.shape(outs[0])) for v in vals]
        elif name in _STEPS:
            vals = list(outs)
        elif name == "rem":
            q = jnp.round((ins[0] - outs[0]) / ins[1])
            vals = [jnp.where(jnp.isfinite(q), q, 0)]
        else:
            vals = [
                o for o in outs if not jnp.issubdtype(jnp.result_type(o), jnp.inexact)
            ]
        for val in vals:
            if tuple(jnp.shape(val)[: len(shape)]) == tuple(shape):
                found.append(jnp.reshape(val, (*shape, -1)))
    return found


def discrete(block: Any, x: Any, known: Sequence[Any], kinks: bool = False) -> Any:
    """A block's discrete choices at `x` (elementwise): per element of `x`,
    a row of numbers that changes wherever the map may jump (`choices_of`,
    and its `kinks`); shape `(*x.shape, k)`, `k` possibly 0."""
    return choices_of(block.steps(x, known), jnp.shape(x), kinks)


def switch_points(
    block: Any, known: Sequence[Any], shape: tuple[int, ...], dtype: Any
) -> tuple[list[float], bool]:
    """Pairs of neighbouring values of `dtype` either side of each place where
    a block (the same map for every element) changes a discrete choice
    between two grid points (`choices_of`: a comparison of the unknown, a bin
    index, a `floor`); at most `_MAX_SWITCHES` per choice and pair of grid
    points, the leftmost. A piecewise map may jump there, between the grid's
    samples. Found by subdividing, all at once, the intervals where a choice
    differs at the ends, each choice on its own: a choice that changes
    often (a staircase of `floor`s) does not hide the few switches of
    another (a window `a < x < b` where the map jumps back). Between two
    grid points where some choice changes more often than that, `_DENSE`
    evenly spaced points too, and the second result is true: a map that
    turns there is refused rather than split into stretches (which a
    staircase's rounding makes many, and slow)."""
    points = _solve.grid(dtype)
    at = _choices_on(block, known, points, shape, dtype)
    if not at.shape[1]:
        return [], False
    # Intervals (lo, hi, grid interval, choice) where the choice differs at
    # the ends.
    pairs, columns = np.nonzero(at[1:] != at[:-1])
    active = [
        (points[i], points[i + 1], int(i), int(c))
        for i, c in zip(pairs, columns, strict=True)
    ]
    ends = {float(p): row for p, row in zip(points, at, strict=True)}
    found: dict[tuple[int, int], list[tuple[float, float]]] = {}
    crowded: set[int] = set()
    seen: set[tuple[float, float, int]] = {
        (float(a), float(b), c) for a, b, _, c in active
    }
    for _ in range(_ROUNDS):
        _locate(block, known, shape, dtype, active, ends, found, crowded)
        # A choice the same at both ends of a grid interval may change and
        # change back inside it (`abs(x - c) < w`): compared again at the
        # switches of the others found there (the kink of `abs` at `c`).
        active = []
        for i in sorted({i for i, _ in found} - crowded):
            cuts = sorted(
                {float(points[i]), float(points[i + 1])}
                | {
                    p
                    for (j, _), got in found.items()
                    if j == i
                    for pair in got
                    for p in pair
                }
            )
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                if np.nextafter(np.asarray(a, dtype), np.asarray(b, dtype)) == b:
                    continue
                for c in np.flatnonzero(ends[a] != ends[b]).tolist():
                    if (a, b, c) not in seen:
                        seen.add((a, b, c))
                        active.append(
                            (np.asarray(a, dtype), np.asarray(b, dtype), i, c)
                        )
        if not active:
            break
    unique = sorted({pair for pairs_ in found.values() for pair in pairs_})
    located = [p for pair in unique for p in pair]
    # Where a choice changes more often than is located (a `floor`
    # staircase), the map is also sampled densely: a jump back there larger
    # than about 1/`_DENSE` of the interval's rise shows; a smaller one may
    # not. (The switches of the other choices there are located still.)
    dense = [
        np.linspace(float(points[i]), float(points[i + 1]), _DENSE + 1)[1:-1]
        for i in sorted(crowded)
    ]
    extra = np.concatenate(dense).astype(dtype).tolist() if dense else []
    return located + extra, bool(crowded)


def _locate(
    block: Any,
    known: Sequence[Any],
    shape: tuple[int, ...],
    dtype: Any,
    active: list[tuple[Any, Any, int, int]],
    ends: dict[float, np.ndarray],
    found: dict[tuple[int, int], list[tuple[float, float]]],
    crowded: set[int],
) -> None:
    """`switch_points`' search: the intervals `(lo, hi, grid interval,
    choice)` where the choice differs at the ends are cut into `_SPLIT`
    parts, all at once, until each switch lies between neighbouring floats
    (added to `found`), at most `_MAX_SWITCHES` per choice and grid
    interval (past that, the grid interval is `crowded`). `ends`: the
    choices at each point evaluated so far, updated."""
    while active:
        cuts: dict[tuple[float, float], np.ndarray] = {}
        for lo, hi, _, _ in active:
            if (float(lo), float(hi)) not in cuts:
                cut = np.linspace(float(lo), float(hi), _SPLIT + 1)[1:-1]
                cut = cut.astype(dtype)
                cuts[float(lo), float(hi)] = np.unique(cut[(cut > lo) & (cut < hi)])
        new = np.concatenate(list(cuts.values()))
        new = np.asarray([p for p in np.unique(new) if float(p) not in ends], dtype)
        if new.size:
            rows = _choices_on(block, known, new, shape, dtype)
            ends.update(zip(map(float, new), rows, strict=True))
        kept: dict[tuple[int, int], int] = {}
        after = []
        for lo, hi, i, c in active:
            seq = [lo, *cuts[float(lo), float(hi)], hi]
            for a, b in zip(seq[:-1], seq[1:], strict=True):
                if ends[float(a)][c] == ends[float(b)][c]:
                    continue
                key = (i, c)
                if len(found.get(key, ())) + kept.get(key, 0) >= _MAX_SWITCHES:
                    crowded.add(i)
                    break
                if np.nextafter(np.asarray(a, dtype), np.asarray(b, dtype)) == b:
                    found.setdefault(key, []).append((float(a), float(b)))
                else:
                    after.append((a, b, i, c))
                    kept[key] = kept.get(key, 0) + 1
        active = after


def _choices_on(
    block: Any,
    known: Sequence[Any],
    xs: np.ndarray,
    shape: tuple[int, ...],
    dtype: Any,
) -> np.ndarray:
    """The block's discrete choices (`choices_of`) at each of `xs`: rows of
    numbers (NaN as inf, so that equal rows compare equal), evaluated now on
    values of `shape`, all at once in a `vmap` where every step batches.
    (Padded to a power of two of calls: eager steps compile once per
    shape.)"""
    size = max(math.prod(shape), 1)
    count = 1 << max(-(-len(xs) // size) - 1, 0).bit_length()
    padded = np.resize(np.asarray(xs, dtype), count * size)
    padded[len(xs) :] = xs[-1]

    def flat(parts: Sequence[Any], count: int) -> np.ndarray:
        cols = [
            np.reshape(np.asarray(c, np.float64), (count * size, -1)) for c in parts
        ]
        if not cols:
            return np.zeros((count * size, 0))
        col = np.concatenate(cols, 1)
        return np.where(np.isnan(col), np.inf, col)

    with jax.ensure_compile_time_eval():
        calls = jnp.asarray(padded.reshape((count, *shape)), dtype)
        try:
            rows = flat(
                jax.vmap(lambda c: discrete(block, c, known, kinks=True))(calls), count
            )
        except NotImplementedError:  # a step without a batching rule
            rows = np.concatenate(
                [
                    flat(discrete(block, calls[i], known, kinks=True), 1)
                    for i in range(count)
                ]
            )
    return rows[: len(xs)]


# At most this many switches are looked for between two grid points.
_MAX_SWITCHES = 16
# Each interval holding a switch is cut into this many pieces per round.
_SPLIT = 16
# Points sampled between two grid points with more switches than located.
_DENSE = 1024
# Rounds of `switch_points`' search, each comparing the choices again at
# the switches the last one found.
_ROUNDS = 3
