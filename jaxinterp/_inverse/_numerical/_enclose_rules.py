"""The rules of affine enclosures (`_enclose_forms.Form`), per primitive.

`RULES` holds a rule per primitive name; `walk` runs an open Jaxpr on
forms. An elementary function `f` is linearised at the centre of its
operand's range, with its slope enclosed over that range (`_UNARY`: the
function and how to enclose its slope; `_BOUNDS`: the range of its values;
`_OUTSIDE`: where it is NaN all over). Steps that pick a case (`abs`,
`max`, `select_n`, comparisons) flag the intervals where they cannot decide
it (`Cells.flag`); step functions (`floor`, `sign`) flag where they jump.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ... import _jax_compat as compat
from .. import _traits as tr
from .._abstract import Rules, call_body
from . import _enclose_forms as fm

# An enclosure of f' over [lo, hi] (NaN where [lo, hi] leaves f's domain or
# f is not differentiable there).
SlopeRange = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# Where [lo, hi] lies wholly outside a step's domain.
Outside = Callable[[np.ndarray, np.ndarray], np.ndarray]


# --- rules -------------------------------------------------------------


def _unary(
    k: fm.Cells,
    a: fm.Form,
    f: Callable[[np.ndarray], np.ndarray],
    df: SlopeRange,
    outside: Outside | None = None,
    bounds: tuple[float, float] = (-np.inf, np.inf),
) -> fm.Form:
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


def _recip(k: fm.Cells, a: fm.Form) -> fm.Form:
    def slope(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sq_lo, sq_hi = _power_range(lo, hi, 2)
        ok = _nonzero(lo, hi)
        return np.where(ok, -1 / sq_lo, np.nan), np.where(ok, -1 / sq_hi, np.nan)

    return _unary(k, a, lambda x: 1 / x, slope)


def _max(k: fm.Cells, a: fm.Form, b: fm.Form) -> fm.Form:
    a_lo, a_hi = k.range(a)
    b_lo, b_hi = k.range(b)
    first = a_lo >= b_hi
    k.flag(~first & ~(b_lo >= a_hi), a, b, unsure=True)
    return _nan_of(k.where(first, a, b), a, b)


def _min(k: fm.Cells, a: fm.Form, b: fm.Form) -> fm.Form:
    a_lo, a_hi = k.range(a)
    b_lo, b_hi = k.range(b)
    first = a_hi <= b_lo
    k.flag(~first & ~(b_hi <= a_lo), a, b, unsure=True)
    return _nan_of(k.where(first, a, b), a, b)


def _nan_of(out: fm.Form, *forms: fm.Form) -> fm.Form:
    """`out`, NaN all over where an operand is (`max` and `min` pass NaN)."""
    void = functools.reduce(np.logical_or, [f.void for f in forms])
    return fm.Form(
        np.where(void, np.nan, out.c),
        np.where(void, 0.0, out.s),
        np.where(void, 0.0, out.e),
        void,
        np.where(void, np.nan, out.lo),
        np.where(void, np.nan, out.hi),
        out.err,
    )


def _decided(
    k: fm.Cells, true: np.ndarray, false: np.ndarray, nan: Any = False
) -> fm.Form:
    """A condition: 1 where `true`, 0 where `false`, neither: not decided
    (unless an operand is NaN all over, `nan`)."""
    k.flag(~true & ~false & ~np.asarray(nan, bool), unsure=True)
    return fm.Form(true.astype(float), np.zeros(true.shape), np.zeros(true.shape))


def _compare(k: fm.Cells, name: str, a: fm.Form, b: fm.Form, same: bool) -> fm.Form:
    nan = a.void | b.void  # (a comparison with NaN is false, `ne` true)
    if same:  # (`x != x`: a NaN test; where `x` is enclosed it is a number)
        value = np.where(nan, name == "ne", name in ("eq", "le", "ge"))
        return fm.Form(value.astype(float), np.zeros(nan.shape), np.zeros(nan.shape))
    out = _compare_numbers(k, name, a, b)
    value = np.where(nan, float(name == "ne"), out.c)
    return fm.Form(value, np.zeros(nan.shape), np.zeros(nan.shape))


def _compare_numbers(k: fm.Cells, name: str, a: fm.Form, b: fm.Form) -> fm.Form:
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


def _jumps(k: fm.Cells, a: fm.Form, f: Callable[[np.ndarray], np.ndarray]) -> fm.Form:
    """A step function of `a`: a constant where it is the same at both ends
    of `a`'s range (and `f` moves only upwards), else not decided."""
    lo, hi = k.range(a)
    f_lo, f_hi = f(lo), f(hi)
    k.flag(f_lo != f_hi, a, unsure=True)
    value = np.where(a.void, np.nan, np.where(np.isfinite(f_lo), f_lo, 0.0))
    return fm.Form(value, np.zeros_like(lo), np.zeros_like(lo), a.void)


