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

The enclosures are first-order affine forms (`_Form`): over an interval of
`x` with centre `m` and half-width `r`, a value `v(x)` lies within
`c + s (x - m) +- e`. Sums and differences of forms are exact in `x`, so a
value computed twice along two paths cancels (`1 + |x| - x sign(x)` is 1);
a nonlinear step `f(u)` is linearised at the centre, its error bounded by
how far `f'` moves over the range of `u` (an interval enclosure of `f'`).
Every step adds a few units of float64 rounding. The slope's form comes
from the map's `jvp`, evaluated the same way. Forms are intersected with
plain interval arithmetic (`exp` of anything is positive), and carry a
running error bound of the map as computed in its dtype: a run of
intervals that moves by no more than that rounding is no turn.

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
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from ._turning import ordered_np as _ordered, unordered_np as _unordered

# Rounding allowed per step, relative to the magnitudes involved (NumPy's
# float64 functions are within a few units in the last place).
_ROUND = 16 * 2.0**-52
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


class _Unsupported(Exception):
    """A step this module has no rule for."""


@dataclasses.dataclass
class _Form:
    """Per interval of `x` (centre `m`, half-width `r`): `v(x)` lies within
    `c + s (x - m) +- e` (NumPy float64 arrays, one element per interval),
    or, where `void`, `v` is NaN all over the interval (a step applied
    wholly outside its domain: `log` of negative values)."""

    c: np.ndarray
    s: np.ndarray
    e: np.ndarray
    void: Any = None
    # An interval enclosure too (interval arithmetic), where it is tighter:
    # `exp` of any interval is positive, which the affine form, linearised,
    # need not show.
    lo: Any = None
    hi: Any = None
    # A bound on how far the map's value computed in its dtype may be from
    # `v` (a running error analysis: each step's rounding, carried on).
    err: Any = None

    def __post_init__(self) -> None:
        if self.void is None:
            self.void = np.zeros(np.shape(self.c), bool)
        if self.err is None:
            self.err = np.zeros(np.shape(self.c))
        if self.lo is None or self.hi is None:
            exact = (self.s == 0) & (self.e == 0)
            self.lo = np.where(exact, self.c, -np.inf)
            self.hi = np.where(exact, self.c, np.inf)

    def constant(self) -> np.ndarray:
        return (self.s == 0) & (self.e == 0) & ~self.void


