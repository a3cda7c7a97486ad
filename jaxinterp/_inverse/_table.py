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
# 0.3 to 0.9 s more of the first call (docs/benchmarks.md, session 18).
MIN_SIZE = 1 << 12
# Gaps between samples more than a cell apart in `y` are split (`_refinements`):
# each into at most `_SPLITS` parts, at most `_MAX_EXTRA` new points a round.
_SPLITS = 64
_MAX_EXTRA = 1 << 16
_REFINE_ROUNDS = 3


class Table(NamedTuple):
    """The inverse at each cell's low end (`x`) and its slope over the cell
    (`slope`, in `|y|`), the positive cells then the negative ones."""

    x: np.ndarray
    slope: np.ndarray


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
    pieces = [(xs64, gs, -np.inf, np.inf)]
    if stretches is not None:
        pieces = []
        for x_lo, x_hi, v_lo, v_hi in stretches:
            on = (xs64 >= x_lo) & (xs64 <= x_hi)
            pieces.append((xs64[on], gs[on], v_lo, v_hi))
    mags = _magnitudes(_BITS, _EXPONENTS)
    xt, st = [], []
    for t in (mags, -mags):
        x = np.full(t.shape, np.nan)
        owner = np.full(t.shape, -1)
        count = np.zeros(t.shape, np.int64)
        for k, (xp, gp, v_lo, v_hi) in enumerate(pieces):
            held = (t >= v_lo) & (t <= v_hi)
            count += held
            x = np.where(held, _inverse_at(t, xp, gp), x)
            owner = np.where(held, k, owner)
        x[count != 1] = np.nan
        slope = np.diff(x) / np.diff(mags)
        # (Across two stretches the slope means nothing: the cell's `x`.)
        slope[owner[1:] != owner[:-1]] = 0.0
        xt.append(x[:-1])
        st.append(np.where(np.isfinite(slope), slope, 0.0))
    with np.errstate(over="ignore"):
        x, slope = np.concatenate(xt).astype(dtype), np.concatenate(st).astype(dtype)
    # (A slope beyond the dtype's range: the cell's `x` alone.)
    return Table(x, np.where(np.isfinite(slope), slope, 0).astype(dtype))


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
    edges = _toward_edges(xs, gs, dtype)
    if wide.size == 0:
        return edges
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
    low = lax.bitcast_convert_type(bits & itype(~((1 << shift) - 1)), dtype)
    x = jnp.asarray(table.x)
    slope = jnp.asarray(table.slope)
    start = jnp.take(x, k, mode="clip") + (a - low) * jnp.take(slope, k, mode="clip")
    return jnp.where(inside, start, jnp.nan)
