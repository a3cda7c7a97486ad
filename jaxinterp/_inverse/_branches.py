"""Principal branches: which inverse rules choose one preimage among several,
and which values a later backward step can accept from such a choice.

A rule for a map that is not injective (`cosh`, `square`, even `integer_pow`,
`sin`, ...) returns one preimage, its *principal branch* (`acosh(y) >= 0`).
That is a valid answer only while nothing else constrains the value, so the
engine (see `_engine.py`):

- prefers exact solutions: an equation whose rule would choose a branch waits
  until no exact step can make progress;
- marks every value that depends on a branch choice as *tainted*, with the
  interval the value is known to lie in (`PRINCIPAL` below gives it right after
  the choice; value-moving steps keep it; any other step widens it to the whole
  real line);
- refuses when a tainted value meets a second constraint (an output it did
  not need, computed forwards again), because the chosen branch may contradict
  it, and when a tainted value is solved backwards through a map whose image
  (`IMAGE` below) may not contain it: the branch could lie outside what the
  earlier part of the program can produce (`cosh(1 - x**2)`: `acosh` gives a
  non-negative `1 - x**2`, which `square`'s inverse cannot always undo).

Intervals are `(lo, hi)` pairs; containment ignores whether an end is open:
a principal branch reaches the end of its interval only where both branches
meet (`acosh(1) = 0 = -0`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from . import _traits as tr

Interval = tuple[float, float]

INF = math.inf
REALS: Interval = (-INF, INF)
NONNEG: Interval = (0.0, INF)
_HALF_PI = math.pi / 2


def contains(outer: Interval, inner: Interval) -> bool:
    """Whether `inner` lies in `outer` (ends compared as closed)."""
    return outer[0] <= inner[0] and inner[1] <= outer[1]


# A value rounded by a narrowing conversion (`float32` to `bfloat16`,
# `reduce_precision`): one of many preimages, like a branch, but within
# rounding of a valid value, so it is not checked against images (it may
# meet no second constraint either). A distinct object: compare with `is`.
ROUNDED: Interval = (-INF, INF)


class Saturated(tuple):
    """The interval a clamp's choice lies in, `(lo, hi)`, where each bound is
    one known value: an element equal to `lo` (with `below`) is the clamp's
    choice for every preimage at or under `lo`, one equal to `hi` (with
    `above`) for every preimage at or over `hi` (`maximum(x, 0.3)` gives
    `Saturated(0.3, 0.3, below=True)`). A later step that checks the value
    against a known one accepts any of those preimages (`admits`). Steps
    that only move values keep it; any other combination of intervals
    (`union`) is a plain interval."""

    below: bool
    above: bool

    def __new__(cls, lo: float, hi: float, *, below: bool, above: bool) -> Saturated:
        interval = super().__new__(cls, (lo, hi))
        interval.below, interval.above = below, above
        return interval


def admits(branch: Interval | None, y: Any, known: Any) -> Any:
    """Where `known` is as valid a preimage as `y`, a value a clamp chose
    (`branch` its `Saturated` interval): `y` at a bound and `known` beyond
    it. `None` for any other branch: only `y` itself is."""
    if not isinstance(branch, Saturated):
        return None
    lo, hi = branch
    ok = jnp.zeros(jnp.broadcast_shapes(jnp.shape(y), jnp.shape(known)), bool)
    if branch.below:
        ok = ok | ((y == lo) & (known <= lo))
    if branch.above:
        ok = ok | ((y == hi) & (known >= hi))
    return ok


def plain(interval: Interval | None) -> Interval | None:
    """`interval` without what `Saturated` adds to it."""
    if isinstance(interval, Saturated):
        return (interval[0], interval[1])
    return interval


def union(a: Interval | None, b: Interval | None) -> Interval | None:
    """The smallest interval holding both; `ROUNDED` only if both are. Two
    `Saturated` intervals of the same bounds (the halves of a clamped value,
    put together again) stay one, saturated where both are."""
    if a is None or (a is ROUNDED and b is not None):
        return b
    if b is None or b is ROUNDED:
        return a
    if isinstance(a, Saturated) and isinstance(b, Saturated) and a == b:
        below, above = a.below and b.below, a.above and b.above
        if below or above:
            return Saturated(a[0], a[1], below=below, above=above)
    return (min(a[0], b[0]), max(a[1], b[1]))


def _narrowing(src: Any, dst: Any) -> bool:
    """Whether converting floating `src` to floating `dst` rounds or clips."""
    if not (jnp.issubdtype(src, jnp.inexact) and jnp.issubdtype(dst, jnp.inexact)):
        return False
    a, b = jnp.finfo(src), jnp.finfo(dst)
    return bool(b.nmant < a.nmant or b.maxexp < a.maxexp or b.minexp > a.minexp)


def _concrete(value: Any) -> np.ndarray | None:
    if value is None or compat.is_tracer(value):
        return None
    return np.asarray(value)


def _odd_integers(b: np.ndarray) -> bool:
    b = b.astype(np.float64)
    return bool(np.all((np.round(b) == b) & (np.abs(np.remainder(b, 2)) == 1)))


def _even_integers_anywhere(b: np.ndarray) -> bool:
    b = b.astype(np.float64)
    return bool(np.any((np.round(b) == b) & (np.remainder(b, 2) == 0)))


def _pow_principal(params: dict[str, Any], ins: Sequence[Any]) -> Interval | None:
    base, exponent = ins
    if base is not None:
        return None  # solving for the exponent: `log(y) / log(a)` is exact
    b = _concrete(exponent)
    if b is None:
        return REALS  # a runtime exponent may be an even integer
    if _odd_integers(b):
        return None
    if _even_integers_anywhere(b):
        return NONNEG
    return None  # a non-integer power is defined for `a >= 0` only: injective


def _integer_pow_principal(
    params: dict[str, Any], ins: Sequence[Any]
) -> Interval | None:
    return NONNEG if int(params["y"]) % 2 == 0 else None


def _bound(value: Any, low: bool) -> float:
    """The least (`low`) or greatest element of a concrete bound, or an
    infinite end when the bound is known only at run time."""
    b = _concrete(value)
    if b is None or b.size == 0:
        return -INF if low else INF
    return float(np.min(b) if low else np.max(b))


def _clamp_bounds(name: str, ins: Sequence[Any]) -> Interval | None:
    """A clamp's known bounds (for `max`/`min`, the known operand's least and
    greatest element), or `None` unless exactly one operand of `max`/`min` is
    unknown."""
    if name == "clamp":
        lo, _, hi = ins
        return (_bound(lo, True), _bound(hi, False))
    a, b = ins
    if (a is None) == (b is None):
        return None
    known = b if a is None else a
    return (_bound(known, True), _bound(known, False))


def _single(value: Any) -> bool:
    """Whether a known bound is concrete and holds one value throughout."""
    b = _concrete(value)
    return b is not None and b.size > 0 and bool(np.all(b == b.flat[0]))


def _clamp_range(
    name: str,
) -> Callable[[dict[str, Any], Sequence[Any]], Interval | None]:
    """Where a clamp's rule chooses: a result at a bound has many preimages,
    and the rule returns the bound, so the choices lie between the known
    bounds (other results have one preimage, themselves). With bounds of one
    value each, `Saturated` also says which preimages a bound stands for."""

    def interval(params: dict[str, Any], ins: Sequence[Any]) -> Interval | None:
        bounds = _clamp_bounds(name, ins)
        if bounds is None:
            return None
        if name == "clamp":
            lo, _, hi = ins
            if _single(lo) and _single(hi):
                return Saturated(*bounds, below=True, above=True)
        elif _single(ins[1] if ins[0] is None else ins[0]):
            return Saturated(*bounds, below=name == "max", above=name == "min")
        return bounds

    return interval


def _clamp_image(
    name: str,
) -> Callable[[dict[str, Any], Sequence[Any]], Interval | None]:
    """The values a clamp can produce: within its known bounds."""

    def interval(params: dict[str, Any], ins: Sequence[Any]) -> Interval | None:
        bounds = _clamp_bounds(name, ins)
        if bounds is None or name == "clamp":
            return bounds
        return (bounds[0], INF) if name == "max" else (-INF, bounds[1])

    return interval


def _const(interval: Interval) -> Callable[[dict[str, Any], Sequence[Any]], Interval]:
    return lambda params, ins: interval


# primitive name -> (params, operands with None where unknown) -> the interval
# the rule's solution lies in, or None when the rule is exact there.
PRINCIPAL: dict[str, Callable[[dict[str, Any], Sequence[Any]], Interval | None]] = {
    "cosh": _const(NONNEG),
    "square": _const(NONNEG),
    "abs": _const(NONNEG),
    "sin": _const((-_HALF_PI, _HALF_PI)),
    "cos": _const((0.0, math.pi)),
    "tan": _const((-_HALF_PI, _HALF_PI)),
    "integer_pow": _integer_pow_principal,
    "pow": _pow_principal,
    "max": _clamp_range("max"),
    "min": _clamp_range("min"),
    "clamp": _clamp_range("clamp"),
}


# Primitives that round when they narrow a floating type (`ROUNDED`).
ROUNDING = tr.having(tr.ROUNDING)


def principal_range(eqn: Any, ins: Sequence[Any]) -> Interval | None:
    """The interval of the branch `eqn`'s rule chooses, or `None` if exact.

    Only floating results have branches (integer rules refuse instead).
    """
    name = eqn.primitive.name
    if name not in PRINCIPAL and name not in ROUNDING:
        return None  # the common case, decided without looking at dtypes
    if not all(jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in eqn.outvars):
        return None
    if name == "convert_element_type":
        src, dst = eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype
        return ROUNDED if _narrowing(src, dst) else None
    if name == "reduce_precision":
        finfo = jnp.finfo(eqn.invars[0].aval.dtype)
        params = eqn.params  # a first-order primitive's own params
        bits = (int(params["exponent_bits"]), int(params["mantissa_bits"]))
        return ROUNDED if bits[1] < finfo.nmant or bits[0] < finfo.nexp else None
    fn = PRINCIPAL.get(name)
    if fn is None:
        return None
    return fn(eqn.params, ins)


# Images of elementwise maps (the values the result can take, whatever the
# unknown operand): a backward step accepts a tainted result only inside it.
_IMAGE: dict[str, Interval] = {
    "exp": (0.0, INF),
    "exp2": (0.0, INF),
    "log": REALS,
    "log1p": REALS,
    "expm1": (-1.0, INF),
    "tanh": (-1.0, 1.0),
    "atanh": REALS,
    "sinh": REALS,
    "asinh": REALS,
    "cosh": (1.0, INF),
    "acosh": NONNEG,
    "sin": (-1.0, 1.0),
    "cos": (-1.0, 1.0),
    "tan": REALS,
    "asin": (-_HALF_PI, _HALF_PI),
    "acos": (0.0, math.pi),
    "atan": (-_HALF_PI, _HALF_PI),
    "logistic": (0.0, 1.0),
    "sqrt": NONNEG,
    "rsqrt": (0.0, INF),
    "cbrt": REALS,
    "square": NONNEG,
    "abs": NONNEG,
    "erf": (-1.0, 1.0),
    "erfc": (0.0, 2.0),
    "erf_inv": REALS,
    "neg": REALS,
    "add": REALS,
    "sub": REALS,
    "mul": REALS,
    "div": REALS,
    "atan2": (-math.pi, math.pi),
    "add_any": REALS,
    "cumsum": REALS,
    "dot_general": REALS,
    "triangular_solve": REALS,
}


def _integer_pow_image(params: dict[str, Any], ins: Sequence[Any]) -> Interval:
    return REALS if int(params["y"]) % 2 else NONNEG


def _pow_image(params: dict[str, Any], ins: Sequence[Any]) -> Interval | None:
    base, exponent = ins
    if base is not None:
        a = _concrete(base)  # y = a**b for b: positive for a > 0
        return (0.0, INF) if a is not None and bool(np.all(a > 0)) else None
    b = _concrete(exponent)
    if b is not None and _odd_integers(b):
        return REALS
    return NONNEG if b is not None else None


_IMAGE_FNS: dict[str, Callable[[dict[str, Any], Sequence[Any]], Interval | None]] = {
    "integer_pow": _integer_pow_image,
    "pow": _pow_image,
    "max": _clamp_image("max"),
    "min": _clamp_image("min"),
    "clamp": _clamp_image("clamp"),
}

# Steps that only move, copy or select values: a tainted value keeps its
# interval through them.
VALUE_PRESERVING = tr.having(tr.MOVE, tr.ROUNDING) | {
    "copy",
    "stop_gradient",
    "optimization_barrier",
    "device_put",
    "select_n",
    "gather",
    "scatter",
}


# Clamps return their result itself where it is not at a bound: a value chosen
# earlier passes through them, so their solution's interval joins the
# intervals of the values they were given with their own.
CLAMPS = tr.having(tr.CLAMP)


# Rules whose results, given the known operands, are a bijection of the
# unknown ones: solving them with a known operand that depends on a choice
# adds no second constraint on it (elementwise arithmetic with one side known).
KNOWN_OPERAND_SAFE = tr.having(tr.INVERTIBLE_PER_OPERAND)


def image(eqn: Any, ins: Sequence[Any]) -> Interval | None:
    """The image of `eqn`'s map onto its results, or `None` if not known."""
    name = eqn.primitive.name
    if name in VALUE_PRESERVING:
        return REALS
    fn = _IMAGE_FNS.get(name)
    if fn is not None:
        return fn(eqn.params, ins)
    return _IMAGE.get(name)


def describe(interval: Interval) -> str:
    def end(v: float) -> str:
        if v == INF:
            return "inf"
        if v == -INF:
            return "-inf"
        return f"{v:.4g}"

    return f"[{end(interval[0])}, {end(interval[1])}]"


# Rules of call-like primitives invert their body with the same engine and
# hand it the intervals of their tainted results (`ctx.result_branches`);
# each returns, as a third element, the intervals of its solved operands
# and, fourth, whether its body chose them only by elementwise solves
# (`Solution.unique_choices`; loops return both too).
BRANCH_AWARE = tr.having(tr.CALL, tr.CONDITIONAL)

# Loops report the intervals of the values they solve (an elementwise solve
# inside may determine a carry, see `_loops._carry_branches`) but take
# none for their results: a choice they report was made inside their body.
LOOPS = tr.having(tr.LOOP)
