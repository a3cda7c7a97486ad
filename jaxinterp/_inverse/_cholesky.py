"""The inverse rule of `cholesky`: `x = L L^T` on the lower triangle.

`lax.linalg.cholesky` stages a `cholesky` equation that reads only the lower
triangle of its operand (its result's upper triangle is unspecified), and
`jnp.linalg.cholesky` wraps it: the operand is first symmetrized,
`(a + a^T) / 2`, and the result masked with `tril` (a `select_n` with a
constant predicate, so the result is known only on its lower triangle,
see `_masked.py`). So:

- the rule reads the lower triangle `L` of the result and gives the lower
  triangle of the operand, `tril(L L^T)`, as a piece: the operand's strict
  upper triangle is never read, so it is not determined (alone, a
  `cholesky` of a value whose upper triangle matters is refused, naming it);
- a result that is not a Cholesky factor (a diagonal element that is not
  positive, or not finite) gives NaN, batch element by batch element;
- the ildj is over the `n (n + 1) / 2` free coordinates of each batch
  element, the lower triangles of `x` and `L`:
  `log|det dx/dL| = n log 2 + sum_i (n - i) log L_ii` (`i` from 0), as in
  NumPyro's `CholeskyTransform`;
- the symmetrization before it is a linear block that reads only the
  symmetric part of `a`: it is solved on symmetric matrices (`_blocks.py`,
  a choice like a principal branch), so `inverse(jnp.linalg.cholesky)(L)` is
  `L L^T`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.extend.core.primitives as jex_prims
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._errors import NotInvertibleError
from . import _traits as tr
from ._ildj import total
from ._rules import InverseContext, MaskedPiece, PieceResult, inverse_rules

# Primitives whose rule needs only the lower triangle of the result.
READS_LOWER = tr.having(tr.LOWER_RESULT)


def lower_mask(shape: Sequence[int]) -> np.ndarray:
    """The lower triangle (with the diagonal) of the last two axes, as a
    static boolean array of `shape`."""
    shape = tuple(int(d) for d in shape)
    tri = np.tril(np.ones(shape[-2:], bool))
    return np.broadcast_to(tri, shape)


def cholesky_ildj(factor: Any) -> Any:
    """`n log 2 + sum_i (n - i) log L_ii`, summed over batch elements: the
    ildj of `L -> L L^T` on lower-triangular coordinates."""
    n = jnp.shape(factor)[-1]
    diag = jnp.diagonal(factor, axis1=-2, axis2=-1)
    weights = jnp.arange(n, 0, -1).astype(diag.dtype)
    batch = math.prod(jnp.shape(factor)[:-2])
    return batch * n * math.log(2.0) + total(weights * jnp.log(diag))


@inverse_rules.register(jex_prims.cholesky_p)
def _cholesky_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, **params: Any
) -> Any:
    """The lower triangle of `x = L L^T` from the lower triangle `L` of the
    result (NaN unless `L` has a positive, finite diagonal); the strict upper
    triangle of `x` is not read by `cholesky`, so it stays unknown."""
    if x is not None:
        return None
    (y,) = outvals
    if not jnp.issubdtype(jnp.result_type(y), jnp.floating):
        raise NotInvertibleError("`cholesky` is inverted for real matrices only")
    factor = jnp.tril(y)
    diag = jnp.diagonal(factor, axis1=-2, axis2=-1)
    ok = jnp.all((diag > 0) & jnp.isfinite(diag), axis=-1)
    ok = ok & jnp.all(jnp.isfinite(factor), axis=(-2, -1))
    hi = lax.Precision.HIGHEST
    product = jnp.matmul(factor, jnp.swapaxes(factor, -1, -2), precision=hi)
    product = jnp.where(ok[..., None, None], product, jnp.nan)
    mask = lower_mask(jnp.shape(y))
    value = jnp.ravel(product)[np.flatnonzero(mask)]
    ildj = cholesky_ildj(factor) if ctx.want_ildj else 0.0
    return PieceResult([MaskedPiece(0, np.array(mask), value)], ildj)
