"""Partly known values: masked couplings and diagonal rewrites.

`jnp.where(mask, a, b)` with a constant `mask` (a `select_n` with a concrete
predicate) and two unknown cases tells each case only where the mask selects
it: each gets a `MaskedPiece` (see `_rules.py`), and a value becomes known
once its pieces cover it. Until then the engine takes steps on the partly
known values, element by element, where that is exact:

- **forwards**, an elementwise equation gives its result where every operand
  is known, and where a concrete zero factor of a `mul` makes the unknown
  elements irrelevant (the conditioner `s(x * mask)` of a masked coupling);
  `select_n` with a concrete predicate gives its result where the selected
  case is known;
- **backwards**, an elementwise equation whose result is known where its one
  unknown operand is not solves for exactly those elements: its inverse rule
  runs on them alone (gathered at static positions, so no filler value ever
  reaches a rule, a result or a gradient), and its ildj counts only them;
- a call (`jit`, a `custom_jvp` function, ...) is solved in place with its
  operands' and results' pieces as seeds. Forwards (some result only partly
  known) only what it computes of its results is taken, backwards (every
  result known) its solved operands and ildj, once. An elementwise call whose
  result is known wherever its unknown operand is not is inverted by its own
  rule on the whole value, the known elements filled in by running it
  forwards, and its ildj counted by `jax.jvp` over the new elements only.

Every element is solved at most once, so the ildj adds one term per element
of the unknown, as for a triangular Jacobian. Values that depend on a
principal-branch choice (`_branches.py`) are left to the engine's other
steps. An element that no step determines stays unknown, and `inverse`
refuses, naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import (
    _branches as br,
    _cholesky as chol,
    _elementwise_steps as ew,
    _ildj,
    _scattered,
)
from ._dataflow import (
    FORWARD,
    MASKED,
    Solved,
    SolveState,
    Walker,
    gather,
    shape_of,
)
from ._rules import (
    InverseContext,
    MaskedPiece,
    describe_elements,
)

_Literal = compat.Literal


_BODIES: dict[Any, Callable[[Any], Any]] = {
    p: get
    for p, get in (
        (compat.jit_p, lambda params: compat.jit_params(params).jaxpr),
        (compat.closed_call_p, compat.call_jaxpr),
        (compat.core_call_p, compat.call_jaxpr),
        (compat.custom_jvp_call_p, compat.call_jaxpr),
        (compat.remat_p, lambda params: compat.remat_params(params).jaxpr),
    )
    if p is not None
}


def may_split(eqn: compat.JaxprEqn) -> bool:
    """Whether `eqn`, refused by its rule, may still solve some elements:
    a `select_n` (with a concrete predicate), a call, or a copy of scattered
    elements (`_scattered.py`)."""
    return (
        eqn.primitive is lax.select_n_p
        or eqn.primitive in _BODIES
        or eqn.primitive in _COPIES
        or (
            eqn.primitive is compat.cond_p
            and compat.cond_platform_branch(eqn) is not None
        )
    )


_COPIES = (lax.gather_p, lax.broadcast_in_dim_p)

# The method of a step whose discarded elements were completed, also of a
# call in whose body some were (see `_gram.py`).
COMPLETED = "discarded elements completed"


def _masked(st: SolveState, v: Any) -> bool:
    have = st.pieces.get(v)
    return have is not None and any(isinstance(p, MaskedPiece) for p in have)


def touches(st: SolveState, eqn: compat.JaxprEqn) -> bool:
    """Whether an operand or result of `eqn` is known only in masked pieces."""
    return any(
        type(v) is not _Literal and _masked(st, v) for v in (*eqn.invars, *eqn.outvars)
    )


def zero_product(st: SolveState, eqn: Any) -> bool:
    """Whether `eqn` is a `mul` of an unknown by a concrete factor with
    zeros, whose result is then known there (`x * mask`)."""
    if eqn.primitive is not lax.mul_p or eqn.outvars[0] in st.env:
        return False
    if not eqn.outvars[0].aval.shape:
        return False
    for v in eqn.invars:
        if st.is_known(v):
            val = st.partial_value(v)
            # A mask (an array), not a scalar `0.0 * x`.
            if (
                np.ndim(val)
                and not compat.is_tracer(val)
                and np.any(np.asarray(val) == 0)
            ):
                return True
    return False


# -- views of partly known values -------------------------------------------


def _add_piece(
    st: SolveState, v: Any, mask: np.ndarray, value: Any, i: int, backward: bool
) -> None:
    """Record that `v` equals `value` (1-D) where `mask` holds, as equation
    `i` found it (`backward`: solving for it)."""
    if backward:
        _scattered.solved_part(st, v, mask, value, i)
        return
    st.commit(Solved(MASKED, at=i, indices=(), pieces=[(v, mask, value)]))
    if i not in st.masked_inverted:
        st.status[i] = FORWARD


# -- one step ------------------------------------------------------------------


def step(walker: Walker, st: SolveState, i: int) -> bool:
    """Solve what equation `i` determines of its partly known values (see
    the module docstring); whether it learned anything."""
    eqn: Any = st.eqns[i]
    variables = [v for v in (*eqn.invars, *eqn.outvars) if type(v) is not _Literal]
    if any(v in st.taint or v in st.piece_branch for v in variables):
        return False
    seen = tuple(int(st.known_mask(v).sum()) for v in variables)
    if st.masked_seen.get(i) == seen:
        return False  # nothing new since the last try
    st.masked_seen[i] = seen
    try:
        user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
        with user_ctx, eqn_ctx:
            if eqn.primitive is lax.select_n_p:
                progress = _select_n(st, i)
                if i in st.reasons:
                    _refresh_reason(st, i)
                return progress
            if eqn.primitive in _BODIES:
                try:  # (its rule may refuse the whole value: then in parts)
                    if _whole_call(walker, st, i):
                        return True
                except NotInvertibleError:
                    pass
                return _call(walker, st, i)
            if eqn.primitive.name in chol.READS_LOWER:
                return _lower_known(walker, st, i)
            if eqn.primitive is compat.cond_p:
                return _platform_branch(walker, st, i)
            copied = _scattered.step(walker, st, i)
            if copied is not None:
                return copied
            if len(eqn.outvars) != 1 or not ew.is_elementwise(
                eqn, shape_of(eqn.outvars[0])
            ):
                return False
            backward = _backward(walker, st, i)
            forward = _forward(walker, st, i)
            return backward or forward
    except NotInvertibleError:
        return False


def _lower_known(walker: Walker, st: SolveState, i: int) -> bool:
    """A `cholesky` whose result is known on its lower triangle (JAX masks
    the rest with `tril`): its rule, which reads only that triangle, gives
    the lower triangle of its operand."""
    eqn: Any = st.eqns[i]
    (out,), (x,) = eqn.outvars, eqn.invars
    if st.is_known(x) or x in st.pieces:
        return False
    if (chol.lower_mask(shape_of(out)) & ~st.known_mask(out)).any():
        return False
    rule = walker.rules.get(eqn.primitive)
    if rule is None:
        return False
    ctx = InverseContext.of(
        eqn, want_ildj=st.options.want_ildj, solvers=st.options.solvers
    )
    res = rule(ctx, [st.partial_value(out)], None, **eqn.params)
    if res is None or not hasattr(res, "pieces"):
        return False
    if st.options.want_ildj and res.ildj is not None:
        st.ildj_terms.append(res.ildj)
    for piece in res.pieces:
        _add_piece(st, x, piece.mask, piece.value, i, True)
    return True


def _platform_branch(walker: Walker, st: SolveState, i: int) -> bool:
    """A `cond` on the platform: its branch for this platform, solved in
    place."""
    eqn: Any = st.eqns[i]
    k = compat.cond_platform_branch(eqn)
    if k is None:
        return False
    progress = _call(walker, st, i, compat.cond_branches(eqn)[k], skip=1)
    if progress and i in st.reasons:
        st.reasons[i] = (
            "its branch for this platform determines only some elements of "
            "its operands (see below)"
        )
    return progress


def _select_n(st: SolveState, i: int) -> bool:
    """`select_n` with a concrete predicate: each case is the result where
    selected, and the result is each selected case where that is known."""
    eqn: Any = st.eqns[i]
    pred_var, cases = eqn.invars[0], eqn.invars[1:]
    (out,) = eqn.outvars
    if not st.is_known(pred_var):
        return False
    pred = st.partial_value(pred_var)
    if compat.is_tracer(pred):
        return False
    shape = shape_of(out)
    which = np.broadcast_to(np.asarray(pred).astype(np.int32), shape)
    out_mask = st.known_mask(out)
    case_masks = [st.known_mask(c) for c in cases]
    progress = False
    if out_mask.any():
        out_value = None
        for k, c in enumerate(cases):
            if st.is_known(c):
                continue
            new = (which == k) & out_mask & ~case_masks[k]
            if new.any():
                if out_value is None:
                    out_value = st.partial_value(out)
                flat = np.flatnonzero(new)
                _add_piece(st, c, new, gather(out_value, flat), i, True)
                progress = True
    if out not in st.env:
        for k, c in enumerate(cases):
            new = (which == k) & case_masks[k] & ~out_mask
            if new.any():
                flat = np.flatnonzero(new)
                value = jnp.broadcast_to(st.partial_value(c), shape)
                _add_piece(st, out, new, gather(value, flat), i, False)
                progress = True
    return progress


def _refresh_reason(st: SolveState, i: int) -> None:
    """Say which elements a blocked `select_n` with a concrete predicate
    discards of its cases still unknown (the rule's refusal may predate
    values learned since)."""
    eqn: Any = st.eqns[i]
    (out,) = eqn.outvars
    pred = st.read(eqn.invars[:1])[0]
    if pred is None or compat.is_tracer(pred):
        return
    which = np.broadcast_to(np.asarray(pred).astype(np.int32), shape_of(out))
    dropped = []
    for k, c in enumerate(eqn.invars[1:]):
        lost = (which != k) & ~st.known_mask(c)
        if lost.any():
            dropped.append(
                f"case {k} where the predicate selects another case (elements "
                f"{describe_elements(lost)})"
            )
    if dropped:
        st.reasons[i] = (
            f"`select_n` discards {' and '.join(dropped)}, so those elements "
            "cannot be recovered"
        )


def _the_unknown(st: SolveState, eqn: compat.JaxprEqn) -> int | None:
    """The index of `eqn`'s one operand not fully known (of the result's
    shape), or `None`."""
    unknown = [k for k, v in enumerate(eqn.invars) if not st.is_known(v)]
    if len(unknown) != 1:
        return None
    (k,) = unknown
    if shape_of(eqn.invars[k]) != shape_of(eqn.outvars[0]):
        return None
    return k


def _no_branch(res: Any) -> bool:
    """Whether a rule's result chose no principal branch."""
    return len(res) <= 2 or res[2] is None or all(b is None for b in res[2])


