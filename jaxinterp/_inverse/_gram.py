"""Two choices the engine makes only when nothing else determines a value.

* **A Gram matrix `A @ A.T` of a factor lower triangular by construction**
  (`L = jnp.tril(z)`, TFP's `band_part`, then `L @ L.T`): every such
  product has many factors (a sign flip of a column of `L`), and the
  principal one, the Cholesky factor with a positive diagonal, is taken, as
  `sqrt` is for `x**2`. The factor must be lower triangular whatever its
  unknowns are: its producer, run on NaN unknowns, gives exact zeros above
  the diagonal. `y` must be symmetric positive definite: the product is then
  recomputed from the factor and compared with `y` like any second
  constraint (NaN off the image). The ildj is on the lower triangles of `y`
  and `L`: `-(n log 2 + sum_i (n - i) log L_ii)`. A factor *upper*
  triangular by construction (`U^T` in `U^T @ U` of a lower `U`) is the
  reversed Cholesky factor of the reversed product (`P A P` with `P` the
  reversal is lower triangular), with the ildj of that factor (the reversal
  permutes the coordinates). A `triangular_solve`'s result with a triangular
  constant right-hand side is triangular by construction too
  (`_trisolve.py`: TFP's `CholeskyToInvCholesky`).
* **Elements a step discards**: a value known only in parts, whose unknown
  elements a step of the same shape never reads (`jnp.tril(z)` reads only `z`'s
  lower triangle; a `select_n` with a constant predicate and a constant
  other case; the triangle of its matrix a `triangular_solve` never reads,
  `_trisolve.py`) is completed with what the step uses in their place, the
  preimage the step leaves unchanged (`z = tril(z)`: zeros above the
  diagonal), as the symmetric preimage of a symmetrization is
  (`_cholesky.py`). That the step does not read them, and what it uses
  instead, is found by running it with NaN there (its other operands must
  be constants); the completed value is run forwards and compared with the
  step's result like any second constraint. Each discarded element must
  come from at most one element of the unknowns, through steps that move
  elements one by one (`_sources`): through a product or a solve, the
  inverse would mix the completion with `y` into elements of `x` that no
  output reads. Only the outermost run of the
  engine completes values (`complete=True`), and `inverse` then takes the
  ildj in the coordinates the inverse reads: the steps' ildjs would count
  the elements discarded (`exp(where(mask, x, 2.0))`). Not inside a call's
  body solved in parts (`_masked._call`): that solve is stuck for want of
  what the rest of the program determines, not for good.

Both run only when the engine is otherwise stuck (see
`InverseWalker.solve`), so an exact solution is always preferred.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from . import (
    _cholesky as chol,
    _elementwise_steps as ew,
    _masked as mk,
    _refusals as rf,
    _sources as sr,
    _traits as tr,
    _trisolve as ts,
)
from ._dataflow import Solved, SolveState, Walker, shape_of
from ._rounding import agree_recomputed

_Literal = compat.Literal

GRAM = "principal Cholesky factor"
NOT_COMPLETED = (
    "the elements it discards each mix several elements of the unknowns (a "
    "product, a solve, a running sum): completed with what the step uses in "
    "their place, the inverse would move elements of `x` that no output reads"
)
COMPLETED = mk.COMPLETED
STRICT_NOT_COMPLETED = (
    "with `strict=True` the elements it discards are not completed with what "
    "it uses in their place: the outputs leave them undetermined"
)

# Steps through which a value is the same matrix, possibly transposed.
_SAME = tr.having(tr.COPY) | {"convert_element_type", "transpose", "squeeze"}


def gram_step(walker: Walker, st: SolveState) -> Solved | None:
    """Solve one blocked `A @ A.T` (`A` lower triangular by construction;
    with leading batch axes, `jnp.matmul` of a batch of matrices) for `A`'s
    source, or `None`."""
    for i in sorted(st.reasons, reverse=True):
        eqn: Any = st.eqns[i]
        if eqn.primitive is not lax.dot_general_p:
            continue
        (out,) = eqn.outvars
        lhs, rhs = eqn.invars
        if out not in st.env or not _unknown(st, lhs) or not _unknown(st, rhs):
            continue
        (lc, rc), (lb, rb) = compat.dot_general_dimensions(eqn)
        nb = len(lb)  # leading batch axes, the same in both operands
        batch = tuple(range(nb))
        if tuple(lb) != batch or tuple(rb) != batch or len(lc) != 1:
            continue
        if not jnp.issubdtype(lhs.aval.dtype, jnp.floating):
            # Complex `L @ L.T` (no conjugate) is complex symmetric, which a
            # Cholesky factorization (Hermitian) does not factor.
            continue
        n = lhs.aval.shape[lc[0]]
        # (`n x k`, `k != n`: the Cholesky factor is `n x n`, and `y`
        # singular for `k < n`: not this step's.)
        axes_l = _matrix_axes(lhs, nb, lc[0], n)
        axes_r = _matrix_axes(rhs, nb, rc[0], n)
        if axes_l is None or axes_r is None:
            continue
        src_l, perm_l = _source(st, lhs)
        src_r, perm_r = _source(st, rhs)
        # Each operand with its contracted axis last, as axes of the source:
        # `A @ A.T` when the two agree.
        left = _contracted_last(tuple(perm_l[k] for k in axes_l), axes_l.index(lc[0]))
        right = _contracted_last(tuple(perm_r[k] for k in axes_r), axes_r.index(rc[0]))
        if src_l is not src_r or left != right:
            continue
        # Size-1 axes of the source not among these (squeezed away, or a
        # free axis of the product: `jnp.matmul` of a batch of one), taken
        # as leading batch axes.
        squeezed = tuple(k for k in range(len(src_l.aval.shape)) if k not in left)
        left = squeezed + left
        nb = len(left) - 2
        if left[:nb] != tuple(range(nb)):  # (a batch axis among the matrix axes)
            continue
        kind = _triangle_by_construction(walker, st, src_l, left)
        if kind is None:
            continue
        # (Reads the lower triangle only: the recomputed product checks the
        # upper one.)
        # (The product's axes: its batch, then one matrix axis of each
        # operand, and size-1 axes.)
        y = jnp.reshape(
            st.env[out], tuple(src_l.aval.shape[k] for k in left[:-1]) + (n,)
        )
        # From the lower triangle alone (also in its derivative: the ildj's
        # coordinates are the ones the inverse reads).
        lower = jnp.tril(y) + jnp.swapaxes(jnp.tril(y, -1), -1, -2)
        if kind == ts.UPPER:
            # `A` upper triangular: with `P` the reversal, `P A P` is the
            # lower factor of `P y P` (`U^T U` of a lower `U`, as TFP's
            # `CholeskyToInvCholesky` takes it).
            lower = lower[..., ::-1, ::-1]
        chol_factor = jnp.tril(lax.linalg.cholesky(lower, symmetrize_input=False))
        factor = chol_factor[..., ::-1, ::-1] if kind == ts.UPPER else chol_factor
        # The product recomputed must give `y` (symmetric, and no NaN from a
        # matrix that is not positive definite); the step is then done, so
        # no rule solves one operand again from the other.
        ok = agree_recomputed(
            lambda a: [jnp.matmul(a, jnp.swapaxes(a, -1, -2))], [factor], [y]
        )
        # The source from `A`: undo the permutation.
        value = jnp.transpose(factor, tuple(int(k) for k in np.argsort(left)))
        return Solved(
            GRAM,
            at=i,
            indices=[i],
            values={src_l: value.astype(src_l.aval.dtype)},
            # (The reversal permutes the coordinates of both triangles.)
            ildj=-chol.cholesky_ildj(chol_factor) if st.options.want_ildj else None,
            agreements=[(ok & ~jnp.any(jnp.isnan(factor)), eqn)],
        )
    return None


def fill_step(walker: Walker, st: SolveState) -> Solved | None:
    """Complete one value known in parts whose unknown elements an
    elementwise step discards, or a triangular solve does not read (or
    `None`)."""
    for v in list(st.pieces):
        mask = st.known_mask(v)
        if mask.all() or not jnp.issubdtype(v.aval.dtype, jnp.inexact):
            continue
        for c in sorted(st.consumers.get(v, ())):
            eqn: Any = st.eqns[c]
            if len(eqn.outvars) != 1:
                continue
            if eqn.outvars[0] in st.env and _elementwise_in(eqn, v):
                if st.options.nan_checks:
                    # `strict`: elements a step discards are undetermined,
                    # not a value to choose.
                    if c in st.reasons:
                        st.refuse(c, STRICT_NOT_COMPLETED)
                    break
                used = _used_instead(walker, st, eqn, v, mask)
            elif eqn.outvars[0] not in st.env and not st.done[c]:
                continue
            else:
                # A triangular solve's unread triangle (its result known, or
                # solved and released): zeros (its rule checked the triangle
                # it read), unless running it, where it can still be run,
                # shows it reads them.
                used = ts.unread_by_solve(st, eqn, v, mask)
                runnable = _operands(st, eqn, v, np.zeros(mask.shape)) is not None
                if used is not None and runnable and _reads(walker, st, eqn, v, mask):
                    used = None
            if used is None:
                continue
            if not _aligned(st, v, ~mask):
                # Some discarded element mixes unknowns (`L @ x`, a
                # triangular solve): completing it would mix the completion
                # into elements of `x` that no output reads.
                if c in st.reasons:
                    st.refuse(c, NOT_COMPLETED)
                break
            if any(
                _reads(walker, st, st.eqns[d], v, mask)
                for d in st.consumers.get(v, ())
                if d != c
            ):
                # Another step reads them: they are not free (`x[1] * x[3]`
                # beside `where(mask, x, 0)`), and the value the projection
                # uses would have to agree with it by chance.
                break
            lost = ~mask
            value = jnp.asarray(used.ravel()[np.flatnonzero(lost)])
            return Solved(
                COMPLETED,
                at=c,
                indices=[c],
                checks=rf.piece_checks(st, v, value, c),
                pieces=[(v, lost, value)],
                done=False,
                completes=True,
            )
    return None


def _aligned(st: SolveState, v: Any, lost: np.ndarray) -> bool:
    """Whether each element of `v` in `lost` comes from at most one element
    of the unknowns, through steps that move it element by element. Only
    then does completing it (a constant) fix just that element of `x`, which
    no output reads: through a step that mixes elements, the inverse would
    mix the completion with `y` into elements of `x` no output reads (the
    preimage moves with `y` where the map ignores it)."""
    got = sr.sources(st, v)
    return got is None or not np.any(got[lost] == sr.MIXED)


def _elementwise_in(eqn: Any, v: Any) -> bool:
    """Whether `eqn` maps `v` to its one result element by element: an
    elementwise step, or a call whose every step on the way from `v` is one
    (`jnp.tril` builds its mask with `iota`, which does not read `v`)."""
    shape = shape_of(v)
    if len(eqn.outvars) != 1 or shape_of(eqn.outvars[0]) != shape:
        return False
    get_body = mk._BODIES.get(eqn.primitive)
    if get_body is None:
        return ew.is_elementwise(eqn, shape)
    jaxpr = compat.open_jaxpr(get_body(eqn.params))
    if len(jaxpr.invars) != len(eqn.invars):
        return False
    reached = {
        inner
        for outer, inner in zip(eqn.invars, jaxpr.invars, strict=True)
        if outer is v
    }
    for e in jaxpr.eqns:
        if any(type(u) is not _Literal and u in reached for u in e.invars):
            if not _elementwise_in(
                e, next(u for u in e.invars if type(u) is not _Literal and u in reached)
            ):
                return False
            reached.update(e.outvars)
    return all(type(o) is not _Literal and o in reached for o in jaxpr.outvars)


def _unknown(st: SolveState, v: Any) -> bool:
    return type(v) is not _Literal and v not in st.env and v not in st.pieces


def _matrix_axes(v: Any, nb: int, contracted: int, n: int) -> tuple[int, ...] | None:
    """The axes of a `dot_general` operand `v` that hold its batch of
    `n x n` matrices (the batch, the one free axis of size `n` and the
    contracted one, in order), or `None` unless its other axes are of size
    1."""
    shape = v.aval.shape
    free = [k for k in range(nb, len(shape)) if k != contracted]
    sized = [k for k in free if shape[k] != 1]
    if n != 1 and (len(sized) != 1 or shape[sized[0]] != n):
        return None
    if not free:
        return None
    matrix = sized[0] if sized else free[-1]
    return (*range(nb), *sorted((matrix, contracted)))


def _source(st: SolveState, v: Any) -> tuple[Any, tuple[int, ...]]:
    """The value `v` copies (through copies, transposes, squeezes and
    conversions to the same dtype), and for each of `v`'s axes the source's
    axis it is: a permutation of the source's axes, less any size-1 axes
    squeezed away (`jnp.matmul` squeezes a batch of one)."""
    perm = tuple(range(len(v.aval.shape)))
    while True:
        p = st.producer.get(v)
        if p is None:
            return v, perm
        eqn: Any = st.eqns[p]
        name = eqn.primitive.name
        (u,) = eqn.invars if len(eqn.invars) == 1 else (None,)
        if name not in _SAME or u is None or type(u) is _Literal or u in st.env:
            return v, perm
        if u.aval.dtype != v.aval.dtype:
            return v, perm
        if name == "transpose":
            # v = transpose(u, t): v's axis k is u's axis t[k].
            t = compat.transpose_permutation(eqn)
            perm = tuple(t[k] for k in perm)
        elif name == "squeeze":
            # v = squeeze(u, d): v's axis k is u's k-th axis not in d.
            dropped = compat.squeeze_dimensions(eqn)
            kept = [k for k in range(len(u.aval.shape)) if k not in dropped]
            perm = tuple(kept[k] for k in perm)
        v = u


def _contracted_last(perm: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """`perm` with the entry at `axis` moved last."""
    rest = [p for k, p in enumerate(perm) if k != axis]
    return (*rest, perm[axis])


def _triangle_by_construction(
    walker: Any, st: SolveState, src: Any, perm: tuple[int, ...]
) -> str | None:
    """`LOWER` or `UPPER` if `transpose(src, perm)` is that triangular
    whatever the unknowns, else `None`: a `triangular_solve`'s result with a
    triangular constant right-hand side (`_trisolve.py`), or a value whose
    producer, run on NaN unknowns, gives exact zeros in the other triangle,
    and so it does run on numbers (`_probes`): a step that maps NaN to 0
    (`jnp.nan_to_num`, `where(z > 0, z, 0)`) is no zero by construction."""
    solved = ts.solved_triangle(st, src)
    if solved is not None:
        nb = len(perm) - 2
        if perm == tuple(range(nb + 2)):
            return solved
        if perm == (*range(nb), nb + 1, nb):
            return ts.UPPER if solved == ts.LOWER else ts.LOWER
        return None
    p = st.producer.get(src)
    if p is None:
        return None
    eqn: Any = st.eqns[p]
    known: dict[int, Any] = {}
    for k, u in enumerate(eqn.invars):
        if type(u) is _Literal:
            known[k] = u.val
        elif u in st.env:
            if compat.is_tracer(st.env[u]):
                return None
            known[k] = st.env[u]
        elif not jnp.issubdtype(u.aval.dtype, jnp.inexact):
            return None
    kinds = [ts.LOWER, ts.UPPER]
    for fill in _probes():
        ins = [
            known[k] if k in known else fill(u.aval.shape, u.aval.dtype)
            for k, u in enumerate(eqn.invars)
        ]
        probe = _run(walker, eqn, ins)
        if probe is None:
            return None
        value = np.transpose(probe[eqn.outvars.index(src)], perm)
        above = np.triu(np.ones(value.shape, bool), 1)
        if not np.all(value[above] == 0):
            kinds = [k for k in kinds if k != ts.LOWER]
        if not np.all(value[np.swapaxes(above, -1, -2)] == 0):
            kinds = [k for k in kinds if k != ts.UPPER]
    return kinds[0] if kinds else None


def _probes() -> list[Any]:
    """Values for unknowns, to run a step on: NaN (which every arithmetic
    step propagates), then numbers of both signs, small and large (which a
    comparison, an `isnan` or a cast to an integer tells apart from NaN)."""
    rng = np.random.default_rng(0)

    def nan(shape: Any, dtype: Any) -> Any:
        return np.full(shape, np.nan, dtype)

    def numbers(shape: Any, dtype: Any, scale: float = 1.0) -> Any:
        size = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        return (scale * size).astype(dtype)

    def large(shape: Any, dtype: Any) -> Any:
        return numbers(shape, dtype, 1e4)

    return [nan, numbers, large]


def _used_instead(
    walker: Any, st: SolveState, eqn: Any, v: Any, mask: np.ndarray
) -> np.ndarray | None:
    """If `eqn` passes `v`'s elements in `mask` through unchanged and never
    reads the others, the constant result it gives there (what it uses in
    their place), else `None`. Run twice with NaN outside `mask` and two
    stand-ins in it: the result must have no NaN, equal the stand-ins in
    `mask`, and be the same outside it both times. Its other operands must
    be constants. (A step that also transforms the kept elements, such as
    `exp(where(mask, x, 2.0))` as one call, is not such a projection: its
    result there is not what it uses instead.)"""
    probes = []
    for stand_in in (0.5, 0.25):
        ins = _operands(st, eqn, v, np.where(mask, stand_in, np.nan))
        if ins is None:
            return None
        probe = _run(walker, eqn, ins)
        if probe is None or np.any(np.isnan(probe[0])):
            return None
        if not np.all(probe[0][mask] == stand_in):
            return None
        probes.append(probe[0].astype(v.aval.dtype))
    lost = ~mask
    if not np.array_equal(probes[0][lost], probes[1][lost]):
        return None
    # Numbers in place of the NaN must change nothing either (a step that
    # maps NaN to a constant, `jnp.nan_to_num`, reads the element).
    numbers = _probes()[1](v.aval.shape, v.aval.dtype)
    ins = _operands(st, eqn, v, np.where(mask, 0.5, numbers))
    probe = None if ins is None else _run(walker, eqn, ins)
    if probe is None or not np.array_equal(
        probe[0].astype(v.aval.dtype)[lost], probes[0][lost]
    ):
        return None
    return probes[0]


def _reads(walker: Any, st: SolveState, eqn: Any, v: Any, mask: np.ndarray) -> bool:
    """Whether `eqn` may read `v`'s elements outside `mask`: run with NaN
    there, then with two sets of numbers, its results must have no NaN and
    not change. `True` where it cannot be run (an unknown operand)."""
    lost = ~mask
    outs = []
    fills = _probes()
    for fill in (fills[0], fills[1], fills[1]):
        there = fill(v.aval.shape, v.aval.dtype)
        ins = _operands(st, eqn, v, np.where(lost, there, 0.5))
        probe = None if ins is None else _run(walker, eqn, ins)
        if probe is None:
            return True
        outs.append(probe)
    for o in outs[0]:
        if jnp.issubdtype(o.dtype, jnp.inexact) and np.any(np.isnan(o)):
            return True
    return not all(
        np.array_equal(a, b, equal_nan=True)
        for a, b in zip(outs[1], outs[2], strict=True)
    )


def _operands(st: SolveState, eqn: Any, v: Any, value: Any) -> list[Any] | None:
    """`eqn`'s operands with `value` (cast to `v`'s dtype) for `v`, or
    `None` if another operand is not a constant now."""
    ins = []
    for u in eqn.invars:
        if u is v:
            ins.append(np.asarray(value).astype(v.aval.dtype))
        elif type(u) is _Literal:
            ins.append(u.val)
        elif u in st.env and not compat.is_tracer(st.env[u]):
            ins.append(st.env[u])
        else:
            return None
    return ins


def _run(walker: Any, eqn: Any, ins: list[Any]) -> list[np.ndarray] | None:
    """`eqn` run on constants now, or `None` if it cannot be."""
    try:
        with jax.ensure_compile_time_eval():
            outs = walker.forward(eqn, ins)
        return [np.asarray(o) for o in outs]
    except Exception:  # (any failure means: cannot tell, so no)
        return None
