"""Solving an elementwise block numerically (see `_blocks.py`).

When no exact method inverts a block `y = g(x)` (elementwise, one unknown
`x`), the root search of `_solve.py` finds `x`. This module decides what
the search may assume and checks what it returns:

- **folds**: a block that is not monotone (its slope changes sign) has more
  than one preimage for some `y`; its turning points are found (on the
  host, once per table of known operands, or per element at run time) and
  the search runs on each monotone stretch, keeping an answer only where
  one stretch holds it;
- **corners**: a block with `max`, `abs`, `select_n`, ... may be constant on
  one side of a corner, where no `x` is unique;
- the answer must map back to `y`, else NaN.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax_compat as compat
from ..._errors import NotInvertibleError
from .. import _blocks as bl, _traits as tr
from .._elementwise_steps import _body_jaxprs
from . import _enclose, _lazy as lazy, _solve, _table, _turning

# Steps at which a map may have a corner: on one side of it the map may be
# constant (`relu(x) + relu(x)**2` for `x <= 0`).
_CORNERS = tr.having(tr.PIECEWISE)


def _has_corners(eqns: Sequence[Any]) -> bool:
    return any(
        eqn.primitive.name in _CORNERS
        or (eqn.primitive is compat.jit_p and _has_corners(_body_jaxprs(eqn).eqns))
        for eqn in eqns
    )


def _folds(
    block: bl.Block, known: Sequence[Any], dtype: Any, extra: Sequence[float]
) -> _enclose.Turns | None:
    """The turns of a uniform map between the solver's grid points (and the
    switches `extra`) that enclosing its slope finds (`_enclose.py`), with
    points about them to sample: none where the map is proven monotone,
    `None` where it is left to the samplers. Only for scalar known operands
    and equations that run on scalars. A map with turns found and intervals
    left undecided (where more turns may hide) is refused."""
    slope = _scalar_slope(block, known, dtype)
    if slope is None:
        return None
    points = _solve.grid(dtype)
    if len(extra):
        points = np.unique(np.concatenate([points, np.asarray(extra, dtype)]))
    turns = _enclose.turn_points(slope, points, dtype)
    if turns.points.size and not turns.complete:
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value that "
            "is not monotone (its slope changes sign between sample points more "
            "often than enclosing the slope locates), so it takes some values "
            "more than once and has no inverse"
        )
    return turns


def _scalar_slope(
    block: bl.Block, known: Sequence[Any], dtype: Any
) -> _enclose.Slope | None:
    """The enclosable slope of the block's map with its known operands as
    scalars (`bl.as_scalar`), or `None` where one is not a scalar, the
    equations do not run on scalars, or a step has no enclosure rule."""
    known = [bl.as_scalar(k) for k in known]
    if any(np.shape(k) for k in known) or not bl.replays_at_any_shape(block.eqns):
        return None
    with jax.ensure_compile_time_eval():
        return _enclose.Slope.of(lambda u: block.g(u, *known), dtype)


def _per_element_slope(block: bl.Block, known: Sequence[Any], y: Any) -> Any:
    """The slope of the block's map with its known operands as inputs
    (`_enclose.Slope`), where each is a scalar or one value per element and
    its equations run on scalars; else `None`."""
    shape = tuple(jnp.shape(y))
    if not known or not bl.replays_at_any_shape(block.eqns):
        return None
    if any(jnp.shape(k) and bl.table_of(k, shape) for k in known):
        return None  # (a table the block indexes)
    if not all(bl.same_for_every_element(k, shape) for k in bl.constants(block.eqns)):
        return None  # (a per-element constant inside the block)
    with jax.ensure_compile_time_eval():
        return _enclose.Slope.of(block.g, jnp.result_type(y), known)


def _refuse_folds_per_element(block: bl.Block, known: Sequence[Any], y: Any) -> None:
    """For known operands that are concrete and differ between elements:
    refused where the map is proven to turn between grid points for some
    element (`_enclose.turning_boxes`), as where the samples show it."""
    slope = _per_element_slope(block, known, y)
    if slope is None:
        return
    dtype = jnp.result_type(y)
    values = [np.asarray(k) for k in known]
    boxes = _enclose.turning_boxes(slope, _solve.grid(dtype), dtype, values)
    turned = _enclose.inside(boxes, values)
    if turned.any():
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value that "
            f"is not monotone for {int(turned.sum())} of {turned.size} elements "
            "of its known operands (its slope changes sign between sample "
            "points), so it takes some values more than once and has no inverse"
        )


# Known operands small enough to key the runtime search's cache by value.
_CACHED_ELEMENTS = 64


def _runtime_turns(block: bl.Block, known: Sequence[Any], y: Any) -> Any:
    """For known operands traced (values not known until the program runs):
    `turns(*known)`, per element, where the map is proven to turn between
    grid points. A host callback encloses the map's slope for the operands'
    values and returns boxes of them within which it turns
    (`_enclose.turning_boxes`, padded to a fixed number with empty ones);
    each element is then tested against the boxes where it lives, so its
    sharding is kept. `None` where the map has no enclosure
    (`_per_element_slope`). The searches of the last few operand values are
    kept (an evaluation loop over fixed parameters searches once)."""
    slope = _per_element_slope(block, known, y)
    if slope is None:
        return None
    dtype = np.dtype(jnp.result_type(y))
    points = _solve.grid(dtype)
    count = _enclose.MAX_BOXES
    ranks = [jnp.ndim(k) for k in known]

    def search(values: list[np.ndarray]) -> list[np.ndarray]:
        return _enclose.turning_boxes(slope, points, dtype, values)

    @functools.lru_cache(maxsize=16)
    def cached(key: tuple[Any, ...]) -> list[np.ndarray]:
        return search([np.frombuffer(raw, kind).reshape(sh) for sh, kind, raw in key])

    # The boxes come back as one array (several results of a callback do
    # not lower on a sharded program in JAX 0.7) of float32, their ends
    # rounded outwards: an element within a box is within the rounded one
    # too (rounding keeps order), and one just outside may be taken as in
    # it (NaN, never a wrong answer). Not float64 even with 64-bit values:
    # under `jax.enable_x64` as a context (per thread) JAX casts a callback's
    # float64 results to float32, since it runs in another thread.
    kind = np.dtype(np.float32)

    def host(*values: Any) -> np.ndarray:
        # Under `vmap`, leading axes of batch: the batch's elements are
        # searched together, as more elements (a box holds for whichever
        # element lies in it), and every batch element gets the same boxes.
        batch = np.shape(values[0])[: np.ndim(values[0]) - ranks[0]]
        top = max(ranks)
        row = [
            np.reshape(v, (*batch, *(1,) * (top - r), *np.shape(v)[len(batch) :]))
            for v, r in zip(values, ranks, strict=True)
        ]
        if sum(v.size for v in row) <= _CACHED_ELEMENTS:
            boxes = cached(tuple((v.shape, v.dtype.str, v.tobytes()) for v in row))
        else:
            boxes = search(row)
        out = np.empty((len(values), count, 2), kind)
        out[..., 0], out[..., 1] = np.inf, -np.inf  # (empty)
        for i, box in enumerate(boxes):
            lo, hi = box[:, 0].astype(kind), box[:, 1].astype(kind)
            out[:, i, 0] = np.where(
                lo > box[:, 0], np.nextafter(lo, kind.type(-np.inf)), lo
            )
            out[:, i, 1] = np.where(
                hi < box[:, 1], np.nextafter(hi, kind.type(np.inf)), hi
            )
        return np.broadcast_to(out, (*batch, *out.shape))

    def turns(*operands: Any) -> Any:
        boxes = _on_host(host, ((len(operands), count, 2), kind), operands)
        # (Tested in the float type both promote to, cast explicitly: JAX's
        # strict type promotion refuses an int operand against a float box.)
        hit = []
        for k, box in zip(operands, boxes, strict=True):
            t = jnp.promote_types(jnp.result_type(k), kind)
            v = jnp.expand_dims(jnp.asarray(k).astype(t), -1)
            hit.append((v >= box[:, 0].astype(t)) & (v <= box[:, 1].astype(t)))
        return jnp.any(functools.reduce(jnp.logical_and, hit), axis=-1)

    return turns


def _on_host(host: Callable[..., Any], result: Any, operands: Sequence[Any]) -> Any:
    """`host(*operands)` (NumPy) when the program runs, by `jax.pure_callback`
    with `result = (shape, dtype)`: the runtime searches for turns. Under
    `vmap` every operand gets the batch's leading axes (`broadcast_all`); the
    operands are not differentiated through (`stop_gradient`)."""
    return jax.pure_callback(
        host,
        jax.ShapeDtypeStruct(*result),
        *(jax.lax.stop_gradient(jnp.asarray(k)) for k in operands),
        vmap_method="broadcast_all",
    )


def scalar_turns(g: Callable[..., Any], dtype: Any, known: Sequence[Any]) -> Any:
    """For `g(s, *known)` with a scalar unknown `s` and known operands of any
    shape (the gap function of a scalar bottleneck, `_bottleneck.py`):
    `turns(*known)`, whether `g` is proven to turn between grid points of
    `s` for these operands (`_enclose.turn_points`, the operands as exact
    arrays), by a host callback when the program runs; `None` where `g` has
    no enclosure. Under `vmap` the batch's operands are searched as one box
    first (each element of each operand between its least and greatest over
    the batch), then halved where that leaves it undecided
    (`_enclose.turning_rows`)."""
    with jax.ensure_compile_time_eval():
        slope = _enclose.Slope.of(g, dtype, known, shaped=True)
    if slope is None:
        return None
    dtype = np.dtype(dtype)
    points = _solve.grid(dtype)
    ranks = [jnp.ndim(k) for k in known]

    def search(box: list[tuple[np.ndarray, np.ndarray]]) -> _enclose.Turns:
        return _enclose.turn_points(slope, points, dtype, box)

    def host(*values: Any) -> np.ndarray:
        values = tuple(np.asarray(v, np.float64) for v in values)
        batch = values[0].shape[: values[0].ndim - ranks[0]]
        if not batch:
            return np.asarray(search([(v, v) for v in values]).turned)
        shapes = [v.shape[len(batch) :] for v in values]
        return _in_rows(
            values,
            batch,
            lambda lo, hi: search(
                list(zip(_unflat(lo, shapes), _unflat(hi, shapes), strict=True))
            ),
        )

    def turns(*operands: Any) -> Any:
        return _on_host(host, ((), jnp.bool_), operands)

    return turns


def _in_rows(
    values: Sequence[np.ndarray],
    batch: tuple[int, ...],
    search: Callable[[np.ndarray, np.ndarray], _enclose.Turns],
) -> np.ndarray:
    """Per batch element of `values` (each with the leading axes `batch`),
    whether `search(lo, hi)` over the box of the flattened operand values
    proves a turn (`_enclose.turning_rows`)."""
    n = math.prod(batch)
    rows = np.concatenate([np.reshape(v, (n, -1)) for v in values], axis=1)
    return _enclose.turning_rows(rows, search).reshape(batch)


def _unflat(flat: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """`flat` cut into arrays of `shapes`, in order."""
    cuts = np.cumsum([math.prod(sh) for sh in shapes])[:-1]
    return [
        np.reshape(p, sh) for p, sh in zip(np.split(flat, cuts), shapes, strict=True)
    ]


def row_turns(
    flat: Callable[..., Any], rows: np.ndarray, dtype: Any, known: Sequence[Any]
) -> Any:
    """For a sequential solve's level (`_sequential.py`): `turns(prev, on,
    *known)`, per element `j` solved at this level (`on[j]`), whether its
    row, `x -> flat(prev with x at j, *known)[rows[j]]`, is proven to turn
    between grid points (`_enclose.turn_points`), by a host callback when
    the program runs; `None` where `flat` has no enclosure. The row's map
    picks its element and its result with one-hot operands, so one
    enclosure serves every row. Under `vmap`, each element's batch is
    searched as one box, then halved (`_enclose.turning_rows`)."""
    n = len(rows)

    def row(s: Any, prev: Any, pick: Any, out: Any, *kn: Any) -> Any:
        return jnp.sum(out * flat(jnp.where(pick, s, prev), *kn))

    prev = jnp.zeros((n,), dtype)
    with jax.ensure_compile_time_eval():
        m = int(jnp.shape(jax.eval_shape(flat, prev, *known))[0])
        pick, out = np.zeros(n, bool), np.zeros(m, dtype)
        slope = _enclose.Slope.of(row, dtype, (prev, pick, out, *known), shaped=True)
    if slope is None:
        return None
    dtype = np.dtype(dtype)
    points = _solve.grid(dtype)
    ranks = [1, 1, *(jnp.ndim(k) for k in known)]

    shapes = [(n,), *(tuple(jnp.shape(k)) for k in known)]

    def host(prev: Any, on: Any, *kn: Any) -> np.ndarray:
        values = [np.asarray(v, np.float64) for v in (prev, *kn)]
        on = np.asarray(on) != 0
        batch = values[0].shape[: values[0].ndim - ranks[0]]
        out = np.zeros((*batch, n), bool)
        for j in range(n):
            pick = np.zeros(n, np.float64)
            pick[j] = 1
            one = np.zeros(m, np.float64)
            one[rows[j]] = 1

            def search(
                lo: np.ndarray, hi: np.ndarray, pick: Any = pick, one: Any = one
            ) -> _enclose.Turns:
                box = list(zip(_unflat(lo, shapes), _unflat(hi, shapes), strict=True))
                box[1:1] = [(pick, pick), (one, one)]
                return _enclose.turn_points(slope, points, dtype, box)

            # (The batch elements that solve element `j` at this level.)
            solving = on[..., j]
            if not solving.any():
                continue
            picked = [v[solving] for v in values]
            out[..., j][solving] = _in_rows(picked, (len(picked[0]),), search)
        return out

    def turns(prev: Any, on: Any, *kn: Any) -> Any:
        return _on_host(host, ((n,), jnp.bool_), (prev, on, *kn))

    return turns


def solve_numerically(block: bl.Block, y: Any, known: Sequence[Any]) -> Any:
    """`x` by the elementwise solver (NaN where no root is found). A map that
    turns (`_solve.monotone_on_grid`) is not injective: refused now when its
    known operands are constants, else NaN where it turns. A map with
    corners is NaN where its root lies at the edge of a stretch on which it
    is constant (`_solve.edge_of_plateau`): every point of the stretch is a
    preimage too."""
    x = _solve_numerically(block, y, known)
    if not _has_corners(block.eqns):
        return x
    runs = _unproven(block, known, y)
    if runs is None:
        edge = _solve.edge_of_plateau(lambda u: block.g(u, *known), x)
    else:
        edge = _edges_in(block.g, x, known, runs)
    return jnp.where(edge, jnp.asarray(jnp.nan, jnp.result_type(x)), x)


# At most this many runs where a map with corners is not proven to move
# (`_unproven`) are looked up at run time; beyond, every element is tested
# for the edge of a plateau. Up to `_FEW_RUNS`, by a comparison with each.
_MAX_RUNS = 256
_FEW_RUNS = 8


def _unproven(block: bl.Block, known: Sequence[Any], y: Any) -> np.ndarray | None:
    """For a map `g` the same for every element, known now (constant scalar
    operands, equations that run on scalars): the runs of `x` outside of
    which `g(x - d) != g(x) != g(x + d)` is proven, as computed in its
    dtype, for `_solve.edge_of_plateau`'s step `d` (`_solve.plateau_step`),
    so that no `x` there is the edge of a plateau (`_enclose.unmoving`);
    `None` where there is no proof to use, or more than `_MAX_RUNS` runs."""
    if (
        any(compat.is_tracer(k) for k in known)
        or compat.in_manual_body()
        or not bl.uniform(block, known, tuple(jnp.shape(y)))
    ):
        return None
    dtype = jnp.result_type(y)
    slope = _scalar_slope(block, known, dtype)
    if slope is None:
        return None
    step = _solve.plateau_step_size(dtype)
    runs = _enclose.unmoving(slope, _solve.grid(dtype), dtype, step)
    return runs if len(runs) <= _MAX_RUNS else None


def _at_or_below(ends: np.ndarray, x: Any) -> Any:
    """Per element of `x`, how many of the sorted `ends` are at or below it:
    a binary search unrolled over the bits of the count, each step a
    comparison with one gathered end. (`jnp.searchsorted` batches a scan
    with `vmap`, which JAX's hijax scan does not take; its `compare_all`
    was 384 ms at 10^6 elements and 214 ends, against 5.6 ms searched.)"""
    table = jnp.asarray(ends)
    count = jnp.zeros(jnp.shape(x), jnp.int32)
    step = 1 << (len(ends).bit_length() - 1)
    while step:
        # (`count + step` ends are at or below `x` if the last of them is.)
        take = count + step
        last = jnp.take(table, jnp.minimum(take, len(ends)) - 1, mode="clip")
        count = jnp.where((take <= len(ends)) & (last <= x), take, count)
        step >>= 1
    return count


def _edges_in(
    g: Callable[..., Any], x: Any, known: Sequence[Any], runs: np.ndarray
) -> Any:
    """`_solve.edge_of_plateau` of `g(., *known)` at `x` where `x` lies in
    one of `runs`, false elsewhere (where `g(x)` is proven to differ from
    its values at `edge_of_plateau`'s nearest neighbours either side). The
    elements in a run are tested gathered with their known operands,
    lazily (`_lazy.gather_where`): none of them, usually, when the runs
    are short stretches about a map's corners."""
    x = lax.stop_gradient(x)
    if len(runs) <= _FEW_RUNS:
        near: Any = jnp.zeros(jnp.shape(x), bool)
        for lo, hi in runs.tolist():
            near = near | ((x >= lo) & (x <= hi))
    else:
        # (Sorted, apart: `x` lies in a run where an odd number of ends are
        # at or below it; the ends a float apart outwards, so that one equal
        # to an end counts too.)
        dtype = np.dtype(jnp.result_type(x))
        inf = np.asarray(np.inf, dtype)
        lo = np.nextafter(runs[:, 0].astype(dtype), -inf)
        hi = np.nextafter(runs[:, 1].astype(dtype), inf)
        near = _at_or_below(np.stack([lo, hi], axis=1).ravel(), x) % 2 == 1
    nan = jnp.asarray(jnp.nan, jnp.result_type(x))

    def test(x: Any, *known: Any) -> Any:
        edge = _solve.edge_of_plateau(lambda u: g(u, *known), x)
        return jnp.where(edge, nan, x)

    tested = lazy.gather_where(near, x, test, known)
    return jnp.isnan(tested) & ~jnp.isnan(x)


def _solve_numerically(block: bl.Block, y: Any, known: Sequence[Any]) -> Any:

    def choices(x: Any, *known: Any) -> list[Any]:
        return _turning.discrete(block, x, known)

    # (A map that differs between elements through a constant inside it is
    # checked element by element, whatever its operands.)
    inside = all(
        bl.same_for_every_element(k, jnp.shape(y)) for k in bl.constants(block.eqns)
    )
    # The undecided elements are solved apart, gathered, only where the
    # block's equations run at any shape (not a call whose body is typed at
    # the elements' shape, a `custom_jvp` function's).
    gather = inside and bl.replays_at_any_shape(block.eqns)
    if not any(compat.is_tracer(k) for k in known) and not compat.in_manual_body():
        shape, dtype = jnp.shape(y), jnp.result_type(y)
        uniform = bl.uniform(block, known, tuple(shape))
        try:
            # A piecewise map may jump between grid points where a case
            # switches: sampled either side of each switch too.
            extra, crowded = (
                _turning.switch_points(block, known, tuple(shape), dtype)
                if uniform
                else ([], False)
            )
            # Turns between the grid points, found by enclosing the slope.
            folds = _folds(block, known, dtype, extra) if uniform else None
            if not uniform:
                _refuse_folds_per_element(block, known, y)
            # (And either side of the switches the enclosures could not
            # decide between grid points: the map may jump back there.)
            more = (
                [*folds.points.tolist(), *folds.switches.tolist()]
                if folds is not None
                else []
            )
            with jax.ensure_compile_time_eval():
                ok = np.asarray(
                    _solve.monotone_on_grid(
                        lambda x: block.g(x, *known),
                        shape,
                        dtype,
                        uniform=uniform,
                        extra=[*extra, *more],
                        # (Per element: its switches located there.)
                        choices=None if uniform else lambda x: choices(x, *known),
                    )
                )
        except jax.errors.TracerArrayConversionError:
            # Some bodies stage even here (a `custom_jvp` on older JAX): the
            # check then runs with the solve, NaN where the map turns.
            return _solve.solver(
                block.g, choices=choices, uniform=inside, gather=gather
            )(y, *known)
        # (A turn the enclosures prove is one, whatever the samples show.)
        if not ok.all() or (folds is not None and folds.turns):
            # It turns: inverted where `y` has one preimage (`_turning.py`),
            # if it has one anywhere.
            turns = folds.turns if folds is not None else ()
            walk = (extra, more, turns)
            searched = uniform and not crowded
            return _solve_turning(block, y, known, searched, walk, gather)
        # The same map for every element, known now: a table of starts.
        try:
            table = (
                _table.build(lambda x: block.g(x, *known), shape, dtype)
                if uniform
                else None
            )
        except jax.errors.TracerArrayConversionError:
            table = None  # (a body that stages even here: no table)
        return _solve.solver(
            block.g, check_grid=False, table=table, choices=choices, gather=gather
        )(y, *known)
    # Turns between grid points, found when the program runs.
    turns = _runtime_turns(block, known, y)
    # Inside a `shard_map` body the solver's trial values vary as the
    # unknown does in the Jaxpr, so the block's equations replay as typed.
    axes = compat.varying_axes(block.x.aval)
    if axes:
        g = block.g
        return _solve.solver(
            lambda x, *k: g(compat.vary_over(x, axes), *k),
            choices=lambda x, *k: _turning.discrete(
                block, compat.vary_over(x, axes), k
            ),
            uniform=inside,
            turns=turns,
        )(y, *known)
    # (The undecided elements gathered: not inside a `shard_map` body, above.)
    return _solve.solver(
        block.g,
        choices=choices,
        uniform=inside,
        gather=gather,
        turns=turns,
        kinks=lambda x, *known: _turning.discrete(block, x, known, kinks=True),
    )(y, *known)


def _solve_turning(
    block: bl.Block,
    y: Any,
    known: Sequence[Any],
    searched: bool,
    walk: tuple[Any, Any, Any],
    gather: bool,
) -> Any:
    """The block's unknown where `y` has one preimage, for a map known now
    (the same for every element) that turns; refused if no `y` has one.
    `searched`: whether to look for its monotone stretches; `walk`: the
    extra sample points, switches and proven turns found; `gather`: as for
    `_solve.solver`."""
    shape, dtype = jnp.shape(y), jnp.result_type(y)
    extra, more, turns = walk

    def choices(x: Any, *known: Any) -> list[Any]:
        return _turning.discrete(block, x, known)

    found = None
    if searched:
        try:
            found = _turning.stretches(
                lambda x: block.g(x, *known), dtype, tuple(shape), extra, more, turns
            )
        except jax.errors.TracerArrayConversionError:
            found = None  # (a body that stages even here: refused)
    if found is None or not found.any_single():
        every = (
            " (every value it takes, as far as the sample points and "
            "the refinement of its turns show)"
            if found is not None
            else ""
        )
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value "
            "that is not monotone (it turns between sample points of "
            f"{_solve.grid(dtype)[[0, -1]].tolist()}), so it takes "
            f"some values more than once{every} and has no inverse"
        )
    # A table of starts on the stretches (`found` only exists for the same
    # map for every element, known now).
    try:
        table = _table.build(lambda x: block.g(x, *known), shape, dtype, found.pieces())
    except jax.errors.TracerArrayConversionError:
        table = None
    x = _solve.solver(
        block.g, check_grid=False, table=table, choices=choices, gather=gather
    )(y, *known)
    ok_y = found.single(y) & found.holds(y, x)
    return jnp.where(ok_y, x, jnp.asarray(jnp.nan, jnp.result_type(x)))
