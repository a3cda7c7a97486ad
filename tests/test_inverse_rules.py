"""Per-primitive inverse rules: round trips, ildj against `slogdet(jacfwd)`, pieces.

Each row of the table is `(prim, fn, domain)`: `fn` uses `prim` on its one
unknown input, `domain` draws valid inputs. The rule is called directly on the
equations of `jax.make_jaxpr(fn)(x)` (inlining `jit` and `custom_jvp` bodies),
with the operands that depend on `x` unknown, and must give them back; its
ildj must equal the `slogdet` of the Jacobian of its own solution in the
results. The same rows then go end to end through `jaxinterp.inverse_and_ildj`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st
from jax import lax
from jax.experimental import multihost_utils

import jaxinterp
from jaxinterp import NotInvertibleError
from jaxinterp._inverse import _elementwise, _linalg, _structural  # noqa: F401
from jaxinterp._inverse._rules import (
    InverseContext,
    Piece,
    PieceResult,
    assemble,
    inverse_rules,
)

BARE = InverseContext()  # no avals: what a rule called by hand knows

X64 = bool(jax.config.jax_enable_x64)
HAS_INVERSE = hasattr(jaxinterp, "inverse_and_ildj")


# ---------------------------------------------------------------------------
# Domains: where each primitive is invertible (its principal branch).


@dataclasses.dataclass(frozen=True)
class Domain:
    """Inputs drawn uniformly from `[low, high]`, at least `margin` from zero.

    `shape` is used by the table; rows with `any_shape` also run in the
    hypothesis tests on random shapes.
    """

    low: float
    high: float
    shape: tuple[int, ...] = (2, 3)
    margin: float = 0.0
    dtype: Any = np.float32
    any_shape: bool = True
    min_rank: int = 1
    quantize: Any = None  # round inputs to this dtype first

    def __str__(self) -> str:
        return f"[{self.low},{self.high}]{list(self.shape)}"

    def fix(self, x: np.ndarray) -> np.ndarray:
        if self.margin:
            x = np.where(np.abs(x) < self.margin, np.copysign(self.margin, x), x)
        if self.quantize is not None:
            x = np.asarray(jnp.asarray(x, self.quantize).astype(np.float32))
        return x.astype(self.dtype)

    def sample(self, seed: int = 0, shape: tuple[int, ...] | None = None) -> Any:
        rng = np.random.default_rng(seed)
        shape = self.shape if shape is None else shape
        if np.issubdtype(self.dtype, np.integer):
            return rng.integers(self.low, self.high, shape).astype(self.dtype)
        return self.fix(rng.uniform(self.low, self.high, shape))

    def strategy(self, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        if np.issubdtype(self.dtype, np.integer):
            elements = st.integers(int(self.low), int(self.high))
        else:
            elements = st.floats(self.low, self.high, allow_nan=False)
        return hnp.arrays(np.float64, shape, elements=elements).map(self.fix)


def domain(low: float, high: float, shape=(2, 3), **kw: Any) -> Domain:
    return Domain(low, high, tuple(shape), **kw)


REAL = domain(-3, 3)
REAL2 = domain(-3, 3, min_rank=2)  # for functions that use axis 1
POS = domain(0.2, 3)
NONZERO = domain(-3, 3, margin=0.3)
UNIT = domain(-0.9, 0.9)
INTS = domain(-50, 50, dtype=np.int32)


def named(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__name__ = name
    return fn


def case_id(value: Any) -> str:
    if isinstance(value, jax.extend.core.Primitive):
        return value.name
    if isinstance(value, Domain):
        return str(value)
    return getattr(value, "__name__", str(value))


rng = np.random.default_rng(42)
C23 = (rng.uniform(0.5, 2.0, (2, 3)) * rng.choice([-1, 1], (2, 3))).astype(np.float32)
A3 = (2 * np.eye(3) + 0.3 * rng.standard_normal((3, 3))).astype(np.float32)
A4 = (2 * np.eye(4) + 0.3 * rng.standard_normal((4, 4))).astype(np.float32)
BATCH_A = (2 * np.eye(3) + 0.3 * rng.standard_normal((2, 3, 3))).astype(np.float32)
L3 = np.tril(A3) + np.eye(3, dtype=np.float32)
A4_22 = A4.reshape(2, 2, 4)
PERM = np.array([2, 0, 1])
ZERO = np.float32(0)
PAD_INTERIOR = [(1, 2, 1), (0, 0, 2)]
PAD_NEGATIVE = [(0, 0, 0), (-1, 1, 0)]
solve_triangular = jax.scipy.linalg.solve_triangular
# JAX < 0.8 stages `x[:, ::2]` as a `gather`, later releases as a strided `slice`.
STRIDED_SLICE = any(
    e.primitive is lax.slice_p
    for e in jax.make_jaxpr(lambda x: x[::2])(np.ones(3)).jaxpr.eqns
)


def even_odd(x):
    if STRIDED_SLICE:
        return x[:, ::2], 2 * x[:, 1::2]
    return lax.slice(x, (0, 0), (2, 3), (1, 2)), 2 * lax.slice(
        x, (0, 1), (2, 3), (1, 2)
    )


# fmt: off
ELEMENTWISE_CASES = [
    (lax.neg_p, named("neg", lax.neg), REAL),
    (lax.exp_p, named("exp", jnp.exp), REAL),
    (lax.log_p, named("log", jnp.log), POS),
    (lax.tanh_p, named("tanh", jnp.tanh), domain(-2, 2)),
    # `abs` on its principal branch x >= 0.
    (lax.abs_p, named("abs", jnp.abs), POS),
    # Clamps, on their unsaturated range: the identity.
    (lax.max_p, named("max_lower_bound", lambda x: jnp.maximum(x, -5.0)), REAL),
    (lax.max_p, named("max_bound_first", lambda x: jnp.maximum(-5.0, x)), REAL),
    (lax.min_p, named("min_upper_bound", lambda x: jnp.minimum(x, 5.0)), REAL),
    (lax.clamp_p, named("clamp", lambda x: lax.clamp(-5.0, x, 5.0)), REAL),
    (lax.exp2_p, named("exp2", jnp.exp2), REAL),
    (lax.log1p_p, named("log1p", jnp.log1p), domain(-0.5, 3)),
    (lax.expm1_p, named("expm1", jnp.expm1), REAL),
    (lax.atanh_p, named("atanh", jnp.arctanh), UNIT),
    (lax.sinh_p, named("sinh", jnp.sinh), REAL),
    (lax.asinh_p, named("asinh", jnp.arcsinh), domain(-5, 5)),
    (lax.cosh_p, named("cosh", jnp.cosh), POS),
    (lax.acosh_p, named("acosh", lax.acosh), domain(1.2, 5)),
    (lax.sin_p, named("sin", jnp.sin), domain(-1.3, 1.3)),
    (lax.asin_p, named("asin", jnp.arcsin), UNIT),
    (lax.cos_p, named("cos", jnp.cos), domain(0.3, 2.8)),
    (lax.acos_p, named("acos", jnp.arccos), UNIT),
    (lax.tan_p, named("tan", jnp.tan), domain(-1.2, 1.2)),
    (lax.atan_p, named("atan", jnp.arctan), domain(-5, 5)),
    (lax.logistic_p, named("sigmoid", jax.nn.sigmoid), REAL),
    (lax.sqrt_p, named("sqrt", jnp.sqrt), POS),
    (lax.rsqrt_p, named("rsqrt", lax.rsqrt), POS),
    (lax.cbrt_p, named("cbrt", jnp.cbrt), NONZERO),
    (lax.square_p, named("square", jnp.square), POS),
    (lax.erf_p, named("erf", jax.scipy.special.erf), domain(-1.5, 1.5)),
    (lax.erfc_p, named("erfc", jax.scipy.special.erfc), domain(-1.5, 1.5)),
    (lax.erf_inv_p, named("erf_inv", jax.scipy.special.erfinv), UNIT),
    (lax.integer_pow_p, named("pow1", lambda x: lax.integer_pow(x, 1)), REAL),
    (lax.integer_pow_p, named("x**2", lambda x: x**2), POS),
    (lax.integer_pow_p, named("x**3", lambda x: x**3), NONZERO),
    (lax.integer_pow_p, named("x**4", lambda x: x**4), POS),
    (lax.integer_pow_p, named("x**5", lambda x: x**5), NONZERO),
    (lax.integer_pow_p, named("x**-1", lambda x: x**-1), NONZERO),
    (lax.integer_pow_p, named("x**-2", lambda x: x**-2), POS),
    (lax.integer_pow_p, named("x**-3", lambda x: x**-3), NONZERO),
    (lax.convert_element_type_p,
     named("to_f16", lambda x: x.astype(jnp.float16)), REAL),
    (lax.convert_element_type_p,
     named("to_bf16_to_f32", lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)),
     domain(-3, 3, quantize=jnp.bfloat16)),
    (lax.copy_p, named("copy", jnp.copy), REAL),
    (lax.reduce_precision_p,
     named("reduce_precision", lambda x: lax.reduce_precision(x, 8, 23)), REAL),
    (lax.stop_gradient_p, named("stop_gradient", lax.stop_gradient), REAL),
    (lax.device_put_p, named("device_put", jax.device_put), REAL),
    (lax.optimization_barrier_p,
     named("optimization_barrier", lax.optimization_barrier), REAL),
    (lax.not_p, named("not", lax.bitwise_not), INTS),
    (lax.xor_p, named("xor", lambda x: lax.bitwise_xor(x, jnp.int32(5))), INTS),
    (lax.add_p, named("x+c", lambda x: x + C23), REAL),
    (lax.add_p, named("2+x", lambda x: 2.0 + x), REAL),
    (lax.sub_p, named("x-2", lambda x: x - 2.0), REAL),
    (lax.sub_p, named("c-x", lambda x: C23 - x), REAL),
    (lax.mul_p, named("x*c", lambda x: x * C23), REAL),
    (lax.mul_p, named("-3*x", lambda x: -3.0 * x), REAL),
    (lax.div_p, named("x/c", lambda x: x / C23), REAL),
    (lax.div_p, named("x/-2", lambda x: x / -2.0), REAL),
    (lax.div_p, named("3/x", lambda x: 3.0 / x), NONZERO),
    (lax.div_p, named("c/x", lambda x: C23 / x), NONZERO),
    (lax.pow_p, named("x**2.5", lambda x: x**2.5), POS),
    (lax.pow_p, named("x**3.0", lambda x: lax.pow(x, np.float32(3))), NONZERO),
    (lax.pow_p, named("x**-1.0", lambda x: lax.pow(x, np.float32(-1))), NONZERO),
    (lax.pow_p, named("x**c", lambda x: x ** jnp.abs(C23)), POS),
    (lax.pow_p, named("2**x", lambda x: 2.0**x), REAL),
    (lax.pow_p, named("0.5**x", lambda x: 0.5**x), REAL),
    (lax.atan2_p, named("atan2(x,2)", lambda x: jnp.arctan2(x, 2.0)), REAL),
    (lax.atan2_p, named("atan2(x,-2)", lambda x: jnp.arctan2(x, -2.0)), REAL),
    (lax.atan2_p, named("atan2(1.5,x)", lambda x: jnp.arctan2(1.5, x)), REAL),
    (lax.atan2_p, named("atan2(-1.5,x)", lambda x: jnp.arctan2(-1.5, x)), REAL),
]

FIXED = dict(any_shape=False)
STRUCTURAL_CASES = [
    (lax.reshape_p, named("flatten", lambda x: x.reshape(-1)), REAL2),
    (lax.reshape_p,
     named("reshape_dims", lambda x: lax.reshape(x, (3, 2), dimensions=(1, 0))),
     domain(-3, 3, **FIXED)),
    (lax.squeeze_p, named("squeeze", lambda x: lax.squeeze(x, (0, 2))),
     domain(-3, 3, (1, 3, 1), **FIXED)),
    (lax.broadcast_in_dim_p, named("expand_dims", lambda x: jnp.expand_dims(x, 1)),
     REAL),
    (lax.transpose_p, named("T", lambda x: x.T), REAL2),
    (lax.transpose_p, named("transpose3",
                            lambda x: lax.transpose(x, (2, 0, 1))),
     domain(-3, 3, (2, 3, 4), **FIXED)),
    (lax.rev_p, named("flip", jnp.flip), REAL),
    (lax.concatenate_p, named("concat_known", lambda x: jnp.concatenate([C23, x])),
     domain(-3, 3, **FIXED)),
    (lax.concatenate_p, named("concat_two", lambda x: jnp.concatenate([x, 2 * x], 1)),
     REAL2),
    (lax.concatenate_p, named("roll", lambda x: jnp.roll(x, 1, axis=1)),
     domain(-3, 3, **FIXED)),
    (lax.slice_p, named("halves", lambda x: (x[:, :1], x[:, 1:])),
     domain(-3, 3, **FIXED)),
    (lax.slice_p, even_odd,
     domain(-3, 3, **FIXED)),
    (lax.split_p, named("split", lambda x: tuple(jnp.split(x, 3, axis=1))),
     domain(-3, 3, **FIXED)),
    (lax.dynamic_slice_p,
     named("dynamic_slices", lambda x: (lax.dynamic_slice(x, (0, 1), (2, 2)),
                                        lax.dynamic_slice_in_dim(x, -3, 1, 1))),
     domain(-3, 3, **FIXED)),
    (lax.dynamic_update_slice_p,
     named("dus_update", lambda x: lax.dynamic_update_slice(
         jnp.zeros((4, 5), x.dtype), x, (1, 2))),
     domain(-3, 3, **FIXED)),
    (lax.pad_p, named("jnp.pad", lambda x: jnp.pad(x, 1)), REAL),
    (lax.pad_p, named("pad_interior", lambda x: lax.pad(x, ZERO, PAD_INTERIOR)),
     domain(-3, 3, **FIXED)),
    (lax.pad_p, named("pad_negative",
                      lambda x: (lax.pad(x, ZERO, PAD_NEGATIVE), x[:, :1])),
     domain(-3, 3, **FIXED)),
    (lax.gather_p, named("x[perm]", lambda x: x[PERM]), domain(-3, 3, (3, 2), **FIXED)),
    (lax.gather_p, named("take_axis1", lambda x: jnp.take(x, PERM, axis=1)),
     domain(-3, 3, **FIXED)),
    (lax.gather_p,
     named("gather_pieces", lambda x: (x[:, np.array([2, 0])], x[:, np.array([1])])),
     domain(-3, 3, **FIXED)),
    (lax.gather_p,
     named("gather_scattered", lambda x: (x[np.array([3, 0])], x[np.array([1, 2])])),
     domain(-3, 3, (4, 2), **FIXED)),
    (lax.scatter_p,
     named("fill_tril", lambda x: jnp.zeros((3, 3)).at[np.tril_indices(3)].set(x)),
     domain(-3, 3, (6,), **FIXED)),
    (lax.scatter_add_p,
     named("add_at_columns",
           lambda x: jnp.ones((2, 4)).at[:, np.array([3, 0, 1])].add(x)),
     domain(-3, 3, (2, 3), **FIXED)),
    (lax.select_n_p,
     named("where_all", lambda x: jnp.where(jnp.ones(x.shape, bool), x, 0.0)), REAL),
    (lax.cumsum_p, named("cumsum", lambda x: jnp.cumsum(x, axis=-1)), REAL),
    (lax.cumsum_p, named("cumsum_rev", lambda x: lax.cumsum(x, 0, reverse=True)), REAL),
    (lax.cumprod_p, named("cumprod", lambda x: jnp.cumprod(x, axis=-1)), NONZERO),
    (lax.cumprod_p, named("cumprod_rev", lambda x: lax.cumprod(x, 0, reverse=True)),
     NONZERO),
    (lax.cumlogsumexp_p, named("cumlogsumexp", lambda x: lax.cumlogsumexp(x, 1)),
     REAL2),
    (lax.cumlogsumexp_p,
     named("cumlogsumexp_rev", lambda x: lax.cumlogsumexp(x, 0, reverse=True)), REAL),
]
if hasattr(lax, "stack_p"):  # JAX >= 0.8
    STRUCTURAL_CASES += [
        (lax.stack_p, named("stack", lambda x: jnp.stack([x, 2 * x])), REAL),
        (lax.unstack_p, named("unstack", lambda x: tuple(jnp.unstack(x))),
         domain(-3, 3, **FIXED)),
        (lax.tile_p, named("tile1", lambda x: jnp.tile(x, (1, 1))), REAL2),
    ]

class SPDDomain(Domain):
    """Symmetric positive definite matrices `x x^T / n + I` from uniform `x`."""

    def fix(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        n = x.shape[-1]
        spd = x @ np.swapaxes(x, -1, -2) / n + np.eye(n)
        return spd.astype(self.dtype)


LINALG_CASES = [
    (lax.dot_general_p, named("x@A", lambda x: x @ A3), domain(-3, 3, **FIXED)),
    (lax.dot_general_p, named("A@x", lambda x: A3 @ x), domain(-3, 3, (3, 2), **FIXED)),
    (lax.dot_general_p, named("A@vec", lambda x: A3 @ x), domain(-3, 3, (3,), **FIXED)),
    (lax.dot_general_p,
     named("batched", lambda x: jnp.einsum("bij,bjk->bik", BATCH_A, x)),
     domain(-3, 3, (2, 3, 4), **FIXED)),
    (lax.dot_general_p,
     named("conv1x1", lambda x: jnp.einsum("nhwc,cd->nhwd", x, A3)),
     domain(-3, 3, (1, 2, 2, 3), **FIXED)),
    (lax.dot_general_p,
     named("two_contracted", lambda x: jnp.einsum("ijk,jkl->il", x, A4_22)),
     domain(-3, 3, (3, 2, 2), **FIXED)),
    (jax.extend.core.primitives.triangular_solve_p,
     named("solve_lower", lambda x: solve_triangular(L3, x, lower=True)),
     domain(-3, 3, (3, 2), **FIXED)),
    (jax.extend.core.primitives.triangular_solve_p,
     named("solve_upper_trans",
           lambda x: solve_triangular(L3.T, x, lower=False, trans=1)),
     domain(-3, 3, (3, 2), **FIXED)),
    (jax.extend.core.primitives.triangular_solve_p,
     named("solve_right_unit", lambda x: lax.linalg.triangular_solve(
         L3, x, left_side=False, lower=True, unit_diagonal=True)),
     domain(-3, 3, (2, 3), **FIXED)),
    (lax.fft_p, named("rfft", jnp.fft.rfft), domain(-3, 3, (2, 6), **FIXED)),
    (jax.extend.core.primitives.cholesky_p, named("cholesky", jnp.linalg.cholesky),
     SPDDomain(-1, 1, (2, 3, 3), any_shape=False)),
]
# fmt: on

CASES = ELEMENTWISE_CASES + STRUCTURAL_CASES + LINALG_CASES
# fmt: off
CASES += [
    # Point gathers: a triangle's entries, then the other triangle's.
    (lax.gather_p,
     named("gather_points",
           lambda x: (x[np.tril_indices(3)], x[np.triu_indices(3, 1)])),
     domain(-3, 3, (3, 3), **FIXED)),
]
# fmt: on

# Primitives whose rule always raises `NotInvertibleError` naming them.
NOT_INVERTIBLE = [
    getattr(lax, f"{name}_p")
    for name in (
        "sign floor ceil round is_finite rem eq ne lt le gt ge "
        "and or shift_left shift_right_logical shift_right_arithmetic "
        "population_count clz real imag reduce_sum reduce_prod reduce_max "
        "reduce_min reduce_and reduce_or reduce_xor argmax argmin cummax cummin "
        "sort top_k"
    ).split()
]


# ---------------------------------------------------------------------------
# Calling rules on the equations of a traced function.


@dataclasses.dataclass
class Record:
    eqn: Any
    invals: list[Any]
    outvals: list[Any]
    unknown: list[bool]


def _sub_jaxpr(eqn: Any) -> Any:
    for key in ("jaxpr", "call_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None and hasattr(sub, "jaxpr"):
            return sub
    return None


def trace_records(fn: Callable[..., Any], x: Any) -> list[Record]:
    """Evaluate `fn`'s Jaxpr at `x`, inlining calls, recording each equation
    with its values and which operands depend on `x`."""
    closed = jax.make_jaxpr(fn)(x)
    records: list[Record] = []

    def run(jaxpr: Any, consts: list[Any], args: list[Any], taint: list[bool]):
        env: dict[Any, tuple[Any, bool]] = {}

        def read(v: Any) -> tuple[Any, bool]:
            if isinstance(v, jax.extend.core.Literal):
                return v.val, False
            return env[v]

        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = (c, False)
        for v, a, t in zip(jaxpr.invars, args, taint, strict=True):
            env[v] = (a, t)
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            vals = [a for a, _ in ins]
            marks = [t for _, t in ins]
            sub = _sub_jaxpr(eqn)
            if sub is not None:
                outs = run(sub.jaxpr, list(sub.consts), vals, marks)
            else:
                res = eqn.primitive.bind(*vals, **eqn.params)
                outs = list(res) if eqn.primitive.multiple_results else [res]
                outs = [(o, any(marks)) for o in outs]
                if any(marks):
                    records.append(Record(eqn, vals, [o for o, _ in outs], marks))
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    run(closed.jaxpr, list(closed.consts), [x], [True])
    return records


def call_rule(rec: Record, outvals: list[Any] | None = None) -> Any:
    rule = inverse_rules.lookup(rec.eqn)
    ins = [None if u else v for v, u in zip(rec.invals, rec.unknown, strict=True)]
    ctx = InverseContext.of(rec.eqn)
    return rule(
        ctx, rec.outvals if outvals is None else outvals, *ins, **rec.eqn.params
    )


def tolerance(*dtypes: Any) -> dict[str, float]:
    """Tolerances for the least precise of `dtypes`."""
    bits = min(
        jnp.finfo(d).bits if jnp.issubdtype(d, jnp.inexact) else 64 for d in dtypes
    )
    if bits <= 16:
        return dict(rtol=2e-2, atol=2e-2)
    if bits == 32:
        return dict(rtol=2e-4, atol=2e-4)
    return dict(rtol=1e-9, atol=1e-9)


def flat(values: list[Any]) -> Any:
    return jnp.concatenate([jnp.ravel(jnp.asarray(v)) for v in values])


def check_solved(rec: Record, *, jacobian: bool = True) -> None:
    """The rule gives the unknown operands back, with the ildj of its solution
    (checked against `slogdet(jacfwd)` if `jacobian`, else only finite)."""
    res = call_rule(rec)
    assert res is not None, f"{rec.eqn.primitive} returned None"
    assert not isinstance(res, PieceResult)
    solved, ildj = res
    unknown = [k for k, u in enumerate(rec.unknown) if u]
    dtypes = [jnp.result_type(v) for v in [*rec.invals, *rec.outvals]]
    for k in unknown:
        want = rec.invals[k]
        assert jnp.shape(solved[k]) == jnp.shape(want)
        assert jnp.result_type(solved[k]) == jnp.result_type(want)
        np.testing.assert_allclose(
            np.asarray(solved[k], np.float64),
            np.asarray(want, np.float64),
            **tolerance(*dtypes),
        )
    if jacobian:
        check_ildj(rec, unknown, ildj)
    else:
        assert jnp.ndim(ildj) == 0 and np.isfinite(float(ildj))


def check_ildj(rec: Record, unknown: list[int], ildj: Any) -> None:
    assert jnp.ndim(ildj) == 0
    outs = [o for o in rec.outvals if o is not None]
    dtypes = [jnp.result_type(v) for v in outs + [rec.invals[k] for k in unknown]]
    if any(jnp.issubdtype(d, jnp.complexfloating) for d in dtypes):
        # Real and imaginary parts: checked in test_inverse_linear.py.
        assert np.isfinite(float(ildj))
        return
    if not all(jnp.issubdtype(d, jnp.floating) for d in dtypes):
        assert float(ildj) == 0.0
        return
    shapes = [jnp.shape(o) for o in outs]
    sizes = [math.prod(s) for s in shapes]
    dtype = max((jnp.dtype(d) for d in dtypes), key=lambda d: d.itemsize)
    dtype = jnp.dtype(jnp.float32) if dtype.itemsize < 4 else dtype

    def solve(flat_y: Any) -> Any:
        parts = jnp.split(flat_y, np.cumsum(sizes)[:-1])
        ys = [
            p.reshape(s).astype(jnp.result_type(o))
            for p, s, o in zip(parts, shapes, outs, strict=True)
        ]
        solved, _ = call_rule(rec, ys)
        return flat([jnp.asarray(solved[k]).astype(dtype) for k in unknown])

    y = flat([jnp.asarray(o).astype(dtype) for o in outs])
    jac = np.asarray(jax.jit(jax.jacfwd(solve))(y))
    # Results the unknown operands do not depend on (beside known operands,
    # or padding) are not part of the map whose volume change the ildj is.
    jac = jac[:, np.any(jac != 0, axis=0)]
    assert jac.shape[0] == jac.shape[1], f"the inverse is not square: {jac.shape}"
    want = jnp.linalg.slogdet(jac)[1]
    tol = tolerance(*dtypes)
    np.testing.assert_allclose(float(ildj), float(want), rtol=tol["rtol"] * 10,
                               atol=tol["atol"] * 10 * jac.shape[0])  # fmt: skip


def check_rows(
    prim: Any, fn: Callable[..., Any], x: Any, *, jacobian: bool = True
) -> None:
    """Every equation of `prim` in `fn` inverts: whole operands directly,
    pieces once all of them are in."""
    records = trace_records(fn, x)
    assert any(r.eqn.primitive is prim for r in records), f"no `{prim}` in {fn}"
    pieces: dict[Any, list[Piece]] = {}
    truth: dict[Any, Any] = {}
    for rec in records:
        if rec.eqn.primitive is not prim and not _returns_pieces(rec):
            continue
        res = call_rule(rec)
        if isinstance(res, PieceResult) and res.ildj is not None:
            # Computed pieces (`cholesky`: the lower triangle of the operand,
            # the only part it reads): compared where they cover.
            for p in res.pieces:
                truth_p = np.asarray(rec.invals[p.operand])[p.index()]
                np.testing.assert_allclose(np.asarray(p.value), truth_p,
                                           rtol=1e-5, atol=1e-5)  # fmt: skip
            assert np.isfinite(float(res.ildj))
            continue
        if isinstance(res, PieceResult):
            for p in res.pieces:
                var = rec.eqn.invars[p.operand]
                pieces.setdefault(var, []).append(p)
                truth[var] = rec.invals[p.operand]
        else:
            check_solved(rec, jacobian=jacobian)
    for var, have in pieces.items():
        got = assemble(var.aval.shape, var.aval.dtype, have)
        assert got is not None, f"pieces do not cover {var}"
        np.testing.assert_array_equal(np.asarray(got), np.asarray(truth[var]))


def _returns_pieces(rec: Record) -> bool:
    pieces = (lax.slice_p, lax.dynamic_slice_p, lax.pad_p, lax.gather_p)
    return rec.eqn.primitive in pieces


# ---------------------------------------------------------------------------
# The table.


@pytest.mark.parametrize("prim, fn, domain", CASES, ids=case_id)
def test_rule_round_trip_and_ildj(prim, fn, domain):
    check_rows(prim, fn, domain.sample())


def test_every_registered_primitive_has_a_row():
    covered = {prim for prim, _, _ in CASES} | set(NOT_INVERTIBLE)
    higher_order = set(jaxinterp.higher_order_primitives())
    # `xla_pmap` (`jax.pmap` before JAX 0.10) needs several devices: its
    # inverse is checked in test_multidevice.py.
    higher_order.add(jaxinterp._jax_compat.pmap_p)
    # The host-local/global conversions of a multi-process `jax.pmap` need two
    # processes: test_multiprocess.py checks their inverses.
    higher_order |= {
        multihost_utils.host_local_array_to_global_array_p,
        multihost_utils.global_array_to_host_local_array_p,
    }
    missing = sorted(
        p.name for p in inverse_rules.primitives() - covered - higher_order
    )
    assert not missing, f"inverse rules without a test row: {missing}"


@pytest.mark.parametrize("prim", NOT_INVERTIBLE, ids=case_id)
def test_not_invertible_rules_raise_naming_the_primitive(prim):
    rule = inverse_rules.get(prim)
    assert rule is not None
    with pytest.raises(NotInvertibleError, match=re.escape(f"`{prim.name}`")):
        rule(BARE, [jnp.ones(3)], None, jnp.ones(3))


# ---------------------------------------------------------------------------
# Hypothesis: the laws on random shapes and values.

ANY_SHAPE = [c for c in CASES if c[2].any_shape]
# A few shapes of ranks 1 to 3: compiling for every new shape is what costs.
SHAPES = st.sampled_from([(1,), (4,), (3, 2), (2, 1, 3)])


@given(case=st.sampled_from(ANY_SHAPE), shape=SHAPES, data=st.data())
def test_property_round_trip_any_shape(case, shape, data):
    prim, fn, dom = case
    assume(len(shape) >= dom.min_rank)
    if fn.__name__ in ("x+c", "c-x", "x*c", "x/c", "c/x", "x**c"):
        shape = (2, 3)  # these close over a constant of this shape
    x = data.draw(dom.strategy(shape), label="x")
    check_rows(prim, fn, x, jacobian=False)


@given(
    shape=SHAPES,
    axis=st.integers(0, 2),
    cuts=st.lists(st.integers(0, 4), max_size=3),
    stride=st.integers(1, 3),
)
def test_property_assemble_covers_exactly(shape, axis, cuts, stride):
    axis = axis % len(shape)
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    n = shape[axis]
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    pieces = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        start, limit = [0] * len(shape), list(shape)
        start[axis], limit[axis] = lo, hi
        index = tuple(slice(a, b) for a, b in zip(start, limit, strict=True))
        pieces.append(Piece(0, tuple(start), tuple(limit), x[index]))
    np.testing.assert_array_equal(assemble(shape, jnp.float32, pieces), x)
    assert assemble(shape, jnp.float32, pieces[1:]) is None or len(bounds) == 2
    # Strided pieces: residues modulo `stride` along `axis`.
    strided = []
    for r in range(min(stride, n)):
        start, steps = [0] * len(shape), [1] * len(shape)
        start[axis], steps[axis] = r, stride
        index = tuple(slice(a, None, s) for a, s in zip(start, steps, strict=True))
        strided.append(Piece(0, tuple(start), tuple(shape), x[index], tuple(steps)))
    np.testing.assert_array_equal(assemble(shape, jnp.float32, strided), x)


@given(
    n=st.integers(1, 3),
    k=st.integers(1, 2),
    side=st.sampled_from(["lhs", "rhs"]),
    seed=st.integers(0, 2**16),
)
def test_property_dot_general_solves(n, k, side, seed):
    r = np.random.default_rng(seed)
    a = (2 * np.eye(n) + 0.3 * r.standard_normal((n, n))).astype(np.float32)
    x = r.standard_normal((k, n) if side == "lhs" else (n, k)).astype(np.float32)
    fn = (lambda x: x @ a) if side == "lhs" else (lambda x: a @ x)
    (rec,) = trace_records(fn, x)
    solved, ildj = call_rule(rec)
    np.testing.assert_allclose(solved[rec.unknown.index(True)], x, rtol=1e-4, atol=1e-4)
    want = -k * np.linalg.slogdet(a.astype(np.float64))[1]
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Targeted behaviour: branches, fallbacks and errors.


def _record(fn: Callable[..., Any], x: Any, prim: Any) -> Record:
    return next(r for r in trace_records(fn, x) if r.eqn.primitive is prim)


@pytest.mark.parametrize("n", [-3, -1, 3, 5])
def test_odd_powers_invert_negative_inputs_with_finite_ildj(n):
    x = np.array([-2.0, -0.5, 0.7, 1.5], np.float32)
    rec = _record(lambda x: x**n, x, lax.integer_pow_p)
    (solved,), ildj = call_rule(rec)
    np.testing.assert_allclose(solved, x, rtol=1e-5)
    assert np.isfinite(ildj)


def test_reciprocal_of_negative_inputs_has_finite_ildj():
    x = np.array([-2.0, -0.5], np.float32)
    rec = _record(lambda x: 3.0 / x, x, lax.div_p)
    (_, solved), ildj = call_rule(rec)
    np.testing.assert_allclose(solved, x, rtol=1e-6)
    # d/dy (3 / y) = -3 / y**2; y = 3 / x.
    want = np.sum(np.log(3.0) - 2 * np.log(np.abs(3.0 / x)))
    np.testing.assert_allclose(ildj, want, rtol=1e-5)


def test_even_power_returns_the_non_negative_branch():
    rec = _record(lambda x: x**2, np.array([-2.0, 3.0], np.float32), lax.integer_pow_p)
    (solved,), _ = call_rule(rec)
    np.testing.assert_allclose(solved, [2.0, 3.0])


def test_hand_written_inverses_agree():
    y = jnp.linspace(0.1, 0.9, 7)
    for fn, hand in [
        (jnp.exp, jnp.log),
        (jnp.sinh, jnp.arcsinh),
        (lambda x: x**3, jnp.cbrt),
        (jax.nn.sigmoid, jax.scipy.special.logit),
        (jnp.tan, jnp.arctan),
    ]:
        rec = _record(fn, hand(y), inverse_rules_prim(fn))
        (solved, *_), ildj = call_rule(rec, [y])
        np.testing.assert_allclose(solved, hand(y), rtol=1e-5, atol=1e-6)
        jac = jax.vmap(jax.grad(hand))(y)
        np.testing.assert_allclose(ildj, jnp.sum(jnp.log(jnp.abs(jac))), rtol=1e-4)


def inverse_rules_prim(fn: Callable[..., Any]) -> Any:
    (eqn,) = jax.make_jaxpr(fn)(1.0).jaxpr.eqns
    return eqn.primitive


def test_rules_stay_traceable_under_jit_and_vmap():
    x = jnp.linspace(-2.0, 2.0, 6).reshape(2, 3)
    rec = _record(lambda x: x**3, x, lax.integer_pow_p)

    def solve(y):
        (s,), ildj = call_rule(rec, [y])
        return s, ildj

    s, ildj = jax.jit(solve)(x**3)
    np.testing.assert_allclose(s, x, rtol=1e-5, atol=1e-6)
    s2, _ = jax.vmap(solve)(x**3)
    np.testing.assert_allclose(s2, x, rtol=1e-5, atol=1e-6)


def _raises(fn: Callable[..., Any], x: Any, prim: Any, match: str) -> None:
    rec = _record(fn, x, prim)
    with pytest.raises(NotInvertibleError, match=re.escape(match)):
        call_rule(rec)


def test_not_invertible_variants_say_why():
    x = np.ones((2, 3), np.float32)
    _raises(lambda x: x.astype(jnp.int32), x, lax.convert_element_type_p, "rounds")
    _raises(
        lambda x: jnp.broadcast_to(x, (4, 2, 3)), x, lax.broadcast_in_dim_p, "copies"
    )
    _raises(lambda x: x[jnp.array([0, 0])], x, lax.gather_p, "not a permutation")
    _raises(lambda x: x[jnp.array([0, 0]), :2], x, lax.gather_p, "whole slices")
    _raises(
        lambda x: jnp.where(jnp.array([True, False, True]), x, 1.0),
        x,
        lax.select_n_p,
        "discards case 1",
    )
    _raises(lambda x: lax.integer_pow(x, 0), x, lax.integer_pow_p, "exponent 0")
    _raises(lambda x: x @ np.ones((3, 2), np.float32), x, lax.dot_general_p, "square")
    _raises(
        lambda x: jnp.maximum(x.astype(jnp.int32), 0),
        x,
        lax.max_p,
        "`max` is not invertible: it discards the smaller operand (an integer",
    )
    if hasattr(lax, "tile_p"):
        _raises(lambda x: jnp.tile(x, (2, 1)), x, lax.tile_p, "copies")


def test_gather_of_part_windows_gives_the_elements_it_reads():
    # Rows permuted and one column dropped: the rule recovers the four
    # elements read and leaves the dropped column to the engine, which then
    # says which elements nothing determines.
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    fn = lambda x: x[jnp.array([1, 0]), :2]  # noqa: E731
    res = call_rule(_record(fn, x, lax.gather_p))
    assert isinstance(res, PieceResult)
    (piece,) = res.pieces
    np.testing.assert_array_equal(piece.mask, [[True, True, False]] * 2)
    np.testing.assert_array_equal(piece.value, x[:, :2].reshape(-1))
    with pytest.raises(NotInvertibleError, match=re.escape("not (0, 2), (1, 2)")):
        jaxinterp.inverse(fn, example_args=(x,))(fn(x))


def test_triangular_solve_for_the_matrix_is_not_invertible():
    b = np.ones((3, 2), np.float32)
    rec = _record(
        lambda a: jax.scipy.linalg.solve_triangular(a, b, lower=True),
        L3,
        jax.extend.core.primitives.triangular_solve_p,
    )
    with pytest.raises(NotInvertibleError, match="right-hand side"):
        call_rule(rec)


def test_rules_return_none_when_they_cannot_solve_yet():
    x = np.ones((2, 3), np.float32)
    rec = _record(lambda x: x + x, x, lax.add_p)
    assert call_rule(rec) is None  # both operands unknown
    rec = _record(lambda x: x.reshape(-1), x, lax.reshape_p)
    rule = inverse_rules.lookup(rec.eqn)
    assert rule(BARE, rec.outvals, None, **rec.eqn.params) is None  # no aval
    rec = _record(lambda x: lax.div(x[0, 0], jnp.full(3, 2.0, x.dtype)), x, lax.div_p)
    assert call_rule(rec) is None  # a broadcast scalar cannot be recovered


def test_rules_fall_back_without_avals():
    """Given no avals, rules use params and values."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert BARE.operand_aval(0) is None
    for fn, prim in [
        (lambda x: jnp.concatenate([C23, x]), lax.concatenate_p),
        (lambda x: jnp.expand_dims(x, 1), lax.broadcast_in_dim_p),
        (lambda x: jnp.pad(x, 1), lax.pad_p),
        (lambda x: jnp.take(x, PERM, axis=1), lax.gather_p),
    ]:
        rec = _record(fn, x, prim)
        ins = [None if u else v for v, u in zip(rec.invals, rec.unknown, strict=True)]
        rule = inverse_rules.lookup(rec.eqn)
        solved, _ = rule(BARE, rec.outvals, *ins, **rec.eqn.params)
        k = rec.unknown.index(True)
        np.testing.assert_array_equal(solved[k], rec.invals[k])