def _backward(walker: Walker, st: SolveState, i: int) -> bool:
    """An elementwise primitive: solve the unknown operand's elements where
    the result is known, with the rule run on those elements alone."""
    eqn: Any = st.eqns[i]
    (out,) = eqn.outvars
    k = _the_unknown(st, eqn)
    if k is None:
        return False
    x = eqn.invars[k]
    new = st.known_mask(out) & ~st.known_mask(x)
    if not new.any():
        return False
    ins = st.read(eqn.invars)
    name = eqn.primitive.name
    if br.principal_range(eqn, ins) is not None or name in br.CLAMPS:
        return False
    rule = walker.rules.get(eqn.primitive)
    if rule is None:
        return False
    flat = np.flatnonzero(new)
    y = gather(st.partial_value(out), flat)
    ins_c = [None if j == k else gather(val, flat) for j, val in enumerate(ins)]
    n = flat.size
    in_avals = [
        compat.ShapedArray((n,), v.aval.dtype) if v.aval.shape else v.aval
        for v in eqn.invars
    ]
    ctx = InverseContext(
        in_avals,
        [compat.ShapedArray((n,), out.aval.dtype)],
        want_ildj=st.options.want_ildj,
        solvers=st.options.solvers,
    )
    res = rule(ctx, [y], *ins_c, **eqn.params)
    if res is None or hasattr(res, "pieces") or not _no_branch(res):
        return False
    solved = res[0][k]
    if solved is None or np.shape(solved) != (n,):
        return False
    if st.options.want_ildj:
        ildj = res[1]
        if ildj is None:

            def solve(t: Any) -> Any:
                return rule(ctx, [t], *ins_c, **eqn.params)[0][k]

            ildj = _ildj.elementwise(solve, y)
        st.ildj_terms.append(ildj)
    _add_piece(st, x, new, solved, i, True)
    return True


