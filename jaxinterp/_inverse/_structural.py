"""Inverse rules for structural primitives: reshapes, permutations, pieces of
arrays, padding and gathers of whole slices.

All of these move values without changing them, so their ildj is zero. Rules
that only learn part of an operand (`slice`, `dynamic_slice`, `pad` with
negative padding, `dynamic_update_slice`, gathers of some rows, and `split` or
`unstack` with dropped results) return a `PieceResult`; the engine assembles
the operand when its pieces cover it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _branches as br, _scattered
from ._rounding import agree_within_rounding
from ._rules import InverseContext, Piece, PieceResult, inverse_rules


def _unless_known_part_differs(
    solved: Any, y: Any, known: Any, where_known: Any, ctx: InverseContext
) -> Any:
    """`solved` (values read out of `y`), all NaN if `y` differs from the
    `known` values where `where_known` holds, within rounding of `y`'s
    largest element: the map copies those values (a padding's constant, the
    operand a `dynamic_update_slice` leaves alone, a known operand of a
    concatenation), so such a `y` is off its image. Where `y` is a clamp's
    choice, a known value it stands for agrees too (`_branches.admits`).
    Integers pass unchecked (they cannot hold NaN)."""
    if not jnp.issubdtype(jnp.result_type(y), jnp.inexact):
        return solved
    known = jnp.asarray(known, jnp.result_type(y))
    scale = jnp.max(jnp.abs(jnp.where(jnp.isfinite(y), y, 0)), initial=0)
    agree = agree_within_rounding(y, known, scale)
    chosen = br.admits(
        ctx.result_branches[0] if ctx.result_branches else None, y, known
    )
    if chosen is not None:
        agree = agree | chosen
    off = jnp.any(where_known & ~agree)
    return jnp.where(off, jnp.asarray(jnp.nan, jnp.result_type(solved)), solved)


def _static_ints(values: Sequence[Any]) -> tuple[int, ...] | None:
    """The values as Python ints, or `None` if any is traced."""
    try:
        return tuple(int(v) for v in values)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return None


# Concrete values (checked with NumPy, not computed on) allow static checks
# such as "is this a permutation".
_is_tracer = compat.is_tracer


# ---------------------------------------------------------------------------
# Reshapes and permutations: the whole operand, ildj 0.


@inverse_rules.register(lax.reshape_p)
def _reshape_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    *dyn: Any,
    dimensions: Any = None,
    **params: Any,
) -> Any:
    """Reshape back to the operand's shape (read from `ctx.operand_aval`)."""
    aval = ctx.operand_aval(0)
    if x is not None or aval is None:
        return None
    (y,) = outvals
    if dimensions is None:
        return [lax.reshape(y, tuple(aval.shape)), *dyn], 0.0
    # `dimensions` transposes the operand before reshaping it.
    shape = tuple(aval.shape[d] for d in dimensions)
    inv = tuple(sorted(range(len(dimensions)), key=lambda k: dimensions[k]))
    x = lax.transpose(lax.reshape(y, shape), inv)
    return [x, *dyn], 0.0


@inverse_rules.register(lax.squeeze_p)
def _squeeze_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, dimensions: Any
) -> Any:
    """Put the squeezed size-1 dimensions back."""
    if x is not None:
        return None
    (y,) = outvals
    ndim = jnp.ndim(y) + len(dimensions)
    dims = sorted(d % ndim for d in dimensions)
    return [lax.expand_dims(y, dims)], 0.0


