"""A start for the elementwise solver from a table of the inverse, looked up
by the bits of `y`.

When the map is the same for every element and its known operands are
constants, `build` samples it while tracing (a fine grid of `x`, one call of
the map per `size` points) and tabulates its inverse at the floats whose
mantissa has only `_BITS` bits, `+-(1 + m / 2**_BITS) 2**e` for `e` in
`[-_EXPONENTS, _EXPONENTS)`: the inverse there is read off the samples by
linear interpolation, and so is its slope over each cell. At run time an
element's cell is its `|y|`'s sign, exponent and top mantissa bits (shifts of
its bit pattern, no search), and the start is the table's `x` at the cell's
low end plus the slope times the distance (`lookup`): two gathers and a
multiply-add, within about `1e-4` relative of the root for a smooth map, so
that one Newton step (two in float64) reaches the dtype's precision.

Where the inverse curves within a cell (a sigmoid's tail, where a cell of
`y` spans several units of `x`; the flat steps of a soft floor, where the
inverse is nearly vertical), the chord of the cell is a poor start, so such
cells are cut (`_tree`): into 16 by the next 4 bits of `|y|`, and those
sub-cells again, up to four levels, while the samples inside lie more than
`2**-14` relative from the chord, at most `_MAX_REFINED` new cells in all;
the samples are refined there too (`_curved`). `lookup` then walks down the
levels, a gather of the cell's `meta` each (where its sub-cells start), the
same levels for every element (a map with no cut cell has none). For TFP's
`Softfloor(0.05)` this took the roots one Newton step decides from 28% to
79% (`benchmarks/peers_solver.py`).

The table is only a start: every result is accepted by the solver's own tests
(`_solve._accept`), and an element whose start is poor (a cell at the edge of
the map's image, where the inverse is steep; `y` outside the table's range)
is left to the solver's later tiers. So nothing here needs to be exact: the
samples are interpolated in float64, and a map that wobbles by rounding
between close samples is made monotone by a running maximum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Mantissa bits of `y` that pick its cell (128 cells per power of two) and
# the powers of two covered either side of 1.
_BITS = 7
_EXPONENTS = 32
# The samples of `x`: `_SAMPLE_BITS` mantissa bits over `2**+-_SAMPLE_RANGE`.
_SAMPLE_BITS = 7
_SAMPLE_RANGE = 40
# Below this many elements a call of the solver is cheap without a table
# (and sampling would take many calls of the map). At 10^4 elements the
# table made TFP's `Invert(Sigmoid())` 21x faster (1.82 to 0.085 ms) for
# 0.3 to 0.9 s more of the first call (`benchmarks/peers_solver.py`).
MIN_SIZE = 1 << 12
# Gaps between samples more than a cell apart in `y` are split (`_refinements`):
# each into at most `_SPLITS` parts, at most `_MAX_EXTRA` new points a round.
_SPLITS = 64
_MAX_EXTRA = 1 << 16
_REFINE_ROUNDS = 3
_CURVED_SPLITS = 4
# A cell is cut (`_tree`) where its samples lie more than `_TOLERANCE`
# relative from its chord (and more than `_NOISE` times the map's rounding),
# into `2**_FANOUT` by the next bits of `|y|`, at most `_MAX_LEVELS` times;
# at most `_MAX_REFINED` new cells in all.
_TOLERANCE = 2.0**-14
_NOISE = 4.0
_FANOUT = 4
_MAX_LEVELS = 4
_MAX_REFINED = 1 << 16


class Table(NamedTuple):
    """The inverse at each cell's low end (`x`) and its slope over the cell
    (`slope`, in `|y|`), the positive cells then the negative ones."""

    x: np.ndarray
    slope: np.ndarray
    # Per entry, where its sub-cells start and how many bits of `|y|` pick
    # one (`start * 32 + bits`; its own index and 0 where it is not cut),
    # and how many times a cell may be cut: `None` and 0 where none is (an
    # entry per cell).
    meta: np.ndarray | None = None
    levels: int = 0


# A monotone piece of the map: its samples `(x, g(x))`, and the values it
# alone stands for.
_Piece = tuple[np.ndarray, np.ndarray, float, float]


def _magnitudes(bits: int, top: int) -> np.ndarray:
    """`(1 + m / 2**bits) 2**e` for `e` in `[-top, top)`, ascending, then
    `2**top` (the last cell's high end)."""
    m = 1.0 + np.arange(2**bits) / 2**bits
    e = np.exp2(np.arange(-top, top, dtype=np.float64))
    return np.append((e[:, None] * m[None, :]).ravel(), 2.0**top)


def build(
    g: Callable[[Any], Any],
    shape: Any,
    dtype: Any,
    stretches: Sequence[tuple[float, float, float, float]] | None = None,
) -> Table | None:
    """The table for the elementwise map `g` (called on arrays of `shape`;
    its values must be concrete: known operands are constants), or `None`
    where it would not pay (`shape` holds fewer than `MIN_SIZE` elements, a
    dtype other than float32 or float64) or the map has fewer than two finite
    values on the samples.

    For a map that turns, `stretches` are its monotone stretches, `(x_lo,
    x_hi, v_lo, v_hi)` each (`_turning.Stretches`): the table holds, at a
    value taken by exactly one of them, the inverse on that one (read off
    its own samples), and nothing (NaN) at a value taken by none or several."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if size < MIN_SIZE or dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    half = _magnitudes(_SAMPLE_BITS, _SAMPLE_RANGE)
    xs = np.concatenate([-half[::-1], [0.0], half]).astype(dtype)
    gs = _sample(g, xs, shape, dtype)
    # Where the map is steep, consecutive samples are several cells of `y`
    # apart, and interpolating between them is off by far more than the
    # `1e-4` the first tier needs (logit near 1: its samples there are
    # `2**-8` apart in `x`, `0.3` in `y`, against cells `0.03` wide); such
    # gaps are sampled again, more finely.
    for _ in range(_REFINE_ROUNDS):
        extra = _refinements(xs, gs, dtype)
        if extra.size == 0:
            break
        xs = np.concatenate([xs, extra])
        gs = np.concatenate([gs, _sample(g, extra, shape, dtype)])
        order = np.argsort(xs, kind="stable")
        xs, gs = xs[order], gs[order]
    finite = np.isfinite(gs)
    xs64, gs = xs.astype(np.float64)[finite], gs[finite]
    if gs.size < 2 or gs[0] == gs[-1]:
        return None
    # Per piece: its samples and the values it alone stands for (all of
    # them without `stretches`).
    pieces: list[_Piece] = [(xs64, gs, -np.inf, np.inf)]
    if stretches is not None:
        pieces = []
        for x_lo, x_hi, v_lo, v_hi in stretches:
            on = (xs64 >= x_lo) & (xs64 <= x_hi)
            pieces.append((xs64[on], gs[on], v_lo, v_hi))
    x, slope, meta, levels = _tree(pieces, _magnitudes(_BITS, _EXPONENTS), dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        x, slope = x.astype(dtype), slope.astype(dtype)
    # (A slope beyond the dtype's range: the cell's `x` alone.)
    slope = np.where(np.isfinite(slope), slope, 0).astype(dtype)
    return Table(x, slope, meta, levels)


def _held(t: np.ndarray, pieces: Sequence[_Piece]) -> tuple[np.ndarray, np.ndarray]:
    """The inverse at each value of `t` on the one piece that takes it, and
    that piece's index (NaN and -1 where no piece or several take it)."""
    x = np.full(t.shape, np.nan)
    owner = np.full(t.shape, -1)
    count = np.zeros(t.shape, np.int64)
    for k, (xp, gp, v_lo, v_hi) in enumerate(pieces):
        held = (t >= v_lo) & (t <= v_hi)
        count += held
        x = np.where(held, _inverse_at(t, xp, gp), x)
        owner = np.where(held, k, owner)
    x[count != 1] = np.nan
    owner[count != 1] = -1
    return x, owner


class _Nodes(NamedTuple):
    """One level of the table's cells, in the table's order: each holds the
    values `sign * [lo, lo + width)`, and is named by `key` (its cell's
    index, then the bits of `|y|` that pick it within the cell)."""

    sign: np.ndarray
    lo: np.ndarray
    width: np.ndarray
    key: np.ndarray


def _tree(
    pieces: Sequence[_Piece], mags: np.ndarray, dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """The table's entries (`x` at each cell's low end, the slope over it),
    and where cells are cut (`Table.meta`, `Table.levels`).

    The cells are those of `lookup` (`mags`, either sign); a level at a
    time, each cell whose samples lie farther from its chord than
    `_TOLERANCE` relative (where the inverse curves within it: a sigmoid's
    tail, the flat steps of a soft floor) is cut into `2**_FANOUT` by the
    next bits of `|y|`, the cells that curve most first, while
    `_MAX_REFINED` new cells in all allow. Not where the samples' distance
    from the chord is the map's rounding, which no cut lessens: the
    tolerance is at least `_NOISE` times how far the samples lie from the
    chords of their neighbours (`_wobble`)."""
    cells = mags.size - 1
    width = np.diff(mags)
    level = _Nodes(
        np.repeat([1.0, -1.0], cells),
        np.tile(mags[:-1], 2),
        np.tile(width, 2),
        np.arange(2 * cells, dtype=np.int64),
    )
    top = min(_MAX_LEVELS, (int(np.finfo(dtype).nmant) - _BITS) // _FANOUT)
    wobble = [_wobble(xp, gp) for xp, gp, _, _ in pieces]
    xs, slopes, cut = [], [], []
    budget = _MAX_REFINED
    for depth in range(top + 1):
        x, slope, owner = _entries(pieces, level)
        xs.append(x)
        slopes.append(slope)
        if depth == top or budget < 2**_FANOUT:
            break
        dev, noise = _deviations(pieces, wobble, mags, level, depth, x, slope, owner)
        scale = np.fmax(np.abs(x), np.abs(x + slope * level.width))
        tol = np.fmax(_TOLERANCE * scale, _NOISE * noise)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(dev > tol, dev / tol, 0.0)
        (worst,) = np.nonzero(ratio)
        worst = worst[np.argsort(-ratio[worst], kind="stable")]
        worst = np.sort(worst[: budget >> _FANOUT])
        if worst.size == 0:
            break
        budget -= worst.size << _FANOUT
        cut.append(worst)
        level = _children(level, worst)
    if not cut:
        return xs[0], slopes[0], None, 0
    # Each entry's `meta`: where its sub-cells start and their bits, or
    # (not cut) its own index and 0.
    sizes = [x.size for x in xs]
    offsets = np.cumsum([0, *sizes])
    meta = [(offsets[i] + np.arange(n)) << 5 for i, n in enumerate(sizes)]
    for i, worst in enumerate(cut):
        first = offsets[i + 1] + (np.arange(worst.size) << _FANOUT)
        meta[i][worst] = first << 5 | _FANOUT
    return (
        np.concatenate(xs),
        np.concatenate(slopes),
        np.concatenate(meta).astype(np.int32),
        len(cut),
    )


def _entries(
    pieces: Sequence[_Piece], level: _Nodes
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell, the inverse at its low end, its slope over the cell (0
    where its ends lie on two stretches: the low end's `x` alone), and the
    piece its low end lies on (`_held`)."""
    x_lo, o_lo = _held(level.sign * level.lo, pieces)
    x_hi, o_hi = _held(level.sign * (level.lo + level.width), pieces)
    slope = (x_hi - x_lo) / level.width
    slope[o_lo != o_hi] = 0.0
    return x_lo, slope, o_lo


def _children(level: _Nodes, cut: np.ndarray) -> _Nodes:
    """The cells the cells `cut` of `level` are cut into, in order."""
    parts = 1 << _FANOUT
    j = np.tile(np.arange(parts), cut.size)
    width = np.repeat(level.width[cut] / parts, parts)
    return _Nodes(
        np.repeat(level.sign[cut], parts),
        np.repeat(level.lo[cut], parts) + j * width,
        width,
        (np.repeat(level.key[cut], parts) << _FANOUT) + j,
    )


def _deviations(
    pieces: Sequence[_Piece],
    wobble: Sequence[np.ndarray],
    mags: np.ndarray,
    level: _Nodes,
    depth: int,
    x: np.ndarray,
    slope: np.ndarray,
    owner: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per cell of `level` (cut `depth` times; its entries `x`, `slope` and
    `owner`, `_entries`), how far the samples inside it lie from its chord
    at most (in `x`; NaN where none tells), and how far they lie from their
    neighbours' chords at most (`_wobble`)."""
    cells = mags.size - 1
    dev = np.full(level.key.shape, np.nan)
    noise = np.zeros(level.key.shape)
    for k, ((xp, gp, _, _), wob) in enumerate(zip(pieces, wobble, strict=True)):
        a = np.abs(gp)
        c = np.searchsorted(mags, a, side="right") - 1
        inside = (c >= 0) & (c < cells) & (gp != 0)
        c, a, xs, wob = c[inside], a[inside], xp[inside], wob[inside]
        half = np.where(gp[inside] < 0, 1, 0)
        parts = 1 << (_FANOUT * depth)
        q = np.floor((a - mags[c]) / ((mags[c + 1] - mags[c]) / parts))
        q = np.minimum(q, parts - 1).astype(np.int64)
        key = ((half * cells + c) << (_FANOUT * depth)) + q
        at = np.minimum(np.searchsorted(level.key, key), level.key.size - 1)
        on = level.key[at] == key
        at, a, xs, wob = at[on], a[on], xs[on], wob[on]
        # (Only where the cell's ends lie on this piece: its `x` alone
        # elsewhere, `_entries`.)
        mine = owner[at] == k
        at, a, xs, wob = at[mine], a[mine], xs[mine], wob[mine]
        off = np.abs(xs - (x[at] + (a - level.lo[at]) * slope[at]))
        ok = np.isfinite(off)
        np.fmax.at(dev, at[ok], off[ok])
        np.maximum.at(noise, at, wob)
    return dev, noise


def _wobble(xp: np.ndarray, gp: np.ndarray) -> np.ndarray:
    """Per sample of a piece, how far it lies from the chord of its two
    neighbours (in `x`; 0 at the ends): the map's rounding, where the
    samples are close (a smooth map is nearly straight between them)."""
    out = np.zeros(xp.shape)
    if xp.size < 3:
        return out
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (gp[1:-1] - gp[:-2]) / (gp[2:] - gp[:-2])
        off = np.abs(xp[1:-1] - (xp[:-2] + t * (xp[2:] - xp[:-2])))
    out[1:-1] = np.where(np.isfinite(off), off, 0.0)
    return out


def _inverse_at(t: np.ndarray, xs: np.ndarray, gs: np.ndarray) -> np.ndarray:
    """The inverse at `t` of the monotone map sampled as `gs` at `xs`
    (ascending; made monotone by a running extremum where it wobbles by
    rounding), by linear interpolation; NaN outside the sampled values."""
    if gs.size < 2 or gs[0] == gs[-1]:
        return np.full(t.shape, np.nan)
    if gs[-1] < gs[0]:  # decreasing: interpolate on the reversed samples
        xs, gs = xs[::-1], gs[::-1]
    gs = np.maximum.accumulate(gs)
    x = np.interp(t, gs, xs)
    # Only strictly inside the sampled values: at an end, the map may be
    # saturated by rounding (softsign is 1.0 from 2**24 on).
    x[(t <= gs[0]) | (t >= gs[-1])] = np.nan
    return x


def _sample(g: Callable[[Any], Any], xs: np.ndarray, shape: Any, dtype: Any) -> Any:
    """`g` at `xs` (float64), one call per `shape`'s worth of points."""
    size = math.prod(shape)
    values = []
    with jax.ensure_compile_time_eval():
        for lo in range(0, xs.size, size):
            chunk = np.resize(xs[lo : lo + size], size).reshape(shape)
            out = np.asarray(g(jnp.asarray(chunk, dtype)), np.float64).ravel()
            values.append(out[: min(size, xs.size - lo)])
    return np.concatenate(values)


def _refinements(xs: np.ndarray, gs: np.ndarray, dtype: Any) -> np.ndarray:
    """New points of `x` splitting each gap between consecutive finite
    samples (`xs` ascending) whose values are more than a cell of the table
    apart (a cell at the smaller `|g|`, at least the table's smallest), into
    as many parts as cells, at most `_SPLITS`; at most `_MAX_EXTRA` points
    in all, the widest gaps first. Points that round to an end of their gap
    in `dtype` are dropped."""
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.abs(np.diff(gs))
        low = np.minimum(np.abs(gs[:-1]), np.abs(gs[1:]))
        cell = np.maximum(low, 2.0**-_EXPONENTS) * 2.0**-_BITS
        cells = gap / cell
    wide = np.nonzero(np.isfinite(cells) & (cells > 1.0))[0]
    edges = np.concatenate([_toward_edges(xs, gs, dtype), _curved(xs, gs, dtype)])
    if wide.size == 0:
        return np.unique(edges)
    parts = np.minimum(np.ceil(cells[wide]), _SPLITS).astype(np.int64)
    order = np.argsort(-cells[wide], kind="stable")
    keep = order[np.cumsum(parts[order] - 1) <= _MAX_EXTRA]
    wide, parts = wide[keep], parts[keep]
    lo, hi = xs[wide].astype(np.float64), xs[wide + 1].astype(np.float64)
    # Gap `j` gets the points `lo + (i / parts) (hi - lo)`, `0 < i < parts`.
    per = parts - 1
    steps = np.repeat(parts, per)
    first = np.repeat(np.cumsum(per) - per, per)
    frac = (np.arange(steps.size) - first + 1) / steps
    lo, hi = np.repeat(lo, per), np.repeat(hi, per)
    new = (lo + frac * (hi - lo)).astype(dtype)
    inside = (new > lo) & (new < hi)
    return np.unique(np.concatenate([new[inside], edges]))


def _curved(xs: np.ndarray, gs: np.ndarray, dtype: Any) -> np.ndarray:
    """New points of `x` splitting in `_CURVED_SPLITS` the gaps either side
    of each sample that lies more than `_TOLERANCE` relative from the chord
    of its neighbours (`_wobble`: where the inverse curves between samples,
    the cells there cannot be cut finely enough, `_tree`), at most
    `_MAX_EXTRA` points, the most curved first."""
    finite = np.isfinite(gs)
    xs, gs = xs[finite].astype(np.float64), gs[finite]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = _wobble(xs, gs) / (_TOLERANCE * np.abs(xs))
    (bent,) = np.nonzero(np.isfinite(ratio) & (ratio > 1.0))
    bent = bent[np.argsort(-ratio[bent], kind="stable")]
    gaps = np.unique(np.concatenate([bent - 1, bent])[: _MAX_EXTRA // _CURVED_SPLITS])
    frac = np.arange(1, _CURVED_SPLITS) / _CURVED_SPLITS
    lo, hi = xs[gaps][:, None], xs[gaps + 1][:, None]
    new = (lo + frac * (hi - lo)).astype(dtype)
    return new[(new > lo) & (new < hi)]


def _toward_edges(xs: np.ndarray, gs: np.ndarray, dtype: Any) -> np.ndarray:
    """Points approaching, geometrically, each edge of the map's domain
    where it is finite: between a sample with a finite value and a
    neighbour without one (logit's samples stop at `1 - 2**-8`, where
    `y = 5.5`, while float32 reaches `1 - 2**-24`, `y = 16.6`), at
    distances `2**-k (1 + m / 8)` of the gap from the non-finite end
    (each round of `build` comes closer)."""
    finite = np.isfinite(gs)
    out = []
    k = np.arange(1, jnp.finfo(dtype).nmant + 2)
    frac = (np.exp2(-k)[:, None] * (1 + np.arange(8) / 8)[None, :]).ravel()
    for i in np.nonzero(finite[:-1] != finite[1:])[0]:
        good, bad = (i, i + 1) if finite[i] else (i + 1, i)
        a, b = float(xs[good]), float(xs[bad])
        pts = (b + (a - b) * frac).astype(dtype)
        pts = pts[(pts != xs[good]) & (pts != xs[bad])]
        out.append(pts)
    return np.concatenate(out) if out else np.zeros(0, dtype)


def lookup(table: Table, y: Any) -> Any:
    """Per element, the start the table gives for `y` (NaN where `y` is
    outside its range or its cell has no finite entry)."""
    dtype = jnp.result_type(y)
    finfo = jnp.finfo(dtype)
    nmant, bias = int(finfo.nmant), int(finfo.maxexp) - 1
    itype = jnp.int32 if finfo.bits == 32 else jnp.int64
    cells = 2 * _EXPONENTS << _BITS
    a = jnp.abs(y)
    bits = lax.bitcast_convert_type(a, itype)
    shift = nmant - _BITS
    k = lax.shift_right_logical(bits, itype(shift)) - ((bias - _EXPONENTS) << _BITS)
    inside = (k >= 0) & (k < cells)
    k = jnp.clip(k, 0, cells - 1) + jnp.where(jnp.signbit(y), cells, 0)
    rest = itype(shift)
    if table.meta is not None:
        # Down the cut cells: each level picks a sub-cell by the next bits.
        meta = jnp.asarray(table.meta).astype(itype)
        for _ in range(table.levels):
            node = jnp.take(meta, k, mode="clip")
            sub = rest - (node & 31)
            below = lax.shift_left(itype(1), rest) - 1
            k = (node >> 5) + lax.shift_right_logical(bits & below, sub)
            rest = sub
    low = lax.bitcast_convert_type(bits & ~(lax.shift_left(itype(1), rest) - 1), dtype)
    x = jnp.asarray(table.x)
    slope = jnp.asarray(table.slope)
    start = jnp.take(x, k, mode="clip") + (a - low) * jnp.take(slope, k, mode="clip")
    return jnp.where(inside, start, jnp.nan)
