"""When a computed value counts as another: equal within rounding.

Every method checks its answer by running the forward map on it: `x` is
kept where `g(x)` is `y` within rounding, and is NaN elsewhere (`close`,
`maps_back`). The test is the same everywhere: a number of units in the
last place (`ulps`, each method's own) of the magnitude the value is
computed from, plus a few of the smallest normal numbers, because XLA's CPU
code flushes smaller values to 0. A value the engine reaches along two
paths (a second constraint: an output that reads an input already solved)
is compared the same way, with the rounding both paths took (`agree`,
`agree_recomputed`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import _jax_compat as compat


def close(value: Any, target: Any, scale: Any, ulps: float = 16) -> Any:
    """Where `value` is `target` within `ulps` units of rounding of `scale`
    (in `target`'s floating type)."""
    finfo = jnp.finfo(jnp.result_type(target))
    return jnp.abs(value - target) <= ulps * finfo.eps * scale + 16 * finfo.tiny


def through(x: Any, slope: Any) -> Any:
    """`|x g'(x)|`: the rounding of `x` carried to `g(x)` through its slope,
    as a magnitude; 0 where it overflows. (An infinite tolerance would
    accept any `x` far out where `g` is steep: `x e^(x^2/20)` at `x = 40` in
    float32 is about 4e36, and would pass for `y = 69`.)"""
    carried = jnp.abs(x * slope)
    return jnp.where(carried == jnp.inf, 0.0, carried)


def maps_back(at: Any, y: Any, x: Any, slope: Any, ulps: float = 16) -> Any:
    """Where `at = g(x)` is `y` within rounding: of `y`, and of `x` through
    `slope = g'(x)`, where finite)."""
    finite = jnp.where(jnp.isfinite(slope), slope, 0.0)
    return close(at, y, jnp.abs(y) + through(x, finite), ulps)


def one_preimage(x: Any, y: Any, slope: Any, y_scale: Any = 0.0) -> Any:
    """How far apart two candidates may be and still count as one preimage:
    a few ulps of `x`, or as far as rounding of `y` moves it (`16 (eps |y|
    + tiny) / |g'(x)|`: at a jump of the program that rounding hides, two
    cases' candidates; `tiny`, the smallest normal number, for `y` near 0,
    which XLA's CPU code rounds to 0 below it). `y_scale`: the magnitude
    the block's values are computed to rounding of, where larger than `|y|`
    (a spline's value near 0 is its knot's height plus the bin's part)."""
    finfo = jnp.finfo(jnp.result_type(y))
    steep = jnp.isfinite(slope) & (slope != 0)
    rounding = 16 * (finfo.eps * jnp.maximum(jnp.abs(y), y_scale) + finfo.tiny)
    moved = rounding / jnp.where(steep, jnp.abs(slope), 1)
    return 8 * finfo.eps * jnp.maximum(jnp.abs(x), finfo.tiny) + jnp.where(
        steep, moved, 0
    )


def agree_within_rounding(a: Any, b: Any, scale: Any) -> Any:
    """Elementwise, whether `a` and `b` (two values of what should be the
    same elements: redundant copies, a known constant) agree within the
    rounding of values of magnitude `scale` as well as their own: one of
    them may come from steps solved before (a linear solve leaves `1e-8`
    where `0` was meant)."""
    eps = jnp.finfo(jnp.result_type(a, b)).eps
    return jnp.abs(a - b) <= 32 * eps * (jnp.abs(a) + jnp.abs(b) + scale)


# How far, in units of the dtype's epsilon times the magnitudes involved, a
# value recomputed from solved inputs may differ from the same value known
# from the outputs (two paths round differently).
REDUNDANT_ROUNDING = 64
# The same for dtypes of fewer than 23 mantissa bits (bfloat16, float16):
# 64 of its epsilons are half its magnitude (a `y` off the image by 10%
# passed the check of `bf16(x)` against it). Two epsilons of each of the two
# magnitudes allow four to eight ulps, for values solved backwards through a
# few steps of the narrow dtype (fewer gave false NaNs in such chains).
LOW_PRECISION_ROUNDING = 2


def rounding_allowed(dtype: Any) -> Any:
    """How far, relative to the magnitudes involved, two values of `dtype`
    computed along different paths may differ: `REDUNDANT_ROUNDING`
    epsilons, `LOW_PRECISION_ROUNDING` for a dtype of few mantissa bits."""
    finfo = jnp.finfo(dtype)
    ulps = REDUNDANT_ROUNDING if finfo.nmant >= 23 else LOW_PRECISION_ROUNDING
    return ulps * finfo.eps


def agree(a: Any, b: Any, slope: Any = 0.0, excused: Any = False) -> Any:
    """Whether two values of what must be the same elements agree, as one
    boolean: within rounding for floating values (of their magnitudes and of
    `slope`, how much the first moves when its inputs move by their own
    magnitude), exactly otherwise. A NaN in `b` agrees with anything (an
    element a backward step left undetermined, `0 / 0`), and a NaN in `a`
    when `excused` (it comes from a NaN solved before, which the answer
    holds already); a NaN in `a` against a number disagrees."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jnp.shape(a) != jnp.shape(b):
        b = jnp.broadcast_to(b, jnp.shape(a))
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return jnp.all(a == b)
    finfo = jnp.finfo(dtype)
    # Their own rounding, and that of what they were computed from (`slope`,
    # which carries the rounding of values solved before).
    own = rounding_allowed(dtype) * (jnp.abs(a) + jnp.abs(b))
    bound = own + REDUNDANT_ROUNDING * finfo.eps * slope + 16 * finfo.tiny
    # An infinite value agrees only with itself (the bound is inf there).
    close = (jnp.abs(a - b) <= bound) & ((a == b) | (jnp.isfinite(a) & jnp.isfinite(b)))
    return jnp.all(close | jnp.isnan(b) | (jnp.isnan(a) & excused))


def forward_differentiable(eqn: Any) -> bool:
    """Whether the check of `eqn`'s recomputation takes forward derivatives:
    for first-order equations only (a higher-order one would trace its body
    again per operand, and JAX's forward mode stops at a `custom_vjp`)."""
    return not compat.sub_jaxprs(eqn) and eqn.primitive not in {
        compat.custom_vjp_call_p,
        compat.call_hi_primitive_p,
    }


def floating(x: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(x), jnp.inexact))


def largest(x: Any) -> Any:
    """The largest magnitude among `x`'s elements (NaN ignored), 0 if not
    floating."""
    if not floating(x):
        return 0.0
    size = jnp.abs(jnp.asarray(x))
    return jnp.max(jnp.where(jnp.isnan(size), 0, size), initial=0.0)


def agree_recomputed(
    forward: Callable[..., list[Any]],
    ins: Sequence[Any],
    known: Sequence[Any],
    differentiable: bool = True,
    solved: bool = False,
    inherited: Sequence[Any] | None = None,
    known_rounding: Sequence[Any] | None = None,
) -> Any:
    """Whether `forward(*ins)` agrees with the values `known` of its results
    (`None` where not known), as one boolean. The tolerance follows each
    result's sensitivity to each floating operand's magnitude (one forward
    derivative per such operand, unless not `differentiable`: magnitudes
    only), so a recomputation through a steep map rounds as it may. An
    operand's magnitude is taken as its own plus its largest element's:
    solved operands carry rounding relative to the values around them (a
    factorization's `4e-25` where `0` was meant), and `inherited` (per
    operand, `None` or a magnitude) adds the rounding an operand solved
    backwards took from the values it was solved from (`x = y - 1` for
    `y = x + 1` is off by `eps |y|`, not `eps |x|`), and `known_rounding`
    (per result, `None` or a magnitude) the rounding a known result solved
    backwards took likewise. With `solved`, the
    known results were solved too and carry the same: their largest
    elements' rounding is allowed as well."""
    # A check, not part of the answer's derivative: no tangents through it.
    ins = [lax.stop_gradient(x) if floating(x) else x for x in ins]
    known = [None if k is None else lax.stop_gradient(k) for k in known]
    inexact = [k for k, x in enumerate(ins) if differentiable and floating(x)]
    outs: list[Any] | None = None
    slopes: list[Any] = [0.0] * len(known)
    nan_in: Any = False
    for k in inexact:

        def moved(xk: Any, k: int = k) -> list[Any]:
            return list(forward(*ins[:k], xk, *ins[k + 1 :]))

        at = jnp.asarray(ins[k])  # (a literal is a Python scalar on JAX 0.7)
        size = jnp.abs(at)
        nan = jnp.isnan(size)
        nan_in = nan_in | jnp.any(nan)
        size = jnp.where(nan, 0, size)
        if jnp.ndim(size) and jnp.size(size):
            # (An empty operand, `lax.pad` with negative padding: no element
            # to scale by, and `max` of nothing raises.)
            size = size + jnp.max(size)
        if inherited is not None and inherited[k] is not None:
            size = size + inherited[k]
        outs, tangents = jax.jvp(moved, (at,), (size.astype(at.dtype),))
        # The operand's rounding is of its own dtype: a result of another
        # dtype (a conversion) weighs its slope by the two dtypes' epsilons.
        slopes = [
            s
            + jnp.nan_to_num(jnp.abs(t), nan=0.0, posinf=0.0)
            * _eps_ratio(at.dtype, jnp.result_type(t))
            if jnp.issubdtype(jnp.result_type(t), jnp.inexact)
            else s
            for s, t in zip(slopes, tangents, strict=True)
        ]
    if outs is None:
        # Without derivatives (a higher-order equation, a `custom_vjp`): the
        # rounding of the results' largest elements.
        outs = list(forward(*ins))
        slopes = [largest(o) for o in outs]
    if solved:
        slopes = [
            s if kn is None else s + largest(kn)
            for s, kn in zip(slopes, known, strict=True)
        ]
    if known_rounding is not None:
        # Known results solved by a formula carry the rounding they took.
        slopes = [
            s if r is None else s + lax.stop_gradient(r)
            for s, r in zip(slopes, known_rounding, strict=True)
        ]
    oks = [
        agree(o, kn, s, nan_in)
        for o, kn, s in zip(outs, known, slopes, strict=True)
        if kn is not None
    ]
    return functools.reduce(jnp.logical_and, oks, jnp.bool_(True))


def inherited_rounding(forward: Callable[[Any], Any], solved: Any, result: Any) -> Any:
    """The rounding a value `solved` backwards from `result = forward(solved)`
    (an elementwise step, its other operands known) took from `result`: the
    result's magnitude (its own plus its largest element's) over the step's
    slope, elementwise; 0 where the slope is 0 or not finite. First order:
    `x = log(y)` keeps `eps`, `x = y - 1` gets `eps |y|`."""
    at = lax.stop_gradient(jnp.asarray(solved))
    _, slope = jax.jvp(forward, (at,), (jnp.ones_like(at),))
    size = jnp.abs(lax.stop_gradient(jnp.asarray(result))).astype(at.dtype)
    size = jnp.where(jnp.isnan(size), 0, size)
    if jnp.ndim(size) and jnp.size(size):  # (an empty one has no largest)
        size = size + jnp.max(size)
    slope = jnp.abs(slope)
    ok = (slope > 0) & jnp.isfinite(slope) & jnp.isfinite(size)
    # (`integer_pow`, not `div`: a check, told apart from solving steps.)
    inverse_slope = lax.integer_pow(jnp.where(ok, slope, 1), -1)
    # In epsilons of `solved`'s dtype: `bf16(y)` solved from a float32 `y`
    # took float32's rounding, not 65,536 times more.
    ratio = _eps_ratio(jnp.result_type(result), at.dtype)
    return jnp.where(ok, size * inverse_slope * ratio, 0).astype(at.dtype)


def _eps_ratio(source: Any, target: Any) -> float:
    """`eps(source) / eps(target)` for floating dtypes (1 otherwise): a
    rounding of `source`'s precision in epsilons of `target`."""
    if not (
        jnp.issubdtype(source, jnp.inexact) and jnp.issubdtype(target, jnp.inexact)
    ):
        return 1.0
    return float(jnp.finfo(source).eps / jnp.finfo(target).eps)


def agree_solved(a: Any, b: Any) -> Any:
    """Whether a value solved again, `a`, agrees with its known value `b`
    (within rounding of its largest element), as one boolean. A NaN in `a`
    is an element the second path leaves undetermined (`0 / 0`), not a
    contradiction."""
    return agree(a, b, largest(b), excused=True)
