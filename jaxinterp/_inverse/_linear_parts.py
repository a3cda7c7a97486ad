"""What a linear block solves from: its known results, as real numbers.

A linear block (`_blocks.py`) is `ys = J u + c` on flat real vectors. Its
results are

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
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from .._errors import NotInvertibleError

if TYPE_CHECKING:
    from ._blocks import Block


def _real_parts(value: Any) -> list[Any]:
    flat = jnp.ravel(value)
    if jnp.issubdtype(jnp.result_type(flat), jnp.complexfloating):
        return [jnp.real(flat), jnp.imag(flat)]
    return [flat]


def flatten_results(block: Block, env: dict[Any, Any]) -> Any:
    """The block's results, from the values of a run of it, as one real
    vector (the rows of `J`)."""
    pieces = [p for v in block.ys for p in _real_parts(env[v])]
    for v, (_, indices) in block.parts.items():
        pieces.extend(_real_parts(jnp.ravel(env[v])[indices]))
    return jnp.concatenate(pieces)


def flatten_values(block: Block, ys: Sequence[Any]) -> Any:
    """The known values of the block's results, in `flatten_results` order."""
    pieces = [p for y in ys for p in _real_parts(y)]
    for base, indices in block.parts.values():
        pieces.extend(_real_parts(jnp.ravel(base)[indices]))
    return jnp.concatenate(pieces)


def _real_size(v: Any, count: int) -> int:
    complex_ = jnp.issubdtype(v.aval.dtype, jnp.complexfloating)
    return count * (2 if complex_ else 1)


def parts_size(block: Block) -> int:
    """How many real results the known parts of values inside add."""
    return sum(
        _real_size(v, int(indices.size)) for v, (_, indices) in block.parts.items()
    )


def result_size(block: Block) -> int:
    """How many real results the block solves from."""
    ends = sum(_real_size(v, math.prod(v.aval.shape)) for v in block.ys)
    return ends + parts_size(block)


def add_parts(block: Block, pieces: dict[Any, list[Any]], partly_known: Any) -> None:
    """Record in `block.parts` the values inside it known in parts
    (`pieces`: the engine's pieces per variable; `partly_known(shape, dtype,
    pieces)` gives their known value and the flat indices not covered)."""
    for eqn in block.eqns:
        for v in eqn.outvars:
            have = pieces.get(v)
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


def check_rank(block: Block, jac: Any) -> None:
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
