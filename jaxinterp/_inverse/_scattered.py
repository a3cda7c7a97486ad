"""Values copied to and from scattered positions: point gathers, broadcasts
and platform-dependent `cond`s on partly known values.

Triangular-matrix bijectors read and write single elements: `m[..., r, c]`
with the indices of a triangle (a gather of points), `jnp.diagonal` (a
`cond` over platform-specific implementations, one of them a point gather),
and `where(eye, exp(d)[None, :], m)` (a broadcast of which only the diagonal
is selected). Each copies values, so its steps have ildj 0:

- a **point gather** at concrete distinct in-bounds indices gives its
  operand where it reads (a `MaskedPiece`); `inverse` refuses the other
  elements, naming them, unless other results complete them;
- a **broadcast** whose result is partly known gives each operand element
  from its first known copy (NaN unless the other known copies agree);
- a **platform-dependent `cond`** is solved, on partly known values, with the
  branch the default backend runs (`lax.platform_dependent`'s branches are
  implementations of one function).

The steps on partly known values are hooks of `_masked.step`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _refusals as rf, _traits as tr
from ._dataflow import MASKED, Solved, SolveState, Walker, gather, shape_of
from ._rounding import agree_within_rounding
from ._rules import MaskedPiece


def point_positions(
    indices: Any, dimension_numbers: Any, slice_sizes: Any, shape: Sequence[int]
) -> np.ndarray | None:
    """The flat operand position each element of a gather's result reads
    (row-major), when its indices are concrete: for a gather of single
    elements, and for one of slices (a batched `jnp.diagonal`, `m[:, rows,
    cols]`) whose windows are in bounds and read each element at most once;
    else `None`. Raises `NotInvertibleError` for single elements at indices
    out of bounds or repeated (the result then does not copy each element
    once)."""
    if compat.is_tracer(indices) or np.ndim(indices) < 1:
        return None
    dn = dimension_numbers
    rank = len(shape)
    points = (
        not tuple(dn.offset_dims)
        and not tuple(getattr(dn, "operand_batching_dims", ()))
        and sorted(dn.collapsed_slice_dims) == list(range(rank))
        and sorted(dn.start_index_map) == list(range(rank))
        and all(int(s) == 1 for s in slice_sizes)
        and np.shape(indices)[-1] == rank
    )
    if not points:
        return _window_positions(indices, dn, slice_sizes, shape)
    coords = np.asarray(indices).reshape(-1, rank).astype(np.int64)
    placed = np.zeros_like(coords)
    placed[:, list(dn.start_index_map)] = coords
    bounds = np.asarray(shape, np.int64)
    if np.any(placed < 0) or np.any(placed >= bounds):
        raise NotInvertibleError(
            "`gather` reads elements at indices out of bounds, which it clamps "
            "or fills, so its result does not copy its operand"
        )
    flat = np.asarray(
        np.ravel_multi_index(tuple(placed.T), tuple(shape)) if rank else placed[:, 0],
        np.int64,
    )
    if len(np.unique(flat)) != len(flat):
        raise NotInvertibleError(
            "`gather` reads some elements more than once (repeated indices)"
        )
    return flat


def _window_positions(
    indices: Any, dimension_numbers: Any, slice_sizes: Any, shape: Sequence[int]
) -> np.ndarray | None:
    """`point_positions` of a gather of slices: the gather itself run on the
    operand's positions (`iota`), windows out of bounds filled with -1.
    `None` where a window is out of bounds (clamped or filled: not a copy)
    or an element is read twice."""
    size = math.prod(shape)
    if size >= 2**31:
        return None
    with jax.ensure_compile_time_eval():
        where = lax.gather(
            jnp.arange(size, dtype=jnp.int32).reshape(tuple(shape)),
            jnp.asarray(indices),
            dimension_numbers,
            tuple(int(s) for s in slice_sizes),
            mode=lax.GatherScatterMode.FILL_OR_DROP,
            fill_value=-1,
        )
    flat = np.asarray(where).reshape(-1).astype(np.int64)
    if np.any(flat < 0) or len(np.unique(flat)) != len(flat):
        return None
    return flat


def point_piece(y: Any, flat: np.ndarray, shape: Sequence[int]) -> MaskedPiece:
    """The operand's elements read by a point gather with result `y`."""
    order = np.argsort(flat, kind="stable")
    mask = np.zeros(tuple(shape), bool)
    mask.reshape(-1)[flat] = True
    value = lax.reshape(y, (int(np.size(flat)),))[order.astype(np.int32)]
    return MaskedPiece(0, mask, value)


# -- hooks of `_masked.step` -------------------------------------------------