def test_split_with_a_dropped_result_gives_pieces():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    rec = _record(lambda x: tuple(jnp.split(x, 3, axis=1)), x, lax.split_p)
    res = call_rule(rec, [rec.outvals[0], None, rec.outvals[2]])
    assert isinstance(res, PieceResult)
    assert [(p.start, p.limit) for p in res.pieces] == [
        ((0, 0), (2, 1)),
        ((0, 2), (2, 3)),
    ]
    assert assemble((2, 3), jnp.float32, res.pieces) is None


def test_dynamic_update_slice_gives_the_operand_outside_the_update():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    upd = np.full((2, 2), -1.0, np.float32)
    rec = _record(lambda x: lax.dynamic_update_slice(x, upd, (1, 2)), x,
                  lax.dynamic_update_slice_p)  # fmt: skip
    res = call_rule(rec)
    assert isinstance(res, PieceResult)
    assert assemble((4, 5), jnp.float32, res.pieces) is None  # the hole remains
    hole = Piece(0, (1, 2), (3, 4), x[1:3, 2:4])
    np.testing.assert_array_equal(assemble((4, 5), jnp.float32, [*res.pieces, hole]), x)


def test_select_n_with_a_traced_predicate_marks_discarded_elements_nan():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    pred = np.array([True, False, True])
    rec = _record(
        lambda x: lax.select_n(pred, jnp.zeros(3, x.dtype), x), x, lax.select_n_p
    )
    rule = inverse_rules.lookup(rec.eqn)
    solved = jax.jit(lambda y, p: rule(BARE, [y], p, rec.invals[1], None)[0][2])(
        rec.outvals[0], pred
    )
    np.testing.assert_array_equal(solved, [1.0, np.nan, 3.0])