class _Cells:
    """The intervals being enclosed, and which of them some step could not
    enclose (`bad`: a jump, a pole, a value outside a step's domain); of
    those, `unsure` where a step could not decide a discrete choice (a
    comparison, the case of a `max` or an `abs`, a step function): the map
    may well be finite there."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, unit: float) -> None:
        self.unit = unit  # (the unit roundoff of the map's dtype)
        self.m = lo / 2 + hi / 2
        self.r = np.maximum(hi / 2 - lo / 2, 0.0) * (1 + 4 * 2.0**-52)
        self.r = np.maximum(self.r, np.abs(hi - self.m), out=self.r)
        self.r = np.maximum(self.r, np.abs(self.m - lo))
        self.bad = np.zeros(lo.shape, bool)
        self.unsure = np.zeros(lo.shape, bool)

    def const(self, value: Any) -> _Form:
        if np.ndim(value):
            # (An array: its axes first, one for the cells last.)
            c = np.asarray(value, np.float64)[..., None]
        else:
            c = np.full(self.m.shape, float(value))
        return _Form(c, np.zeros_like(c), np.zeros_like(c))

    def box(self, lo: Any, hi: Any) -> _Form:
        """A known operand somewhere within `[lo, hi]` (per element where it
        is an array), the same all over each interval of `x`: its middle,
        give or take its half-width. Exact where `lo == hi`; NaN where the
        ends differ and one is not finite (as the walk takes a constant
        NaN)."""
        lo, hi = np.broadcast_arrays(
            np.asarray(lo, float)[..., None], np.asarray(hi, float)[..., None]
        )
        exact = lo == hi
        finite = np.isfinite(lo) & np.isfinite(hi)
        with np.errstate(all="ignore"):
            mid = np.where(exact, lo, np.where(finite, lo / 2 + hi / 2, np.nan))
            half = np.where(
                exact | ~finite,
                0.0,
                np.maximum(hi - mid, mid - lo) * (1 + 4 * 2.0**-52),
            )
        return _Form(
            mid,
            np.zeros_like(mid),
            half,
            None,
            np.where(exact | ~finite, mid, lo),
            np.where(exact | ~finite, mid, hi),
        )

    def range(self, a: _Form) -> tuple[np.ndarray, np.ndarray]:
        """The interval `a` takes over each cell, rounded outwards: its
        affine form's range within its interval enclosure."""
        spread = np.abs(a.s) * self.r + a.e
        lo, hi = a.c - spread, a.c + spread
        lo, hi = lo - _ROUND * np.abs(lo), hi + _ROUND * np.abs(hi)
        both_lo, both_hi = np.maximum(lo, a.lo), np.minimum(hi, a.hi)
        # (Both enclose the values; should rounding part them, the hull.)
        apart = both_lo > both_hi
        return (
            np.where(apart, np.minimum(lo, a.lo), both_lo),
            np.where(apart, np.maximum(hi, a.hi), both_hi),
        )

    def rounded(
        self,
        c: Any,
        s: Any,
        e: Any,
        void: Any,
        lo: Any = None,
        hi: Any = None,
        err: Any = 0.0,
        ulps: float = 1.0,
    ) -> _Form:
        """The result of a step: its form (`e` widened by float64 rounding),
        and its error in the dtype, `err` carried from the operands plus
        `ulps` units of rounding of the result."""
        e = e + _ROUND * (np.abs(c) + np.abs(s) * self.r)
        void = np.asarray(void, bool)
        nan = np.full(void.shape, np.nan)
        if lo is None or hi is None:
            lo, hi = np.full(void.shape, -np.inf), np.full(void.shape, np.inf)
        else:
            lo = np.where(np.isnan(lo), -np.inf, lo - _ROUND * np.abs(lo))
            hi = np.where(np.isnan(hi), np.inf, hi + _ROUND * np.abs(hi))
        form = _Form(
            np.where(void, nan, c),
            np.where(void, 0.0, s),
            np.where(void, 0.0, e),
            void,
            np.where(void, nan, lo),
            np.where(void, nan, hi),
        )
        finite = np.isfinite(form.c) & np.isfinite(form.s) & np.isfinite(form.e)
        self.mark(~finite & ~void)
        r_lo, r_hi = self.range(form)
        size = np.maximum(np.abs(r_lo), np.abs(r_hi))
        form.err = np.where(void, 0.0, err + ulps * self.unit * size)
        return form

    def where(self, pick: np.ndarray, a: _Form, b: _Form) -> _Form:
        return _Form(*(np.where(pick, getattr(a, f), getattr(b, f)) for f in _FIELDS))

    def flag(self, mask: np.ndarray, *forms: _Form, unsure: bool = False) -> None:
        """Cells where a step could not enclose its result (not where an
        operand in `forms` is NaN all over); `unsure`: for want of deciding
        a discrete choice."""
        mask = np.asarray(mask, bool)
        for f in forms:
            mask = mask & ~f.void
        self.mark(mask, unsure=unsure)

    def mark(self, mask: Any, *, unsure: bool = False) -> None:
        """The cells where `mask` holds for some element of a value (a
        value's axes come first, the cells' last)."""
        mask = np.asarray(mask, bool)
        if mask.ndim > 1:
            mask = mask.reshape(-1, mask.shape[-1]).any(axis=0)
        self.bad |= mask
        if unsure:
            self.unsure |= mask


_FIELDS = ("c", "s", "e", "void", "lo", "hi", "err")


def _neg(a: _Form) -> _Form:
    return _Form(-a.c, -a.s, a.e, a.void, -a.hi, -a.lo, a.err)


def _size(k: _Cells, a: _Form) -> np.ndarray:
    lo, hi = k.range(a)
    return np.maximum(np.abs(lo), np.abs(hi))


# --- rules -------------------------------------------------------------


def _add(k: _Cells, a: _Form, b: _Form) -> _Form:
    (a_lo, a_hi), (b_lo, b_hi) = k.range(a), k.range(b)
    void = a.void | b.void
    lo, hi, err = a_lo + b_lo, a_hi + b_hi, a.err + b.err
    return k.rounded(a.c + b.c, a.s + b.s, a.e + b.e, void, lo, hi, err)


def _sub(k: _Cells, a: _Form, b: _Form) -> _Form:
    return _add(k, a, _neg(b))


def _mul(k: _Cells, a: _Form, b: _Form) -> _Form:
    r = k.r
    e = (
        np.abs(a.s * b.s) * r * r
        + np.abs(a.c) * b.e
        + np.abs(b.c) * a.e
        + np.abs(a.s) * r * b.e
        + np.abs(b.s) * r * a.e
        + a.e * b.e
    )
    # (A constant 0 times anything is 0, also where the other is not finite.)
    zero = (a.constant() & (a.c == 0)) | (b.constant() & (b.c == 0))
    c = np.where(zero, 0.0, a.c * b.c)
    s = np.where(zero, 0.0, a.c * b.s + b.c * a.s)
    (a_lo, a_hi), (b_lo, b_hi) = k.range(a), k.range(b)
    ends = np.stack([a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi])
    lo = np.where(zero, 0.0, np.min(ends, axis=0))
    hi = np.where(zero, 0.0, np.max(ends, axis=0))
    err = _size(k, b) * a.err + _size(k, a) * b.err + a.err * b.err
    err = np.where(zero, 0.0, err)
    return k.rounded(c, s, np.where(zero, 0.0, e), a.void | b.void, lo, hi, err)


