"""Inverse rules for linear and triangular maps: `dot_general` with a known
square operand (`x @ A`, `A @ x`, `einsum`, 1x1 convolutions over channels),
`triangular_solve` with a known matrix or a known triangular right-hand side
(`x^-1 = triangular_solve(x, I)`), and the cumulative reductions `cumsum`,
`cumprod` and `cumlogsumexp`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.extend.core.primitives as jex_prims
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from ._ildj import total
from ._rounding import agree_recomputed
from ._rules import InverseContext, MaskedPiece, PieceResult, inverse_rules

BOTH_UNKNOWN = (
    "`dot_general` of two unknown operands is not inverted: a product such as "
    "`L @ L.T` has many factors (a matrix square root is not unique: `L @ Q` "
    "for any orthogonal `Q`, or a sign flip of a column of a triangular "
    "factor). A factor triangular by construction (`L = jnp.tril(z)`, or a "
    "batch of them on leading axes, "
    "or `triangular_solve(z, I)`) is taken as the Cholesky factor (reversed, "
    "for an upper one), its principal branch; otherwise "
    "give the function a `@jaxinterp.custom_inverse` (`jnp.linalg.cholesky(y)` "
    "when `L` is lower triangular with a positive diagonal)"
)


def _argsort(order: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=lambda k: order[k]))


@inverse_rules.register(lax.dot_general_p)
def _dot_general_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    lhs: Any,
    rhs: Any,
    *,
    dimension_numbers: Any,
    **params: Any,
) -> Any:
    """Solve `y = dot_general(x, A)` (or `(A, x)`) for `x` given `A`.

    The map is invertible when, per batch element, `A`'s contracted dimensions
    and its free (neither contracted nor batch) dimensions have the same total
    size `n` and that `n x n` matrix is non-singular. Then `x` follows from
    `jnp.linalg.solve`, and the ildj is `-k * log|det A|` summed over batch
    elements, where `k` is the number of right-hand sides (the size of `x`'s
    free dimensions).
    """
    (y,) = outvals
    if lhs is None and rhs is None:
        raise NotInvertibleError(BOTH_UNKNOWN)
    if lhs is not None and rhs is not None:
        return None
    (lc, rc), (lb, rb) = dimension_numbers
    x_is_lhs = lhs is None
    a = jnp.asarray(rhs if x_is_lhs else lhs)
    x_contract, a_contract = (tuple(lc), tuple(rc)) if x_is_lhs else (rc, lc)
    x_batch, a_batch = (tuple(lb), tuple(rb)) if x_is_lhs else (rb, lb)
    x_contract, a_contract = tuple(x_contract), tuple(a_contract)
    x_batch, a_batch = tuple(x_batch), tuple(a_batch)
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise NotInvertibleError("`dot_general` of integers is not inverted.")

    a_free = tuple(d for d in range(a.ndim) if d not in a_contract and d not in a_batch)
    shape = jnp.shape(y)
    nb = len(x_batch)
    batch_shape = shape[:nb]
    if x_is_lhs:
        x_free_shape = shape[nb : len(shape) - len(a_free)]
    else:
        x_free_shape = shape[nb + len(a_free) :]
    contract_shape = tuple(a.shape[d] for d in a_contract)
    free_size = math.prod(a.shape[d] for d in a_free)
    n = math.prod(contract_shape)
    if n != free_size:
        raise NotInvertibleError(
            f"`dot_general` maps {n} contracted values to {free_size} outputs per "
            "right-hand side; only a square known operand is invertible."
        )
    batch = math.prod(batch_shape)
    k = math.prod(x_free_shape)
    a = a.astype(dtype)
    rank = nb + len(contract_shape) + len(x_free_shape)
    x_free = _free_dims(x_batch, x_contract, rank)
    if x_is_lhs:
        # Y_b (k, n) = X_b (k, n) @ M_b (n, n):  X_b^T = solve(M_b^T, Y_b^T).
        m = lax.transpose(a, a_batch + a_contract + a_free).reshape(batch, n, n)
        rhs_t = jnp.swapaxes(jnp.reshape(y, (batch, k, n)), -1, -2)
        x = jnp.swapaxes(jnp.linalg.solve(jnp.swapaxes(m, -1, -2), rhs_t), -1, -2)
        x = x.reshape(batch_shape + x_free_shape + contract_shape)
        layout = x_batch + x_free + x_contract
    else:
        # Y_b (n, k) = M_b (n, n) @ X_b (n, k).
        m = lax.transpose(a, a_batch + a_free + a_contract).reshape(batch, n, n)
        x = jnp.linalg.solve(m, jnp.reshape(y, (batch, n, k)))
        x = x.reshape(batch_shape + contract_shape + x_free_shape)
        layout = x_batch + x_contract + x_free
    x = lax.transpose(x, _argsort(layout))
    aval = ctx.operand_aval(0 if x_is_lhs else 1)
    if aval is not None:
        x = lax.convert_element_type(x, aval.dtype)
    ildj = -k * total(jnp.linalg.slogdet(m)[1]) if ctx.want_ildj else 0.0
    return ([x, rhs] if x_is_lhs else [lhs, x]), ildj


def _free_dims(
    batch: tuple[int, ...], contract: tuple[int, ...], rank: int
) -> tuple[int, ...]:
    return tuple(d for d in range(rank) if d not in batch and d not in contract)


def _triangle(a: Any, lower: bool, unit_diagonal: bool) -> Any:
    """The triangle of `a` that `triangular_solve` reads."""
    tri = jnp.tril(a) if lower else jnp.triu(a)
    if unit_diagonal:
        eye = jnp.eye(a.shape[-1], dtype=bool)
        tri = jnp.where(eye, jnp.ones((), a.dtype), tri)
    return tri


@inverse_rules.register(jex_prims.triangular_solve_p)
def _triangular_solve_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    a: Any,
    b: Any,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool,
    conjugate_a: bool,
    unit_diagonal: bool,
    **params: Any,
) -> Any:
    """`y = op(a)^-1 b` (or `b op(a)^-1`) for `b`: multiply back by `op(a)`,
    reading only the triangle of `a` that the solve read (ildj: `k` times
    `log|diag(a)|`, summed, with `k` right-hand sides)."""
    (y,) = outvals
    if a is None and b is None:
        raise NotInvertibleError(
            "`triangular_solve` is inverted for its right-hand side, with a "
            "known matrix, or for its matrix, with a known right-hand side."
        )
    if a is None:
        flags = compat.TriangularSolveParams(
            left_side, lower, transpose_a, conjugate_a, unit_diagonal
        )
        return _matrix_inverse(ctx, y, b, flags)
    if b is not None:
        return None
    a = jnp.asarray(a)
    tri = _triangle(a, lower, unit_diagonal)
    op = jnp.swapaxes(tri, -1, -2) if transpose_a else tri
    if conjugate_a:
        op = jnp.conj(op)
    hi = lax.Precision.HIGHEST
    solved = (
        jnp.matmul(op, y, precision=hi)
        if left_side
        else jnp.matmul(y, op, precision=hi)
    )
    if unit_diagonal or not ctx.want_ildj:
        ildj: Any = 0.0
    else:
        k = jnp.shape(y)[-1] if left_side else jnp.shape(y)[-2]
        diag = jnp.diagonal(a, axis1=-2, axis2=-1)
        ildj = k * total(lax.log(lax.abs(diag)))
    if not unit_diagonal:
        # A zero on the diagonal divides by zero: the solve gives no finite
        # `y` at all (every one is off the image), not `op(a) @ y`.
        singular = jnp.any(jnp.diagonal(a, axis1=-2, axis2=-1) == 0, axis=-1)
        nan = jnp.asarray(jnp.nan, solved.dtype)
        solved = jnp.where(singular[..., None, None], nan, solved)
        if ctx.want_ildj:
            ildj = jnp.where(jnp.any(singular), jnp.nan, ildj)
    return [a, solved], ildj


def _matrix_inverse(
    ctx: InverseContext, y: Any, b: Any, flags: compat.TriangularSolveParams
) -> PieceResult:
    """`y = op(a)^-1 b` (or `b op(a)^-1`) for the matrix `a`, with `b` a
    known constant, square, triangular like `op(a)` and non-singular (`y` is
    then triangular like it): `op(a) = b y^-1` (or `y^-1 b`), solved reading
    only `y`'s triangle. Only the triangle of `a` the solve reads is
    determined: it is the piece given (the other stays unknown, see
    `_gram.fill_step`). The triangle is solved into `a` and recomputed: a `y`
    off the image (not triangular, a diagonal with a zero) gives NaN. The
    ildj is over the triangles of `y` and `a` (a map `X -> A X C` of
    triangular matrices scales `X_ij` by `A_ii C_jj`)."""
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise NotInvertibleError(
            "`triangular_solve` is inverted for its matrix for real values only."
        )
    if flags.unit_diagonal:
        raise NotInvertibleError(
            "`triangular_solve` with `unit_diagonal=True` is not inverted for its "
            "matrix."
        )
    if compat.is_tracer(b):
        raise NotInvertibleError(
            "`triangular_solve` is inverted for its matrix only with a constant "
            "right-hand side (known when the inverse is traced)."
        )
    rhs = np.asarray(b)
    n = rhs.shape[-1]
    op_lower = flags.lower != flags.transpose_a
    triangle = np.tril if op_lower else np.triu
    if (
        rhs.ndim < 2
        or rhs.shape[-2] != n
        or np.shape(y)[-2:] != (n, n)
        or not np.all(rhs == triangle(rhs))
        or np.any(np.diagonal(rhs, axis1=-2, axis2=-1) == 0)
    ):
        side = "lower" if op_lower else "upper"
        raise NotInvertibleError(
            "`triangular_solve` is inverted for its matrix only with a square, "
            f"non-singular right-hand side {side} triangular like the matrix "
            "solved with (the identity for an inverse): then the matrix is "
            "determined, and the result triangular."
        )
    rhs_j = jnp.asarray(rhs, dtype)
    # `op(a) y = b`: `op(a) = b y^-1`, a solve from the other side (and so
    # for `y op(a) = b`); it reads `y`'s triangle only.
    op = lax.linalg.triangular_solve(
        y, rhs_j, left_side=not flags.left_side, lower=op_lower
    )
    matrix = jnp.swapaxes(op, -1, -2) if flags.transpose_a else op
    shape = jnp.shape(matrix)
    read_triangle = (np.tril if flags.lower else np.triu)(np.ones(shape[-2:], bool))
    mask = np.array(np.broadcast_to(read_triangle, shape))
    read = jnp.where(mask, matrix, jnp.zeros((), dtype))

    def solve(m: Any) -> list[Any]:
        return [
            lax.linalg.triangular_solve(
                m,
                rhs_j,
                left_side=flags.left_side,
                lower=flags.lower,
                transpose_a=flags.transpose_a,
                conjugate_a=flags.conjugate_a,
            )
        ]

    ok = agree_recomputed(solve, [read], [y]) & jnp.all(jnp.isfinite(matrix))
    value = jnp.ravel(matrix)[np.flatnonzero(mask)]
    value = jnp.where(ok, value, jnp.asarray(jnp.nan, dtype))
    ildj: Any = 0.0
    if ctx.want_ildj:
        rows = jnp.arange(n)
        # `X -> A X C` on lower triangles: `prod A_ii^(i+1) C_jj^(n-j)`
        # (reversed on upper ones).
        left_w, right_w = (rows + 1, n - rows) if op_lower else (n - rows, rows + 1)
        log_op = jnp.log(jnp.abs(jnp.diagonal(op, axis1=-2, axis2=-1)))
        log_y = jnp.log(jnp.abs(jnp.diagonal(y, axis1=-2, axis2=-1)))
        if flags.left_side:  # d op = -op dy y^-1
            terms = left_w * log_op - right_w * log_y
        else:  # d op = -y^-1 dy op
            terms = right_w * log_op - left_w * log_y
        ildj = total(terms.astype(dtype))
    return PieceResult([MaskedPiece(0, mask, value)], ildj)


# ---------------------------------------------------------------------------
# Cumulative reductions: triangular maps (`cumsum` is a product with a
# triangular matrix of ones; `cumprod` and `cumlogsumexp` are triangular too).


def _shifted(y: Any, axis: int, reverse: bool, fill: Any) -> Any:
    """`y` shifted by one along `axis` (towards the end, or the start if
    `reverse`), with `fill` in the vacated place."""
    config = [(0, 0, 0)] * jnp.ndim(y)
    config[axis] = (-1, 1, 0) if reverse else (1, -1, 0)
    return lax.pad(y, jnp.asarray(fill, jnp.result_type(y)), config)


@inverse_rules.register(lax.cumsum_p)
def _cumsum_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, axis: int, reverse: bool
):
    """Differences along the axis (unit triangular: ildj 0)."""
    if x is not None:
        return None
    (y,) = outvals
    return [y - _shifted(y, axis, reverse, 0)], 0.0


@inverse_rules.register(lax.cumprod_p)
def _cumprod_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, axis: int, reverse: bool
):
    """Ratios along the axis; the operand must have no zeros."""
    if x is not None:
        return None
    (y,) = outvals
    if not jnp.issubdtype(jnp.result_type(y), jnp.inexact):
        raise NotInvertibleError("`cumprod` of integers is not inverted.")
    prev = _shifted(y, axis, reverse, 1)
    return [y / prev], (-total(lax.log(lax.abs(prev))) if ctx.want_ildj else 0.0)


@inverse_rules.register(lax.cumlogsumexp_p)
def _cumlogsumexp_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, axis: int, reverse: bool
) -> Any:
    """`x = y + log(1 - exp(prev - y))` where `prev` is the previous partial sum."""
    if x is not None:
        return None
    (y,) = outvals
    prev = _shifted(y, axis, reverse, -math.inf)
    log_gap = lax.log(-lax.expm1(prev - y))
    return [y + log_gap], (-total(log_gap) if ctx.want_ildj else 0.0)
