"""Elementwise blocks that are linear-fractional in their unknown.

`y = (a x + b) / (c x + d)` per element, written with the unknown in more
than one place: `(x - 1) / (x + 1)`, `x / (1 + x)`, `1 - 2 / (x + 1)`,
`x * (1 / (x + 2))`. Such a map (a Möbius transformation) is injective
wherever `a d - b c != 0`, with the inverse `x = (b - d y) / (c y - a)`: an
exact formula, so the numerical solver (which returns one preimage, a
choice) is not needed, and a later constraint on the same value is checked
instead of refused.

The block's equations are walked with every value held as a pair of
polynomials of degree at most one in `x` (numerator, denominator), with the
known operands' values as coefficients; a step that would raise a degree
above one, or that is not arithmetic (`exp` of `x`, `abs`, a comparison),
means the block is not linear-fractional and the other methods are tried.

A value may also be the logarithm of such a fraction: `log`
and `log1p` of a fraction, sums and differences of logarithms (a product or
quotient of fractions, if its degrees stay at most one), a known value added
(`log(R) + k = log(R e^k)`), `neg`, and `exp` back to a fraction. Logit,
`log(x) - log1p(-x) = log(x / (1 - x))`, is one: `y = log(R(x))` is solved
as `R(x) = e^y`, with `e^-y` in the formula where `y > 0` so that neither
exponential overflows.

The same walk runs with the polynomials in `s = e^x` or `s = e^-x`
when it fails in `x`: `x` is then the logarithm `log s` (or `log(1 / s)`),
`exp` and `expm1` of it fractions of `s`, so softplus's inverse `x +
log(-expm1(-x)) = log((1 - s) / s)` with `s = e^-x` is solved for `s` and `x
= -log s` (`log1p` of `s - 1` near `s = 1`, so a small `x` keeps its digits).

The polynomials are never simplified, so the coefficients found describe the
same function as the program wherever the program's own divisions are
defined; the solution is checked by mapping it back (NaN where it does not
reproduce `y`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp

from .. import _jax_compat as compat
from . import _block_solve as bs, _rounding as rd, _traits as tr
from ._abstract import Rules

_Literal = compat.Literal

# Method, as `explain_inverse` names it.
LINEAR_FRACTIONAL = "linear-fractional formula"

# Steps that pass their one operand through unchanged as a value of `x`.
_PASS = tr.having(tr.COPY, tr.ROUNDING)

# (numerator degree, denominator degree, whether the value is the logarithm
# of that fraction) of a value in the block.
Degrees = tuple[int, int, bool]

_KNOWN: Degrees = (0, 0, False)

# The variable the fractions are polynomials in: `x` itself (0), or `s =
# e^x` (1) or `s = e^-x` (-1), with `x` then the logarithm `log s` or
# `log(1 / s)`; `SUBSTITUTIONS` is the order they are tried in.
SUBSTITUTIONS = (0, 1, -1)
_START: dict[int, Degrees] = {0: (1, 0, False), 1: (1, 0, True), -1: (0, 1, True)}


class _NotFractional(Exception):
    """A step that is not linear-fractional (or the logarithm of such a
    map) in the unknown: the method does not apply."""


def degrees(eqns: Sequence[Any], x: Any, sign: int = 0) -> Degrees | None:
    """The degrees of the block's last result as a fraction of polynomials
    in `x` (or in `e^(sign x)`; or the logarithm of one), or `None` if some
    step is not rational of degree at most one in each part."""
    env: dict[Any, Degrees] = {x: _START[sign]}
    try:
        DEGREES.run(None, eqns, env, outside=lambda v: _KNOWN)
    except _NotFractional:
        return None
    return DEGREES.read(None, env, eqns[-1].outvars[0], lambda v: _KNOWN)


def substitution(eqns: Sequence[Any], x: Any) -> int | None:
    """The first of `SUBSTITUTIONS` in which the block is linear-fractional
    (or the logarithm of such a map), or `None`."""
    for sign in SUBSTITUTIONS:
        if degrees(eqns, x, sign) is not None:
            return sign
    return None


def _floating_eqn(eqn: Any) -> bool:
    return all(
        jnp.issubdtype(v.aval.dtype, jnp.floating) for v in (*eqn.invars, *eqn.outvars)
    )


def _pass_through(eqn: Any) -> None:
    """Refuse a conversion that is not between floating types: it rounds
    to whole numbers or to booleans, a step, not a value of `x`."""
    if eqn.primitive.name == "convert_element_type" and not _floating_eqn(eqn):
        raise _NotFractional("convert_element_type")


# --- Degrees: the walk that decides whether the method applies -------------
# Each value is (numerator degree, denominator degree, logarithm or not);
# a known value is `_KNOWN`. A step that is not linear-fractional raises.

DegreeRule = Callable[[Any, Any, list[Degrees]], list[Degrees]]


def _fold_known(ctx: Any, eqn: Any, ins: list[Degrees]) -> list[Degrees] | None:
    if all(d == _KNOWN for d in ins):
        return [_KNOWN] * len(eqn.outvars)
    return None


DEGREES: Rules[Degrees] = Rules(
    "linear-fractional degrees",
    _NotFractional,
    lift=lambda ctx, c: _KNOWN,
    fold=_fold_known,
)


def _degree_rule(*names: str) -> Callable[[Callable[..., Degrees]], DegreeRule]:
    """Register a rule `(eqn, *operand degrees) -> degrees` for `names`,
    refusing a result of degree above one."""

    def decorate(fn: Callable[..., Degrees]) -> DegreeRule:
        def rule(ctx: Any, eqn: Any, ins: list[Degrees]) -> list[Degrees]:
            got = fn(eqn, *ins)
            if max(got[:2]) > 1:
                raise _NotFractional(eqn.primitive.name)
            return [got]

        return DEGREES.register(*names)(rule)

    return decorate


def _no_logarithm(eqn: Any, *ins: Degrees) -> None:
    if any(log for _, _, log in ins):
        raise _NotFractional(eqn.primitive.name)


@_degree_rule(*_PASS)
def _pass_degrees(eqn: Any, a: Degrees) -> Degrees:
    _pass_through(eqn)
    return a


@_degree_rule("neg")
def _neg_degrees(eqn: Any, a: Degrees) -> Degrees:
    n, d, log = a
    return (d, n, True) if log else a  # -log R = log(1 / R)


@_degree_rule("log", "log1p")
def _log_degrees(eqn: Any, a: Degrees) -> Degrees:
    _no_logarithm(eqn, a)
    n, d, _ = a
    return (max(n, d), d, True) if eqn.primitive.name == "log1p" else (n, d, True)


@_degree_rule("exp", "expm1")
def _exp_degrees(eqn: Any, a: Degrees) -> Degrees:
    n, d, log = a
    if not log:
        raise _NotFractional(eqn.primitive.name)
    return (max(n, d), d, False) if eqn.primitive.name == "expm1" else (n, d, False)


@_degree_rule("add", "sub", "add_any")
def _sum_degrees(eqn: Any, a: Degrees, b: Degrees) -> Degrees:
    (n1, d1, log1), (n2, d2, log2) = a, b
    if log1 or log2:
        # Logarithms (or known values) only: the log of a product.
        if not ((log1 or a == _KNOWN) and (log2 or b == _KNOWN)):
            raise _NotFractional(eqn.primitive.name)
        if eqn.primitive.name == "sub":
            n2, d2 = d2, n2
        if (n1 and n2) or (d1 and d2):  # one factor of each part constant
            raise _NotFractional(eqn.primitive.name)
        return (n1 + n2, d1 + d2, True)
    if d1 and d2:
        raise _NotFractional(eqn.primitive.name)  # two denominators
    return (max(n1 + d2, n2 + d1), max(d1, d2), False)


@_degree_rule("mul")
def _mul_degrees(eqn: Any, a: Degrees, b: Degrees) -> Degrees:
    _no_logarithm(eqn, a, b)
    return (a[0] + b[0], a[1] + b[1], False)


@_degree_rule("div")
def _div_degrees(eqn: Any, a: Degrees, b: Degrees) -> Degrees:
    _no_logarithm(eqn, a, b)
    return (a[0] + b[1], a[1] + b[0], False)


# --- Coefficients: the same walk, on the fractions themselves ---------------

Fraction = tuple[Any, Any, Any, Any]  # (a, b, c, d): (a x + b) / (c x + d)


class _Log(NamedTuple):
    """The logarithm of the fraction `frac`."""

    frac: Fraction


class _Known(NamedTuple):
    """A known value of the block (an array)."""

    value: Any


def coefficients(
    eqns: Sequence[Any],
    x: Any,
    known_vars: Sequence[Any],
    known: Sequence[Any],
    sign: int = 0,
) -> Fraction | _Log:
    """`(a, b, c, d)` with the block's last result `(a s + b) / (c s + d)`
    (or its logarithm, a `_Log`), `s` being `x` or `e^(sign x)`, each
    computed from the known values (call after `degrees` accepted the block
    with this `sign`)."""
    values = dict(zip(known_vars, known, strict=True))
    zero, one = jnp.zeros((), x.aval.dtype), jnp.ones((), x.aval.dtype)
    start: Any = (one, zero, zero, one)  # s
    if sign == 1:
        start = _Log(start)  # x = log s
    elif sign == -1:
        start = _Log((zero, one, one, zero))  # x = log(1 / s)
    env: dict[Any, Any] = {x: start}

    def outside(v: Any) -> _Known:
        return _Known(values[v])

    COEFFICIENTS.run(None, eqns, env, outside)
    last = COEFFICIENTS.read(None, env, eqns[-1].outvars[0], outside)
    return _constant(last.value) if isinstance(last, _Known) else last


def _constant(value: Any) -> Fraction:
    zero = jnp.zeros_like(value)
    return (zero, value, zero, jnp.ones_like(value))


def _value_of(f: Fraction) -> Any:
    return f[1] / f[3]


def _fold_values(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A step of known values only (a known scale computed in the block)."""
    if not all(isinstance(v, _Known) for v in ins):
        return None
    outs = compat.bind_eqn(eqn.primitive, [v.value for v in ins], eqn.params)
    return [_Known(o) for o in outs]


