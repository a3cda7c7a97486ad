"""Quotients of polynomials of degree at most two, with array coefficients.

A value of a block walked as a rational function of its unknown `z` is a
`Frac`: a numerator and a denominator, each a tuple of coefficients (of
`z^0`, `z^1`, `z^2`; a denominator `None` is 1). `step` applies one
arithmetic primitive to such values (`STEPS`, a rule per primitive name); a
result of higher degree raises `NotRational`. `quadratic` returns the real roots of one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp

# The highest degree a numerator or a denominator may reach.
DEGREE = 2


class NotRational(Exception):
    """A value is no quotient of polynomials of degree at most `DEGREE`."""


Poly = tuple[Any, ...]  # coefficients of z^0, z^1, ...


class Frac(NamedTuple):
    num: Poly
    den: Poly | None  # None: 1


def const(v: Any) -> Frac:
    return Frac((v,), None)


def padd(p: Poly, q: Poly, sign: int = 1) -> Poly:
    out = []
    for i in range(max(len(p), len(q))):
        if i >= len(q):
            out.append(p[i])
        elif i >= len(p):
            out.append(q[i] if sign > 0 else -q[i])
        else:
            out.append(p[i] + q[i] if sign > 0 else p[i] - q[i])
    return check(tuple(out))


def pmul(p: Poly, q: Poly) -> Poly:
    if len(p) + len(q) - 2 > DEGREE:
        raise NotRational
    out: list[Any] = [None] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            term = a * b
            out[i + j] = term if out[i + j] is None else out[i + j] + term
    return tuple(out)


def check(p: Poly) -> Poly:
    if len(p) - 1 > DEGREE:
        raise NotRational
    return p


def denominator(f: Frac) -> Poly:
    return f.den if f.den is not None else (1.0,)


# One arithmetic step on quotients, by primitive name: (operands, the
# equation's params) -> the result; `step` raises `NotRational` for a name
# without one.
Step = Callable[[Sequence[Frac], dict[str, Any]], Frac]
STEPS: dict[str, Step] = {}


def _steps(*names: str) -> Callable[[Step], Step]:
    def register(fn: Step) -> Step:
        STEPS.update(dict.fromkeys(names, fn))
        return fn

    return register


def step(name: str, ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    """`name` applied to quotients (`NotRational` if it is no arithmetic
    step of this algebra, or the result's degree is too high)."""
    fn = STEPS.get(name)
    if fn is None:
        raise NotRational
    return fn(ins, params)


@_steps("convert_element_type", "copy", "copy_p", "stop_gradient")
def _same(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    return ins[0]


@_steps("neg")
def _neg(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    return Frac(tuple(-a for a in ins[0].num), ins[0].den)


def _sum(f: Frac, g: Frac, sign: int) -> Frac:
    if f.den is None and g.den is None:
        return Frac(padd(f.num, g.num, sign), None)
    if f.den is g.den:
        return Frac(padd(f.num, g.num, sign), f.den)
    num = padd(pmul(f.num, denominator(g)), pmul(g.num, denominator(f)), sign)
    return Frac(num, pmul(denominator(f), denominator(g)))


@_steps("add", "add_any")
def _add(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    return _sum(*ins, 1)


@_steps("sub")
def _sub(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    return _sum(*ins, -1)


def _product(f: Frac, g: Frac) -> Frac:
    both_one = f.den is None and g.den is None
    den = None if both_one else pmul(denominator(f), denominator(g))
    return Frac(pmul(f.num, g.num), den)


@_steps("mul")
def _mul(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    return _product(*ins)


@_steps("div")
def _div(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    f, g = ins
    return Frac(pmul(f.num, denominator(g)), pmul(denominator(f), g.num))


@_steps("square", "integer_pow")
def _power(ins: Sequence[Frac], params: dict[str, Any]) -> Frac:
    (f,) = ins
    power = int(params.get("y", 2))  # (`square` has no params)
    if power == 0:
        return const(1.0)
    out = f
    for _ in range(abs(power) - 1):
        out = _product(out, f)
    if power < 0:
        out = Frac(denominator(out), out.num)
    return out


def select(which: Any, cases: Sequence[Frac]) -> Frac:
    """Coefficient by coefficient, the case `which` picks (a bool or an int
    per element)."""
    if all(c is cases[0] for c in cases):
        return cases[0]

    def pick(polys: Sequence[Poly]) -> Poly:
        n = max(len(p) for p in polys)
        out: list[Any] = []
        for i in range(n):
            terms = [p[i] if i < len(p) else 0.0 for p in polys]
            if jnp.result_type(which) == jnp.bool_:
                out.append(jnp.where(which, terms[1], terms[0]))
            else:
                v = terms[0]
                for j in range(1, len(terms)):
                    v = jnp.where(which == j, terms[j], v)
                out.append(v)
        return tuple(out)

    num = pick([c.num for c in cases])
    if all(c.den is None for c in cases):
        return Frac(num, None)
    return Frac(num, pick([denominator(c) for c in cases]))


def quadratic(a: Any, b: Any, c: Any) -> tuple[Any, ...]:
    """Both real roots of `a z^2 + b z + c` (the stable pair of formulas; one
    root where `a == 0`), NaN where there is none. Safe to differentiate:
    no NaN is computed where it is not returned. Only the one root of
    `b z + c` where `a` is 0 whatever the known values are
    (`static_zero`: a linear-fractional block), with no square root."""
    if static_zero(a):
        nonzero = b != 0
        return (jnp.where(nonzero, -c / jnp.where(nonzero, b, 1.0), jnp.nan),)
    disc = b * b - 4 * a * c
    real = disc >= 0
    # (No square root of 0 or less is differentiated: its infinite slope
    # times a zero cotangent would be NaN in the other rows' gradients. A
    # double root's slope is infinite anyway: the map turns there.)
    positive = disc > 0
    sq = jnp.where(positive, jnp.sqrt(jnp.where(positive, disc, 1.0)), 0.0)
    q = -0.5 * (b + jnp.where(b < 0, -sq, sq))
    nan = jnp.asarray(jnp.nan, jnp.result_type(a, b, c))
    nonzero_a, nonzero_q = a != 0, q != 0
    z1 = jnp.where(real & nonzero_a, q / jnp.where(nonzero_a, a, 1.0), nan)
    z2 = jnp.where(real & nonzero_q, c / jnp.where(nonzero_q, q, 1.0), nan)
    return z1, z2


def padded(p: Poly) -> Poly:
    return tuple(p[i] if i < len(p) else 0.0 for i in range(DEGREE + 1))


def static_zero(c: Any) -> bool:
    """Whether a coefficient is 0 whatever the block's known values are (a
    Python number: `padded`'s, or a literal's)."""
    return isinstance(c, (int, float)) and c == 0


def leading(n2: Any, d2: Any, y: Any) -> Any:
    """The quadratic coefficient of `N(z) - y D(z)`: a static 0 where both
    are (`quadratic` then solves a linear equation)."""
    return 0.0 if static_zero(n2) and static_zero(d2) else n2 - y * d2


def polyval(p: Poly, z: Any) -> Any:
    out = p[-1]
    for c in reversed(p[:-1]):
        out = out * z + c
    return out