def test_assemble_is_traceable():
    x = jnp.arange(12.0).reshape(3, 4)

    def rebuild(x):
        pieces = [Piece(0, (0, 0), (3, 4), x[:, ::2], (1, 2)),
                  Piece(0, (0, 1), (3, 4), x[:, 1::2], (1, 2))]  # fmt: skip
        return assemble((3, 4), x.dtype, pieces)

    np.testing.assert_array_equal(jax.jit(rebuild)(x), x)
    np.testing.assert_array_equal(jax.vmap(rebuild)(x[None])[0], x)


def test_softplus_jaxpr_is_logaddexp_custom_jvp():
    """Pins what `jax.nn.softplus` stages (the engine inverts it by name)."""
    jaxpr = jax.make_jaxpr(jax.nn.softplus)(1.0).jaxpr
    (eqn,) = jaxpr.eqns
    assert eqn.params["name"] == "softplus"
    (inner,) = eqn.params["jaxpr"].jaxpr.eqns
    if inner.primitive.name == "call_hi_primitive":  # JAX's hijax flags
        hi = jaxinterp.hijax_params(inner)
        assert hi.kind == "custom_jvp"
        body = getattr(hi.body, "jaxpr", hi.body)
    else:
        assert inner.primitive.name == "custom_jvp_call"
        body = inner.params["call_jaxpr"].jaxpr
    # The name is not a param: it is only in the body's debug info.
    assert body.debug_info.func_src_info.startswith("logaddexp ")
    body = [e.primitive.name for e in body.eqns]
    assert "max" in body and "log1p" in body and "select_n" in body


