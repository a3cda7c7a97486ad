"""Non-square linear blocks: more results than unknowns (see `_blocks.py`).

A vector filled into a triangular matrix, then its diagonal transformed,
is a linear map onto a subspace: the results hold the unknowns redundantly.
`least_squares` recovers the unknowns from the results and gives the ildj of
a map onto its image, `-0.5 log det(J^T J)` (the area formula: 0 for a map
that copies each unknown to some results); the caller checks the residual,
so a result off the image (a non-zero above the diagonal) gives NaN.
`flat_maps_back` makes that check for a flat map solved otherwise
(normalized and projective blocks), with its ildj (the area formula where
it has more results than unknowns).
`_block_find.cut_shared` lets a linear block stop below values that its
unknowns share, so that `fill(x[:-n]) + diag(exp(x[-n:]))` is a block in
`x[:-n]` and `exp(x[-n:])`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from . import _linear_parts as lp, _rounding as rd
from ._ildj import log_det


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


def flat_maps_back(g: Any, u: Any, y_flat: Any, want_ildj: bool) -> tuple[Any, Any]:
    """Whether the flat map `g` takes `u` back to `y_flat` within rounding
    (of `y` and of `u` through `g`'s Jacobian), and, if wanted, the ildj:
    `-log|det J|`, or the area formula for more results than unknowns
    (whose Jacobian must then have full column rank)."""
    jac = jax.jacfwd(g)(u)
    scale = jnp.abs(y_flat) + jnp.abs(jac) @ jnp.abs(u)
    ok = jnp.all(rd.close(g(u), y_flat, scale, ulps=32))
    ildj: Any = 0.0
    if want_ildj:
        if jac.shape[0] == jac.shape[1]:
            ildj = -log_det(jac)
        else:
            _, ildj, full_rank = least_squares(jac, y_flat)
            ok = ok & full_rank
    return ok, ildj


def determined(block: Any, known: Sequence[Any], traced: bool = True) -> bool:
    """Whether a linear block's results determine its unknowns: its matrix
    has full column rank. Checked now when the matrix is a constant; a traced
    one is checked by the solve (NaN), or counts as not determined if not
    `traced`."""
    if any(compat.is_tracer(k) for k in known) or compat.in_manual_body():
        return traced
    # The matrix does not depend on the values known in parts: zeros
    # there keep it a constant.
    zeros = {
        v: (np.zeros(np.shape(base), base.dtype), idx)
        for v, (base, idx) in block.partial.items()
    }
    with jax.ensure_compile_time_eval():
        jac, _ = lp.linear_matrix(dataclasses.replace(block, partial=zeros), known)
    if compat.is_tracer(jac):
        return traced
    jac = np.asarray(jac)
    return bool(np.linalg.matrix_rank(jac) == jac.shape[1])