# An enclosure of f' over [lo, hi] (NaN where [lo, hi] leaves f's domain or
# f is not differentiable there).
SlopeRange = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# Where [lo, hi] lies wholly outside a step's domain.
Outside = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _unary(
    k: _Cells,
    a: _Form,
    f: Callable[[np.ndarray], np.ndarray],
    df: SlopeRange,
    outside: Outside | None = None,
    bounds: tuple[float, float] = (-np.inf, np.inf),
) -> _Form:
    """`f(a)`: linearised at `a`'s centre; the error bounded by how far `f'`
    moves over `a`'s range (the mean value theorem)."""
    lo, hi = k.range(a)
    void = a.void | (outside(lo, hi) if outside is not None else False)
    d_lo, d_hi = df(lo, hi)
    d_c, _ = df(a.c, a.c)
    moves = np.maximum(np.abs(d_hi - d_c), np.abs(d_lo - d_c))
    k.flag(~(np.isfinite(d_lo) & np.isfinite(d_hi) & np.isfinite(d_c)) & ~void)
    c = f(a.c)
    s = d_c * a.s
    e = np.abs(d_c) * a.e + moves * (np.abs(a.s) * k.r + a.e)
    const = a.constant()
    # Where `f` is monotone over `a`'s range, its values lie between its
    # values at the ends.
    f_lo, f_hi = f(lo), f(hi)
    rising, falling = d_lo >= 0, d_hi <= 0
    v_lo = np.where(rising, f_lo, np.where(falling, f_hi, -np.inf))
    v_hi = np.where(rising, f_hi, np.where(falling, f_lo, np.inf))
    # (Library functions are within a few units in the last place.)
    err = np.maximum(np.abs(d_lo), np.abs(d_hi)) * a.err
    form = k.rounded(
        c, np.where(const, 0.0, s), np.where(const, 0.0, e), void, v_lo, v_hi, err, 4.0
    )
    # (Rounded outwards, but never past the bounds of `f`'s values: `tanh`
    # of a large value is within [1 - eps, 1], so `1 - tanh**2 >= 0`.)
    form.lo = np.maximum(form.lo, bounds[0])
    form.hi = np.minimum(form.hi, bounds[1])
    return form


def _rising(f: Callable[[np.ndarray], np.ndarray]) -> SlopeRange:
    """The enclosure of a slope `f` that rises with `x`."""
    return lambda lo, hi: (f(lo), f(hi))


def _falling(f: Callable[[np.ndarray], np.ndarray]) -> SlopeRange:
    return lambda lo, hi: (f(hi), f(lo))


