"""Turns of an elementwise map between the solver's grid points, found by
enclosing its slope over intervals of `x`.

The solver's monotonicity check and the split into monotone stretches
(`_grid.py`, `_turning.py`) judge a map by its values at sample points. A
map that folds between two of them (`x - 0.02 tanh(100 (x - 0.3))` turns
twice between the grid points 0.25 and 0.5) takes some values three times,
and the solver answered one of the three preimages. Here, for a map that is
the same for every element with constant known operands (so now, at trace
time), its slope is enclosed over each interval between grid points; an
interval whose enclosure has both signs is cut in four (on the floats'
order), and its parts enclosed again. An interval whose slope is proven of
one sign is monotone; a run of proven rising intervals beside a run of
proven falling ones brackets a turn: the runs' ends are handed to the
samplers as more points, and the turn splits the stretches there
(`_turning.stretches(turns=...)`).

The enclosures are first-order affine forms (`_enclose_forms.py`), which
carry a running error bound of the map as computed in its dtype: a run of
intervals that moves by no more than that rounding is no turn. The slope's
form comes from the map's `jvp`, evaluated the same way.

What this does not decide: an interval where the map cannot fold by more
than rounding (`tanh` far out) is let be; one where a step jumps (a case
switch, a pole, the end of a domain, `floor`) is cut down to neighbouring
floats; one whose enclosures do not narrow within `_FAMILY` intervals per
grid interval (`x / (1 + |x|)` beyond 1e16) is left undecided. A map with
turns and an undecided interval is refused (more turns may hide there);
without turns it is left to the samplers, and so is a map with
a primitive that has no rule here.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _jax_compat as compat
from . import _enclose_forms as forms, _enclose_rules as rules
from ._turning import ordered_np as _ordered, unordered_np as _unordered

# Halving goes on in at most this many intervals from one grid interval: a
# turn, a fold or a jump keeps one or two undecided each round, a map flat
# to within rounding keeps them all (its slope's sign stays unknown).
_FAMILY = 64
# As many for `unmoving`, whose open intervals about a jump never close:
# fewer per family keeps the many families of a staircase (`floor`) within
# `_CAP`, so that the others are cut down.
_MOVING_FAMILY = 16
# At most this many intervals are enclosed at once; beyond, the search stops.
_CAP = 4096
_ROUNDS = 40
# Each undecided interval is cut in this many (on the floats' order).
_WAYS = 4


# --- the search ------------------------------------------------------------


# A box of known operands: each operand's least and greatest value (equal
# for an operand whose value is known exactly), per element for an array.
Box = Sequence[tuple[Any, Any]]


class Slope:
    """The slope of an elementwise map, enclosed over intervals of `x`, for
    known operands within a box (`g(x, *known)`, `known` scalars)."""

    def __init__(
        self, jaxpr: Any, consts: Sequence[Any], dtype: Any, n_known: int = 0
    ) -> None:
        self.jaxpr = jaxpr
        self.consts = consts
        self.unit = float(jnp.finfo(dtype).eps) / 2
        self.n_known = n_known

    @classmethod
    def of(
        cls,
        g: Callable[..., Any],
        dtype: Any,
        known: Sequence[Any] = (),
        *,
        shaped: bool = False,
    ) -> Slope | None:
        """For `g(x, *known)` on a scalar `x` of `dtype`, each known operand
        a scalar of its own dtype (its value given to `enclose` as a box),
        or with `shaped` of its own shape too; `None` where a step has no
        rule or `g` does not run so."""
        one = jnp.ones((), dtype)
        kinds = [
            jax.ShapeDtypeStruct(jnp.shape(k) if shaped else (), jnp.result_type(k))
            for k in known
        ]
        try:
            closed = jax.make_jaxpr(
                lambda u, *k: jax.jvp(lambda v: g(v, *k), (u,), (one,))
            )(jax.ShapeDtypeStruct((), dtype), *kinds)
        except Exception:  # noqa: BLE001 - a map that does not run so: none
            return None
        if not shaped and any(a.shape for a in closed.out_avals):
            return None  # (a constant of the elements' shape inside: per element)
        slope = cls(
            compat.open_jaxpr(closed), compat.jaxpr_consts(closed), dtype, len(kinds)
        )
        try:
            zero = [np.zeros(kind.shape) for kind in kinds]
            slope.enclose(np.zeros(1), np.ones(1), list(zip(zero, zero, strict=True)))
        except (forms.Unsupported, ValueError, TypeError, IndexError, KeyError):
            # (A step without a rule, or with parameters its rule does not
            # take: left to the samplers.)
            return None
        return slope

    def enclose(self, lo: np.ndarray, hi: np.ndarray, box: Box = ()) -> Enclosed:
        """Per interval `[lo, hi]`: the map's value range and its slope's,
        for every value of the known operands within `box`."""
        if len(box) != self.n_known:
            raise ValueError(f"a box of {len(box)} operands for {self.n_known}")
        k = forms.Cells(np.asarray(lo, float), np.asarray(hi, float), self.unit)
        x = forms.Form(
            k.m,
            np.ones_like(k.m),
            np.zeros_like(k.m),
            None,
            np.asarray(lo, float),
            np.asarray(hi, float),
        )
        with np.errstate(all="ignore"):
            known = [k.box(a, b) for a, b in box]
            value, slope = rules.walk(k, self.jaxpr, self.consts, [x, *known])
            v_lo, v_hi = k.range(value)
            d_lo, d_hi = k.range(slope)
        void = value.void & ~k.bad
        bad = k.bad | (~value.void & slope.void)
        nan = np.full(k.m.shape, np.nan)
        v_lo, v_hi, d_lo, d_hi, err = (
            np.where(bad | void, nan, a) for a in (v_lo, v_hi, d_lo, d_hi, value.err)
        )
        return Enclosed(v_lo, v_hi, d_lo, d_hi, void, err, k.unsure & ~void)


@dataclasses.dataclass(frozen=True)
class Enclosed:
    """Per interval: the ranges of the map's values and of its slope (NaN
    where not enclosed), and whether the map is NaN all over it (`void`)."""

    v_lo: np.ndarray
    v_hi: np.ndarray
    d_lo: np.ndarray
    d_hi: np.ndarray
    void: np.ndarray
    # How far the map's values computed in its dtype may be from the exact
    # ones (a running error bound), NaN where not enclosed.
    err: np.ndarray
    # Not enclosed for want of deciding a discrete choice (`forms.Cells.unsure`):
    # not known to be NaN or infinite there.
    unsure: np.ndarray


@dataclasses.dataclass(frozen=True)
class Turns:
    """`points` about each turn found; `complete`: whether every interval
    was decided (monotone, NaN all over, or too flat for a fold beyond
    rounding), so that no turn can hide between the points."""

    points: np.ndarray
    complete: bool
    # Each turn: `(lo, hi, peak)`, within `[lo, hi]`, a maximum if `peak > 0`.
    turns: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    # Neighbouring floats (both, flat) where a discrete choice of the map
    # was not decided down to them: where it may switch (a comparison of a
    # value that turns between grid points, `exp(-400 (x - 0.3)**2) > 0.5`),
    # and the map may jump there, which the samplers see only if they
    # sample there.
    switches: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    # How many of those places the map is proven to jump across against the
    # direction it moves everywhere else (`_jumps_back`): it takes some
    # values twice there, as at a turn.
    jumps_back: int = 0

    @property
    def turned(self) -> bool:
        """Whether the map is proven not injective: a turn, or a jump back."""
        return bool(self.turns) or self.jumps_back > 0


def turn_points(slope: Slope, points: np.ndarray, dtype: Any, box: Box = ()) -> Turns:
    """The turns of the map between `points` (sorted floats of `dtype`):
    the ends of a proven rising interval and of the proven falling one
    next to it (and the other way round). With known operands within `box`,
    a turn found is one for each of their values, and `complete` holds for
    each."""
    ends = _ordered(points, dtype)
    a, b = ends[:-1], ends[1:]
    keep = b > a
    a, b = a[keep], b[keep]
    family = np.arange(a.size)
    found: list[tuple[np.ndarray, ...]] = []
    switches: list[np.ndarray] = []
    # Intervals where a choice was not decided when cutting them stopped
    # (down to neighbouring floats, or given up): `(a, b)` per round.
    bands: list[tuple[np.ndarray, np.ndarray]] = []
    moved: list[np.ndarray] = []
    complete = True
    for _ in range(_ROUNDS):
        if not a.size:
            break
        lo, hi = _unordered(a, dtype), _unordered(b, dtype)
        got, at_ends = _enclosed(slope, lo, hi, box)
        # (Proven to fall or rise from one end to the other, as computed.)
        moved.append(_ends_moved(at_ends, dtype))
        choosing = got.unsure & ~got.void & np.isnan(got.d_lo)
        # (Down to neighbouring floats, a choice still not decided.)
        at = (b - a < 2) & choosing
        switches += [lo[at], hi[at]]
        up = got.d_lo >= 0
        down = got.d_hi <= 0
        direction = np.where(up & down, 0, np.where(up, 1, -1))
        decided = up | down
        # How far the map may move over the interval, at most (a run that
        # moves by no more than rounding is no turn: `_around_turns`).
        with np.errstate(all="ignore"):
            steep = np.maximum(np.abs(got.d_lo), np.abs(got.d_hi)) * (hi - lo)
            move = np.fmin(steep, got.v_hi - got.v_lo)
        move = np.where(np.isnan(move), np.inf, move)
        noise = _noise(got)
        found.append(
            (a[decided], b[decided], direction[decided], move[decided], noise[decided])
        )
        # (Where the map cannot fold by more than rounding, nothing to find.)
        open_ = ~decided & ~got.void & (b - a >= 2) & ~_shallow(got, lo, hi)
        split = open_.copy()
        crowd = np.bincount(family[split], minlength=int(np.max(family)) + 1)
        split &= crowd[family] <= _FAMILY
        if np.any(open_ & ~split):
            complete = False
        # (With known operands in a box, where a choice switches moves with
        # them: cutting stops at the crowd of intervals it leaves open.)
        stop = at | (open_ & ~split & choosing)
        if _WAYS * int(np.sum(split)) > _CAP:
            complete = False
            stop |= split & choosing
            bands.append((a[stop], b[stop]))
            break
        bands.append((a[stop], b[stop]))
        a, b, family = _cut(a[split], b[split], family[split])
    else:
        complete = complete and not a.size
    points, turns, way = _around_turns(found, dtype)
    near = np.unique(np.concatenate(switches)) if switches else np.zeros(0)
    back = 0
    if way and not turns:
        # Against the way the map moves: from an interval's end to the
        # other, or across where a choice switches.
        back = int(np.sum(np.concatenate(moved) == -way))
        band_a = np.concatenate([p[0] for p in bands])
        band_b = np.concatenate([p[1] for p in bands])
        back += _jumps_back(slope, band_a, band_b, way, dtype, box)
    return Turns(points, complete, turns, near, back)


def _ends_moved(ends: tuple[Enclosed, Enclosed], dtype: Any) -> np.ndarray:
    """Per interval, `_moves` from the map enclosed at its low end to its
    high end."""
    left, right = ((e.v_lo, e.v_hi, e.err) for e in ends)
    return _moves(left, right, dtype)


def _moves(
    left: tuple[np.ndarray, ...], right: tuple[np.ndarray, ...], dtype: Any
) -> np.ndarray:
    """From enclosures `(lo, hi, err)` of the map at two points, the left
    one first: 1 where its values as computed in `dtype` (within `[lo - err,
    hi + err]`) are proven to rise from one to the other by more than the
    samplers' rounding allowance (`_grid._noise`), -1 where to fall, else
    0 (also where either is not enclosed)."""
    (l_lo, l_hi, l_err), (r_lo, r_hi, r_err) = left, right
    eps = float(jnp.finfo(dtype).eps)
    with np.errstate(all="ignore"):
        size = np.fmax(np.fmax(np.abs(l_lo), np.abs(l_hi)), 1.0)
        size = np.fmax(size, np.fmax(np.abs(r_lo), np.abs(r_hi)))
        noise = 16 * eps * size
        rise = (r_lo - r_err) - (l_hi + l_err) > noise
        fall = (l_lo - l_err) - (r_hi + r_err) > noise
    return np.where(rise, 1, np.where(fall, -1, 0))


# Floats stepped outwards from a switch to where the map's choice, so its
# value, is decided (`_jumps_back`).
_OUTWARD = 8


def _jumps_back(
    slope: Slope,
    band_a: np.ndarray,
    band_b: np.ndarray,
    direction: int,
    dtype: Any,
    box: Box,
) -> int:
    """How many places where a choice switches the map is proven to jump
    across against `direction`, the way it moves everywhere it was proven
    to move: `[band_a, band_b]` (on the floats' order) are the intervals
    `turn_points` left with a choice not decided, which join into bands
    where they touch (neighbouring floats about a switch; with known
    operands in a box, the stretch over which the switch moves with them).
    Each band's map is enclosed at the nearest float outside it on each
    side where the choice is decided (within `_OUTWARD` floats), for every
    operand value in `box`; a jump back is one where the two values as
    computed in `dtype` (within their running error bound) move the wrong
    way by more than the samplers' rounding allowance (`_grid._noise`).
    The samplers locate one switch per choice between grid points, and
    with traced or per-element operands do not sample at these places: they
    miss a window of a comparison of a smoothly turning value (`exp(-400 (x
    - c)**2) > 0.5` between the grid points 0.25 and 0.5) and all but one
    step of a staircase."""
    if not band_a.size:
        return 0
    order = np.argsort(band_a, kind="stable")
    band_a, band_b = band_a[order], band_b[order]
    # (Bands: intervals that touch, or lie a float apart, join.)
    reach = np.maximum.accumulate(band_b)
    starts = np.flatnonzero(np.append(True, band_a[1:] > reach[:-1] + 1))
    first = band_a[starts]
    last = reach[np.append(starts[1:], band_a.size) - 1]
    steps = np.arange(_OUTWARD)
    sides = [first[:, None] - steps, last[:, None] + steps]
    n = first.size
    at = _unordered(np.concatenate([s.ravel() for s in sides]), dtype)
    got = slope.enclose(at, at, box)
    lo, hi, err = (
        np.asarray(v, float).reshape(2, n, _OUTWARD)
        for v in (got.v_lo, got.v_hi, got.err)
    )
    decided = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(err)
    pick = np.argmax(decided, axis=2)  # (the nearest decided float)
    use = np.take_along_axis(decided, pick[..., None], axis=2)[..., 0].all(axis=0)

    def nearest(v: np.ndarray) -> np.ndarray:
        return np.take_along_axis(v, pick[..., None], axis=2)[..., 0]

    left, right = zip(nearest(lo), nearest(hi), nearest(err), strict=True)
    return int(np.sum((_moves(left, right, dtype) == -direction) & use))


def unmoving(slope: Slope, points: np.ndarray, dtype: Any, step: float) -> np.ndarray:
    """Where the map may repeat its value a step away: runs `(lo, hi)` of
    `x` (float64, merged, sorted; shape `(k, 2)`) outside of which
    `g(x - d) != g(x) != g(x + d)` as computed in `dtype`, for `d = step
    max(|x|, 1)` computed there too. Proven per interval between `points`
    (sorted floats of `dtype`, cut as `turn_points` cuts them): over the
    interval widened by the steps, the map's slope keeps one sign (no jump
    either: `bad` there leaves it open), and the least slope times the
    least step outweighs twice the map's rounding (`_noise`); or the map is
    NaN all over it. An interval left open is cut in `_WAYS`, at most
    `_MOVING_FAMILY` open parts per interval between `points` and `_CAP` in
    all (the most crowded given up first), for at most `_ROUNDS` rounds;
    what is left open then is a run."""
    # (`d` and `x +- d` are rounded in `dtype`: the step taken is `d` within
    # a relative `sqrt(eps)`.)
    slack = 2 * math.sqrt(float(jnp.finfo(dtype).eps))
    ends = _ordered(points, dtype)
    a, b = ends[:-1], ends[1:]
    keep = b > a
    a, b = a[keep], b[keep]
    family = np.arange(a.size)
    left: list[tuple[np.ndarray, np.ndarray]] = []
    for _ in range(_ROUNDS):
        if not a.size:
            break
        lo, hi = _unordered(a, dtype), _unordered(b, dtype)
        big = np.maximum(np.maximum(np.abs(lo), np.abs(hi)), 1.0)
        across = (lo <= 0) & (hi >= 0)
        least_x = np.minimum(np.abs(lo), np.abs(hi))
        small = np.where(across, 1.0, np.maximum(least_x, 1.0))
        reach = step * big * (1 + slack)
        got, _ = _enclosed(slope, lo - reach, hi + reach, ())
        least = np.where(got.d_lo > 0, got.d_lo, np.where(got.d_hi < 0, -got.d_hi, 0.0))
        with np.errstate(invalid="ignore"):
            moves = least * (step * small * (1 - slack)) > _noise(got)
        open_ = ~(moves | got.void)
        split = open_ & (b - a >= 2)
        crowd = np.bincount(family[split], minlength=int(np.max(family)) + 1)
        split &= crowd[family] <= _MOVING_FAMILY
        # Over `_CAP`: the most crowded families are given up (left runs)
        # first, so that the others (near 0, where most roots lie) are cut.
        crowd = np.bincount(family[split], minlength=crowd.size)
        while _WAYS * int(np.sum(crowd)) > _CAP:
            worst = int(np.argmax(crowd))
            split &= family != worst
            crowd[worst] = 0
        left.append((a[open_ & ~split], b[open_ & ~split]))
        a, b, family = a[split], b[split], family[split]
        a, b, family = _cut(a, b, family)
    left.append((a, b))
    a = np.concatenate([p[0] for p in left])
    b = np.concatenate([p[1] for p in left])
    order = np.argsort(a, kind="stable")
    runs: list[list[int]] = []
    for lo_, hi_ in zip(a[order].tolist(), b[order].tolist(), strict=True):
        if runs and lo_ <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], hi_)
        else:
            runs.append([lo_, hi_])
    if not runs:
        return np.zeros((0, 2))
    bounds = _unordered(np.asarray(runs, np.int64).ravel(), dtype)
    return np.asarray(bounds, np.float64).reshape(-1, 2)


def _cut(
    a: np.ndarray, b: np.ndarray, family: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each interval `[a, b]` (on the floats' order) cut in `_WAYS`, empty
    parts dropped; each part keeps its interval's `family`."""
    cuts = [a, b]
    while len(cuts) <= _WAYS:
        pairs = zip(cuts[:-1], cuts[1:], strict=True)
        cuts = [c for lo_, hi_ in pairs for c in (lo_, _mid(lo_, hi_))] + [b]
    parts = list(zip(cuts[:-1], cuts[1:], strict=True))
    nonempty = [hi_ > lo_ for lo_, hi_ in parts]
    a = np.concatenate([p[0][m] for p, m in zip(parts, nonempty, strict=True)])
    b = np.concatenate([p[1][m] for p, m in zip(parts, nonempty, strict=True)])
    return a, b, np.concatenate([family[m] for m in nonempty])