def _forward(walker: Walker, st: SolveState, i: int) -> bool:
    """An elementwise primitive: its result where every operand is known
    (run on those elements alone), and `0` where a `mul` has a concrete zero
    factor."""
    eqn: Any = st.eqns[i]
    (out,) = eqn.outvars
    if out in st.env:
        return False
    shape = shape_of(out)
    masks = [np.broadcast_to(st.known_mask(v), shape) for v in eqn.invars]
    everywhere = np.all(np.stack(masks), axis=0) if masks else np.ones(shape, bool)
    out_mask = st.known_mask(out)
    progress = False
    new = everywhere & ~out_mask
    if new.any():
        flat = np.flatnonzero(new)
        ins = [gather(st.partial_value(v), flat) for v in eqn.invars]
        (value,) = walker.forward(eqn, ins)
        _add_piece(st, out, new, value, i, False)
        out_mask = out_mask | new
        progress = True
    if eqn.primitive is lax.mul_p and out not in st.env:
        zero = np.zeros(shape, bool)
        for v in eqn.invars:
            if st.is_known(v):
                val = st.partial_value(v)
                if np.ndim(val) and not compat.is_tracer(val):
                    zero |= np.broadcast_to(np.asarray(val) == 0, shape)
        new = zero & ~out_mask
        if new.any():
            count = int(new.sum())
            _add_piece(st, out, new, jnp.zeros((count,), out.aval.dtype), i, False)
            progress = True
    return progress