def _round_half(x: np.ndarray) -> np.ndarray:
    # Constant only between two half-integers: NaN at one (either rounding).
    k = np.floor(x + 0.5)
    return np.where(x + 0.5 == k, np.nan, k)


# --- the walk ------------------------------------------------------------


def _real(aval: Any) -> None:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None or jnp.issubdtype(dtype, jnp.complexfloating):
        raise fm.Unsupported("a value that is not a real array")


RULES: Rules[fm.Form] = Rules(
    "enclosures",
    fm.Unsupported,
    lift=lambda k, c: k.const(np.asarray(c, np.float64)),
    check=_real,
)


def walk(
    k: fm.Cells, jaxpr: Any, consts: Sequence[Any], args: Sequence[fm.Form]
) -> list[fm.Form]:
    """The enclosures of the open `jaxpr`'s results over `k`'s cells."""
    return RULES.walk(k, jaxpr, consts, args)


def _out_dtype(eqn: Any) -> Any:
    return eqn.outvars[0].aval.dtype


def _unary_rule(name: str) -> Callable[..., list[fm.Form]]:
    f, df = _UNARY[name]
    bounds = _BOUNDS.get(name, (-np.inf, np.inf))
    outside = _OUTSIDE.get(name)
    return lambda k, eqn, ins: [_unary(k, ins[0], f, df, outside, bounds)]


def _exp(k: fm.Cells, a: fm.Form) -> fm.Form:
    return _unary(k, a, *_UNARY["exp"], None, _BOUNDS["exp"])


def _power(k: fm.Cells, a: fm.Form, n: int) -> fm.Form:
    f, df = _integer_pow(n)
    return _unary(k, a, f, df, None, (0.0 if n % 2 == 0 else -np.inf, np.inf))


