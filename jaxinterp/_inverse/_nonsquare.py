"""Non-square linear blocks: more results than unknowns (see `_blocks.py`).

A vector filled into a triangular matrix, then its diagonal transformed,
is a linear map onto a subspace: the results hold the unknowns redundantly.
`least_squares` recovers the unknowns from the results and gives the ildj of
a map onto its image, `-0.5 log det(J^T J)` (the area formula: 0 for a map
that copies each unknown to some results); the caller checks the residual,
so a result off the image (a non-zero above the diagonal) gives NaN.
`cut_shared` lets a linear block stop below values that its unknowns share,
so that `fill(x[:-n]) + diag(exp(x[-n:]))` is a block in `x[:-n]` and
`exp(x[-n:])`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat

_Literal = compat.Literal


def least_squares(jac: Any, rhs: Any) -> tuple[Any, Any, Any]:
    """`u` minimizing `|jac u - rhs|` for a tall `jac` (m > n), by a QR
    factorization `jac = QR`; `-0.5 log det(jac^T jac) = -sum(log|diag R|)`;
    and whether `jac` has full column rank (else `u` is meaningless: the
    caller makes it NaN)."""
    m = jac.shape[0]
    eps = jnp.finfo(jnp.result_type(jac)).eps
    q, r = jnp.linalg.qr(jac)
    diag = jnp.abs(jnp.diagonal(r))
    full_rank = jnp.min(diag) > m * eps * jnp.max(diag)
    # A rank-deficient `R` gets ones added to its diagonal, so the solve
    # stays finite (its answer is discarded) and gradients stay NaN-free.
    safe = r + jnp.where(full_rank, 0.0, 1.0).astype(r.dtype) * jnp.eye(
        r.shape[0], dtype=r.dtype
    )
    u = lax.linalg.triangular_solve(
        safe, (q.T @ rhs)[:, None], left_side=True, lower=False
    )[:, 0]
    return u, -jnp.sum(jnp.log(diag)), full_rank


def cut_shared(
    region: set[int],
    leaves: set[Any],
    grow: Callable[..., tuple[set[int], set[Any]]],
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
) -> tuple[set[int], set[Any]]:
    """A linear region whose leaves depend on one another (fill-triangular of
    `x[:-n]` plus a diagonal `exp(x[-n:])`: the block grows up to `x`, which
    `exp`'s operand also reads) regrown to stop below the shared ancestors:
    its leaves are then `x[:-n]` and `exp(...)`, solved as free values and
    the rest left to the engine. The region as is when that does not help."""
    from ._blocks import independent  # (`_blocks` imports this module)

    shared: set[Any] = set()
    for leaf in leaves:
        todo = [leaf]
        while todo:
            p = producer.get(todo.pop())
            if p is None:
                continue
            for u in eqns[p].invars:
                if type(u) is not _Literal and not known(u) and u not in shared:
                    shared.add(u)
                    todo.append(u)
    if not shared & leaves:
        return region, leaves
    cut_region, cut_leaves = grow(shared=frozenset(shared))
    if len(cut_leaves) > 1 and not independent(
        sorted(cut_leaves, key=lambda v: producer.get(v, -1)),
        cut_region,
        eqns,
        producer,
        known,
    ):
        return region, leaves
    return cut_region, cut_leaves


def determined(block: Any, known: Sequence[Any]) -> bool:
    """Whether a linear block's results determine its unknowns: its matrix
    has full column rank. Checked now when the matrix is a constant; a traced
    one is checked by the solve (NaN)."""
    from ._blocks import linear_matrix

    if any(compat.is_tracer(k) for k in known) or compat.in_manual_body():
        return True
    # The matrix does not depend on the values known in parts: zeros
    # there keep it a constant.
    zeros = {
        v: (np.zeros(np.shape(base), base.dtype), idx)
        for v, (base, idx) in block.partial.items()
    }
    with jax.ensure_compile_time_eval():
        jac, _ = linear_matrix(dataclasses.replace(block, partial=zeros), known)
    if compat.is_tracer(jac):
        return True
    jac = np.asarray(jac)
    return bool(np.linalg.matrix_rank(jac) == jac.shape[1])