# ---------------------------------------------------------------------------
# float64.


F64_CASES = [
    (lax.integer_pow_p, lambda x: x**-3, NONZERO),
    (lax.div_p, lambda x: 3.0 / x, NONZERO),
    (lax.atanh_p, jnp.arctanh, UNIT),
    (lax.erf_inv_p, jax.scipy.special.erfinv, UNIT),
    (lax.cumlogsumexp_p, lambda x: lax.cumlogsumexp(x, 1), REAL),
    (lax.dot_general_p, lambda x: x @ A3.astype(np.float64), REAL),
    (lax.convert_element_type_p, lambda x: x.astype(jnp.float32), REAL),
]


@pytest.mark.skipif(not X64, reason="needs JAX_ENABLE_X64=1 (run by the next test)")
@pytest.mark.parametrize("prim, fn, domain", F64_CASES, ids=case_id)
def test_float64_rules(prim, fn, domain):
    x = domain.sample().astype(np.float64)
    check_rows(prim, fn, x)


@pytest.mark.slow
@pytest.mark.skipif(X64, reason="x64 is on: test_float64_rules runs directly")
def test_float64_rules_in_subprocess():
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "-k", "test_float64_rules and not subprocess", "-W", "error::UserWarning"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(F64_CASES)} passed" in proc.stdout