@inverse_rules.register(lax.broadcast_in_dim_p)
def _broadcast_in_dim_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    *dyn: Any,
    shape: Any,
    broadcast_dimensions: Any,
    **params: Any,
) -> Any:
    """Invert a `broadcast_in_dim` that only adds size-1 dimensions (as
    `expand_dims` does). A broadcast that copies values is not a bijection.

    Without `ctx.operand_aval`, an operand dimension is assumed to have the size of
    the output dimension it maps to."""
    if x is not None:
        return None
    (y,) = outvals
    aval = ctx.operand_aval(0)
    in_shape = (
        tuple(shape[d] for d in broadcast_dimensions)
        if aval is None
        else tuple(aval.shape)
    )
    new = [d for d in range(len(shape)) if d not in broadcast_dimensions]
    copies = any(shape[d] != 1 for d in new) or any(
        shape[d] != n for d, n in zip(broadcast_dimensions, in_shape, strict=True)
    )
    if copies:
        raise NotInvertibleError(
            f"`broadcast_in_dim` copies its operand of shape {in_shape} to shape "
            f"{tuple(shape)}; only broadcasts that add size-1 dimensions are "
            "invertible."
        )
    return [lax.reshape(y, in_shape), *dyn], 0.0


@inverse_rules.register(lax.transpose_p)
def _transpose_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, permutation: Any
) -> Any:
    if x is not None:
        return None
    (y,) = outvals
    inv = tuple(sorted(range(len(permutation)), key=lambda k: permutation[k]))
    return [lax.transpose(y, inv)], 0.0


@inverse_rules.register(lax.rev_p)
def _rev_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, dimensions: Any
) -> Any:
    if x is not None:
        return None
    (y,) = outvals
    return [lax.rev(y, dimensions)], 0.0


@inverse_rules.register(lax.concatenate_p)
def _concatenate_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *operands: Any, dimension: int
) -> Any:
    """Slice each unknown operand out of the result. The sizes of unknown
    operands come from `ctx.operand_aval`, or, for a single unknown operand,
    from the result's size less the known operands'."""
    (y,) = outvals
    sizes: list[int | None] = []
    for k, op in enumerate(operands):
        aval = ctx.operand_aval(k)
        if op is not None:
            sizes.append(jnp.shape(op)[dimension])
        elif aval is not None:
            sizes.append(int(aval.shape[dimension]))
        else:
            sizes.append(None)
    missing = [k for k, s in enumerate(sizes) if s is None]
    if len(missing) > 1:
        return None
    if missing:
        rest = sum(s for s in sizes if s is not None)
        sizes[missing[0]] = jnp.shape(y)[dimension] - rest
    solved, start = [], 0
    checks = []
    for op, size in zip(operands, sizes, strict=True):
        assert size is not None
        end = start + size
        part = lax.slice_in_dim(y, start, end, axis=dimension)
        solved.append(part if op is None else op)
        if op is not None:
            checks.append((part, op))
        start = end
    # The result holds the known operands: a `y` that differs there is off
    # the image, and the unknown operands are NaN.
    ildj: Any = 0.0
    for part, op in checks:
        solved = [
            s if o is not None else _unless_known_part_differs(s, part, op, True, ctx)
            for s, o in zip(solved, operands, strict=True)
        ]
        ildj = _unless_known_part_differs(ildj, part, op, True, ctx)
    return solved, ildj


_stack_p = getattr(lax, "stack_p", None)  # JAX >= 0.8
_unstack_p = getattr(lax, "unstack_p", None)

if _stack_p is not None:

    @inverse_rules.register(_stack_p)
    def _stack_inverse(
        ctx: InverseContext, outvals: Sequence[Any], *operands: Any, axis: int
    ) -> Any:
        (y,) = outvals
        solved = [
            lax.index_in_dim(y, k, axis, keepdims=False) if op is None else op
            for k, op in enumerate(operands)
        ]
        return solved, 0.0


if _unstack_p is not None:

    @inverse_rules.register(_unstack_p)
    def _unstack_inverse(
        ctx: InverseContext, outvals: Sequence[Any], x: Any, *, axis: int
    ) -> Any:
        """All results known: stack them; otherwise each known one is a piece."""
        if x is not None:
            return None
        if all(o is not None for o in outvals):
            parts = [lax.expand_dims(o, (axis,)) for o in outvals]
            return [lax.concatenate(parts, axis)], 0.0
        pieces = []
        for k, o in enumerate(outvals):
            if o is None:
                continue
            value = lax.expand_dims(o, (axis,))
            start = [0] * value.ndim
            start[axis] = k
            pieces.append(Piece(0, tuple(start), _limit(start, value.shape), value))
        return PieceResult(tuple(pieces))


