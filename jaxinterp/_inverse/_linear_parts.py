"""What a linear block solves from: its known results, as real numbers.

A linear block (`_blocks.py`) is `ys = J u + c` on flat real vectors
(`linear_matrix`; `u` holds the elements of its unknowns not known already,
`Block.partial`). Its results are

- the known values the block ends at (`Block.ys`), complex ones counted as
  their real and imaginary parts (a block may run through `fft` and
  multiplications by known complex values, and end at a complex result);
- the known elements of values *inside* the block that are known only in
  parts (`Block.parts`): a Haar transform of odd length passes one element of
  an intermediate sum straight to the output, so that element is known
  (from a `slice`'s inverse) while the rest of the value is not. Those
  elements are results too: without them the block has fewer results than
  unknowns.

The residual check of `solve_linear` covers every one of these results, so
a known element that the block's other results contradict gives NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from ._rounding import largest


class LinearBlock(Protocol):
    """What this module reads of a linear block (a `_blocks.Block`)."""

    x: Any
    xs: list[Any]
    ys: list[Any]
    indices: list[int]
    eqns: list[Any]
    partial: dict[Any, tuple[Any, np.ndarray]]
    parts: dict[Any, tuple[Any, np.ndarray]]

    def run(self, x: Any, known: Sequence[Any]) -> dict[Any, Any]: ...


def _real_parts(value: Any) -> list[Any]:
    flat = jnp.ravel(value)
    if jnp.issubdtype(jnp.result_type(flat), jnp.complexfloating):
        return [jnp.real(flat), jnp.imag(flat)]
    return [flat]


def flatten_results(block: LinearBlock, env: dict[Any, Any]) -> Any:
    """The block's results, from the values of a run of it, as one real
    vector (the rows of `J`)."""
    pieces = [p for v in block.ys for p in _real_parts(env[v])]
    for v, (_, indices) in block.parts.items():
        pieces.extend(_real_parts(jnp.ravel(env[v])[indices]))
    return jnp.concatenate(pieces)


def flatten_values(block: LinearBlock, ys: Sequence[Any]) -> Any:
    """The known values of the block's results, in `flatten_results` order."""
    pieces = [p for y in ys for p in _real_parts(y)]
    for base, indices in block.parts.values():
        pieces.extend(_real_parts(jnp.ravel(base)[indices]))
    return jnp.concatenate(pieces)


def value_scales(block: LinearBlock, ys: Sequence[Any]) -> Any:
    """For each element of `flatten_values`, the largest magnitude in the
    value it comes from. A result solved by steps after the block carries
    their rounding, which is relative to the value's largest element, not to
    the element itself (a zero that a triangular solve recomputes as
    `1e-8`): the residual check allows that much."""
    pieces = [
        jnp.full(p.shape, largest(y), p.dtype) for y in ys for p in _real_parts(y)
    ]
    for base, indices in block.parts.values():
        part = jnp.ravel(base)[indices]
        pieces.extend(
            jnp.full(p.shape, largest(part), p.dtype) for p in _real_parts(part)
        )
    return jnp.concatenate(pieces)


def _real_size(v: Any, count: int) -> int:
    complex_ = jnp.issubdtype(v.aval.dtype, jnp.complexfloating)
    return count * (2 if complex_ else 1)


def parts_size(block: LinearBlock) -> int:
    """How many real results the known parts of values inside add."""
    return sum(
        _real_size(v, int(indices.size)) for v, (_, indices) in block.parts.items()
    )


def result_size(block: LinearBlock) -> int:
    """How many real results the block solves from."""
    ends = sum(_real_size(v, math.prod(v.aval.shape)) for v in block.ys)
    return ends + parts_size(block)


def _unknown_indices(block: LinearBlock, v: Any) -> np.ndarray | None:
    """The flat indices of `v` a linear block solves for (`None`: all)."""
    got = block.partial.get(v)
    return None if got is None else got[1]