def _whole_call(walker: Walker, st: SolveState, i: int) -> bool:
    """An elementwise call whose result is known wherever its one unknown
    operand is not: its own rule on the whole value (the operand's known
    elements mapped forwards to fill the result), the new elements kept."""
    eqn: Any = st.eqns[i]
    if len(eqn.outvars) != 1:
        return False
    (out,) = eqn.outvars
    shape = shape_of(out)
    if not ew.is_elementwise(eqn, shape):
        return False
    if not jnp.issubdtype(out.aval.dtype, jnp.inexact):
        return False
    k = _the_unknown(st, eqn)
    if k is None:
        return False
    x = eqn.invars[k]
    x_mask, out_mask = st.known_mask(x), st.known_mask(out)
    new = out_mask & ~x_mask
    if not new.any() or (~out_mask & ~x_mask).any():
        return False
    ins = st.read(eqn.invars)
    # Traced known operands would get NaN gradients from the filler.
    if any(j != k and compat.is_tracer(val) for j, val in enumerate(ins)):
        return False
    rule = walker.rules.get(eqn.primitive)
    if rule is None:
        return False

    def run(t: Any) -> Any:
        return walker.forward(eqn, [t if j == k else v for j, v in enumerate(ins)])[0]

    y = jnp.where(out_mask, st.partial_value(out), run(st.partial_value(x)))
    ctx = InverseContext.of(
        eqn, want_ildj=st.options.want_ildj, solvers=st.options.solvers
    )
    res = rule(ctx, [y], *ins, **eqn.params)
    if res is None or hasattr(res, "pieces") or not _no_branch(res):
        return False
    solved = res[0][k]
    if solved is None or np.shape(solved) != shape:
        return False
    if st.options.want_ildj:
        _, slope = jax.jvp(run, (solved,), (jnp.ones_like(solved),))
        log_slope = jnp.log(jnp.abs(slope))
        st.ildj_terms.append(-jnp.sum(jnp.where(new, log_slope, 0)))
    _add_piece(st, x, new, gather(solved, np.flatnonzero(new)), i, True)
    return True