def _clamp(
    idx: Sequence[int], shape: Sequence[int], sizes: Sequence[int]
) -> tuple[int, ...]:
    """Start indices clamped so the slice fits, as `dynamic_slice` does."""
    return tuple(
        min(max(i, 0), n - s) for i, n, s in zip(idx, shape, sizes, strict=True)
    )


def _limit(start: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(s + n for s, n in zip(start, shape, strict=True))


# ---------------------------------------------------------------------------
# Pieces: each equation sees part of its operand.


@inverse_rules.register(lax.slice_p)
def _slice_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    *,
    start_indices: Any,
    limit_indices: Any,
    strides: Any = None,
) -> Any:
    """The result is the piece `[start:limit:strides)` of the operand."""
    if x is not None:
        return None
    (y,) = outvals
    stride = None if strides is None else tuple(int(s) for s in strides)
    piece = Piece(
        0,
        tuple(int(s) for s in start_indices),
        tuple(int(s) for s in limit_indices),
        y,
        stride,
    )
    return PieceResult([piece])


@inverse_rules.register(lax.split_p)
def _split_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *, sizes: Any, axis: int
) -> Any:
    """All results known: concatenate them; otherwise each is a piece."""
    if x is not None:
        return None
    if all(o is not None for o in outvals):
        return [lax.concatenate(list(outvals), axis)], 0.0
    pieces, offset = [], 0
    for o, size in zip(outvals, sizes, strict=True):
        if o is not None:
            start = [0] * jnp.ndim(o)
            start[axis] = offset
            pieces.append(Piece(0, tuple(start), _limit(start, jnp.shape(o)), o))
        offset += int(size)
    return PieceResult(tuple(pieces))


@inverse_rules.register(lax.dynamic_slice_p)
def _dynamic_slice_inverse(
    ctx: InverseContext, outvals: Sequence[Any], x: Any, *starts: Any, slice_sizes: Any
) -> Any:
    """A piece at the start indices, clamped into the operand as JAX clamps
    them. The indices must be concrete, since pieces are static regions
    (a slice covering the whole operand is the operand whatever they are)."""
    if x is not None or any(s is None for s in starts):
        return None
    (y,) = outvals
    aval = ctx.operand_aval(0)
    sizes = tuple(int(s) for s in slice_sizes)
    if aval is not None and tuple(aval.shape) == sizes:
        return [y, *starts], 0.0
    idx = _static_ints(starts)
    if idx is None:
        raise NotInvertibleError(
            "`dynamic_slice` with traced start indices gives a piece of its "
            "operand at a place only known at run time, which cannot be "
            "assembled; use static indices (`lax.slice`)."
        )
    if aval is not None:
        idx = _clamp(idx, aval.shape, sizes)
    else:
        idx = tuple(max(i, 0) for i in idx)
    return PieceResult([Piece(0, idx, _limit(idx, sizes), y)])