def linear_matrix(block: LinearBlock, known: Sequence[Any]) -> tuple[Any, Any]:
    """The block as `ys = J u + c` on flattened values, where `u` holds the
    unknown elements of the block's unknowns: `(J, c)`."""
    avals = [v.aval for v in block.xs]
    sizes = [unknown_count(block, v) for v in block.xs]
    dtype = jnp.result_type(*(a.dtype for a in avals))

    def flat(u: Any) -> Any:
        parts = place(block, u)
        env = block.run(parts if len(parts) > 1 else parts[0], known)
        return flatten_results(block, env)

    if not any(compat.is_tracer(k) for k in known) and not compat.in_manual_body():
        # Constants only: `J` is concrete, and its rank is checked now.
        with jax.ensure_compile_time_eval():
            zero = jnp.zeros((sum(sizes),), dtype)
            return jax.jacfwd(flat)(zero), flat(zero)
    zero = jnp.zeros((sum(sizes),), dtype)
    return jax.jacfwd(flat)(zero), flat(zero)


def unknown_count(block: LinearBlock, v: Any) -> int:
    """How many elements of `v` the block solves for."""
    indices = _unknown_indices(block, v)
    return math.prod(v.aval.shape) if indices is None else int(indices.size)


def place(block: LinearBlock, u: Any) -> list[Any]:
    """The block's unknowns from the vector `u` of their unknown elements."""
    parts, start = [], 0
    for v in block.xs:
        size = unknown_count(block, v)
        piece = u[start : start + size].astype(v.aval.dtype)
        start += size
        got = block.partial.get(v)
        if got is None:
            parts.append(jnp.reshape(piece, v.aval.shape))
        else:
            base, indices = got
            flat = jnp.ravel(base).at[indices].set(piece)
            parts.append(jnp.reshape(flat, v.aval.shape))
    return parts


def add_parts(block: LinearBlock, st: Any, partly_known: Any) -> None:
    """Record in `block.parts` the values inside it known in parts (`st`:
    the engine's `SolveState`; `partly_known(shape, dtype, pieces)` gives
    their known value and the flat indices not covered).

    A value whose producer in the block already solved its operands' elements
    from it (a step on partly known values, with its own ildj) is left out:
    those operands' elements are the results instead, else the same data
    would count twice."""
    inside = dict(zip(block.indices, block.eqns, strict=True))
    for i, eqn in inside.items():
        if i in st.masked_inverted:
            continue
        for v in eqn.outvars:
            have = st.pieces.get(v)
            if not have or v in block.xs:
                continue
            base, uncovered = partly_known(v.aval.shape, v.aval.dtype, have)
            known = np.setdiff1d(np.arange(math.prod(v.aval.shape)), uncovered)
            if known.size:
                block.parts[v] = (base, known)


def through_complex(eqns: Sequence[Any]) -> bool:
    """Whether a chain of linear steps passes through complex values: then a
    step that alone discards a part (`real`, an `IRFFT`) may discard only
    what an earlier step made redundant, so the chain is solved as a block."""
    return any(
        jnp.issubdtype(v.aval.dtype, jnp.complexfloating)
        for e in eqns
        for v in e.outvars
    )


def check_rank(block: LinearBlock, jac: Any) -> None:
    """Refuse a block whose concrete matrix `J` has rank below its number of
    unknowns (they are not determined); a traced `J` is checked when solved
    (NaN)."""
    if compat.is_tracer(jac):
        return
    mat = np.asarray(jac, np.float64)
    m, n = mat.shape
    if n == 0:
        return
    sv = np.linalg.svd(mat, compute_uv=False)
    eps = float(jnp.finfo(jac.dtype).eps)
    rank = int(np.sum(sv > max(m, n) * eps * sv[0])) if sv[0] > 0 else 0
    if rank < n:
        raise NotInvertibleError(
            f"its unknown operand is a linear function of {n} unknowns whose "
            f"matrix has rank {rank}: the known results it reaches do not "
            "determine them"
        )


def partial_tops(st: Any) -> set[int]:
    """The unfinished equations producing a value known only in parts
    (`st`: the engine's `SolveState`)."""
    tops = set()
    for v in st.pieces:
        p = st.producer.get(v)
        if p is not None and not st.done[p]:
            tops.add(p)
    return tops