def step(walker: Walker, st: SolveState, i: int) -> bool | None:
    """A step on partly known values for the equations above, or `None`
    when `eqn` is none of them."""
    eqn: Any = st.eqns[i]
    if eqn.primitive is lax.gather_p:
        return _gather(st, i, **eqn.params)
    if eqn.primitive is lax.broadcast_in_dim_p:
        return _broadcast(st, i, **eqn.params)
    if relayout(eqn):
        return _relaid(st, i)
    return None


# Steps that keep the elements and their row-major order, changing only the
# shape (a `reshape` without a transposition first).
_RELAYOUTS = tr.having(tr.RELAYOUT)


def relayout(eqn: Any) -> bool:
    """Whether `eqn` keeps its one operand's elements in row-major order,
    changing only the shape."""
    if eqn.primitive.name not in _RELAYOUTS or len(eqn.invars) != 1:
        return False
    return (
        eqn.primitive.name != "reshape"
        or compat.params_of(eqn).get("dimensions") is None
    )


def _relaid(st: SolveState, i: int) -> bool:
    """A reshape (or squeeze) whose result is partly known: its operand
    there."""
    eqn: Any = st.eqns[i]
    (x,), (out,) = eqn.invars, eqn.outvars
    if type(x) is compat.Literal or st.is_known(x):
        return False
    new = st.known_mask(out).reshape(-1) & ~st.known_mask(x).reshape(-1)
    if not new.any():
        return False
    value = gather(st.partial_value(out), np.flatnonzero(new))
    solved_part(st, x, new.reshape(shape_of(x)), value, i)
    return True


def _gather(
    st: SolveState, i: int, *, dimension_numbers: Any, slice_sizes: Any, **_: Any
) -> bool:
    """A point gather whose result is known: its operand where it reads."""
    eqn: Any = st.eqns[i]
    (out,) = eqn.outvars
    x, idx_var = eqn.invars
    if not st.is_known(out) or st.is_known(x) or not st.is_known(idx_var):
        return False
    shape = shape_of(x)
    flat = point_positions(
        st.partial_value(idx_var), dimension_numbers, slice_sizes, shape
    )
    if flat is None:
        return False
    have = st.known_mask(x).reshape(-1)
    new_at = ~have[flat]
    if not new_at.any():
        return False
    piece = point_piece(
        gather(st.partial_value(out), np.flatnonzero(new_at)), flat[new_at], shape
    )
    solved_part(st, x, piece.mask, piece.value, i)
    return True


def _broadcast(
    st: SolveState, i: int, *, shape: Any, broadcast_dimensions: Any, **_: Any
) -> bool:
    """A broadcast whose result is partly known: each operand element from
    its first known copy."""
    eqn: Any = st.eqns[i]
    x = eqn.invars[0]
    (out,) = eqn.outvars
    if type(x) is compat.Literal or st.is_known(x) or len(eqn.invars) != 1:
        return False
    in_shape = shape_of(x)
    out_shape = tuple(int(d) for d in shape)
    dims = [int(d) for d in broadcast_dimensions]
    expanded = [1] * len(out_shape)
    for k, d in enumerate(dims):
        expanded[d] = in_shape[k]
    source = np.broadcast_to(
        np.arange(int(np.prod(in_shape)), dtype=np.int64).reshape(expanded), out_shape
    ).reshape(-1)
    known_at = np.flatnonzero(st.known_mask(out))
    if not known_at.size:
        return False
    sources = source[known_at]
    found, first, which = np.unique(sources, return_index=True, return_inverse=True)
    have = st.known_mask(x).reshape(-1)
    fresh = ~have[found]
    if not fresh.any():
        return False
    new = np.zeros(int(np.prod(in_shape)), bool)
    new[found[fresh]] = True
    out_value = st.partial_value(out)
    value = gather(out_value, known_at[first[fresh]])
    if len(found) < len(sources) and jnp.issubdtype(value.dtype, jnp.inexact):
        # Further known copies must agree with the first: else the result
        # is off the image, and the new elements are NaN.
        copies = gather(out_value, known_at)
        firsts = gather(out_value, known_at[first])
        scale = jnp.max(jnp.abs(jnp.where(jnp.isfinite(copies), copies, 0)), initial=0)
        agree = jnp.all(
            agree_within_rounding(copies, jnp.asarray(firsts)[np.ravel(which)], scale)
        )
        value = jnp.where(agree, value, jnp.nan)
    solved_part(st, x, new.reshape(in_shape), value, i)
    return True


def solved_part(st: SolveState, v: Any, mask: Any, value: Any, i: int) -> None:
    """Record that equation `i`, solved backwards, gave `v` equal to `value`
    (1-D) where the static `mask` holds, with its NaN checks."""
    checks = rf.piece_checks(st, v, value, i)
    pieces = [(v, mask, value)]
    st.commit(
        Solved(MASKED, at=i, indices=(i,), pieces=pieces, checks=checks, done=False)
    )
