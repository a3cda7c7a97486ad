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


def determined(block: Any, known: Sequence[Any], traced: bool = True) -> bool:
    """Whether a linear block's results determine its unknowns: its matrix
    has full column rank. Checked now when the matrix is a constant; a traced
    one is checked by the solve (NaN), or counts as not determined if not
    `traced`."""
    from ._blocks import linear_matrix

    if any(compat.is_tracer(k) for k in known) or compat.in_manual_body():
        return traced
    # The matrix does not depend on the values known in parts: zeros
    # there keep it a constant.
    zeros = {
        v: (np.zeros(np.shape(base), base.dtype), idx)
        for v, (base, idx) in block.partial.items()
    }
    with jax.ensure_compile_time_eval():
        jac, _ = linear_matrix(dataclasses.replace(block, partial=zeros), known)
    if compat.is_tracer(jac):
        return traced
    jac = np.asarray(jac)
    return bool(np.linalg.matrix_rank(jac) == jac.shape[1])


# A whole map's area formula takes its dense Jacobian: at most this many real
# unknown coordinates, and this many Jacobian entries.
MAX_AREA_UNKNOWNS = 2048
MAX_AREA_ENTRIES = 1 << 24


def _real_size(aval: Any) -> int:
    """How many real coordinates a value of `aval` has (0 if not inexact)."""
    dtype = aval.dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
        return 0
    return int(np.prod(aval.shape)) * (
        2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1
    )


def whole_map_ildj(
    forward: Callable[[list[Any]], list[Any]],
    xs: Sequence[Any],
    out_avals: Sequence[Any],
    fn_name: str,
) -> Any | None:
    """The ildj of a map with more results than unknowns, `-0.5 logdet(J^T J)`
    for the Jacobian `J` of the whole map at `xs` (the area formula, in real
    coordinates); `None` when the map is square (the backward steps' ildjs
    add up to it).

    The sum of the steps' ildjs is the area formula only when the steps after
    the non-square one act on the unknowns' coordinates alone; a linear map
    applied after a padding, or an unknown both copied and transformed
    (`(x, exp(x))`), needs the whole Jacobian.

    Raises:
        NotInvertibleError: if the Jacobian is too large to form densely.
    """
    from .._errors import NotInvertibleError

    avals = [compat.aval_of(x) for x in xs]
    if not avals or any(not jnp.issubdtype(a.dtype, jnp.inexact) for a in avals):
        return None
    n = sum(_real_size(a) for a in avals)
    m = sum(_real_size(a) for a in out_avals)
    if m <= n:
        return None
    if n > MAX_AREA_UNKNOWNS or n * m > MAX_AREA_ENTRIES:
        shapes = ", ".join(str(a.str_short()) for a in avals)
        raise NotInvertibleError(
            f"`{fn_name}` maps {n} unknown real coordinates ({shapes}) to {m} "
            "results: its ildj is the area formula `-0.5 logdet(J^T J)` of "
            f"its dense Jacobian, formed up to {MAX_AREA_UNKNOWNS} unknowns and "
            f"{MAX_AREA_ENTRIES} entries. Ask for `inverse` only, or map the "
            "inverse over independent rows with `jax.vmap`."
        )
    flat = [_to_real(x) for x in xs]
    sizes = [int(v.size) for v in flat]
    splits = list(np.cumsum(sizes)[:-1])

    def g(u: Any) -> Any:
        parts = jnp.split(u, splits) if splits else [u]
        args = [_from_real(p, a) for p, a in zip(parts, avals, strict=True)]
        outs = forward(args)
        return jnp.concatenate(
            [
                _to_real(o)
                for o in outs
                if jnp.issubdtype(jnp.result_type(o), jnp.inexact)
            ]
        )

    u = jnp.concatenate(flat) if len(flat) > 1 else flat[0]
    jac = jax.jacfwd(g)(u)
    _, r = jnp.linalg.qr(jac)
    return -jnp.sum(jnp.log(jnp.abs(jnp.diagonal(r))))


def _to_real(x: Any) -> Any:
    """`x` flattened, a complex value as its real and imaginary parts."""
    x = jnp.ravel(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.concatenate([jnp.real(x), jnp.imag(x)])
    return x


def _from_real(u: Any, aval: Any) -> Any:
    """The inverse of `_to_real` for a value of type `aval`."""
    if jnp.issubdtype(aval.dtype, jnp.complexfloating):
        re, im = jnp.split(u, 2)
        u = lax.complex(re, im)
    return jnp.reshape(u.astype(aval.dtype), aval.shape)