@RULES.register("custom_jvp_call")
def _custom_jvp(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    if compat.call_name(eqn) == "exp_neg_sq":
        # (JAX >= 0.12 writes `erf`'s slope `exp(-x**2)` with a `custom_jvp`
        # whose body splits floats by their bits.)
        return [_exp(k, fm.neg(_power(k, ins[0], 2)))]
    body, consts = call_body(eqn, fm.Unsupported)
    return RULES.walk(k, body, consts, ins)


@RULES.register("div")
def _div(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    if not jnp.issubdtype(_out_dtype(eqn), jnp.floating):
        raise fm.Unsupported("integer division")
    return [fm.mul(k, ins[0], _recip(k, ins[1]))]


@RULES.register("pow")
def _pow(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    # a ** b = exp(b log a), where a > 0 (elsewhere not decided).
    # (Not NaN all over where `a < 0`: `pow(-2.0, 2.0)` is 4.)
    log_a = _unary(k, ins[0], *_UNARY["log"])
    return [_exp(k, fm.mul(k, ins[1], log_a))]


@RULES.register("abs")
def _abs(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    (a,) = ins
    lo, hi = k.range(a)
    k.flag(~(lo >= 0) & ~(hi <= 0), a, unsure=True)
    return [k.where(lo >= 0, a, fm.neg(a))]


@RULES.register("lt", "le", "gt", "ge", "eq", "ne")
def _comparison(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    a, b = eqn.invars
    same = a is b and not isinstance(a, compat.Literal)
    return [_compare(k, compat.construct_name(eqn), ins[0], ins[1], same)]


@RULES.register("select_n")
def _select_n(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    which, *cases = ins
    k.flag(~which.constant(), unsure=True)
    index = np.clip(np.where(np.isfinite(which.c), which.c, 0), 0, len(cases) - 1)
    index = index.astype(int)
    fields = (np.choose(index, [getattr(c, f) for c in cases]) for f in fm.FIELDS)
    return [fm.Form(*fields)]


_LOGIC: dict[str, Callable[..., np.ndarray]] = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "not": lambda a: ~a,
}


@RULES.register(*_LOGIC)
def _logic(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    name = compat.construct_name(eqn)
    if any(not a.constant().all() for a in ins) or _out_dtype(eqn) != jnp.bool_:
        raise fm.Unsupported(name)
    value = _LOGIC[name](*(a.c != 0 for a in ins))
    zeros = np.zeros(value.shape)
    return [fm.Form(value.astype(float), zeros, zeros)]


@RULES.register("is_finite")
def _is_finite(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    lo, hi = k.range(ins[0])
    finite = np.isfinite(lo) & np.isfinite(hi) & ~ins[0].void
    return [_decided(k, finite, ins[0].void)]


@RULES.register("convert_element_type")
def _convert(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    (a,) = ins
    dtype = _out_dtype(eqn)
    if jnp.issubdtype(dtype, jnp.floating):
        return [a]
    if dtype == jnp.bool_:
        lo, hi = k.range(a)
        zero = a.constant() & (a.c == 0)
        return [_decided(k, (lo > 0) | (hi < 0) | a.void, zero)]
    return [_jumps(k, a, np.trunc)]


@RULES.register("reduce_sum")
def _reduce_sum(k: fm.Cells, eqn: Any, ins: list[fm.Form]) -> list[fm.Form]:
    axes = tuple(int(a) for a in compat.params_of(eqn)["axes"])
    return [fm.sum_over(k, ins[0], axes, tuple(eqn.invars[0].aval.shape))]


def _clamp(k: fm.Cells, low: fm.Form, x: fm.Form, high: fm.Form) -> fm.Form:
    return _min(k, _max(k, x, low), high)


def _one(fn: Callable[..., fm.Form]) -> Callable[..., list[fm.Form]]:
    """A rule from a function of the cells and the operands."""
    return lambda k, eqn, ins: [fn(k, *ins)]


RULES.each({name: _unary_rule(name) for name in _UNARY})
RULES.each(
    dict.fromkeys(
        tr.having(tr.COPY) | {"reduce_precision", "stop_gradient"},
        lambda k, eqn, ins: ins[:1],
    )
)
RULES.each(
    {name: (lambda k, eqn, ins, m=m: m(eqn, ins)) for name, m in fm.MOVES.items()}
)
RULES.each(
    {
        "optimization_barrier": lambda k, eqn, ins: ins,
        "dot_general": lambda k, eqn, ins: [fm.dot(k, eqn, *ins)],
        "add": _one(fm.add),
        "add_any": _one(fm.add),
        "sub": _one(fm.sub),
        "neg": lambda k, eqn, ins: [fm.neg(ins[0])],
        "mul": _one(fm.mul),
        "integer_pow": lambda k, eqn, ins: [
            _power(k, ins[0], int(compat.params_of(eqn)["y"]))
        ],
        "square": lambda k, eqn, ins: [_power(k, ins[0], 2)],
        "sign": lambda k, eqn, ins: [_jumps(k, ins[0], np.sign)],
        "floor": lambda k, eqn, ins: [_jumps(k, ins[0], np.floor)],
        "ceil": lambda k, eqn, ins: [_jumps(k, ins[0], np.ceil)],
        "round": lambda k, eqn, ins: [_jumps(k, ins[0], _round_half)],
        "max": _one(_max),
        "min": _one(_min),
        "clamp": _one(_clamp),
    }
)