@inverse_rules.register(lax.dynamic_update_slice_p)
def _dynamic_update_slice_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    operand: Any,
    update: Any,
    *starts: Any,
    **params: Any,
) -> Any:
    """The update is the slice of the result at the start indices; the operand
    is known outside it (pieces, for concrete indices)."""
    if any(s is None for s in starts):
        return None
    (y,) = outvals
    up_aval = ctx.operand_aval(1)
    up_shape = jnp.shape(update) if update is not None else None
    if up_shape is None and up_aval is not None:
        up_shape = tuple(up_aval.shape)
    shape = jnp.shape(y)
    pieces = []
    if update is None:
        if up_shape is None:
            return None
        value = lax.dynamic_slice(y, starts, up_shape)
        if operand is not None:
            # The result holds the known operand outside the update: a `y`
            # that differs there is off the image.
            inside = lax.dynamic_update_slice(
                jnp.zeros(shape, bool), jnp.ones(up_shape, bool), starts
            )
            value = _unless_known_part_differs(value, y, operand, ~inside, ctx)
        pieces.append(Piece(1, (0,) * len(up_shape), tuple(up_shape), value))
    if operand is None:
        idx = _static_ints(starts)
        if idx is not None and up_shape is not None:
            idx = _clamp(idx, shape, up_shape)
            for lo, hi in _complement(shape, idx, _limit(idx, up_shape)):
                value = lax.slice(y, lo, hi)
                pieces.append(Piece(0, lo, hi, value))
    return PieceResult(pieces) if pieces else None