def _mid(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The middle of `a` and `b` (int64, without overflow)."""
    return a // 2 + b // 2 + (a % 2 + b % 2) // 2


def _enclosed(
    slope: Slope, lo: np.ndarray, hi: np.ndarray, box: Box
) -> tuple[Enclosed, tuple[Enclosed, Enclosed]]:
    """`slope.enclose(lo, hi)`, with the intervals not enclosed where the
    map is not finite at either end taken as NaN all over: past where it
    overflows float64 (so the dtype too), or outside its domain. The
    samplers take it so between two such points of theirs too. (One call
    for the intervals and their ends: each call walks the Jaxpr.) With
    the ends' enclosures: `(enclosed, (at_lo, at_hi))`."""
    n = lo.size
    got = slope.enclose(np.concatenate([lo, lo, hi]), np.concatenate([hi, lo, hi]), box)
    part = [
        Enclosed(*(getattr(got, f)[i * n : (i + 1) * n] for f in _ENCLOSED))
        for i in range(3)
    ]
    whole, at_lo, at_hi = part
    # (An end not enclosed for want of deciding a choice may be finite: at
    # a point, `max(x, 0) == x` is not decided on forms that both round.)
    finite = [
        (np.isfinite(e.v_lo) & np.isfinite(e.v_hi)) | e.unsure for e in (at_lo, at_hi)
    ]
    open_ = np.isnan(whole.d_lo) & ~whole.void
    void = whole.void | (open_ & ~finite[0] & ~finite[1])
    whole = dataclasses.replace(whole, void=void)
    return whole, (at_lo, at_hi)


_ENCLOSED = ("v_lo", "v_hi", "d_lo", "d_hi", "void", "err", "unsure")


def _noise(got: Enclosed) -> np.ndarray:
    """Per interval: how far the map's computed values may stray by
    rounding, twice (either end of a step), from the running error bound;
    at least the enclosures' own float64 rounding. A fold no deeper is no
    turn of the map as computed: `(32 + x) - 32 + 1e-12 sin(x)` in float32
    rounds to steps of 4e-6, and its real folds of 2e-12 do not show."""
    size = np.maximum(np.abs(got.v_lo), np.abs(got.v_hi))
    return np.maximum(2 * got.err, 64 * forms.ROUND * size)


def _shallow(got: Enclosed, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Intervals where the map cannot fold by more than `_noise`: to fold
    it must move both ways, by at most its slope's bound either way times
    the interval's width, and within its value range."""
    with np.errstate(all="ignore"):
        fall = np.minimum(-got.d_lo, got.d_hi) * (hi - lo)
        depth = np.minimum(fall, got.v_hi - got.v_lo)
    return depth <= _noise(got)


def _around_turns(
    found: list[tuple[np.ndarray, ...]], dtype: Any
) -> tuple[np.ndarray, list[tuple[float, float, int]], int]:
    """The ends of the proven runs either side of each turn, and each turn
    as `(lo, hi, peak)`: it lies within `[lo, hi]`, a maximum if `peak >
    0`; without turns, the way the map moves (1 rising, -1 falling, 0 where
    no run was proven to move). Runs of intervals proven to move one way
    are joined; a run that provably moves by no more than rounding
    (`_noise`) is no turn, and its neighbours join across it."""
    none: tuple[np.ndarray, list[tuple[float, float, int]], int] = (
        np.zeros(0, dtype),
        [],
        0,
    )
    if not found:
        return none
    a, b, d, move, noise = (np.concatenate([f[k] for f in found]) for k in range(5))
    order = np.argsort(a, kind="stable")
    a, b, d, move, noise = (v[order] for v in (a, b, d, move, noise))
    moving = d != 0
    a, b, d, move, noise = (v[moving] for v in (a, b, d, move, noise))
    # Runs: [first cell, last cell, direction, how far it moves, noise].
    runs: list[list[Any]] = []
    for i, di in enumerate(d.tolist()):
        if runs and runs[-1][2] == di:
            run = runs[-1]
            run[1] = i
            run[3] += move[i]
            run[4] = max(run[4], noise[i])
        else:
            runs.append([i, i, di, float(move[i]), float(noise[i])])
    kept: list[list[Any]] = []
    for run in runs:
        if not run[3] > run[4]:
            continue
        if kept and kept[-1][2] == run[2]:
            kept[-1][1] = run[1]
        else:
            kept.append(run)
    out: list[int] = []
    turns: list[tuple[float, float, int]] = []
    for before, after in zip(kept[:-1], kept[1:], strict=True):
        i, j = before[1], after[0]
        out += [a[before[0]], a[i], b[i], a[j], b[j], b[after[1]]]
        ends = _unordered(np.asarray([a[i], b[j]], np.int64), dtype)
        turns.append((float(ends[0]), float(ends[1]), int(before[2])))
    if not out:
        # (One direction, or none: the way the map moves.)
        return (*none[:2], kept[0][2] if kept else 0)
    points = np.unique(_unordered(np.asarray(out, np.int64), dtype).astype(dtype))
    return points, turns, 0


# --- per element ------------------------------------------------------------

# How many searches `turning_boxes` makes at most, halving the box of the
# operands' values where it is not decided as a whole.
_SEARCHES = 16
# At most this many boxes come back: one per box searched, and one per
# element searched alone (a median found to turn).
MAX_BOXES = 2 * _SEARCHES


def turning_boxes(
    slope: Slope, points: np.ndarray, dtype: Any, known: Sequence[Any]
) -> list[np.ndarray]:
    """Boxes of known operand values (`(lo, hi)` per operand, one row each)
    for every value within which the map is proven to turn between
    `points`, found from the values of the elements (`known`, broadcast
    together): at most `_SEARCHES` of them.

    One search over the box of all their values first: a turn found there
    is one for every element, and a search completed without one proves
    that none turns. Where it is not decided, the elements are halved at
    the median of the operand whose values spread widest (relative to their
    size) and each half searched over its own box, widest boxes first,
    within `_SEARCHES` searches of boxes in all. A half is not halved again
    where its median element alone leaves the search undecided too: what
    stays open then is an interval of `x`, not the box. Elements left
    undecided are in no box: left to the samplers, as is a map with a step
    that has no rule here, or operands that are not finite."""
    values = [np.asarray(k, np.float64) for k in known]
    shape = np.broadcast_shapes(*(v.shape for v in values))
    rows = np.stack([np.broadcast_to(v, shape).ravel() for v in values], axis=-1)
    boxes: list[np.ndarray] = []

    def visit(index: np.ndarray, part: np.ndarray) -> list[np.ndarray]:
        low, high = part.min(axis=0), part.max(axis=0)
        found = turn_points(
            slope, points, dtype, list(zip(low.tolist(), high.tolist(), strict=True))
        )
        if found.turned:
            boxes.append(np.stack([low, high], axis=-1))
            return []
        if found.complete or not np.any(high > low):
            return []
        order, half = _halved(part)
        # Not decided for the median element alone either (the intervals of
        # `x` are what stays open, not the box): halving will not help.
        middle = part[order[half]]
        alone = turn_points(
            slope,
            points,
            dtype,
            list(zip(middle.tolist(), middle.tolist(), strict=True)),
        )
        if alone.turned:
            boxes.append(np.stack([middle, middle], axis=-1))
        elif not alone.complete:
            return []
        return [index[order[:half]], index[order[half:]]]

    _halving(rows, visit)
    return boxes


def _halving(
    rows: np.ndarray, visit: Callable[[np.ndarray, np.ndarray], list[np.ndarray]]
) -> None:
    """`visit(index, rows[index])` for the finite rows, then for each set of
    rows it hands back (halves), in order, within `_SEARCHES` visits."""
    queue = collections.deque([np.flatnonzero(np.all(np.isfinite(rows), axis=1))])
    for _ in range(_SEARCHES):
        if not queue:
            break
        index = queue.popleft()
        if index.size:
            queue.extend(visit(index, rows[index]))


def _halved(part: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows of values (`(n, k)`, `n >= 2`) halved at the median of the
    column whose values spread widest relative to their size: an order of
    the rows whose first `half` lie at or below it, in linear time."""
    low, high = part.min(axis=0), part.max(axis=0)
    size = np.maximum(np.maximum(np.abs(low), np.abs(high)), np.finfo(float).tiny)
    half = part.shape[0] // 2
    return np.argpartition(part[:, int(np.argmax((high - low) / size))], half), half


def turning_rows(
    rows: np.ndarray, search: Callable[[np.ndarray, np.ndarray], Turns]
) -> np.ndarray:
    """Per row of operand values (`(n, k)`: a batch element's operands,
    flattened), whether the map is proven to turn for it, where `search(lo,
    hi)` searches for every value within the box `[lo, hi]` (`turn_points`).
    The box of all rows first; where that is not decided, halved at the
    median of the widest column (`_halved`) and each half searched, widest
    first, within `_SEARCHES` searches; a row left undecided is left to the
    samplers, as is a row with an operand that is not finite."""
    turned = np.zeros(rows.shape[0], bool)

    def visit(index: np.ndarray, part: np.ndarray) -> list[np.ndarray]:
        found = search(part.min(axis=0), part.max(axis=0))
        if found.turned:
            turned[index] = True
        elif not found.complete and index.size > 1 and np.ptp(part, axis=0).any():
            order, half = _halved(part)
            return [index[order[:half]], index[order[half:]]]
        return []

    _halving(rows, visit)
    return turned


def inside(boxes: Sequence[np.ndarray], known: Sequence[Any]) -> np.ndarray:
    """Per element of `known` (broadcast together): whether its operands lie
    within one of `boxes` (so the map turns for it)."""
    values = [np.asarray(k, np.float64) for k in known]
    shape = np.broadcast_shapes(*(v.shape for v in values))
    found = np.zeros(shape, bool)
    for box in boxes:
        hit = np.ones(shape, bool)
        for v, (lo, hi) in zip(values, box, strict=True):
            hit &= (v >= lo) & (v <= hi)
        found |= hit
    return found