def symmetric_basis(block: LinearBlock, jac: Any) -> Any | None:
    """For a block whose one unknown is a (batch of) square matrices of
    which a concrete `J` reads only the symmetric part (`J` is unchanged by
    transposing the unknown), and which its results do not determine
    otherwise: the basis `B` of symmetric matrices on their lower-triangular
    coordinates (`x = B v`, `v` the lower triangle), else `None`.

    Solving `J B v = rhs` picks the symmetric preimage, one among many (any
    antisymmetric part maps to the same results): a choice, like a principal
    branch, and the engine treats it as one. The ildj is then over the
    lower-triangular coordinates, as `cholesky`'s."""
    if len(block.xs) != 1 or block.partial or compat.is_tracer(jac):
        return None
    shape = tuple(int(d) for d in block.x.aval.shape)
    if len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] < 2:
        return None
    n = math.prod(shape)
    index = np.arange(n).reshape(shape)
    swapped = np.swapaxes(index, -1, -2).reshape(-1)
    mat = np.asarray(jac, np.float64)
    eps = float(jnp.finfo(jac.dtype).eps)
    scale = float(np.max(np.abs(mat))) if mat.size else 0.0
    if scale == 0 or not np.allclose(
        mat[:, swapped], mat, rtol=0, atol=64 * eps * scale
    ):
        return None
    sv = np.linalg.svd(mat, compute_uv=False)
    if int(np.sum(sv > max(mat.shape) * eps * sv[0])) == n:
        return None  # determined without the choice
    lower = np.tril(np.ones(shape[-2:], bool))
    rows, cols = [], []
    for k, flat in enumerate(index[..., lower].reshape(-1)):
        mirror = swapped[flat]
        rows.extend([flat] if mirror == flat else [flat, mirror])
        cols.extend([k] if mirror == flat else [k, k])
    basis = np.zeros((n, int(index[..., lower].size)), np.asarray(jac).dtype)
    basis[rows, cols] = 1.0
    return jnp.asarray(basis)


def chosen_values(block: LinearBlock, known: Sequence[Any]) -> set[Any]:
    """The values of a block solved on symmetric matrices that depend on
    the choice (change with an antisymmetric part added to the unknown): the
    unknown itself, and values that do not read only its symmetric part.
    The others (the symmetrized matrix) are determined by the results."""
    (x,) = block.xs
    shape = tuple(int(d) for d in x.aval.shape)
    n = math.prod(shape)
    swapped = np.swapaxes(np.arange(n).reshape(shape), -1, -2).reshape(-1)
    variables = [v for e in block.eqns for v in e.outvars]

    def values(u: Any) -> list[Any]:
        env = block.run(jnp.reshape(u, shape).astype(x.aval.dtype), known)
        return [jnp.concatenate(_real_parts(env[v])) for v in variables]

    with jax.ensure_compile_time_eval():
        jacs = jax.jacfwd(values)(jnp.zeros((n,), x.aval.dtype))
    chosen = {x}
    for v, k in zip(variables, jacs, strict=True):
        mat = np.asarray(k, np.float64)
        eps = float(jnp.finfo(k.dtype).eps)
        scale = float(np.max(np.abs(mat))) if mat.size else 0.0
        if not np.allclose(mat[:, swapped], mat, rtol=0, atol=64 * eps * scale):
            chosen.add(v)
    return chosen


def may_be_symmetric(block: LinearBlock) -> bool:
    """Whether the block's one unknown is a (batch of) square matrices with
    at least as many results as symmetric ones have free coordinates (it may
    then be solved on symmetric matrices, see `symmetric_basis`)."""
    if len(block.xs) != 1 or block.partial:
        return False
    shape = tuple(int(d) for d in block.x.aval.shape)
    if len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] < 2:
        return False
    n = shape[-1]
    free = math.prod(shape[:-2]) * n * (n + 1) // 2
    return result_size(block) >= free