def _peaked(f: Callable[[np.ndarray], np.ndarray]) -> SlopeRange:
    """A slope that rises up to `x = 0` and falls after it."""

    def enclose(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b = f(lo), f(hi)
        top = np.where((lo <= 0) & (hi >= 0), f(np.zeros_like(lo)), np.maximum(a, b))
        return np.minimum(a, b), top

    return enclose


def _valley(f: Callable[[np.ndarray], np.ndarray]) -> SlopeRange:
    """A slope that falls down to `x = 0` and rises after it."""

    def enclose(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b = f(lo), f(hi)
        bottom = np.where((lo <= 0) & (hi >= 0), f(np.zeros_like(lo)), np.minimum(a, b))
        return bottom, np.maximum(a, b)

    return enclose


def _on(
    domain: Callable[[np.ndarray, np.ndarray], np.ndarray], slope: SlopeRange
) -> SlopeRange:
    """`slope` where `[lo, hi]` lies within `domain`, else NaN."""

    def enclose(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = domain(lo, hi)
        a, b = slope(np.where(inside, lo, 1.0), np.where(inside, hi, 1.0))
        return np.where(inside, a, np.nan), np.where(inside, b, np.nan)

    return enclose


def _positive(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo > 0


def _nonzero(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo > 0) | (hi < 0)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z))


_SQRT_PI = math.sqrt(math.pi)
_erf = np.vectorize(math.erf, otypes=[float])
_erfc = np.vectorize(math.erfc, otypes=[float])


def _gauss(x: np.ndarray) -> np.ndarray:
    return 2 / _SQRT_PI * np.exp(-x * x)


def _cos_range(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The range of `cos` over `[lo, hi]`: its ends, and +-1 where a multiple
    of pi lies inside (all of [-1, 1] far out, where pi's multiples blur)."""
    a, b = np.cos(lo), np.cos(hi)
    low, high = np.minimum(a, b), np.maximum(a, b)
    k_lo = np.ceil(lo / math.pi)
    # Multiples of pi within [lo, hi]: even ones are maxima, odd ones minima.
    has = k_lo * math.pi <= hi
    two = k_lo + 1 <= hi / math.pi
    even = np.mod(k_lo, 2) == 0
    high = np.where(has & (even | two), 1.0, high)
    low = np.where(has & (~even | two), -1.0, low)
    far = (np.abs(lo) > 2.0**40) | (np.abs(hi) > 2.0**40) | (hi - lo >= 2 * math.pi)
    return np.where(far, -1.0, low), np.where(far, 1.0, high)


def _minus_sin_range(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The range of `-sin` over `[lo, hi]` (`sin(x) = cos(x - pi / 2)`)."""
    s_lo, s_hi = _cos_range(lo - math.pi / 2, hi - math.pi / 2)
    return -s_hi, -s_lo


def _power_range(
    lo: np.ndarray, hi: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The range of `x**n` over `[lo, hi]` (integer `n`; for `n < 0`, where
    `[lo, hi]` excludes 0: NaN otherwise)."""
    with np.errstate(all="ignore"):
        a, b = lo**n, hi**n
    if n == 0:
        one = np.ones_like(lo)
        return one, one
    if n > 0 and n % 2 == 0:
        across = (lo < 0) & (hi > 0)
        return np.where(across, 0.0, np.minimum(a, b)), np.maximum(a, b)
    if n > 0:
        return a, b
    ok = _nonzero(lo, hi)
    low, high = np.minimum(a, b), np.maximum(a, b)
    return np.where(ok, low, np.nan), np.where(ok, high, np.nan)


def _integer_pow(n: int) -> tuple[Callable[[np.ndarray], np.ndarray], SlopeRange]:
    def f(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return x**n

    def df(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if n == 0:
            return np.zeros_like(lo), np.zeros_like(lo)
        p_lo, p_hi = _power_range(lo, hi, n - 1)
        if n < 0:
            ok = _nonzero(lo, hi)
            p_lo, p_hi = np.where(ok, p_lo, np.nan), np.where(ok, p_hi, np.nan)
        return (n * p_lo, n * p_hi) if n > 0 else (n * p_hi, n * p_lo)

    return f, df


def _cbrt_slope(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    near = np.minimum(np.abs(lo), np.abs(hi))
    far = np.maximum(np.abs(lo), np.abs(hi))
    return far ** (-2 / 3) / 3, near ** (-2 / 3) / 3


# The bounds of each function's values.
_BOUNDS: dict[str, tuple[float, float]] = {
    "exp": (0.0, np.inf),
    "exp2": (0.0, np.inf),
    "expm1": (-1.0, np.inf),
    "sqrt": (0.0, np.inf),
    "rsqrt": (0.0, np.inf),
    "tanh": (-1.0, 1.0),
    "logistic": (0.0, 1.0),
    "atan": (-math.pi / 2, math.pi / 2),
    "cosh": (1.0, np.inf),
    "erf": (-1.0, 1.0),
    "erfc": (0.0, 2.0),
    "one_minus_square": (-np.inf, 1.0),
    "sin": (-1.0, 1.0),
    "cos": (-1.0, 1.0),
}

_OUTSIDE: dict[str, Outside] = {
    "log": lambda lo, hi: hi <= 0,
    "log1p": lambda lo, hi: hi <= -1,
    "sqrt": lambda lo, hi: hi < 0,
    "rsqrt": lambda lo, hi: hi <= 0,
}

_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], SlopeRange]] = {
    "exp": (np.exp, _rising(np.exp)),
    "exp2": (np.exp2, _rising(lambda x: math.log(2) * np.exp2(x))),
    "expm1": (np.expm1, _rising(np.exp)),
    "log": (np.log, _on(_positive, _falling(lambda x: 1 / x))),
    "log1p": (np.log1p, _on(lambda lo, hi: lo > -1, _falling(lambda x: 1 / (1 + x)))),
    "sqrt": (np.sqrt, _on(_positive, _falling(lambda x: 0.5 / np.sqrt(x)))),
    "rsqrt": (
        lambda x: 1 / np.sqrt(x),
        _on(_positive, _rising(lambda x: -0.5 * x**-1.5)),
    ),
    "cbrt": (np.cbrt, _on(_nonzero, _cbrt_slope)),
    "tanh": (np.tanh, _peaked(lambda x: 1 / np.cosh(x) ** 2)),
    "logistic": (_sigmoid, _peaked(lambda x: _sigmoid(x) * _sigmoid(-x))),
    "atan": (np.arctan, _peaked(lambda x: 1 / (1 + x * x))),
    "asinh": (np.arcsinh, _peaked(lambda x: 1 / np.sqrt(1 + x * x))),
    "sinh": (np.sinh, _valley(np.cosh)),
    "cosh": (np.cosh, _rising(np.sinh)),
    "erf": (_erf, _peaked(_gauss)),
    "erfc": (_erfc, _valley(lambda x: -_gauss(x))),
    # (JAX >= 0.12 writes `tanh`'s slope as `one_minus_square(tanh(x))`.)
    "one_minus_square": (lambda x: 1 - x * x, _falling(lambda x: -2 * x)),
    "sin": (np.sin, _cos_range),
    "cos": (np.cos, lambda lo, hi: _minus_sin_range(lo, hi)),
}


def _recip(k: _Cells, a: _Form) -> _Form:
    def slope(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sq_lo, sq_hi = _power_range(lo, hi, 2)
        ok = _nonzero(lo, hi)
        return np.where(ok, -1 / sq_lo, np.nan), np.where(ok, -1 / sq_hi, np.nan)

    return _unary(k, a, lambda x: 1 / x, slope)


def _max(k: _Cells, a: _Form, b: _Form) -> _Form:
    a_lo, a_hi = k.range(a)
    b_lo, b_hi = k.range(b)
    first = a_lo >= b_hi
    k.flag(~first & ~(b_lo >= a_hi), a, b, unsure=True)
    return _nan_of(k.where(first, a, b), a, b)


def _min(k: _Cells, a: _Form, b: _Form) -> _Form:
    a_lo, a_hi = k.range(a)
    b_lo, b_hi = k.range(b)
    first = a_hi <= b_lo
    k.flag(~first & ~(b_hi <= a_lo), a, b, unsure=True)
    return _nan_of(k.where(first, a, b), a, b)


def _nan_of(out: _Form, *forms: _Form) -> _Form:
    """`out`, NaN all over where an operand is (`max` and `min` pass NaN)."""
    void = functools.reduce(np.logical_or, [f.void for f in forms])
    return _Form(
        np.where(void, np.nan, out.c),
        np.where(void, 0.0, out.s),
        np.where(void, 0.0, out.e),
        void,
        np.where(void, np.nan, out.lo),
        np.where(void, np.nan, out.hi),
        out.err,
    )


def _decided(k: _Cells, true: np.ndarray, false: np.ndarray, nan: Any = False) -> _Form:
    """A condition: 1 where `true`, 0 where `false`, neither: not decided
    (unless an operand is NaN all over, `nan`)."""
    k.flag(~true & ~false & ~np.asarray(nan, bool), unsure=True)
    return _Form(true.astype(float), np.zeros(true.shape), np.zeros(true.shape))


def _compare(k: _Cells, name: str, a: _Form, b: _Form, same: bool) -> _Form:
    nan = a.void | b.void  # (a comparison with NaN is false, `ne` true)
    if same:  # (`x != x`: a NaN test; where `x` is enclosed it is a number)
        value = np.where(nan, name == "ne", name in ("eq", "le", "ge"))
        return _Form(value.astype(float), np.zeros(nan.shape), np.zeros(nan.shape))
    out = _compare_numbers(k, name, a, b)
    value = np.where(nan, float(name == "ne"), out.c)
    return _Form(value, np.zeros(nan.shape), np.zeros(nan.shape))


def _compare_numbers(k: _Cells, name: str, a: _Form, b: _Form) -> _Form:
    nan = a.void | b.void
    if name in ("gt", "ge"):
        a, b = b, a
        name = "lt" if name == "gt" else "le"
    a_lo, a_hi = k.range(a)
    b_lo, b_hi = k.range(b)
    both = a.constant() & b.constant()
    if name == "lt":
        return _decided(k, a_hi < b_lo, a_lo >= b_hi, nan)
    if name == "le":
        return _decided(k, a_hi <= b_lo, a_lo > b_hi, nan)
    apart = (a_hi < b_lo) | (b_hi < a_lo)
    # (Also the same exact affine function of `x`: `max(x, 0)`, where it is
    # `x`, against `x`, as the derivative of `max` compares them.)
    same = (a.e == 0) & (b.e == 0) & (a.c == b.c) & (a.s == b.s)
    equal = (both & (a.c == b.c)) | same
    if name == "eq":
        return _decided(k, equal, apart | (both & ~equal), nan)
    return _decided(k, apart | (both & ~equal), equal, nan)


def _jumps(k: _Cells, a: _Form, f: Callable[[np.ndarray], np.ndarray]) -> _Form:
    """A step function of `a`: a constant where it is the same at both ends
    of `a`'s range (and `f` moves only upwards), else not decided."""
    lo, hi = k.range(a)
    f_lo, f_hi = f(lo), f(hi)
    k.flag(f_lo != f_hi, a, unsure=True)
    value = np.where(a.void, np.nan, np.where(np.isfinite(f_lo), f_lo, 0.0))
    return _Form(value, np.zeros_like(lo), np.zeros_like(lo), a.void)


def _round_half(x: np.ndarray) -> np.ndarray:
    # Constant only between two half-integers: NaN at one (either rounding).
    k = np.floor(x + 0.5)
    return np.where(x + 0.5 == k, np.nan, k)


# --- arrays ----------------------------------------------------------------
# A value that is an array has its axes first and the cells' last (1 where
# it is the same over every cell): elementwise steps broadcast as they are.


def _fields(a: _Form, shape: Sequence[int]) -> list[np.ndarray]:
    """`a`'s fields, each of shape `(*shape, cells or 1)`."""
    out = []
    for f in _FIELDS:
        v = np.asarray(getattr(a, f))
        if v.ndim < len(shape) + 1:
            v = v.reshape((1,) * (len(shape) + 1 - v.ndim) + v.shape)
        out.append(np.broadcast_to(v, (*shape, v.shape[-1])))
    return out


def _each(a: _Form, shape: Sequence[int], move: Callable[[np.ndarray], Any]) -> _Form:
    return _Form(*(move(v) for v in _fields(a, shape)))


def _moved(eqn: Any, name: str, ins: list[_Form]) -> list[_Form]:
    """A step that moves elements: the same move of every field (exact)."""
    params = compat.params_of(eqn)
    shape = tuple(eqn.invars[0].aval.shape)
    out_shape = tuple(eqn.outvars[0].aval.shape)
    a = ins[0]
    if name == "broadcast_in_dim":
        dims = [1] * len(out_shape)
        for i, d in enumerate(params["broadcast_dimensions"]):
            dims[d] = shape[i]

        def move(v: np.ndarray) -> Any:
            return np.broadcast_to(
                v.reshape(*dims, v.shape[-1]), (*out_shape, v.shape[-1])
            )

        return [_each(a, shape, move)]
    if name in ("reshape", "squeeze"):
        return [_each(a, shape, lambda v: v.reshape(*out_shape, v.shape[-1]))]
    if name == "transpose":
        order = (*params["permutation"], len(shape))
        return [_each(a, shape, lambda v: np.transpose(v, order))]
    if name == "slice":
        start, limit = params["start_indices"], params["limit_indices"]
        strides = params.get("strides") or (1,) * len(shape)
        at = tuple(
            slice(int(i), int(j), int(st))
            for i, j, st in zip(start, limit, strides, strict=True)
        )
        return [_each(a, shape, lambda v: v[(*at, slice(None))])]
    if name == "concatenate":
        axis = int(params["dimension"])
        parts = [
            _fields(f, tuple(v.aval.shape))
            for f, v in zip(ins, eqn.invars, strict=True)
        ]
        fields = []
        for i in range(len(_FIELDS)):
            last = max(p[i].shape[-1] for p in parts)
            fields.append(
                np.concatenate(
                    [np.broadcast_to(p[i], (*p[i].shape[:-1], last)) for p in parts],
                    axis=axis,
                )
            )
        return [_Form(*fields)]
    # split
    axis = int(params["axis"])
    cuts = np.cumsum([int(n) for n in params["sizes"]])[:-1]
    pieces = [np.split(v, cuts, axis=axis) for v in _fields(a, shape)]
    return [_Form(*(p[i] for p in pieces)) for i in range(len(eqn.outvars))]


def _sum(k: _Cells, a: _Form, axes: tuple[int, ...], shape: tuple[int, ...]) -> _Form:
    """`a` (a value of `shape`) summed over some of its axes: the forms add
    exactly; float64 and the dtype each round once per term."""
    if not axes:
        return a
    c, s_, e, void, lo, hi, err = _fields(a, shape)
    count = int(np.prod([c.shape[i] for i in axes]))
    lo_, hi_ = k.range(a)
    size = np.sum(np.maximum(np.abs(lo_), np.abs(hi_)), axis=axes)
    spread = np.sum(np.abs(c) + np.abs(s_) * k.r, axis=axes)
    return k.rounded(
        np.sum(c, axis=axes),
        np.sum(s_, axis=axes),
        np.sum(e, axis=axes) + _ROUND * count * spread,
        np.any(void, axis=axes),
        np.sum(lo_, axis=axes),
        np.sum(hi_, axis=axes),
        np.sum(err, axis=axes) + count * k.unit * size,
    )


def _dot(k: _Cells, eqn: Any, a: _Form, b: _Form) -> _Form:
    """`dot_general` without batch axes: a product broadcast over the free
    axes of both, summed over the contracted ones."""
    (a_in, b_in), (a_batch, b_batch) = compat.params_of(eqn)["dimension_numbers"]
    if len(a_batch) or len(b_batch):
        raise _Unsupported("dot_general with batch axes")
    a_shape, b_shape = (tuple(v.aval.shape) for v in eqn.invars)
    a_free = [i for i in range(len(a_shape)) if i not in a_in]
    b_free = [i for i in range(len(b_shape)) if i not in b_in]
    n_free = len(a_free) + len(b_free)

    def arrange(
        f: _Form, shape: Any, free: list[int], inner: Any, front: bool
    ) -> _Form:
        order = (*free, *inner, len(shape))
        ones = (1,) * (len(b_free) if front else len(a_free))

        def move(v: np.ndarray) -> Any:
            v = np.transpose(v, order)
            lead, rest = v.shape[: len(free)], v.shape[len(free) :]
            return (
                v.reshape(*lead, *ones, *rest) if front else v.reshape(*ones, *v.shape)
            )

        return _each(f, shape, move)

    product = _mul(
        k,
        arrange(a, a_shape, a_free, a_in, True),
        arrange(b, b_shape, b_free, b_in, False),
    )
    axes = tuple(range(n_free, n_free + len(a_in)))
    shape = tuple(
        [a_shape[i] for i in a_free]
        + [b_shape[j] for j in b_free]
        + [a_shape[i] for i in a_in]
    )
    return _sum(k, product, axes, shape)


# --- the walk ------------------------------------------------------------

_CALLS = frozenset(
    {
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "checkpoint",
        "remat2",
    }
)
_SAME = frozenset({"copy", "copy_p", "reduce_precision", "stop_gradient"})
# Steps that move a value's elements (`_moved`).
_MOVES = frozenset(
    {"broadcast_in_dim", "reshape", "squeeze", "transpose", "slice", "concatenate"}
    | {"split"}
)


def _body(eqn: Any) -> tuple[Any, Sequence[Any]]:
    """The open Jaxpr a call runs, and its consts."""
    params = compat.params_of(eqn)
    if eqn.primitive is compat.jit_p:
        closed = compat.jit_params(params).jaxpr
        return compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
    if "call_jaxpr" in params:
        closed = compat.call_jaxpr(params)
        return compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
    bodies = compat.sub_jaxprs(eqn)
    if len(bodies) != 1 or bodies[0].constvars:
        raise _Unsupported(compat.construct_name(eqn))
    return bodies[0], ()


def _real(aval: Any) -> None:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None or jnp.issubdtype(dtype, jnp.complexfloating):
        raise _Unsupported("a value that is not a real array")


def _walk(
    k: _Cells, jaxpr: Any, consts: Sequence[Any], args: Sequence[_Form]
) -> list[_Form]:
    env: dict[Any, _Form] = {}

    def read(v: Any) -> _Form:
        if isinstance(v, compat.Literal):
            return k.const(np.asarray(v.val, np.float64))
        return env[v]

    for v, c in zip(jaxpr.constvars, consts, strict=True):
        env[v] = k.const(np.asarray(c, np.float64))
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            _real(v.aval)
        ins = [read(v) for v in eqn.invars]
        outs = _step(k, eqn, ins)
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _step(k: _Cells, eqn: Any, ins: list[_Form]) -> list[_Form]:
    name = compat.construct_name(eqn)
    if name in _CALLS:
        if compat.call_name(eqn) == "exp_neg_sq":
            # (JAX >= 0.12 writes `erf`'s slope `exp(-x**2)` with a
            # `custom_jvp` whose body splits floats by their bits.)
            (a,) = ins
            square = _unary(k, a, *_integer_pow(2), None, (0.0, np.inf))
            return [_unary(k, _neg(square), *_UNARY["exp"], None, _BOUNDS["exp"])]
        body, consts = _body(eqn)
        return _walk(k, body, consts, ins)
    if name == "optimization_barrier":
        return ins
    (out,) = eqn.outvars
    dtype = out.aval.dtype
    if name in _SAME:
        return [ins[0]]
    if name in _MOVES:
        return _moved(eqn, name, ins)
    if name == "reduce_sum":
        axes = tuple(int(a) for a in compat.params_of(eqn)["axes"])
        return [_sum(k, ins[0], axes, tuple(eqn.invars[0].aval.shape))]
    if name == "dot_general":
        return [_dot(k, eqn, *ins)]
    if name in _UNARY:
        f, df = _UNARY[name]
        bounds = _BOUNDS.get(name, (-np.inf, np.inf))
        return [_unary(k, ins[0], f, df, _OUTSIDE.get(name), bounds)]
    if name in ("add", "add_any"):
        return [_add(k, *ins)]
    if name == "sub":
        return [_sub(k, *ins)]
    if name == "neg":
        a = ins[0]
        return [_neg(a)]
    if name == "mul":
        return [_mul(k, *ins)]
    if name == "div":
        if not jnp.issubdtype(dtype, jnp.floating):
            raise _Unsupported("integer division")
        return [_mul(k, ins[0], _recip(k, ins[1]))]
    if name == "integer_pow":
        n = int(compat.params_of(eqn)["y"])
        f, df = _integer_pow(n)
        even = n % 2 == 0
        return [_unary(k, ins[0], f, df, None, (0.0 if even else -np.inf, np.inf))]
    if name == "square":
        f, df = _integer_pow(2)
        return [_unary(k, ins[0], f, df, None, (0.0, np.inf))]
    if name == "pow":
        # a ** b = exp(b log a), where a > 0 (elsewhere not decided).
        # (Not NaN all over where `a < 0`: `pow(-2.0, 2.0)` is 4.)
        log_a = _unary(k, ins[0], *_UNARY["log"])
        return [_unary(k, _mul(k, ins[1], log_a), *_UNARY["exp"], None, _BOUNDS["exp"])]
    if name == "abs":
        a = ins[0]
        lo, hi = k.range(a)
        k.flag(~(lo >= 0) & ~(hi <= 0), a, unsure=True)
        return [k.where(lo >= 0, a, _neg(a))]
    if name == "sign":
        return [_jumps(k, ins[0], np.sign)]
    if name == "floor":
        return [_jumps(k, ins[0], np.floor)]
    if name == "ceil":
        return [_jumps(k, ins[0], np.ceil)]
    if name == "round":
        return [_jumps(k, ins[0], _round_half)]
    if name == "max":
        return [_max(k, *ins)]
    if name == "min":
        return [_min(k, *ins)]
    if name == "clamp":
        low, x, high = ins
        return [_min(k, _max(k, x, low), high)]
    if name in ("lt", "le", "gt", "ge", "eq", "ne"):
        same = eqn.invars[0] is eqn.invars[1] and not isinstance(
            eqn.invars[0], compat.Literal
        )
        return [_compare(k, name, ins[0], ins[1], same)]
    if name == "select_n":
        which, *cases = ins
        k.flag(~which.constant(), unsure=True)
        index = np.clip(np.where(np.isfinite(which.c), which.c, 0), 0, len(cases) - 1)
        index = index.astype(int)
        return [
            _Form(*(np.choose(index, [getattr(c, f) for c in cases]) for f in _FIELDS))
        ]
    if name in ("and", "or", "xor", "not"):
        if any(not a.constant().all() for a in ins) or dtype != jnp.bool_:
            raise _Unsupported(name)
        bits = [a.c != 0 for a in ins]
        value = {
            "and": lambda: bits[0] & bits[1],
            "or": lambda: bits[0] | bits[1],
            "xor": lambda: bits[0] ^ bits[1],
            "not": lambda: ~bits[0],
        }[name]()
        return [
            _Form(value.astype(float), np.zeros(value.shape), np.zeros(value.shape))
        ]
    if name == "is_finite":
        lo, hi = k.range(ins[0])
        finite = np.isfinite(lo) & np.isfinite(hi) & ~ins[0].void
        return [_decided(k, finite, ins[0].void)]
    if name == "convert_element_type":
        a = ins[0]
        if jnp.issubdtype(dtype, jnp.floating):
            return [a]
        if dtype == jnp.bool_:
            lo, hi = k.range(a)
            zero = a.constant() & (a.c == 0)
            return [_decided(k, (lo > 0) | (hi < 0) | a.void, zero)]
        return [_jumps(k, a, np.trunc)]
    raise _Unsupported(name)


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
        except (_Unsupported, ValueError, TypeError, IndexError, KeyError):
            # (A step without a rule, or with parameters its rule does not
            # take: left to the samplers.)
            return None
        return slope

    def enclose(self, lo: np.ndarray, hi: np.ndarray, box: Box = ()) -> Enclosed:
        """Per interval `[lo, hi]`: the map's value range and its slope's,
        for every value of the known operands within `box`."""
        if len(box) != self.n_known:
            raise ValueError(f"a box of {len(box)} operands for {self.n_known}")
        k = _Cells(np.asarray(lo, float), np.asarray(hi, float), self.unit)
        x = _Form(
            k.m,
            np.ones_like(k.m),
            np.zeros_like(k.m),
            None,
            np.asarray(lo, float),
            np.asarray(hi, float),
        )
        with np.errstate(all="ignore"):
            known = [k.box(a, b) for a, b in box]
            value, slope = _walk(k, self.jaxpr, self.consts, [x, *known])
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
    # Not enclosed for want of deciding a discrete choice (`_Cells.unsure`):
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
    return np.maximum(2 * got.err, 64 * _ROUND * size)


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
