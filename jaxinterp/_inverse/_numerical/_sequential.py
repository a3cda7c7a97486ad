"""Sequential blocks: triangular nonlinear maps, solved one level at a time.

An autoregressive flow (`y_i = x_i * exp(s_i(x_<i)) + t_i(x_<i)`), stick-breaking
onto a simplex or the rows of a correlation Cholesky factor reach every result
from one unknown value `x` along many paths, through any primitives (masked
matrix products, `cumprod`, `pad`, scatters, loops). No single equation can be
solved, and the block is neither elementwise nor linear (`_blocks.py`). But the
map is *triangular*: after some ordering, result element `y_r` depends on one
element `x_j` and on elements already solved. The engine tries this last, when
it is otherwise stuck and solvers are on:

1. **Region.** From the blocked equations, the equations between their known
   results and the unknown values they depend on. When that is one floating
   value (at most `MAX_SEQUENTIAL` elements), it is cut at the latest value
   that every path passes through and that is no larger (`z = expit(x)` in a
   stick-breaking map: the rest of the way back is the engine's, by formulas).
2. **Dependency pattern** of the results' elements on the unknown's: the
   nonzeros of `jax.jacfwd` of the region at two fixed pseudo-random points
   (OR of the two; a NaN counts as a dependency). A dependency that vanishes
   at both points but not elsewhere is missed (a measure-zero event for maps
   analytic in `x`, not for `relu` networks that are flat on open sets); the
   residual check below still never accepts a non-solution.
3. **Peel.** Repeatedly, the result elements that depend on exactly one
   unsolved element solve it; the elements found in one round form a *level*.
   When every element is solved, the map is triangular in that order; results
   not used are checked. No order (or a single level, which is the elementwise
   block's business): not this method, the refusal stands.
4. **Solve**, level by level, each level with the elementwise solver of
   `_solve.py` (bracketing and safeguarded Newton; NaN where the one-dimensional
   map turns or has no root), the elements of later levels held at a start
   point that they do not influence.
5. **Check** the residual of every result, used or not, within rounding
   propagated through the triangular system: otherwise every element is NaN
   (a `y` outside the image, e.g. a simplex vector whose entries do not sum
   to one).

The ildj is `-log|det J|` for a square map and, for a map onto a manifold
(more results than unknowns), `-0.5 * logdet(J^T J)` with `J` the block's
Jacobian (the area formula; see docs/inverse-methods.md). Derivatives come from the
implicit function theorem on the rows used (`jax.custom_jvp`), not from the
iterations.

The pattern is computed while tracing. A known operand that only a trace
holds (computed from a weight passed to `inverse` as a known argument) is
recomputed from the program's inputs with each traced input replaced by fixed
pseudo-random positive values: `mask * w` keeps a constant mask's zeros, and
the pattern is that of generic weights, which specific weights can only thin
out when the map is analytic in them (the residual check judges the answer
either way). A traced input that is not floating leaves no pattern, and a
traced mask (random values fill it) no order: refused.
"""

from __future__ import annotations

import functools as ft
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax_compat as compat
from .. import (
    _block_find as bf,
    _blocks as bl,
    _elementwise_steps as ew,
    _linear_parts as lp,
    _rounding as rd,
    _traits as tr,
)
from . import _block_numeric as numeric, _solve

_Literal = compat.Literal

SEQUENTIAL_SOLVE = "sequential solve"
SEQUENTIAL = "sequential"

# The most elements the unknown of a sequential block may have, and the
# most result elements and equations its region may have.
MAX_SEQUENTIAL = 256
_MAX_RESULTS = 8192
_MAX_EQNS = 2000
# At most this many values are tried as the cut of a region.
_MAX_CUTS = 64


class Triangular:
    """The peeled structure of a sequential block: per unknown element, its
    level and the result element (flat index) that solves it."""

    def __init__(
        self, level: np.ndarray, row: np.ndarray, start: np.ndarray, affine: bool
    ) -> None:
        self.level = level
        self.row = row
        self.start = start
        self.n_levels = int(level.max()) + 1
        # Whether each row used is affine in the element it solves (its
        # second derivative there is 0 at both points): one exact step.
        self.affine = affine


def _grow(
    tops: Sequence[int],
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    stop: Any = None,
) -> tuple[set[int], set[Any]] | None:
    """The equations between the results of `tops` and the unknown values
    they depend on (not going past `stop`), and those values; `None` if the
    region is too large or holds an equation with effects."""
    return bf.grow_region(tops, eqns, producer, known, stop=stop, max_eqns=_MAX_EQNS)