# ---------------------------------------------------------------------------
# End to end through `jaxinterp.inverse_and_ildj`.


@functools.cache
def _engine_passes_avals() -> bool:
    """Probe: a conversion needs the operand's dtype, from `ctx.operand_aval`."""
    probe = jaxinterp.inverse(
        lambda x: x.astype(jnp.float16),
        example_args=(jax.ShapeDtypeStruct((3,), jnp.float32),),
    )
    return probe(jnp.ones(3, jnp.float16)).dtype == jnp.float32


@functools.cache
def _engine_folds_constants() -> bool:
    """Probe: gather pieces need the (computed) indices to be concrete."""
    fn = lambda x: (x[np.array([0])], x[np.array([1])])  # noqa: E731
    try:
        jaxinterp.inverse(fn, example_args=(jnp.ones(2),))(fn(jnp.ones(2)))
    except NotInvertibleError:
        return False
    return True


NEEDS_CONCRETE_INDICES = {"gather_pieces", "gather_scattered", "gather_points"}
NEEDS_AVALS = {"flatten", "reshape_dims", "concat_two", "roll", "to_f16",
               "to_bf16_to_f32", "dus_update"}  # fmt: skip


@pytest.mark.skipif(not HAS_INVERSE, reason="`jaxinterp.inverse` has not landed")
@pytest.mark.parametrize("prim, fn, domain", CASES, ids=case_id)
def test_inverse_end_to_end(prim, fn, domain):
    if fn.__name__ in NEEDS_AVALS and not _engine_passes_avals():
        pytest.skip("the engine does not pass avals to rules yet")
    if fn.__name__ in NEEDS_CONCRETE_INDICES and not _engine_folds_constants():
        pytest.skip(
            "the engine traces the index arithmetic, so gather indices are not "
            "concrete (evaluate constant equations under "
            "`jax.ensure_compile_time_eval()` to enable gather pieces)"
        )
    x = jnp.asarray(domain.sample(seed=1))
    y = fn(x)
    got, ildj = jaxinterp.inverse_and_ildj(fn, example_args=(x,))(y)
    tol = tolerance(x.dtype, *(leaf.dtype for leaf in jax.tree.leaves(y)))
    np.testing.assert_allclose(np.asarray(got, np.float64),
                               np.asarray(x, np.float64), **tol)  # fmt: skip
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(y)):
        return  # non-square (rfft): its ildj is checked in test_inverse_linear.py
    if fn.__name__ == "cholesky":
        return  # free coordinates (lower triangles): test_inverse_linear.py
    inv = jaxinterp.inverse(fn, example_args=(x,))
    flat_y, unravel = jax.flatten_util.ravel_pytree(y)
    jac = jax.jit(jax.jacfwd(lambda t: jnp.ravel(inv(unravel(t)))))(flat_y)
    if jac.shape[0] == jac.shape[1]:
        want = jnp.linalg.slogdet(jac.astype(jnp.float32))[1]
        atol = 10 * tol["atol"] * jac.shape[0]
        np.testing.assert_allclose(
            float(ildj), float(want), rtol=10 * tol["rtol"], atol=atol
        )