def _complement(
    shape: Sequence[int], lo: Sequence[int], hi: Sequence[int]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Boxes tiling `shape` outside the box `[lo:hi)`."""
    boxes = []
    prefix_lo: list[int] = []
    prefix_hi: list[int] = []
    rank = len(shape)
    for d in range(rank):
        rest_lo = [0] * (rank - d - 1)
        rest_hi = list(shape[d + 1 :])
        if lo[d] > 0:
            boxes.append(
                (tuple(prefix_lo + [0] + rest_lo), tuple(prefix_hi + [lo[d]] + rest_hi))
            )
        if hi[d] < shape[d]:
            boxes.append(
                (
                    tuple(prefix_lo + [hi[d]] + rest_lo),
                    tuple(prefix_hi + [shape[d]] + rest_hi),
                )
            )
        prefix_lo.append(lo[d])
        prefix_hi.append(hi[d])
    return boxes


@inverse_rules.register(lax.pad_p)
def _pad_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    padding_value: Any,
    *,
    padding_config: Any,
) -> Any:
    """Slice the operand back out of the padded result (strided for interior
    padding). Negative padding crops the operand: what survives is a piece."""
    if x is not None:
        return None
    (y,) = outvals
    aval = ctx.operand_aval(0)
    out_shape = jnp.shape(y)
    start, limit, stride, keep_lo, keep_hi = [], [], [], [], []
    cropped = False
    for d, (lo, hi, interior) in enumerate(padding_config):
        lo, hi, step = int(lo), int(hi), int(interior) + 1
        if aval is not None:
            n = int(aval.shape[d])
        else:
            n = (out_shape[d] - lo - hi + int(interior)) // step
        # Operand element j lands at lo + j * step; keep those inside.
        j0 = -(lo // step) if lo < 0 else 0  # ceil(-lo / step)
        j1 = min(n, (out_shape[d] - 1 - lo) // step + 1)
        if j1 <= j0:
            return None
        cropped = cropped or j0 > 0 or j1 < n
        keep_lo.append(j0)
        keep_hi.append(j1)
        start.append(lo + j0 * step)
        limit.append(lo + (j1 - 1) * step + 1)
        stride.append(step)
    value = lax.slice(y, start, limit, stride)
    # The result holds the padding value around the operand: a `y` that
    # differs there (or, for an unknown padding value, is not constant there)
    # is off the image.
    shape = tuple(aval.shape) if aval is not None else None
    if shape is None:
        shape = tuple(
            (out_shape[d] - int(lo) - int(hi) + int(i)) // (int(i) + 1)
            for d, (lo, hi, i) in enumerate(padding_config)
        )
    with jax.ensure_compile_time_eval():
        outside = ~np.asarray(
            lax.pad(np.ones(shape, bool), False, padding_config), dtype=bool
        )
    ildj: Any = 0.0
    if outside.any():
        if padding_value is None:
            # Wait for it (`jnp.pad` converts its constant first).
            return None
        value = _unless_known_part_differs(value, y, padding_value, outside, ctx)
        ildj = _unless_known_part_differs(ildj, y, padding_value, outside, ctx)
    if cropped:
        return PieceResult([Piece(0, tuple(keep_lo), tuple(keep_hi), value)])
    return [value, padding_value], ildj


# ---------------------------------------------------------------------------
# Gathers of whole slices along one axis.


@inverse_rules.register(lax.gather_p)
def _gather_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    indices: Any,
    *,
    dimension_numbers: Any,
    slice_sizes: Any,
    **params: Any,
) -> Any:
    """Invert a gather of whole slices along one axis (`x[perm]`,
    `jnp.take(x, idx, axis)`, and `x[::2]` before JAX 0.8).

    A permutation of the whole axis is undone by gathering with
    `argsort(perm)`. Concrete distinct indices that do not cover the axis give
    pieces (one strided piece for an arithmetic progression). Traced indices
    are assumed to permute the whole axis; repeated indices are not
    invertible."""
    if x is not None or indices is None:
        return None
    (y,) = outvals
    dn = dimension_numbers
    collapsed = tuple(dn.collapsed_slice_dims)
    aval = ctx.operand_aval(0)
    rank = len(slice_sizes)
    n = jnp.shape(indices)[0] if jnp.ndim(indices) == 2 else -1
    ok = (
        len(collapsed) == 1
        and tuple(dn.start_index_map) == collapsed
        and not tuple(getattr(dn, "operand_batching_dims", ()))
        and jnp.shape(indices) == (n, 1)
        and jnp.ndim(y) == rank
        and len(dn.offset_dims) == rank - 1
        and int(slice_sizes[collapsed[0]]) == 1
    )
    shape = tuple(aval.shape) if aval is not None else None
    if ok and shape is not None:
        ok = all(
            int(s) == shape[d] for d, s in enumerate(slice_sizes) if d != collapsed[0]
        )
    if not ok:
        if shape is not None:
            # Single elements at concrete indices (`m[..., rows, cols]`):
            # the operand where it reads (see `_scattered.py`).
            flat = _scattered.point_positions(indices, dn, slice_sizes, shape)
            if flat is not None:
                return PieceResult([_scattered.point_piece(y, flat, shape)])
        raise NotInvertibleError(
            "`gather` is only inverted when it takes whole slices along one axis "
            "(`x[perm]`, `jnp.take(x, perm, axis)`) or single elements at "
            "concrete indices (`m[rows, cols]`)."
        )
    (axis,) = collapsed
    size = n if shape is None else shape[axis]
    (pos,) = [d for d in range(rank) if d not in dn.offset_dims]
    moved = jnp.moveaxis(y, pos, axis)
    if _is_tracer(indices):
        if n != size:
            raise NotInvertibleError(
                "`gather` with traced indices is only inverted when they permute "
                "the whole axis."
            )
        if not jnp.issubdtype(jnp.result_type(y), jnp.inexact):
            raise NotInvertibleError(
                "`gather` of integers with traced indices is not inverted: whether "
                "they permute the axis is only known at run time, and integers "
                "cannot hold the NaN that marks a failed check."
            )
    else:
        idx = np.asarray(indices)[:, 0].astype(np.int64)
        if (
            len(np.unique(idx)) != n
            or min(0, int(np.min(idx)) if idx.size else 0) < 0
            or max(0, int(np.max(idx)) if idx.size else 0) >= size
        ):
            raise NotInvertibleError(
                "`gather` indices are not a permutation of the axis, so some "
                "elements are dropped or repeated."
            )
        if n != size:
            return PieceResult(_gather_pieces(moved, idx, axis))
    inv_perm = jnp.argsort(jnp.asarray(indices)[:, 0])
    solved = jnp.take(moved, inv_perm, axis=axis, mode="clip")
    if _is_tracer(indices) and jnp.issubdtype(solved.dtype, jnp.inexact):
        # Runtime indices cannot be checked now: if they are not a
        # permutation of the axis, the answer is NaN (documented), never a
        # plausible wrong value.
        runtime_idx = jnp.asarray(indices)[:, 0]
        valid = jnp.all(
            jnp.sort(runtime_idx) == jnp.arange(size, dtype=runtime_idx.dtype)
        )
        solved = jnp.where(valid, solved, jnp.nan)
    return [solved, indices], 0.0


def _gather_pieces(moved: Any, idx: np.ndarray, axis: int) -> list[Piece]:
    """Pieces of the operand from rows `idx` (distinct, static) along `axis`."""
    order = np.argsort(idx)
    if np.any(order != np.arange(len(idx))):
        moved = jnp.take(moved, jnp.asarray(order), axis=axis)
    idx = idx[order]
    shape = jnp.shape(moved)

    def region(lo: int, hi: int, step: int) -> tuple[tuple[int, ...], ...]:
        start, limit, stride = [0] * len(shape), list(shape), [1] * len(shape)
        start[axis], limit[axis], stride[axis] = lo, hi, step
        return tuple(start), tuple(limit), tuple(stride)

    steps = np.diff(idx)
    if len(idx) == 1 or np.all(steps == steps[0]):
        step = int(steps[0]) if len(idx) > 1 else 1
        start, limit, stride = region(int(idx[0]), int(idx[-1]) + 1, step)
        return [Piece(0, start, limit, moved, stride)]
    pieces = []
    for k, i in enumerate(idx):
        start, limit, _ = region(int(i), int(i) + 1, 1)
        pieces.append(
            Piece(0, start, limit, lax.slice_in_dim(moved, k, k + 1, 1, axis))
        )
    return pieces


_tile_p = getattr(lax, "tile_p", None)  # JAX >= 0.8

if _tile_p is not None:

    @inverse_rules.register(_tile_p)
    def _tile_inverse(
        ctx: InverseContext, outvals: Sequence[Any], x: Any, *, reps: Any
    ) -> Any:
        if x is not None:
            return None
        (y,) = outvals
        if all(int(r) == 1 for r in reps):
            return [y], 0.0
        raise NotInvertibleError(
            f"`tile` with reps {tuple(reps)} copies its operand; it is not a bijection."
        )


# ---------------------------------------------------------------------------
# Scatters of unknown updates into a known operand at known positions
# (`jnp.zeros(n).at[idx].set(x)`: fill-triangular, padding into a mask).


def _gather_like_scatter(
    y: Any, indices: Any, dn: Any, updates_shape: Sequence[int], mode: Any
) -> Any:
    """The gather that reads back what a scatter with `dn` wrote."""
    inserted = tuple(dn.inserted_window_dims)
    operand_batching = tuple(getattr(dn, "operand_batching_dims", ()))
    window = iter(dn.update_window_dims)
    slice_sizes = []
    for d in range(jnp.ndim(y)):
        if d in inserted or d in operand_batching:
            slice_sizes.append(1)
        else:
            slice_sizes.append(int(updates_shape[next(window)]))
    gather_dn = lax.GatherDimensionNumbers(
        offset_dims=tuple(dn.update_window_dims),
        collapsed_slice_dims=inserted,
        start_index_map=tuple(dn.scatter_dims_to_operand_dims),
        **(
            {
                "operand_batching_dims": operand_batching,
                "start_indices_batching_dims": tuple(dn.scatter_indices_batching_dims),
            }
            if operand_batching
            else {}
        ),
    )
    return lax.gather(
        y,
        indices,
        gather_dn,
        tuple(slice_sizes),
        mode=lax.GatherScatterMode.FILL_OR_DROP,
        fill_value=jnp.nan if jnp.issubdtype(jnp.result_type(y), jnp.inexact) else 0,
    )


def _landings(
    operand_shape: Sequence[int], indices: Any, updates_shape: Sequence[int], dn: Any
) -> Any:
    """How many update elements each operand element receives."""
    ones = jnp.ones(tuple(updates_shape), jnp.int32)
    zeros = jnp.zeros(tuple(operand_shape), jnp.int32)
    return lax.scatter_add(
        zeros, indices, ones, dn, mode=lax.GatherScatterMode.FILL_OR_DROP
    )


def _scatter_rule(name: str) -> Any:
    def rule(
        ctx: InverseContext,
        outvals: Sequence[Any],
        operand: Any,
        indices: Any,
        updates: Any,
        *,
        dimension_numbers: Any,
        **params: Any,
    ) -> Any:
        if updates is not None or operand is None or indices is None:
            if operand is None and updates is not None and indices is not None:
                raise NotInvertibleError(
                    f"`{name}` overwrites the elements of its operand at the "
                    "indices, so they cannot be recovered (only the updates can)"
                )
            return None
        (y,) = outvals
        dn = dimension_numbers
        upd_aval = ctx.operand_aval(2)
        if upd_aval is None:  # a context without avals: the updates' shape
            return None  # is not known
        updates_shape = tuple(upd_aval.shape)
        # (In a `shard_map` body even constant indices are per shard.)
        if not _is_tracer(indices) and not compat.in_manual_body():
            with jax.ensure_compile_time_eval():
                counts = np.asarray(_landings(jnp.shape(y), indices, updates_shape, dn))
            total = int(np.prod(updates_shape))
            if counts.max(initial=0) > 1:
                raise NotInvertibleError(
                    f"`{name}` writes several updates to one position (repeated "
                    "indices), so they cannot be told apart"
                )
            if int(counts.sum()) != total:
                raise NotInvertibleError(
                    f"`{name}` drops {total - int(counts.sum())} update "
                    "element(s) whose indices are out of bounds"
                )
            landed = None
        elif jnp.issubdtype(jnp.result_type(y), jnp.inexact):
            counts = _landings(jnp.shape(y), indices, updates_shape, dn)
            landed = _gather_like_scatter(
                counts.astype(jnp.result_type(y)), indices, dn, updates_shape, None
            )
        else:
            raise NotInvertibleError(
                f"`{name}` of integers with traced indices is not inverted: "
                "whether they are distinct is only known at run time, and "
                "integers cannot hold the NaN that marks a failed check"
            )
        got = _gather_like_scatter(y, indices, dn, updates_shape, None)
        if name == "scatter-add":
            got = got - _gather_like_scatter(operand, indices, dn, updates_shape, None)
        if landed is not None:
            got = jnp.where(landed == 1, got, jnp.nan)
        if jnp.issubdtype(jnp.result_type(y), jnp.inexact):
            # The result holds the operand where no update lands: a result
            # that differs there is off the image (a non-zero above the
            # diagonal of a filled triangle), and the updates are NaN.
            # (Within rounding: `y` may come from steps solved before.)
            untouched = counts == 0
            op = jnp.asarray(operand, jnp.result_type(y))
            scale = jnp.max(jnp.abs(jnp.where(jnp.isfinite(y), y, 0)), initial=0)
            off = jnp.any(untouched & ~agree_within_rounding(y, op, scale))
            got = jnp.where(off, jnp.nan, got)
        return [operand, indices, got.astype(upd_aval.dtype)], 0.0

    rule.__name__ = f"_{name.replace('-', '_')}_inverse"
    rule.__doc__ = (
        f"`{name}` of unknown updates into a known operand at known distinct "
        "in-bounds indices: the updates are read back with a gather (under "
        "tracing, updates whose indices repeat or fall outside give NaN). A "
        "result that differs from the operand where no update lands is off "
        "the map's image: the updates are then NaN (floating types). The "
        "map copies values, so its ildj is 0."
    )
    return rule


inverse_rules.register(lax.scatter_p)(_scatter_rule("scatter"))
inverse_rules.register(lax.scatter_add_p)(_scatter_rule("scatter-add"))
