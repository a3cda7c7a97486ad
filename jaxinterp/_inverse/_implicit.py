"""Implicit broadcasts made explicit, before `inverse` reads a Jaxpr.

`lax`'s n-ary elementwise primitives take operands of one rank whose sizes
differ where one of them is 1: `jnp` stages `x * s` with `x: f32[4,3]` and
`s: f32[3]` as `s' = broadcast_in_dim s` to `f32[1,3]`, then `mul x s'`,
and `x[1:] + tanh(x[:1])` as an `add` of `f32[2]` and `f32[1]`. The
inverse rules and blocks take operands of the result's shape (or scalars),
so they refused such a `mul`: a batched affine layer with a per-feature
scale, a coupling that shifts by a function of one element.

`explicit_broadcasts` rewrites each such equation into a `broadcast_in_dim`
of the smaller operand to the result's shape, then the same equation on
operands of one shape. The new equations keep the original's source line,
so messages still point at the user's code. Only the Jaxpr being solved
is rewritten: the bodies of higher-order equations are rewritten when the
engine solves them (`SolveState`), and a body run forwards keeps the
implicit broadcast, which binds as it is.

`explicit_powers` does the same for a power written as a product:
`x * x` becomes `integer_pow(x, 2)` and `x * x * x` (`x ** 2 * x`, its
square read nowhere else) `integer_pow(x, 3)`, so that `v * v` is inverted
as `v ** 2` is (the principal root) and `v * v * v` as `v ** 3` (the real
cube root), not as a product of two unknowns.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from jax import lax

from .. import _caches, _jax_compat as compat
from . import _traits as tr

_Literal = compat.Literal

# `lax`'s n-ary elementwise primitives (`broadcasting_shape_rule`): their
# operands may differ in sizes of 1. (`select_n` and `clamp` take operands
# of one shape or scalars.)
_NARY = tr.having(tr.BROADCASTING)

_cache = _caches.Cache(1024, weak=True)


def _broadcast_operand(v: Any, shape: tuple[int, ...]) -> bool:
    """Whether operand `v` is broadcast implicitly to `shape`: of the same
    rank, another shape, each size its own or 1."""
    have = tuple(getattr(v.aval, "shape", ()))
    return (
        len(have) == len(shape)
        and have != shape
        and all(h in (1, s) for h, s in zip(have, shape, strict=True))
    )


def _needs_rewrite(eqn: Any) -> bool:
    if eqn.primitive.name not in _NARY or len(eqn.outvars) != 1:
        return False
    aval = eqn.outvars[0].aval
    shape = tuple(getattr(aval, "shape", ()))
    if not shape or compat.has_explicit_axes(getattr(aval, "sharding", None)):
        # (A result whose type carries a sharding keeps its equation: the
        # broadcast would need that sharding in its parameters.)
        return False
    return any(_broadcast_operand(v, shape) for v in eqn.invars)


def explicit_broadcasts(jaxpr: compat.Jaxpr) -> compat.Jaxpr:
    """`jaxpr` with every implicit broadcast of an operand of its n-ary
    elementwise equations written as a `broadcast_in_dim` (the same Jaxpr
    if it has none). The invars, outvars and constvars are the same."""
    if not any(_needs_rewrite(e) for e in jaxpr.eqns):
        return jaxpr
    hit = _cache.get(jaxpr)
    if hit is not None:
        return hit
    eqns: list[Any] = []
    for eqn in jaxpr.eqns:
        if not _needs_rewrite(eqn):
            eqns.append(eqn)
            continue
        shape = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
        invars = []
        for v in eqn.invars:
            if _broadcast_operand(v, shape):
                wide = compat.broadcast_eqn(eqn, v, shape)
                eqns.append(wide)
                v = wide.outvars[0]
            invars.append(v)
        eqns.append(eqn.replace(invars=invars))
    result = jaxpr.replace(eqns=eqns)
    _cache.put(jaxpr, result)
    return result


def explicit_powers(jaxpr: compat.Jaxpr) -> compat.Jaxpr:
    """`jaxpr` with each product of a value with itself, or with a power of
    itself read nowhere else, written as an `integer_pow` (the same Jaxpr
    if it has none). The invars, outvars and constvars are the same."""
    if not any(e.primitive is lax.mul_p for e in jaxpr.eqns):
        return jaxpr  # (every solve builds a state: most Jaxprs stop here)
    uses = Counter(v for e in jaxpr.eqns for v in e.invars if type(v) is not _Literal)
    uses.update(v for v in jaxpr.outvars if type(v) is not _Literal)
    powers: dict[Any, tuple[Any, int, int]] = {}  # value -> (base, k, index)
    eqns: list[Any] = []
    changed = False
    for eqn in jaxpr.eqns:
        found = _power_of(eqn, powers, uses)
        if found is not None:
            changed = True
            base, k, dropped = found
            if dropped is not None:
                eqns[dropped] = None
            eqn = eqn.replace(
                primitive=lax.integer_pow_p, params={"y": k}, invars=[base]
            )
        if eqn.primitive is lax.integer_pow_p and type(eqn.invars[0]) is not _Literal:
            y = int(compat.params_of(eqn)["y"])
            powers[eqn.outvars[0]] = (eqn.invars[0], y, len(eqns))
        eqns.append(eqn)
    if not changed:
        return jaxpr
    return jaxpr.replace(eqns=[e for e in eqns if e is not None])


def _power_of(
    eqn: Any, powers: dict[Any, tuple[Any, int, int]], uses: Counter
) -> tuple[Any, int, int | None] | None:
    """`(base, k, the equation of a power it absorbs)` for a `mul` that is
    the power `base ** k`, or `None`."""
    if eqn.primitive.name != "mul" or len(eqn.invars) != 2:
        return None
    a, b = eqn.invars
    if type(a) is _Literal or type(b) is _Literal:
        return None
    if a is b:
        return a, 2, None
    for p, q in ((a, b), (b, a)):
        got = powers.get(p)
        if got is not None and got[0] is q and got[1] > 0 and uses[p] == 1:
            return q, got[1] + 1, got[2]
    return None
