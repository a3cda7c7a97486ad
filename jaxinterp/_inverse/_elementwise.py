"""Inverse rules for elementwise primitives: unary maps, binary maps with one
side known, identities, `select_n` with a known predicate, and the common
primitives that are not invertible.

Each invertible rule gives its ildj in closed form. Functions that are not
injective on the reals (`cosh`, `square`, even `integer_pow`, `sin`, ...) are
inverted on their principal branch, stated in the rule's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special  # noqa: F401  (`jax.scipy.special.ndtri`)
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _rounding as rd
from ._ildj import total
from ._rounding import REDUNDANT_ROUNDING
from ._rules import (
    InverseContext,
    describe_elements,
    inverse_rules,
    register_elementwise_inverse,
    undetermined,
)

_LN2 = math.log(2.0)
_LOG_SQRT_PI = 0.5 * math.log(math.pi)
_SQRT_HALF = math.sqrt(0.5)


def _is_float(value: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(value), jnp.inexact))


_is_tracer = compat.is_tracer  # concrete values allow static NumPy checks


def _log_abs(v: Any) -> Any:
    return lax.log(lax.abs(v))


def _log1p_square(y: Any) -> Any:
    """`log(1 + y**2)` without overflow for large `|y|`, with safe gradients."""
    a = lax.abs(y)
    big = a > 1
    a_big = jnp.where(big, a, 1)
    a_small = jnp.where(big, 0, a)
    large = 2 * lax.log(a_big) + lax.log1p(lax.square(lax.reciprocal(a_big)))
    return jnp.where(big, large, lax.log1p(lax.square(a_small)))


def _within(
    lo: float, hi: float, fn: Callable[..., Any], *, open_ends: bool = False
) -> Callable[..., Any]:
    """`fn`, NaN where its first argument, the result of a map whose image is
    `[lo, hi]`, lies outside that image (no preimage: `sqrt` never returns
    `-1`, `asin` never `2`), or with `open_ends` within two ulps of the
    bounds as well. Complex values are passed through."""

    def within(y: Any, *rest: Any) -> Any:
        out = fn(y, *rest)
        if not _is_float(y) or jnp.issubdtype(jnp.result_type(y), jnp.complexfloating):
            return out
        if open_ends:
            # Within two ulps of a bound the map is flat in the dtype (how it
            # rounds there differs between JAX releases): no single preimage.
            ulps = 2 * jnp.finfo(jnp.result_type(y)).eps * max(abs(lo), abs(hi))
            outside = (y <= lo + ulps) | (y >= hi - ulps)
        else:
            outside = (y < lo) | (y > hi)
        return jnp.where(outside, jnp.asarray(jnp.nan, jnp.result_type(out)), out)

    return within


def _log_cosh(y: Any) -> Any:
    """`log(cosh(y))`, stable for large `|y|`."""
    a = lax.abs(y)
    return a + lax.log1p(lax.exp(-2 * a)) - _LN2


# ---------------------------------------------------------------------------
# Unary maps. `register_elementwise_inverse(prim, inverse_fn, log|dx/dy|(y, x))`.

register_elementwise_inverse(
    lax.exp2_p,
    lambda y: lax.log(y) * (1 / _LN2),
    lambda y, x: -lax.log(y) - math.log(_LN2),
)
register_elementwise_inverse(lax.log1p_p, lax.expm1, lambda y, x: y)
register_elementwise_inverse(lax.expm1_p, lax.log1p, lambda y, x: -lax.log1p(y))
register_elementwise_inverse(lax.atanh_p, lax.tanh, lambda y, x: -2 * _log_cosh(y))
register_elementwise_inverse(
    lax.sinh_p, lax.asinh, lambda y, x: -0.5 * _log1p_square(y)
)
register_elementwise_inverse(lax.asinh_p, lax.sinh, lambda y, x: _log_cosh(y))
# Principal branch x >= 0 (`acosh` returns the non-negative root).
register_elementwise_inverse(
    lax.cosh_p, lax.acosh, lambda y, x: -0.5 * (lax.log(y - 1) + lax.log(y + 1))
)
# `acosh` is >= 0, so its inverse `cosh` needs no branch: log sinh(y).
register_elementwise_inverse(
    lax.acosh_p,
    _within(0.0, math.inf, lax.cosh),
    _within(0.0, math.inf, lambda y, x: y + lax.log(-lax.expm1(-2 * y)) - _LN2),
)
# Principal branches: sin on [-pi/2, pi/2], cos on [0, pi], tan on (-pi/2, pi/2).
register_elementwise_inverse(
    lax.sin_p, lax.asin, lambda y, x: -0.5 * (lax.log1p(-y) + lax.log1p(y))
)
register_elementwise_inverse(
    lax.cos_p, lax.acos, lambda y, x: -0.5 * (lax.log1p(-y) + lax.log1p(y))
)
register_elementwise_inverse(lax.tan_p, lax.atan, lambda y, x: -_log1p_square(y))
# Their images are the principal ranges: a result outside has no preimage.
register_elementwise_inverse(
    lax.asin_p,
    _within(-math.pi / 2, math.pi / 2, lax.sin),
    _within(-math.pi / 2, math.pi / 2, lambda y, x: _log_abs(lax.cos(y))),
)
register_elementwise_inverse(
    lax.acos_p,
    _within(0.0, math.pi, lax.cos),
    _within(0.0, math.pi, lambda y, x: _log_abs(lax.sin(y))),
)
# `atan` reaches +-pi/2 (rounded) only where it is flat in the dtype: every
# `x` beyond about 1.7e7 (float32) gives it, so there is no single preimage.
register_elementwise_inverse(
    lax.atan_p,
    _within(-math.pi / 2, math.pi / 2, lax.tan, open_ends=True),
    _within(
        -math.pi / 2,
        math.pi / 2,
        lambda y, x: -2 * _log_abs(lax.cos(y)),
        open_ends=True,
    ),
)
register_elementwise_inverse(
    lax.logistic_p,
    lambda y: lax.log(y) - lax.log1p(-y),
    lambda y, x: -lax.log(y) - lax.log1p(-y),
)
# sqrt and rsqrt return non-negative values, so their inverses need no branch
# (and a negative result has no preimage: NaN, not the square of it).
register_elementwise_inverse(
    lax.sqrt_p,
    _within(0.0, math.inf, lax.square),
    _within(0.0, math.inf, lambda y, x: _LN2 + _log_abs(y)),
)
register_elementwise_inverse(
    lax.rsqrt_p,
    _within(0.0, math.inf, lambda y: lax.reciprocal(lax.square(y))),
    _within(0.0, math.inf, lambda y, x: _LN2 - 3 * _log_abs(y)),
)
register_elementwise_inverse(
    lax.cbrt_p, lambda y: y * y * y, lambda y, x: math.log(3.0) + 2 * _log_abs(y)
)
# Principal branch x >= 0.
register_elementwise_inverse(
    lax.square_p, lax.sqrt, lambda y, x: -_LN2 - 0.5 * lax.log(y)
)
register_elementwise_inverse(
    lax.erf_p, lax.erf_inv, lambda y, x: _LOG_SQRT_PI - _LN2 + lax.square(x)
)
register_elementwise_inverse(
    lax.erfc_p,
    # `erfc(x) = 2 ndtr(-x sqrt 2)`: `ndtri` keeps the tail's digits, where
    # `erf_inv(1 - y)` would lose them in `1 - y` (`erfc(5)` is 1.5e-12).
    lambda y: -jax.scipy.special.ndtri(0.5 * y) * _SQRT_HALF,
    lambda y, x: _LOG_SQRT_PI - _LN2 + lax.square(x),
)
register_elementwise_inverse(
    lax.erf_inv_p, lax.erf, lambda y, x: _LN2 - _LOG_SQRT_PI - lax.square(y)
)


@inverse_rules.register(lax.integer_pow_p)
def _integer_pow_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, y: int, **params: Any
):
    """`out = x**n`: odd `n` is inverted everywhere, as `sign(out) * |out|**(1/n)`;
    even `n` on the branch `x >= 0`. Negative `n` likewise (`x**-1`, `x**-3` are
    inverted for negative `x` too). `n = 0` is constant, hence not invertible."""
    if x is not None:
        return None
    (out,) = outvals
    n = int(y)
    if n == 0:
        raise NotInvertibleError("`integer_pow` with exponent 0 is constant.")
    if not _is_float(out):
        raise NotInvertibleError(
            "`integer_pow` of integers is not inverted: roots of integers are not "
            "integers in general."
        )
    if n == 1:
        return [out], 0.0
    if n == -1:
        solved = lax.reciprocal(out)
    elif n == 2:
        solved = lax.sqrt(out)
    elif n == -2:
        solved = lax.rsqrt(out)
    elif n == 3:
        solved = lax.cbrt(out)
    else:
        root = lax.pow(lax.abs(out), jnp.asarray(1 / n, out.dtype))
        # An even power is never negative: such a result has no preimage.
        solved = (
            lax.sign(out) * root
            if n % 2
            else _within(0.0, math.inf, lambda _: root)(out)
        )
    if not ctx.want_ildj:
        return [solved], 0.0
    return [solved], total(-math.log(abs(n)) + (1 / n - 1) * _log_abs(out))


@inverse_rules.register(lax.convert_element_type_p)
def _convert_element_type_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    *,
    new_dtype: Any,
    **params: Any,
):
    """Conversions between floating dtypes are inverted by converting back
    (ildj 0). Conversions from or to integers and booleans round, and
    complex-to-real drops the imaginary part, so they are not invertible.

    The source dtype comes from `ctx.operand_aval`; called without it, the value
    is returned in `new_dtype`."""
    if x is not None:
        return None
    (out,) = outvals
    aval = ctx.operand_aval(0)
    src = None if aval is None else aval.dtype
    if not jnp.issubdtype(new_dtype, jnp.inexact) or (
        src is not None and not jnp.issubdtype(src, jnp.inexact)
    ):
        raise NotInvertibleError(
            "`convert_element_type` is only inverted between floating dtypes; "
            f"converting {'' if src is None else f'{src} '}to {new_dtype} rounds "
            "or wraps values."
        )
    if src is None:
        return [out], 0.0
    src_complex = jnp.issubdtype(src, jnp.complexfloating)
    new_complex = jnp.issubdtype(new_dtype, jnp.complexfloating)
    if src_complex and not new_complex:
        raise NotInvertibleError(
            "`convert_element_type` from complex to real drops the imaginary part."
        )
    if new_complex and not src_complex:
        # A real value converted has imaginary part 0: an element whose `y`
        # has another (beyond the rounding of the largest element, which a
        # `y` solved back through complex steps carries) is off the image.
        re, im = lax.real(out), lax.imag(out)
        size = jnp.abs(out)
        largest = jnp.max(jnp.where(jnp.isnan(size), 0, size), initial=0.0)
        finfo = jnp.finfo(re.dtype)
        bound = REDUNDANT_ROUNDING * finfo.eps * (size + largest) + 16 * finfo.tiny
        out = jnp.where(jnp.abs(im) <= bound, re, jnp.nan)
    return [lax.convert_element_type(out, src)], 0.0


def _identity_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    """Operands equal results: copy each known result back (results dropped
    from the program stay unknown)."""
    solved = [o if v is None else v for o, v in zip(outvals, invals, strict=True)]
    if all(o is None for o, v in zip(outvals, invals, strict=True) if v is None):
        return None
    return solved, 0.0


for _prim in (
    lax.copy_p,
    lax.reduce_precision_p,
    lax.stop_gradient_p,
    lax.device_put_p,
    lax.optimization_barrier_p,
):
    # `stage` (JAX >= 0.11) needs no rule: JAX binds it only when evaluating
    # eagerly (`EvalTrace.stage_value`); it is never staged into a Jaxpr
    # (checked on 0.12.0.1: `jax.make_jaxpr(lax.stage)` has no equation).
    inverse_rules.register(_prim, _identity_inverse)


# ---------------------------------------------------------------------------
# Binary maps with one side known.


def _register_binary(
    prim: Any,
    solve_lhs: Callable[[Any, Any], tuple[Any, Any]] | None,
    solve_rhs: Callable[[Any, Any], tuple[Any, Any]] | None,
    *,
    floats_only: bool = True,
) -> None:
    """Like `register_binary_inverse`, with `solve_*(y, known) -> (x, log|dx/dy|)` and a
    shape check against the unknown operand's aval (a broadcast scalar operand
    cannot be recovered)."""

    def rule(
        ctx: InverseContext, outvals: Sequence[Any], a: Any, b: Any, **params: Any
    ) -> Any:
        (y,) = outvals
        if a is None and b is not None and solve_lhs is not None:
            solve, known, index = solve_lhs, b, 0
        elif b is None and a is not None and solve_rhs is not None:
            solve, known, index = solve_rhs, a, 1
        else:
            return None
        if floats_only and not _is_float(y):
            raise NotInvertibleError(
                f"`{prim.name}` of integers rounds, so it is not inverted."
            )
        aval = ctx.operand_aval(index)
        if aval is not None and tuple(aval.shape) != jnp.shape(y):
            return None
        if jnp.ndim(known) != 0 and jnp.shape(known) != jnp.shape(y):
            return None
        dtype = jnp.result_type(y)
        if _is_tracer(known):
            known = jnp.asarray(known).astype(dtype)
        else:  # stays concrete, so the solve can check it (zeros)
            known = np.asarray(known).astype(dtype)
        solved, log_abs = solve(y, known)
        if jnp.shape(solved) != jnp.shape(y):
            return None
        if not ctx.want_ildj:
            ildj = 0.0
        elif jnp.ndim(log_abs) == 0:  # a scalar counts once per element
            ildj = log_abs * math.prod(jnp.shape(y))
        else:
            ildj = total(log_abs)
        return ([solved, b] if a is None else [a, solved]), ildj

    rule.__name__ = f"_{prim.name}_inverse"
    inverse_rules.register(prim, rule)


def _div_lhs(y: Any, b: Any) -> tuple[Any, Any]:
    solved = undetermined(
        y * b,
        b,
        lambda k: k == 0,
        "`div` by a known divisor with zeros loses the dividend there",
    )
    return solved, _log_abs(b)


def _div_rhs(y: Any, a: Any) -> tuple[Any, Any]:
    solved = undetermined(
        a / y,
        a,
        lambda k: k == 0,
        "`div` of a known dividend with zeros loses the divisor there (0 / x = 0)",
    )
    return solved, _log_abs(a) - 2 * _log_abs(y)


_register_binary(lax.div_p, _div_lhs, _div_rhs)


def _pow_lhs(y: Any, b: Any) -> tuple[Any, Any]:
    """`y = a**b` for `a`: the root `|y|**(1/b)`, negated where `b` is an odd
    integer and `y < 0` (the only case where a negative base is real). Any
    other `y < 0` has no real preimage: NaN."""
    inv_b = lax.reciprocal(b)
    root = lax.pow(lax.abs(y), inv_b)
    odd = (lax.round(b) == b) & (lax.rem(lax.abs(b), jnp.ones_like(b) * 2) == 1)
    negative = jnp.where(odd, -root, jnp.asarray(jnp.nan, jnp.result_type(root)))
    solved = undetermined(
        jnp.where(y < 0, negative, root),
        b,
        lambda k: k == 0,
        "`pow` with a known exponent with zeros loses the base there (a**0 = 1)",
    )
    return solved, -_log_abs(b) + (inv_b - 1) * _log_abs(y)


def _pow_rhs(y: Any, a: Any) -> tuple[Any, Any]:
    """`y = a**b` for `b` with a known base `a > 0, a != 1`: `log(y) / log(a)`."""
    log_a = lax.log(a)
    solved = undetermined(
        lax.log(y) / log_a,
        a,
        lambda k: (k <= 0) | (k == 1),
        "`pow` of a known base that is not positive or is 1 does not determine "
        "the exponent there",
    )
    return solved, -lax.log(y) - _log_abs(log_a)


_register_binary(lax.pow_p, _pow_lhs, _pow_rhs)


def _atan2_lhs(y: Any, b: Any) -> tuple[Any, Any]:
    """`y = atan2(a, b)` for `a` with `b != 0` known: `a = b * tan(y)`, valid on
    every branch since `tan(atan2(a, b)) = a / b`; but only a `y` on the half
    plane of `b`'s sign has a preimage (`atan2(a, 1)` lies in
    `(-pi/2, pi/2)`): elsewhere NaN."""
    solved = _on_atan2_branch(b * lax.tan(y), b, y, lhs=True)
    return solved, _log_abs(b) - 2 * _log_abs(lax.cos(y))


def _atan2_rhs(y: Any, a: Any) -> tuple[Any, Any]:
    """`y = atan2(a, b)` for `b` with `a != 0` known: `b = a * cos(y) / sin(y)`."""
    s = lax.sin(y)
    solved = _on_atan2_branch(a * lax.cos(y) / s, a, y, lhs=False)
    return solved, _log_abs(a) - 2 * _log_abs(s)


def _on_atan2_branch(solved: Any, known: Any, y: Any, *, lhs: bool) -> Any:
    """`solved`, NaN where `atan2` recomputed from it does not give `y` back
    within rounding (`y` on the other branch: no preimage)."""
    again = lax.atan2(solved, known) if lhs else lax.atan2(known, solved)
    ok = rd.close(again, y, jnp.abs(y) + math.pi, ulps=64)
    return jnp.where(ok | jnp.isnan(y), solved, jnp.nan)


_register_binary(lax.atan2_p, _atan2_lhs, _atan2_rhs)


def _xor_solve(y: Any, known: Any) -> tuple[Any, Any]:
    return lax.bitwise_xor(y, known), 0.0


_register_binary(lax.xor_p, _xor_solve, _xor_solve, floats_only=False)


@inverse_rules.register(lax.not_p)
def _not_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, **params: Any
) -> Any:
    """Bitwise (or logical) not is its own inverse."""
    if x is not None:
        return None
    (y,) = outvals
    return [lax.bitwise_not(y)], 0.0


@inverse_rules.register(lax.select_n_p)
def _select_n_inverse(
    ctx: InverseContext, outvals: Sequence[Any], which: Any, *cases: Any
) -> Any:
    """With a known predicate and one unknown case, the case equals the result
    where the predicate selects it. Elsewhere it was discarded: a concrete
    predicate that does not select the case everywhere raises (the engine
    still takes the selected elements, see `_masked.py`, in case other
    equations determine the rest); under tracing those elements come back as
    NaN. With several unknown cases only a concrete predicate helps, the same
    way."""
    if which is None:
        return None
    unknown = [k for k, c in enumerate(cases) if c is None]
    (y,) = outvals
    if len(unknown) > 1 and not _is_tracer(which):
        picks = np.broadcast_to(np.asarray(which).astype(np.int32), np.shape(y))
        dropped = [
            f"case {k} where the predicate selects another case (elements "
            f"{describe_elements(picks != k)})"
            for k in unknown
        ]
        raise NotInvertibleError(
            f"`select_n` with several unknown cases discards {' and '.join(dropped)}, "
            "so each case is recovered there only if other equations determine it."
        )
    if len(unknown) != 1:
        return None
    (k,) = unknown
    if not _is_tracer(which):
        selected = np.broadcast_to(np.asarray(which).astype(np.int32) == k, np.shape(y))
        if np.all(selected):
            solved = y
        else:
            raise NotInvertibleError(
                f"`select_n` discards case {k} where the predicate selects another "
                f"case (elements {describe_elements(~selected)}), so those "
                "elements cannot be recovered."
            )
    elif jnp.issubdtype(jnp.result_type(y), jnp.inexact):
        solved = jnp.where(lax.convert_element_type(which, jnp.int32) == k, y, jnp.nan)
    else:
        return None
    result = [which, *cases]
    result[k + 1] = solved
    return result, 0.0


# ---------------------------------------------------------------------------
# Saturating clamps: `max(x, lo)`, `min(x, hi)`, `clamp(lo, x, hi)` with known
# bounds. On the unsaturated range they are the identity; a result at a bound
# has many preimages, and the bound itself is chosen (their principal branch,
# `_branches.py`); a result outside the bounds has none and gives NaN. The
# ildj is 0 (the identity's), also at the bounds.

_CLAMP_REFUSAL = {
    "abs": "it maps `x` and `-x` to the same value",
    "max": "it discards the smaller operand",
    "min": "it discards the larger operand",
    "clamp": "it maps everything outside its bounds to the bounds",
}


def _clamp_solution(name: str, y: Any, lo: Any, hi: Any) -> Any:
    if not _is_float(y):
        raise NotInvertibleError(
            f"`{name}` is not invertible: {_CLAMP_REFUSAL[name]} (an integer "
            "result has no NaN for values outside its image)."
        )
    # A result a few ulps beyond a bound is the bound, rounded by the steps
    # that recovered it (`asinh` undone by `sinh`): taken as the bound.
    finfo = jnp.finfo(jnp.result_type(y))
    inside: Any = True
    x = y
    if lo is not None:
        inside = y >= lo - (8 * finfo.eps * jnp.abs(lo) + finfo.tiny)
        x = jnp.maximum(x, lo)
    if hi is not None:
        inside = inside & (y <= hi + (8 * finfo.eps * jnp.abs(hi) + finfo.tiny))
        x = jnp.minimum(x, hi)
    return jnp.where(inside, x, jnp.asarray(jnp.nan, jnp.result_type(y)))


def _max_min_inverse(name: str) -> Any:
    def rule(ctx: InverseContext, outvals: Sequence[Any], a: Any, b: Any) -> Any:
        if (a is None) == (b is None):
            return None  # both unknown: an elementwise block (`_blocks.py`)
        (y,) = outvals
        known = b if a is None else a
        lo, hi = (known, None) if name == "max" else (None, known)
        x = _clamp_solution(name, y, lo, hi)
        return ([x, b] if a is None else [a, x]), 0.0

    rule.__name__ = f"_{name}_inverse"
    rule.__doc__ = (
        f"`{name}(x, c)` with `c` known: `x = y` on the unsaturated range, "
        "`c` at the bound (its principal branch), NaN beyond it."
    )
    return rule


@inverse_rules.register(lax.abs_p)
def _abs_inverse(ctx: InverseContext, outvals: Sequence[Any], x: Any) -> Any:
    """Principal branch `x >= 0`: `x = y`; NaN for `y < 0` (not an absolute
    value). Integers, which cannot hold that NaN, are refused."""
    if x is not None:
        return None
    (y,) = outvals
    if not _is_float(y) or jnp.issubdtype(jnp.result_type(y), jnp.complexfloating):
        raise NotInvertibleError(
            "`abs` is not invertible: it maps `x` and `-x` to the same value (its "
            "principal branch `x >= 0` is taken for real floats only)."
        )
    return [_clamp_solution("abs", y, 0, None)], 0.0


inverse_rules.register(lax.max_p)(_max_min_inverse("max"))
inverse_rules.register(lax.min_p)(_max_min_inverse("min"))


@inverse_rules.register(lax.clamp_p)
def _clamp_inverse(
    ctx: InverseContext, outvals: Sequence[Any], lo: Any, x: Any, hi: Any
) -> Any:
    """`clamp(lo, x, hi)` with known bounds: `x = y` on `[lo, hi]` (a bound at a
    bound: the principal branch), NaN outside."""
    if x is not None or lo is None or hi is None:
        return None
    (y,) = outvals
    return [lo, _clamp_solution("clamp", y, lo, hi), hi], 0.0


# ---------------------------------------------------------------------------
# Not invertible: the reason is reported if the operand is really needed.

_NOT_INVERTIBLE: dict[str, str] = {
    "sign": "it keeps only the sign of its operand",
    "floor": "it rounds its operand",
    "ceil": "it rounds its operand",
    "round": "it rounds its operand",
    "is_finite": "it returns a boolean",
    "rem": "it discards the quotient",
    "eq": "it returns a boolean",
    "ne": "it returns a boolean",
    "lt": "it returns a boolean",
    "le": "it returns a boolean",
    "gt": "it returns a boolean",
    "ge": "it returns a boolean",
    "and": "it discards bits",
    "or": "it discards bits",
    "shift_left": "it discards the high bits",
    "shift_right_logical": "it discards the low bits",
    "shift_right_arithmetic": "it discards the low bits",
    "population_count": "it counts bits",
    "clz": "it counts bits",
    "real": "it drops the imaginary part",
    "imag": "it drops the real part",
    "reduce_sum": "it reduces an axis to one number",
    "reduce_prod": "it reduces an axis to one number",
    "reduce_max": "it reduces an axis to one number",
    "reduce_min": "it reduces an axis to one number",
    "reduce_and": "it reduces an axis to one boolean",
    "reduce_or": "it reduces an axis to one boolean",
    "reduce_xor": "it reduces an axis to one value",
    "argmax": "it returns an index",
    "argmin": "it returns an index",
    "cummax": "it discards values below the running maximum",
    "cummin": "it discards values above the running minimum",
    "sort": "it discards the order of its operand",
    "top_k": "it keeps only the largest values",
}


def _not_invertible_rule(name: str, why: str) -> Any:
    def rule(
        ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
    ) -> Any:
        raise NotInvertibleError(f"`{name}` is not invertible: {why}.")

    rule.__name__ = f"_{name}_inverse"
    return rule


for _name, _why in _NOT_INVERTIBLE.items():
    inverse_rules.register(
        getattr(lax, f"{_name}_p"), _not_invertible_rule(_name, _why)
    )