def _call(
    walker: Walker, st: SolveState, i: int, body: Any = None, skip: int = 0
) -> bool:
    """A call solved in place, its partly known operands and results as
    seeds: forwards (a result partly known) its results only; backwards
    (every result known) its operands and ildj, once. `body` (default: the
    call's) runs on the operands after the first `skip` (a `cond`'s
    branch, after its index)."""
    eqn: Any = st.eqns[i]
    if body is None:
        body = _BODIES[eqn.primitive](eqn.params)
    jaxpr, consts = compat.open_jaxpr(body), compat.jaxpr_consts(body)
    eqn_invars = list(eqn.invars[skip:])
    if len(jaxpr.invars) != len(eqn_invars) or len(jaxpr.outvars) != len(eqn.outvars):
        return False
    backward = all(st.is_known(v) or st.dropped(v) for v in eqn.outvars)
    if backward and i in st.masked_inverted:
        return False  # solved backwards once already
    seeds: list[tuple[Any, list[Any]]] = []
    for outer, inner in (
        *zip(eqn_invars, jaxpr.invars, strict=True),
        *zip(eqn.outvars, jaxpr.outvars, strict=True),
    ):
        if (
            type(inner) is not _Literal
            and not st.is_known(outer)
            and outer in st.pieces
        ):
            seeds.append((inner, st.pieces[outer]))
    invals = st.read(eqn_invars)
    outvals = [st.env.get(v) for v in eqn.outvars]
    sol = walker.solve(
        jaxpr,
        consts,
        invals,
        outvals,
        strict=False,
        want_ildj=st.options.want_ildj,
        solvers=st.options.solvers,
        seeds=seeds,
    )
    if sol.chose:
        return False
    completed = COMPLETED in sol.methods.values()
    progress = False
    pairs: Sequence[tuple[Any, Any, Any]] = list(
        zip(eqn.outvars, jaxpr.outvars, sol.outvals, strict=True)
    )
    if backward:
        pairs = list(zip(eqn_invars, jaxpr.invars, sol.invals, strict=True))
    found: dict[Any, Any] = {}
    for outer, inner, value in pairs:
        if st.is_known(outer) or st.dropped(outer):
            continue
        if value is not None:
            found[outer] = value
            progress = True
        elif type(inner) is not _Literal and inner in sol.pieces:
            have = sol.pieces[inner]
            before = st.known_mask(outer)
            after = np.zeros_like(before)
            for piece in have:
                after[piece.index()] = True
            if (after & ~before).any():
                st.pieces[outer] = list(have)
                st.learned(outer)
                progress = True
    if found:
        # (The body's second constraints, its seeds among them, hold for
        # the values it gave, or `y` is off the image.)
        st.commit(
            Solved(
                MASKED, at=i, indices=(), values=found, agreements=[(sol.agreed, eqn)]
            )
        )
    if progress and backward:
        st.ildj_terms.append(sol.ildj)
        st.masked_inverted.add(i)
        st.methods[i] = MASKED
    if progress and completed:
        # (The outermost run must know: its ildj then needs the read
        # coordinates, see `_gram.py`.)
        st.methods[i] = COMPLETED
    return progress
