"""Blocks: the methods that solve several equations at once for one unknown.

When no equation can be inverted alone, the engine looks for a block ending
at a blocked equation: elementwise steps from one unknown to one known
result, or linear steps from unknowns to known results (`_blocks.py`), and
solves it by the first method that applies, in order: a linear solve, a
linear-fractional formula (`_fractional.py`), piecewise by cases, piecewise
by intervals (`_intervals.py`), numerically. The other block-shaped methods
(`_normalized.py`, `_sequential.py`, `_bottleneck.py`) find their own blocks;
`solved` turns what any of them found into the `Solved` the engine commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .. import _jax_compat as compat
from .._errors import NotInvertibleError, reraise
from . import (
    _block_find as bf,
    _block_solve as bs,
    _blocks as bl,
    _fractional as fr,
    _intervals as iv,
    _linear_parts as lp,
    _nonsquare as nsq,
    _refusals as rf,
)
from ._dataflow import Solved, SolverOrigin, SolveState, Walker, numerical
from ._rounding import floating, inherited_rounding

# What a block method found: (the block, its unknown's value, its ildj, the
# method's label).
Found = tuple[bl.Block, Any, Any, str]


def solved(st: SolveState, found: Found | None) -> Solved | None:
    """What a block method found, as the engine records it."""
    if found is None:
        return None
    block, x_val, block_ildj, method = found
    env = st.env
    # Both methods check that `x` maps back to `y` (else NaN), so they
    # may start from a value chosen on a branch; what they find is then a
    # choice too, as is a numerical solve's preimage.
    chosen_from = [v for v in (*block.ys, *block.known) if v in st.taint]
    chosen_from += [v for v in block.parts if v in st.piece_branch]
    chooses = method in (bl.ELEMENTWISE_SOLVE, bl.SYMMETRIC_SOLVE)
    origin: Any = None
    if chooses:
        origin = SolverOrigin(st.eqns[block.top], method)
    elif chosen_from:
        origin = st.chooser[chosen_from[0]]
    known = [env[v] for v in block.known]
    rounding = {}
    if block.kind == bl.ELEMENTWISE and floating(x_val):
        y_val = env[block.y]
        # (Traced only if a check asks for it: `SolveState.rounding_of`.)
        rounding[block.x] = lambda: inherited_rounding(
            lambda u: block.g(u, *known), x_val, y_val
        )
    values = block.run(x_val, known)
    new_vars = [*block.xs, *(v for e in block.eqns for v in e.outvars)]
    return Solved(
        method,
        at=block.top,
        indices=block.indices,
        values={v: values[v] for v in new_vars},
        ildj=block_ildj,
        checks=rf.block_nan_checks(block, method, env, x_val)
        if st.options.nan_checks
        else (),
        # Its values known in parts (`block.parts`, `block.partial`) are
        # what it solved from: their pieces hold by construction.
        retired={*block.parts, *block.partial},
        chose=chooses or bool(chosen_from),
        origin=origin,
        # A symmetric solve chooses only what depends on the antisymmetric
        # part.
        chosen=lp.chosen_values(block, known)
        if method == bl.SYMMETRIC_SOLVE and not chosen_from
        else None,
        rounding=rounding,
    )


def block_step(walker: Walker, st: SolveState) -> Solved | None:
    """Solve the first elementwise or linear block ending at a blocked
    equation, or `None`."""
    eqns, producer, env, reasons = st.eqns, st.producer, st.env, st.reasons
    # Also linear blocks ending at a value known only in parts (the
    # lower triangle of a symmetrized matrix, see `_cholesky.py`).
    tops = set(reasons) | lp.partial_tops(st)
    for top in sorted(tops, reverse=True):
        known_now = env.__contains__
        partial = not all(v in env for v in eqns[top].outvars)
        block = None if partial else bf.find_block(top, eqns, producer, known_now)
        block = block or bf.find_block(
            top, eqns, producer, known_now, kind=bl.LINEAR, partly=st.pieces
        )
        if block is None:
            continue
        if block.kind == bl.LINEAR:
            if partial:
                block.ys = []  # its known elements are `parts`
            if not block.from_pieces:
                # (A chain from pieces stands alone: joined, its
                # constant-rank condition would no longer hold.)
                block = _join_linear(st, block)
            for v in block.xs:
                if v in st.pieces:
                    block.partial[v] = bl.partly_known(
                        v.aval.shape, v.aval.dtype, st.pieces[v]
                    )
            lp.add_parts(block, st, bl.partly_known)
        elif block.x in st.pieces:
            continue
        try:
            found = _solve_found(walker, st, block)
        except NotInvertibleError as err:
            st.refuse(top, rf.reason(err))
            continue
        except Exception as err:
            reraise(
                "inverse",
                eqns[top],
                err,
                doing="solving the block of equations that ends there",
            )
        if isinstance(found, str):
            st.refuse(top, found)
            continue
        return solved(st, found)
    return None


def _solve_found(walker: Walker, st: SolveState, block: bl.Block) -> Found | str:
    """Solve `block`: (the block, its unknown's value, its ildj, the
    method), or why it was not tried."""
    env, want_ildj, solvers = st.env, st.options.want_ildj, st.options.solvers
    y = env.get(block.y)
    known = [env[v] for v in block.known]
    ildj: Any = 0.0
    if block.kind == bl.LINEAR:
        size = bl.unknown_size(block)
        if size > lp.result_size(block) and not lp.may_be_symmetric(block):
            return bl.too_few(block)
        if size > bl.MAX_LINEAR:
            return bl.too_large(block)
        if not solvers:
            return bl.SOLVERS_OFF
        if block.chain and not nsq.determined(
            block, known, traced=not block.from_pieces
        ):
            # Its equations' refusals stand.
            return st.reasons.get(
                block.top,
                "its unknown operand, known in parts, is a linear function "
                "of the elements left that its results do not determine",
            )
        ys = [env[v] for v in block.ys]
        x, ildj, method = bs.solve_linear(block, ys, known)
        return block, x, ildj if want_ildj else 0.0, method
    compacts = [st.compact(v) for v in block.known]
    # (On one value per element, flattened where that is free: XLA's
    # CPU code for a block on `(n, 5)` is not vectorized.)
    flat = bs.flattened(block, y, known, compacts)
    if flat is not None:
        y, known, compacts, shape = flat
    if block.linear:
        x = bs.solve_linear_elementwise(block, y, known)
        method = bl.LINEAR_SOLVE
    else:
        x = fr.solve(block, y, known)
        method = fr.LINEAR_FRACTIONAL
    if x is None:

        def invert_case(closed: Any, invals: Sequence[Any], y: Any) -> Any:
            return _invert_case(walker, closed, invals, y)

        x = bs.solve_piecewise(block, y, known, invert_case)
        method = bl.PIECEWISE
    if x is None:
        x = iv.solve(block, y, known, compacts)
        method = iv.INTERVALS
    if x is None:
        if not solvers:
            return bl.SOLVERS_OFF
        x = numerical("_block_numeric").solve_numerically(block, y, known)
        method = bl.ELEMENTWISE_SOLVE
    if want_ildj:
        ildj = bl.block_ildj(block, x, known)
    if flat is not None:
        x = jnp.reshape(jax.lax.optimization_barrier(x), shape)
    return block, x, ildj, method


def _join_linear(st: SolveState, block: bl.Block) -> bl.Block:
    """`block` joined with the other blocked linear blocks that share an
    unknown with it (sums and differences of halves: each alone has too
    few results)."""
    eqns, producer, known = st.eqns, st.producer, st.env.__contains__
    changed = True
    while changed:
        changed = False
        for other_top in sorted(st.reasons):
            if other_top in block.indices:
                continue
            other = bf.find_block(other_top, eqns, producer, known, kind=bl.LINEAR)
            if other is not None and not all(known(v) for v in eqns[other_top].outvars):
                other.ys = []  # known in parts only (see `block_step`)
            if other is not None and set(other.xs) & set(block.xs):
                joined = block.merge(other)
                if bf.independent(joined.xs, joined.indices, eqns, producer, known):
                    block = joined
                    changed = True
    return block


def _invert_case(
    walker: Walker, closed: compat.ClosedJaxpr, invals: Sequence[Any], y: Any
) -> Any | None:
    """One case of a piecewise block, inverted by formulas alone."""
    sol = walker.solve(
        compat.open_jaxpr(closed),
        compat.jaxpr_consts(closed),
        invals,
        [y],
        strict=False,
        want_ildj=False,
        methods=(),
    )
    x = sol.invals[0]
    if x is None:
        # A case that uses its unknown twice may be linear-fractional
        # (softsign's `x / (1 + x)` once `|x|` is a case).
        return fr.solve_case(closed, invals[1:], y)
    if sol.branches[0] is not None:
        return None
    return x