COEFFICIENTS: Rules[Any] = Rules(
    "linear-fractional coefficients",
    _NotFractional,
    lift=lambda ctx, c: _Known(c),
    fold=_fold_values,
)


def _fraction_rule(*names: str) -> Callable[[Callable[..., Any]], Any]:
    """Register a rule `(name, *operands) -> fraction or _Log` for `names`,
    a known operand given as a constant fraction. `degrees` has made sure
    no product below has a nonzero `x^2` term (one factor of each product
    is a constant polynomial)."""

    def decorate(fn: Callable[..., Any]) -> Any:
        def rule(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
            args = [_constant(v.value) if isinstance(v, _Known) else v for v in ins]
            return [fn(eqn.primitive.name, *args)]

        return COEFFICIENTS.register(*names)(rule)

    return decorate


@_fraction_rule(*_PASS, "broadcast_in_dim")
def _pass_fraction(name: str, a: Any) -> Any:
    return a


@_fraction_rule("log", "log1p")
def _log_fraction(name: str, f: Fraction) -> _Log:
    a, b, c, d = f
    return _Log((a + c, b + d, c, d)) if name == "log1p" else _Log(f)


@_fraction_rule("exp", "expm1")
def _exp_fraction(name: str, f: _Log) -> Fraction:
    a, b, c, d = f.frac
    return (a - c, b - d, c, d) if name == "expm1" else f.frac


@_fraction_rule("neg")
def _neg_fraction(name: str, f: Any) -> Any:
    if isinstance(f, _Log):
        a, b, c, d = f.frac
        return _Log((c, d, a, b))
    a, b, c, d = f
    return (-a, -b, c, d)


@_fraction_rule("add", "sub", "add_any")
def _sum_fraction(name: str, f: Any, g: Any) -> Any:
    if isinstance(f, _Log) or isinstance(g, _Log):
        return _log_sum(name, f, g)
    (a1, b1, c1, d1), (a2, b2, c2, d2) = f, g
    sign = -1 if name == "sub" else 1
    # p1/q1 + p2/q2 with one of q1, q2 a constant (the degree check).
    num = _poly_add(
        _poly_mul((a1, b1), (c2, d2)),
        _poly_scale(_poly_mul((a2, b2), (c1, d1)), sign),
    )
    return (*num, *_poly_mul((c1, d1), (c2, d2)))


@_fraction_rule("mul")
def _mul_fraction(name: str, f: Fraction, g: Fraction) -> Fraction:
    (a1, b1, c1, d1), (a2, b2, c2, d2) = f, g
    return (*_poly_mul((a1, b1), (a2, b2)), *_poly_mul((c1, d1), (c2, d2)))


@_fraction_rule("div")
def _div_fraction(name: str, f: Fraction, g: Fraction) -> Fraction:
    (a1, b1, c1, d1), (a2, b2, c2, d2) = f, g
    return (*_poly_mul((a1, b1), (c2, d2)), *_poly_mul((c1, d1), (a2, b2)))


def _log_sum(name: str, *ins: Any) -> _Log:
    """A sum or difference of logarithms of fractions and known values (as
    constant fractions, `(0, k, 0, 1)`): the logarithm of their product (or
    quotient), a known value `k` a factor `e^k`."""
    factors = []
    for i, v in enumerate(ins):
        if isinstance(v, _Log):
            f = v.frac
        else:
            e = jnp.exp(_value_of(v))
            f = (jnp.zeros_like(e), e, jnp.zeros_like(e), jnp.ones_like(e))
        if name == "sub" and i == 1:
            f = (f[2], f[3], f[0], f[1])
        factors.append(f)
    (a1, b1, c1, d1), (a2, b2, c2, d2) = factors
    return _Log((*_poly_mul((a1, b1), (a2, b2)), *_poly_mul((c1, d1), (c2, d2))))


def _poly_mul(p: tuple[Any, Any], q: tuple[Any, Any]) -> tuple[Any, Any]:
    """`p * q` for polynomials of degree at most one whose product has no
    `x^2` term (the degree check guarantees one of them is constant)."""
    (p1, p0), (q1, q0) = p, q
    return (p1 * q0 + p0 * q1, p0 * q0)


def _poly_add(p: tuple[Any, Any], q: tuple[Any, Any]) -> tuple[Any, Any]:
    return (p[0] + q[0], p[1] + q[1])


def _poly_scale(p: tuple[Any, Any], s: int) -> tuple[Any, Any]:
    return (s * p[0], s * p[1])


def invert(frac: Fraction, y: Any) -> Any:
    """`x` with `(a x + b) / (c x + d) == y`: `(b - d y) / (c y - a)`, NaN
    where the map is constant (`a d == b c`) or `y` is the value it never
    takes (`c y == a`)."""
    a, b, c, d = frac
    dtype = jnp.result_type(y)
    return _quotient(frac, b - d * y, c * y - a, dtype)


def _quotient(frac: Fraction, num: Any, den: Any, dtype: Any) -> Any:
    """`num / den`, NaN where the map `frac` is constant (`a d == b c`) or
    `den` is 0."""
    a, b, c, d = frac
    bad = (a * d - b * c == 0) | (den == 0)
    x = num / jnp.where(bad, 1, den)
    return jnp.where(bad, jnp.asarray(jnp.nan, dtype), x).astype(dtype)


class _Parts(NamedTuple):
    """The root `s = num / den` of `R(s) = y` (or `log R(s) = y`), with
    `diff = num - den` written without cancellation, and `log|num|`,
    `log|den|` where an exponential in them underflows."""

    num: Any
    den: Any
    diff: Any
    log_num: Any
    log_den: Any


def _safe_log_abs(v: Any) -> Any:
    # (The `where` keeps a zero's infinite derivative out of gradients.)
    return jnp.log(jnp.abs(jnp.where(v == 0, 1, v)))


def _parts(frac: Fraction, y: Any) -> _Parts:
    """`R(s) = y`: `(b - d y) / (c y - a)`."""
    a, b, c, d = frac
    num, den = b - d * y, c * y - a
    return _Parts(
        num, den, (a + b) - (c + d) * y, _safe_log_abs(num), _safe_log_abs(den)
    )


def _log_parts(frac: Fraction, y: Any) -> _Parts:
    """`log R(s) = y`: the fraction's inverse at `w = e^y`, written with `v =
    e^-y` (numerator and denominator divided by `w`) where `y > 0`, so that
    no exponential overflows. Where `|y| < log 2` the exponential is
    written `1 + m` with `m` from `expm1`, so that a small `y` keeps its
    digits where the terms of `1` cancel (`log1p(x) - log1p(-x)` near 0);
    elsewhere `e^-|y|` itself, so that a tiny one is not lost next to 1
    (logit at `y = -80`); a part that is a multiple of it has its logarithm
    from `-|y|` (no underflow)."""
    a, b, c, d = frac
    large = y > 0
    t = jnp.where(large, -y, y)  # -|y|, with the derivative of each side
    e, m = jnp.exp(t), jnp.expm1(t)  # w (or v = 1 / w), and w - 1
    small = t > -math.log(2.0)
    # (b - d w, c w - a), or with v: (b v - d, c - a v).
    num = jnp.where(
        small,
        jnp.where(large, (b - d) + b * m, (b - d) - d * m),
        jnp.where(large, b * e - d, b - d * e),
    )
    den = jnp.where(
        small,
        jnp.where(large, (c - a) - a * m, (c - a) + c * m),
        jnp.where(large, c - a * e, c * e - a),
    )
    diff = jnp.where(
        small,
        jnp.where(large, (a + b - c - d) + (a + b) * m, (a + b - c - d) - (c + d) * m),
        jnp.where(large, (a + b) * e - (c + d), (a + b) - (c + d) * e),
    )
    # The part with no constant term: `k e`, of logarithm `log|k| - |y|`.
    num_free, num_k = jnp.where(large, -d, b), jnp.where(large, b, -d)
    den_free, den_k = jnp.where(large, c, -a), jnp.where(large, -a, c)
    # (One logarithm each: of `k` where the part is `k e`, else of the part.)
    num_ke, den_ke = ~small & (num_free == 0), ~small & (den_free == 0)
    log_num = _safe_log_abs(jnp.where(num_ke, num_k, num)) + jnp.where(num_ke, t, 0)
    log_den = _safe_log_abs(jnp.where(den_ke, den_k, den)) + jnp.where(den_ke, t, 0)
    return _Parts(num, den, diff, log_num, log_den)


def invert_log(frac: Fraction, y: Any) -> Any:
    """`x` with `log((a x + b) / (c x + d)) == y` (see `_log_parts`)."""
    got = _log_parts(frac, y)
    return _quotient(frac, got.num, got.den, jnp.result_type(y))


def _log_of_root(frac: Fraction, got: _Parts, dtype: Any) -> Any:
    """`log s` for the root `s = num / den` (`s = e^(sign x)`): `log1p(diff /
    den)` where `s` is within `[1/2, 3/2]` (a small `x` keeps its digits),
    else `log|num| - log|den|`; NaN where `s <= 0` (no `x` maps there) or
    the map is constant."""
    a, b, c, d = frac
    num, den = got.num, got.den
    positive = ((num > 0) & (den > 0)) | ((num < 0) & (den < 0))
    bad = (a * d - b * c == 0) | ~positive
    safe_den = jnp.where(bad, 1, den)
    near = jnp.abs(got.diff) <= 0.5 * jnp.abs(safe_den)
    out = jnp.where(
        near,
        jnp.log1p(jnp.where(near, got.diff, 0) / safe_den),
        got.log_num - got.log_den,
    )
    return jnp.where(bad, jnp.asarray(jnp.nan, dtype), out).astype(dtype)


def _invert_any(frac: Fraction | _Log, y: Any, sign: int = 0) -> Any:
    """`x` from `y` for the block's fraction (or its logarithm) in `x` (`sign
    == 0`) or in `s = e^(sign x)`, `x = sign * log s`."""
    log = isinstance(frac, _Log)
    f = frac.frac if isinstance(frac, _Log) else frac
    if sign == 0:
        return invert_log(f, y) if log else invert(f, y)
    got = _log_parts(f, y) if log else _parts(f, y)
    return sign * _log_of_root(f, got, jnp.result_type(y))


def _formula(
    eqns: Sequence[Any],
    x: Any,
    known_vars: Sequence[Any],
    known: Sequence[Any],
    y: Any,
) -> tuple[Fraction | _Log, Any] | None:
    """The block's fraction (in the first substitution that fits) and `x`
    from `y` by its formula, or `None` if no substitution fits."""
    sign = substitution(eqns, x)
    if sign is None:
        return None
    frac = coefficients(eqns, x, known_vars, known, sign)
    return frac, _invert_any(frac, y, sign)


def solve(block: Any, y: Any, known: Sequence[Any]) -> Any | None:
    """`x` for an elementwise block linear-fractional in its unknown, or the
    logarithm of such a map (NaN where there is no single preimage, or where
    the program's own evaluation at the solution does not give `y` back
    within rounding), or `None` if the block is neither."""
    got = _formula(block.eqns, block.x, block.known, known, y)
    if got is None:
        return None
    x = got[1]
    ok = bs.maps_back(block, x, block.g(x, *known), y, known)
    return jnp.where(ok, x, jnp.asarray(jnp.nan, jnp.result_type(x)))


def solve_case(closed: Any, known: Sequence[Any], y: Any) -> tuple[Any, Any] | None:
    """One case of a piecewise block (`closed`: a Jaxpr of `x, *known`) by
    the formula, or `None` if the case is not linear-fractional in `x`.

    Returns `(x, flat)`: `flat` marks the elements where the case is a
    constant map that takes the value `y`, so that every point of its region
    is a preimage (the caller's answer is NaN there: no single preimage);
    `x` is NaN where the case is constant."""
    jaxpr = compat.open_jaxpr(closed)
    x_var, *known_vars = jaxpr.invars
    consts = list(compat.jaxpr_consts(closed))
    found = _formula(
        jaxpr.eqns, x_var, [*jaxpr.constvars, *known_vars], [*consts, *known], y
    )
    if found is None:
        return None
    got, x = found
    a, b, c, d = got.frac if isinstance(got, _Log) else got
    # A constant case (`x + -x`, a ratio of proportional polynomials) takes
    # one value, `a / c` or `b / d` (or its logarithm), on its whole region.
    constant = a * d - b * c == 0
    value = jnp.where(c != 0, a / jnp.where(c != 0, c, 1), b / jnp.where(d != 0, d, 1))
    if isinstance(got, _Log):
        value = jnp.log(value)
    takes = rd.close(y, value, jnp.abs(value))
    flat = constant & ((c != 0) | (d != 0)) & takes
    return x, jnp.broadcast_to(flat, jnp.shape(y))