@pytest.mark.skipif(not HAS_INVERSE, reason="`jaxinterp.inverse` has not landed")
def test_pieces_and_solves_compose_with_jit_vmap_grad():
    """Even/odd halves (pieces), a 1x1 mixing (`dot_general`) and a cumsum,
    inverted under `jit(vmap(...))` and differentiated."""

    def flow(x):
        even, odd = lax.slice(x, (0,), (4,), (2,)), lax.slice(x, (1,), (4,), (2,))
        odd = odd * jnp.exp(jnp.tanh(even)) + even
        mixed = jnp.concatenate([even, odd]).reshape(2, 2) @ A3[:2, :2]
        return jnp.cumsum(mixed.reshape(-1))

    xs = jnp.asarray(REAL.sample(seed=3, shape=(3, 4)))
    ys = jax.vmap(flow)(xs)
    inv = jaxinterp.inverse(flow, example_args=(xs[0],))
    np.testing.assert_allclose(jax.jit(jax.vmap(inv))(ys), xs, rtol=1e-4, atol=1e-4)
    jax.test_util.check_grads(inv, (ys[0],), order=1, modes=["rev"], atol=1e-2)


# ---------------------------------------------------------------------------
# The rule signature: `rule(ctx, outvals, *invals, **params)`.


def test_rules_get_the_avals_and_the_ildj_flag_explicitly():
    seen = []
    rules = jaxinterp.InverseRuleRegistry("probe", parent=inverse_rules)

    @rules.register(lax.exp_p, override=True)
    def exp_inverse(ctx, outvals, x, **params):
        seen.append((ctx.in_avals, ctx.out_avals, ctx.want_ildj))
        (y,) = outvals
        return [jnp.log(y)], (-jnp.sum(jnp.log(y)) if ctx.want_ildj else 0.0)

    walker = jaxinterp._inverse._engine.InverseWalker(rules)
    closed = jax.make_jaxpr(jnp.exp)(jnp.ones((2, 3)))
    y = jnp.exp(jnp.ones((2, 3)))
    for wanted in (True, False):
        sol = walker.solve(closed.jaxpr, closed.consts, [None], [y], want_ildj=wanted)
        np.testing.assert_allclose(sol.invals[0], np.ones((2, 3)), rtol=1e-6)
        np.testing.assert_allclose(sol.ildj, -6.0 if wanted else 0.0, rtol=1e-6)
    assert [(tuple(a.shape for a in i), tuple(o.shape for o in out), w)
            for i, out, w in seen] == [(((2, 3),), ((2, 3),), True),
                                       (((2, 3),), ((2, 3),), False)]  # fmt: skip


