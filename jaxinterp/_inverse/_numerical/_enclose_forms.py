"""Affine enclosures of a map over intervals of its input (see `_enclose`).

Over an interval of `x` with centre `m` and half-width `r`, a value `v(x)`
lies within `c + s (x - m) +- e` (a first-order affine form, `Form`). Sums
and differences of forms are exact in `x`, so a value computed twice along
two paths cancels (`1 + |x| - x sign(x)` is 1); a nonlinear step `f(u)` is
linearised at the centre, its error bounded by how far `f'` moves over the
range of `u` (an interval enclosure of `f'`). Every step adds a few units
of float64 rounding. Forms are intersected with plain interval arithmetic
(`exp` of anything is positive), and carry a running error bound of the
map as computed in its dtype. `_enclose_rules` holds their rules per
primitive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import _jax_compat as compat

# Rounding allowed per step, relative to the magnitudes involved (NumPy's
# float64 functions are within a few units in the last place).
ROUND = 16 * 2.0**-52


class Unsupported(Exception):
    """A step this module has no rule for."""


@dataclasses.dataclass
class Form:
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


class Cells:
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

    def const(self, value: Any) -> Form:
        if np.ndim(value):
            # (An array: its axes first, one for the cells last.)
            c = np.asarray(value, np.float64)[..., None]
        else:
            c = np.full(self.m.shape, float(value))
        return Form(c, np.zeros_like(c), np.zeros_like(c))

    def box(self, lo: Any, hi: Any) -> Form:
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
        return Form(
            mid,
            np.zeros_like(mid),
            half,
            None,
            np.where(exact | ~finite, mid, lo),
            np.where(exact | ~finite, mid, hi),
        )

    def range(self, a: Form) -> tuple[np.ndarray, np.ndarray]:
        """The interval `a` takes over each cell, rounded outwards: its
        affine form's range within its interval enclosure."""
        spread = np.abs(a.s) * self.r + a.e
        lo, hi = a.c - spread, a.c + spread
        lo, hi = lo - ROUND * np.abs(lo), hi + ROUND * np.abs(hi)
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
    ) -> Form:
        """The result of a step: its form (`e` widened by float64 rounding),
        and its error in the dtype, `err` carried from the operands plus
        `ulps` units of rounding of the result."""
        e = e + ROUND * (np.abs(c) + np.abs(s) * self.r)
        void = np.asarray(void, bool)
        nan = np.full(void.shape, np.nan)
        if lo is None or hi is None:
            lo, hi = np.full(void.shape, -np.inf), np.full(void.shape, np.inf)
        else:
            lo = np.where(np.isnan(lo), -np.inf, lo - ROUND * np.abs(lo))
            hi = np.where(np.isnan(hi), np.inf, hi + ROUND * np.abs(hi))
        form = Form(
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

    def where(self, pick: np.ndarray, a: Form, b: Form) -> Form:
        return Form(*(np.where(pick, getattr(a, f), getattr(b, f)) for f in FIELDS))

    def flag(self, mask: np.ndarray, *forms: Form, unsure: bool = False) -> None:
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


FIELDS = ("c", "s", "e", "void", "lo", "hi", "err")


def neg(a: Form) -> Form:
    return Form(-a.c, -a.s, a.e, a.void, -a.hi, -a.lo, a.err)


def magnitude(k: Cells, a: Form) -> np.ndarray:
    lo, hi = k.range(a)
    return np.maximum(np.abs(lo), np.abs(hi))


def add(k: Cells, a: Form, b: Form) -> Form:
    (a_lo, a_hi), (b_lo, b_hi) = k.range(a), k.range(b)
    void = a.void | b.void
    lo, hi, err = a_lo + b_lo, a_hi + b_hi, a.err + b.err
    return k.rounded(a.c + b.c, a.s + b.s, a.e + b.e, void, lo, hi, err)


def sub(k: Cells, a: Form, b: Form) -> Form:
    return add(k, a, neg(b))


def mul(k: Cells, a: Form, b: Form) -> Form:
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
    err = magnitude(k, b) * a.err + magnitude(k, a) * b.err + a.err * b.err
    err = np.where(zero, 0.0, err)
    return k.rounded(c, s, np.where(zero, 0.0, e), a.void | b.void, lo, hi, err)


# --- arrays ----------------------------------------------------------------
# A value that is an array has its axes first and the cells' last (1 where
# it is the same over every cell): elementwise steps broadcast as they are.


def fields_of(a: Form, shape: Sequence[int]) -> list[np.ndarray]:
    """`a`'s fields, each of shape `(*shape, cells or 1)`."""
    out = []
    for f in FIELDS:
        v = np.asarray(getattr(a, f))
        if v.ndim < len(shape) + 1:
            v = v.reshape((1,) * (len(shape) + 1 - v.ndim) + v.shape)
        out.append(np.broadcast_to(v, (*shape, v.shape[-1])))
    return out


def each_field(
    a: Form, shape: Sequence[int], move: Callable[[np.ndarray], Any]
) -> Form:
    return Form(*(move(v) for v in fields_of(a, shape)))


def _shapes(eqn: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(eqn.invars[0].aval.shape), tuple(eqn.outvars[0].aval.shape)


def _broadcast_in_dim(eqn: Any, ins: list[Form]) -> list[Form]:
    shape, out_shape = _shapes(eqn)
    dims = [1] * len(out_shape)
    for i, d in enumerate(compat.params_of(eqn)["broadcast_dimensions"]):
        dims[d] = shape[i]

    def move(v: np.ndarray) -> Any:
        return np.broadcast_to(v.reshape(*dims, v.shape[-1]), (*out_shape, v.shape[-1]))

    return [each_field(ins[0], shape, move)]


def _reshape(eqn: Any, ins: list[Form]) -> list[Form]:
    shape, out_shape = _shapes(eqn)
    return [each_field(ins[0], shape, lambda v: v.reshape(*out_shape, v.shape[-1]))]


def _transpose(eqn: Any, ins: list[Form]) -> list[Form]:
    shape, _ = _shapes(eqn)
    order = (*compat.params_of(eqn)["permutation"], len(shape))
    return [each_field(ins[0], shape, lambda v: np.transpose(v, order))]


def _slice(eqn: Any, ins: list[Form]) -> list[Form]:
    shape, _ = _shapes(eqn)
    params = compat.params_of(eqn)
    start, limit = params["start_indices"], params["limit_indices"]
    strides = params.get("strides") or (1,) * len(shape)
    at = tuple(
        slice(int(i), int(j), int(st))
        for i, j, st in zip(start, limit, strides, strict=True)
    )
    return [each_field(ins[0], shape, lambda v: v[(*at, slice(None))])]


def _concatenate(eqn: Any, ins: list[Form]) -> list[Form]:
    axis = int(compat.params_of(eqn)["dimension"])
    parts = [
        fields_of(f, tuple(v.aval.shape)) for f, v in zip(ins, eqn.invars, strict=True)
    ]
    joined = []
    for i in range(len(FIELDS)):
        last = max(p[i].shape[-1] for p in parts)
        wide = [np.broadcast_to(p[i], (*p[i].shape[:-1], last)) for p in parts]
        joined.append(np.concatenate(wide, axis=axis))
    return [Form(*joined)]


def _split(eqn: Any, ins: list[Form]) -> list[Form]:
    shape, _ = _shapes(eqn)
    params = compat.params_of(eqn)
    axis = int(params["axis"])
    cuts = np.cumsum([int(n) for n in params["sizes"]])[:-1]
    pieces = [np.split(v, cuts, axis=axis) for v in fields_of(ins[0], shape)]
    return [Form(*(p[i] for p in pieces)) for i in range(len(eqn.outvars))]


# Steps that move elements: the same move of every field (exact), by name.
MOVES: dict[str, Callable[[Any, list[Form]], list[Form]]] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "concatenate": _concatenate,
    "split": _split,
}


def sum_over(k: Cells, a: Form, axes: tuple[int, ...], shape: tuple[int, ...]) -> Form:
    """`a` (a value of `shape`) summed over some of its axes: the forms add
    exactly; float64 and the dtype each round once per term."""
    if not axes:
        return a
    c, s_, e, void, lo, hi, err = fields_of(a, shape)
    count = int(np.prod([c.shape[i] for i in axes]))
    lo_, hi_ = k.range(a)
    size = np.sum(np.maximum(np.abs(lo_), np.abs(hi_)), axis=axes)
    spread = np.sum(np.abs(c) + np.abs(s_) * k.r, axis=axes)
    return k.rounded(
        np.sum(c, axis=axes),
        np.sum(s_, axis=axes),
        np.sum(e, axis=axes) + ROUND * count * spread,
        np.any(void, axis=axes),
        np.sum(lo_, axis=axes),
        np.sum(hi_, axis=axes),
        np.sum(err, axis=axes) + count * k.unit * size,
    )


def dot(k: Cells, eqn: Any, a: Form, b: Form) -> Form:
    """`dot_general` without batch axes: a product broadcast over the free
    axes of both, summed over the contracted ones."""
    (a_in, b_in), (a_batch, b_batch) = compat.params_of(eqn)["dimension_numbers"]
    if len(a_batch) or len(b_batch):
        raise Unsupported("dot_general with batch axes")
    a_shape, b_shape = (tuple(v.aval.shape) for v in eqn.invars)
    a_free = [i for i in range(len(a_shape)) if i not in a_in]
    b_free = [i for i in range(len(b_shape)) if i not in b_in]
    n_free = len(a_free) + len(b_free)

    def arrange(f: Form, shape: Any, free: list[int], inner: Any, front: bool) -> Form:
        order = (*free, *inner, len(shape))
        ones = (1,) * (len(b_free) if front else len(a_free))

        def move(v: np.ndarray) -> Any:
            v = np.transpose(v, order)
            lead, rest = v.shape[: len(free)], v.shape[len(free) :]
            return (
                v.reshape(*lead, *ones, *rest) if front else v.reshape(*ones, *v.shape)
            )

        return each_field(f, shape, move)

    product = mul(
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
    return sum_over(k, product, axes, shape)