def find_sequential(st: Any) -> list[bl.Block]:
    """Candidate sequential blocks among the blocked equations of the engine
    state `st` (a `SolveState`), one per unknown value reached."""
    eqns, producer, reasons = st.eqns, st.producer, st.reasons
    known = st.env.__contains__
    groups: dict[Any, list[int]] = {}
    for top in sorted(reasons):
        grown = _grow([top], eqns, producer, known)
        if grown is None or len(grown[1]) != 1:
            continue
        (x,) = grown[1]
        groups.setdefault(x, []).append(top)
    blocks = []
    for x, tops in groups.items():
        block = _block(x, tops, st)
        if block is not None:
            blocks.append(block)
    return blocks


def _fits(v: Any, size: int) -> bool:
    aval = v.aval
    return (
        hasattr(aval, "shape")
        and jnp.issubdtype(aval.dtype, jnp.floating)
        and 0 < math.prod(aval.shape) <= size
    )


def _real(v: Any) -> bool:
    dtype = getattr(v.aval, "dtype", None)
    return (
        hasattr(v.aval, "shape")
        and dtype is not None
        and (
            jnp.issubdtype(dtype, jnp.floating)
            or jnp.issubdtype(dtype, jnp.integer)
            or jnp.issubdtype(dtype, jnp.bool_)
        )
    )


def _block(x: Any, tops: list[int], st: Any) -> bl.Block | None:
    eqns, producer, env = st.eqns, st.producer, st.env
    known = env.__contains__
    if not _fits(x, MAX_SEQUENTIAL) or x in st.pieces:
        return None
    grown = _grow(tops, eqns, producer, known)
    if grown is None:
        return None
    region, _ = grown
    # The latest value that every path back passes through, no larger than
    # `x`: what lies before it is the engine's to invert by formulas.
    size = math.prod(x.aval.shape)
    candidates = sorted(
        (p for p in region if p not in tops and len(eqns[p].outvars) == 1),
        reverse=True,
    )[:_MAX_CUTS]
    for p in candidates:
        cut = eqns[p].outvars[0]
        if not _fits(cut, size) or cut in st.pieces:
            continue
        got = _grow(tops, eqns, producer, known, stop=cut)
        if got is not None and got[1] == {cut}:
            x, region = cut, got[0]
            break
    indices = sorted(region)
    block_eqns = [eqns[i] for i in indices]
    # A known value that a block equation's masked step solved from that
    # equation's result (the case a constant-mask `where` always picks)
    # holds nothing that result does not: as a second result it would count
    # the same elements twice in the ildj of a map it makes look non-square.
    learned = {
        v
        for i in indices
        if i in st.masked_inverted
        for v in eqns[i].invars
        if type(v) is not _Literal
    }
    ys: list[Any] = []
    for e in block_eqns:
        ys.extend(v for v in e.outvars if known(v) and v not in ys and v not in learned)
    # Real results only: a complex one would lose its imaginary part.
    if not ys or not all(_real(v) for v in ys):
        return None
    m = sum(math.prod(v.aval.shape) for v in ys)
    if m > _MAX_RESULTS or m < math.prod(x.aval.shape):
        return None  # too large, or too few results to determine `x`
    shape = x.aval.shape
    if all(ew.is_elementwise(e, shape) for e in block_eqns):
        return None  # one level: the elementwise blocks' to solve or refuse
    known_vars: list[Any] = []
    for e in block_eqns:
        for v in e.invars:
            if type(v) is not _Literal and known(v) and v not in known_vars:
                known_vars.append(v)
    return bl.Block(
        max(tops), indices, block_eqns, x, ys[0], known_vars, {}, False, SEQUENTIAL, ys
    )


def flat_results(block: bl.Block) -> Callable[..., Any]:
    """`F(u, *known)`: the block's results, raveled and concatenated, from
    its unknown raveled into `u`."""
    shape, dtype = block.x.aval.shape, block.x.aval.dtype

    def flat(u: Any, *known: Any) -> Any:
        env = block.run(jnp.reshape(u, shape).astype(dtype), known)
        outs = [jnp.ravel(env[v]).astype(dtype) for v in block.ys]
        return jnp.concatenate(outs) if len(outs) > 1 else outs[0]

    return flat