def test_a_rule_of_the_old_signature_is_adapted_with_a_deprecation_warning():
    from jaxinterp._inverse._rules import ildj_wanted, operand_aval

    rules = jaxinterp.InverseRuleRegistry("old", parent=inverse_rules)
    seen = []

    def old_exp_inverse(outvals, x, **params):
        seen.append((operand_aval(0).shape, ildj_wanted()))
        return [jnp.log(outvals[0])], 0.0

    with pytest.warns(DeprecationWarning, match="has the old signature"):
        rules.register(lax.exp_p, old_exp_inverse, override=True)
    walker = jaxinterp._inverse._engine.InverseWalker(rules)
    closed = jax.make_jaxpr(jnp.exp)(jnp.ones(3))
    sol = walker.solve(
        closed.jaxpr, closed.consts, [None], [jnp.ones(3)], want_ildj=False
    )
    np.testing.assert_allclose(sol.invals[0], np.zeros(3), atol=1e-7)
    assert seen == [((3,), False)]
    assert operand_aval(0) is None  # only inside the adapted call


def test_built_in_rules_take_the_context_and_never_read_the_legacy_context_vars():
    # Built-in rules read avals and "ildj wanted" from `ctx`; the ContextVars
    # behind `operand_aval()` / `ildj_wanted()` serve adapted rules of the 0.1
    # signature only, so only their own helpers may touch them.
    import ast
    from pathlib import Path

    from jaxinterp._inverse._rules import _takes_context

    for prim in inverse_rules:
        rule = inverse_rules.get(prim)
        assert _takes_context(rule), f"the rule for `{prim}` has the old signature"
        assert not hasattr(rule, "__wrapped__"), f"`{prim}`'s rule is adapted"
    legacy = {"_WANT_ILDJ", "_AVALS", "ildj_wanted", "operand_aval"}
    helpers = {"ildj_wanted", "operand_aval", "_legacy_context"}
    uses = []
    for path in sorted(Path(jaxinterp.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for top in tree.body:
            if getattr(top, "name", None) in helpers:
                continue
            for node in ast.walk(top):
                name = node.id if isinstance(node, ast.Name) else None
                is_target = isinstance(top, ast.AnnAssign | ast.Assign)
                if name in legacy and not is_target:
                    uses.append(f"{path.name}:{node.lineno} {name}")
    assert uses == []


def test_an_output_emptied_by_negative_padding_is_refused_not_crashed():
    # The recomputation check must not take `max` of an empty operand
    # (numpy's "zero-size array" error): the empty output is a refusal.
    def f(x):
        return jnp.tanh(lax.pad(x, jnp.float32(0.5), [(-1, -1, 0), (0, 1, 0)]))

    x = jnp.array([[-0.86, -0.51], [-0.66, -0.41]], jnp.float32)
    assert f(x).size == 0
    with pytest.raises(NotInvertibleError, match="Blocked at `pad`"):
        jaxinterp.inverse(f, example_args=(x,))(f(x))