def _points(n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Two fixed pseudo-random points, small and away from 0 (inside the
    domains of maps onto (0, 1) or (-1, 1), like `sqrt(1 - sum(t**2))`)."""
    rng = np.random.default_rng(20261123)
    a = rng.uniform(0.05, 0.3, n) / max(1.0, math.sqrt(n / 8))
    b = rng.uniform(0.05, 0.3, n) * rng.choice([-1.0, 1.0], n)
    b = b / max(1.0, math.sqrt(n / 8))
    return a.astype(dtype), b.astype(dtype)


def _probe_values(block: bl.Block, st: Any) -> list[Any] | None:
    """The block's known operands for measuring its pattern: their values
    where concrete; where only a trace holds them (weights passed to
    `inverse` as known arguments, values computed from `y`), recomputed from
    the program's inputs with each traced input replaced by fixed
    pseudo-random positive values of its type, so that the pattern holds for
    generic weights (`mask * w` keeps the constant mask's zeros). `None` if
    a traced input is not floating (an index)."""
    rng = np.random.default_rng(1123)
    memo: dict[Any, Any] = {}
    eqns, producer, env = st.eqns, st.producer, st.env

    def value(v: Any) -> Any:
        if type(v) is _Literal:
            return v.val
        if v in memo:
            return memo[v]
        got = env.get(v)
        if got is not None and not compat.is_tracer(got):
            out = got
        elif v in producer:
            eqn = eqns[producer[v]]
            ins = [value(u) for u in eqn.invars]
            with jax.ensure_compile_time_eval():
                outs = compat.bind_eqn(eqn.primitive, ins, eqn.params)
            memo.update(zip(eqn.outvars, outs, strict=True))
            return memo[v]
        else:
            dtype = v.aval.dtype
            if not jnp.issubdtype(dtype, jnp.floating):
                raise _NoProbe
            out = jnp.asarray(rng.uniform(0.5, 1.5, v.aval.shape), dtype)
        memo[v] = out
        return out

    try:
        # (Arrays made inside a trace are its values: made outside it.)
        with jax.ensure_compile_time_eval():
            return [value(v) for v in block.known]
    except _NoProbe:
        return None


class _NoProbe(Exception):
    """A traced input that random values cannot stand for."""


NOT_TRIANGULAR = (
    "no order of its unknown's elements makes its Jacobian triangular at "
    "two pseudo-random points"
)


def triangular(block: bl.Block, st: Any) -> Triangular | str | None:
    """The peeled order of the block (see the module's docstring);
    `NOT_TRIANGULAR` if there is none; `None` for a single level, fewer
    results than unknowns, or a Jacobian that cannot be measured."""
    if compat.in_manual_body():
        return None
    try:
        known = _probe_values(block, st)
    except Exception:  # noqa: BLE001 - not this method
        return None
    if known is None:
        return None
    n = math.prod(block.x.aval.shape)
    dtype = np.dtype(block.x.aval.dtype)
    a, b = _points(n, dtype)
    flat = flat_results(block)
    try:
        with jax.ensure_compile_time_eval():
            # One compiled call (op-by-op evaluation of the derivatives
            # would dispatch, and compile, every operation on its own).
            measured = jax.jit(ft.partial(_derivatives, flat))(
                jnp.stack([jnp.asarray(a), jnp.asarray(b)]), *known
            )
            jacs, curvatures = (np.asarray(v) for v in measured)
    except Exception:  # noqa: BLE001
        # Not this method: a known operand only a trace holds, or a step
        # forward-mode differentiation refuses (a `custom_vjp` function).
        return None
    if jacs.ndim != 3 or jacs.shape[2] != n:
        return None
    pattern = np.any((jacs != 0) | np.isnan(jacs), axis=0)
    m = pattern.shape[0]
    if m < n:
        return None
    level = np.full(n, -1)
    row = np.full(n, -1)
    solved = np.zeros(n, bool)
    depth = 0
    while not solved.all():
        open_counts = pattern[:, ~solved].sum(axis=1)
        rows = np.flatnonzero(open_counts == 1)
        found = False
        for r in rows:
            j = int(np.flatnonzero(pattern[r] & ~solved)[0])
            if row[j] < 0:
                row[j], level[j], found = r, depth, True
        if not found:
            return NOT_TRIANGULAR
        solved |= level == depth
        depth += 1
    if depth < 2:
        return None
    # Whether each row used is affine in the element it solves: its second
    # derivative there is exactly 0 at both points, and no step is only
    # piecewise affine (a `floor`, `abs` or `where` may make the row turn or
    # jump elsewhere: one Newton step would find one preimage of several).
    affine = bool(np.all(curvatures[:, np.arange(n), row] == 0)) and not any(
        _piecewise(e) for e in block.eqns
    )
    return Triangular(level, row, a, affine)


# Steps whose result is affine only piecewise in their operands.
_PIECEWISE = tr.having(tr.PIECEWISE)


def _piecewise(eqn: Any) -> bool:
    """Whether `eqn`, or an equation of a Jaxpr it runs, is piecewise."""
    if eqn.primitive.name in _PIECEWISE:
        return True
    return any(
        e.primitive.name in _PIECEWISE
        for sub in compat.sub_jaxprs(eqn)
        for e in compat.iter_eqns(sub)
    )


def _derivatives(flat: Callable[..., Any], points: Any, *known: Any) -> tuple[Any, Any]:
    """At each point, the Jacobian of `F` (m x n) and its second derivatives
    along each unknown element (`[j, r] = d^2 F_r / du_j^2`, n x m)."""
    n = points.shape[1]
    basis = jnp.eye(n, dtype=points.dtype)

    def at(point: Any) -> tuple[Any, Any]:
        jac = jax.jacfwd(flat)(point, *known)

        def second(e: Any) -> Any:
            def slope(u: Any) -> Any:
                return jax.jvp(lambda v: flat(v, *known), (u,), (e,))[1]

            return jax.jvp(slope, (point,), (e,))[1]

        return jac, jax.vmap(second)(basis)

    jac_a, curv_a = at(points[0])
    jac_b, curv_b = at(points[1])
    return jnp.stack([jac_a, jac_b]), jnp.stack([curv_a, curv_b])


def solve_sequential(
    block: bl.Block, tri: Triangular, ys: Sequence[Any], known: Sequence[Any]
) -> tuple[Any, Any]:
    """The block's unknown (NaN unless every result checks) and its ildj."""
    flat = flat_results(block)
    dtype = block.x.aval.dtype
    y = jnp.concatenate([jnp.ravel(v).astype(dtype) for v in ys])
    # Static (NumPy) indices: closed over by the derivative rule, which is
    # traced later, outside this trace.
    level, rows = tri.level, tri.row
    # (Turns of a row between grid points, found by enclosing its slope.)
    row_turns = None if tri.affine else numeric.row_turns(flat, rows, dtype, known)

    def one_level(u: Any, k: Any, target: Any, *kn: Any) -> Any:
        on = jnp.equal(level, k)

        def g(t: Any, prev: Any, *kn_: Any) -> Any:
            out = flat(jnp.where(on, t, prev), *kn_)[rows]
            return jnp.where(on, out, t)

        if tri.affine:
            # One exact Newton step from the start point (inside the
            # domain): `F` is affine in each element it solves.
            at, slope = jax.jvp(lambda v: flat(v, *kn)[rows], (u,), (on.astype(dtype),))
            step = (target - at) / jnp.where(slope == 0, 1, slope)
            return jnp.where(on, jnp.where(slope == 0, jnp.nan, u + step), u)
        turns = None
        if row_turns is not None:
            turns = ft.partial(lambda on_, prev, *kn_: row_turns(prev, on_, *kn_), on)
        x = _solve.solver(g, turns=turns)(jnp.where(on, target, u), u, *kn)
        return jnp.where(on, x, u)

    def levels(y: Any, *kn: Any) -> Any:
        target = y[rows]

        def body(state: tuple[Any, Any]) -> tuple[Any, Any]:
            k, u = state
            return k + 1, one_level(u, k, target, *kn)

        start = (jnp.int32(0), jnp.asarray(tri.start, dtype))
        _, u = lax.while_loop(lambda s: s[0] < tri.n_levels, body, start)
        return u

    return implicit_solve(flat, rows, levels, block.x.aval.shape, y, known)


def implicit_solve(
    flat: Callable[..., Any],
    rows: np.ndarray,
    inner: Callable[..., Any],
    shape: tuple[int, ...],
    y: Any,
    known: Sequence[Any],
) -> tuple[Any, Any]:
    """`inner(y, *known)`, the raveled unknown `u` with `flat(u, *known) =
    y` (`flat`: the block's results, raveled and concatenated), checked
    (`_checked`: NaN unless every result is `y` within rounding), reshaped
    to `shape`; and the ildj. Differentiable in `y` and `known` by the
    implicit function theorem on the results `rows` (as many as elements
    of `u`), not through `inner`."""
    n, m = len(rows), y.shape[0]

    def select(u: Any, *kn: Any) -> Any:
        return flat(u, *kn)[rows]

    @jax.custom_jvp
    def solve(y: Any, *kn: Any) -> Any:
        return _checked(flat, inner(y, *kn), y, kn, rows)

    @solve.defjvp
    def _solve_jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
        y, *kn = primals
        dy, *dkn = tangents
        u = solve(y, *kn)
        jac = jax.jacfwd(select)(u, *kn)
        rhs = dy[rows]
        floats = [
            i
            for i, k in enumerate(kn)
            if jnp.issubdtype(jnp.result_type(k), jnp.inexact)
        ]
        if floats:

            def of_known(*fk: Any) -> Any:
                full = list(kn)
                for i, v in zip(floats, fk, strict=True):
                    full[i] = v
                return select(u, *full)

            _, dg = jax.jvp(
                of_known, tuple(kn[i] for i in floats), tuple(dkn[i] for i in floats)
            )
            rhs = rhs - dg
        return u, jnp.linalg.solve(jac, rhs)

    def solve_and_ildj(y: Any, *kn: Any) -> tuple[Any, Any]:
        u = solve(y, *kn)
        jac = jax.jacfwd(flat)(u, *kn)
        if m == n:
            ildj = -jnp.linalg.slogdet(jac)[1]
        else:
            ildj = -0.5 * jnp.linalg.slogdet(jac.T @ jac)[1]
        return jnp.reshape(u, shape), ildj

    # One `jit` equation: an inverse run op by op (under `jax.grad` outside
    # `jit`) compiles it once, not each of its loops and steps.
    return jax.jit(solve_and_ildj)(y, *known)


def _checked(
    flat: Callable[..., Any], u: Any, y: Any, known: Sequence[Any], rows: Any
) -> Any:
    """`u`, or NaN everywhere unless every result is `y` within rounding:
    that of `y`, and of `u` propagated through the rows used."""
    at = flat(u, *known)
    jac = jax.jacfwd(flat)(u, *known)
    n = u.shape[0]
    abs_jac = jnp.abs(jac)
    # How far rounding of the results used (and of `u`) may move `u` ...
    spread = jnp.abs(jnp.linalg.inv(jac[rows])) @ (
        jnp.abs(y[rows]) + abs_jac[rows] @ jnp.abs(u)
    )
    # ... and so every result.
    scale = jnp.abs(y) + abs_jac @ jnp.abs(u) + abs_jac @ spread
    ok = jnp.all(rd.close(at, y, scale, ulps=16 * n))
    return jnp.where(ok, u, jnp.nan)


def _parts_checked(block: bl.Block, x: Any, known: Sequence[Any]) -> Any:
    """`x`, or NaN everywhere unless the block's values known in parts
    (`block.parts`: their known value and flat indices) are those parts
    within rounding at `x`, as `_checked` judges the results: a `y` off
    the image of a map onto a manifold (`(x[:2] transformed, (x @ M)[1:],
    sum(x @ M))`: five results of three unknowns) is NaN, not an `x` that
    reproduces the results the solve used and not the others."""
    dtype = jnp.result_type(x)
    parts = list(block.parts.items())
    want = jnp.concatenate(
        [jnp.ravel(base)[idx].astype(dtype) for _, (base, idx) in parts]
    )

    def got(u: Any) -> Any:
        env = block.run(jnp.reshape(u, jnp.shape(x)), known)
        return jnp.concatenate(
            [jnp.ravel(env[v])[idx].astype(dtype) for v, (_, idx) in parts]
        )

    u = jnp.ravel(x)
    at = got(u)
    scale = jnp.abs(want) + jnp.abs(jax.jacfwd(got)(u)) @ jnp.abs(u)
    ok = jnp.all(rd.close(at, want, scale, ulps=16 * u.shape[0]))
    return jnp.where(ok, x, jnp.nan)


def sequential_step(st: Any) -> tuple[bl.Block, Any, Any, str] | None:
    """Solve the first sequential block of the engine state `st`: (the block,
    its unknown's value, its ildj, the method), or `None`."""
    env = st.env
    for block in find_sequential(st):
        known = [env[v] for v in block.known]
        tri = triangular(block, st)
        if isinstance(tri, str):
            for i in block.indices:
                if i in st.reasons:
                    st.refuse(i, tri)
        if tri is None or isinstance(tri, str):
            continue
        x, ildj = solve_sequential(block, tri, [env[v] for v in block.ys], known)
        # Values inside the block known in parts (a slice of them is a
        # result the engine inverted into pieces) are results too: checked.
        lp.add_parts(block, st, bl.partly_known)
        if block.parts:
            x = _parts_checked(block, x, known)
        return block, x, ildj if st.options.want_ildj else 0.0, SEQUENTIAL_SOLVE
    return None
