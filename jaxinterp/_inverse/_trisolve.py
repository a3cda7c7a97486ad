"""What the Gram step (`_gram.py`) knows of `triangular_solve` by its
structure, where running it on probes cannot tell.

* **Its result is triangular by construction** when its right-hand side is
  a constant triangular like the matrix it solves with (`U = x^-1` as
  `triangular_solve(x, I)`, TFP's `CholeskyToInvCholesky`): `op(a)^-1 b` of
  two lower-triangular matrices is lower triangular whatever `a` is. NaN
  probes cannot show it (a NaN in `a` reaches every element of the
  forward substitution, `0 * NaN`), so the equation is read instead,
  through the bodies of calls (`jax.scipy.linalg.solve_triangular` is a
  `jit`).
* **It never reads one triangle of its matrix** (the strict upper one for
  `lower=True`): solving for the matrix gives only the triangle read
  (`_linalg._matrix_inverse`), and the other is completed with zeros, the
  matrix the solve uses (`tril(a)`), as `_gram.fill_step` completes the
  elements a projection discards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import primitives as jex_prims

from .. import _jax_compat as compat
from . import _masked as mk, _scattered
from ._dataflow import SolveState

_Literal = compat.Literal

LOWER, UPPER = "lower", "upper"


def solved_triangle(st: SolveState, v: Any) -> str | None:
    """`LOWER` or `UPPER` if `v` is, whatever the unknowns, a triangular
    matrix (or a batch of them on leading axes): the result of a
    `triangular_solve` (possibly a call's result, solved in its body) with a
    constant right-hand side triangular like the matrix solved with; else
    `None`."""
    p = st.producer.get(v)
    if p is None or len(v.aval.shape) < 2:
        return None
    eqn: Any = st.eqns[p]
    known = [_constant(st, u) for u in eqn.invars]
    return _triangle_of(eqn, eqn.outvars.index(v), known)


def _constant(st: SolveState, u: Any) -> Any:
    if type(u) is _Literal:
        return u.val
    value = st.env.get(u)
    return None if value is None or compat.is_tracer(value) else value


def _triangle_of(eqn: Any, k: int, known: list[Any]) -> str | None:
    """The triangle result `k` of `eqn` lies in by construction (`known`:
    its operands' constant values, or `None`)."""
    get_body = mk._BODIES.get(eqn.primitive)
    if get_body is not None:
        body = get_body(eqn.params)
        jaxpr = compat.open_jaxpr(body)
        if len(jaxpr.invars) != len(known):
            return None
        inner = jaxpr.outvars[k]
        if type(inner) is _Literal:
            return None
        env: dict[Any, Any] = dict(zip(jaxpr.invars, known, strict=True))
        consts = compat.jaxpr_consts(body)
        if len(consts) == len(jaxpr.constvars):
            env.update(zip(jaxpr.constvars, consts, strict=True))
        producer = {o: e for e in jaxpr.eqns for o in e.outvars}
        _run_constant_steps(jaxpr.eqns, env)
        # Leading size-1 axes put on by a broadcast (`solve_triangular` of a
        # batch of one squeezes it, solves, and broadcasts back).
        while inner in producer and _adds_leading_axes(producer[inner]):
            inner = producer[inner].invars[0]
            if type(inner) is _Literal:
                return None
        e = producer.get(inner)
        if e is None:
            return None
        values = [u.val if type(u) is _Literal else env.get(u) for u in e.invars]
        return _triangle_of(e, e.outvars.index(inner), values)
    if eqn.primitive is not jex_prims.triangular_solve_p:
        return None
    rhs = known[1]
    if rhs is None or compat.is_tracer(rhs):
        return None
    rhs = np.asarray(rhs)
    if rhs.ndim < 2 or rhs.shape[-2] != rhs.shape[-1]:
        return None
    flags = compat.triangular_solve_params(eqn)
    if flags.lower != flags.transpose_a:  # `op(a)` lower triangular
        return LOWER if np.all(np.triu(rhs, 1) == 0) else None
    return UPPER if np.all(np.tril(rhs, -1) == 0) else None


def _adds_leading_axes(eqn: Any) -> bool:
    """Whether `eqn` only puts leading axes before its one operand's
    (a `broadcast_in_dim`, or a `reshape` adding size-1 axes)."""
    if len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return False
    before = tuple(eqn.invars[0].aval.shape)
    after = tuple(eqn.outvars[0].aval.shape)
    extra = len(after) - len(before)
    if extra < 0 or after[extra:] != before:
        return False
    if eqn.primitive is lax.broadcast_in_dim_p:
        dims = compat.params_of(eqn).get("broadcast_dimensions", ())
        return tuple(int(d) for d in dims) == tuple(range(extra, len(after)))
    return (
        _scattered.relayout(eqn)
        and eqn.primitive is lax.reshape_p
        and all(d == 1 for d in after[:extra])
    )


_CONSTANT_STEP_SIZE = 1 << 16


def _run_constant_steps(eqns: Sequence[Any], env: dict[Any, Any]) -> None:
    """Add to `env` the results of the first-order steps whose operands all
    have concrete values there (small ones: a squeezed identity matrix)."""
    for e in eqns:
        if compat.sub_jaxprs(e) or not e.outvars or e.effects:
            continue
        if any(math.prod(o.aval.shape) > _CONSTANT_STEP_SIZE for o in e.outvars):
            continue
        values = [u.val if type(u) is _Literal else env.get(u) for u in e.invars]
        if any(v is None or compat.is_tracer(v) for v in values):
            continue
        with jax.ensure_compile_time_eval():
            outs = compat.bind_eqn(e.primitive, values, compat.params_of(e))
        env.update(zip(e.outvars, outs, strict=True))


def unread_by_solve(st: SolveState, eqn: Any, v: Any, mask: np.ndarray) -> Any:
    """If `eqn` passes `v` (through calls) only to a `triangular_solve` as
    its matrix, and `v`'s elements outside `mask` lie outside the triangle
    it reads: what it uses in their place, zeros (`v`'s shape); else
    `None`. (`unit_diagonal` also skips the diagonal, which is not
    completed.)"""
    if type(v) is _Literal or len(eqn.outvars) != 1:
        return None
    if [u for u in eqn.invars if u is v] != [v]:
        return None  # (read twice)
    get_body = mk._BODIES.get(eqn.primitive)
    if get_body is not None:
        jaxpr = compat.open_jaxpr(get_body(eqn.params))
        if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != 1:
            return None
        inner = jaxpr.invars[eqn.invars.index(v)]
        inner_mask = mask
        while True:
            if any(type(o) is not _Literal and o is inner for o in jaxpr.outvars):
                return None
            users = [
                e
                for e in jaxpr.eqns
                if any(type(u) is not _Literal and u is inner for u in e.invars)
            ]
            if len(users) != 1:
                return None
            (user,) = users
            if not _scattered.relayout(user):
                break
            # (A squeeze of a batch of one, as `solve_triangular` takes it.)
            inner = user.outvars[0]
            inner_mask = inner_mask.reshape(inner.aval.shape)
        if unread_by_solve(st, user, inner, inner_mask) is None:
            return None
        return np.zeros(tuple(int(d) for d in v.aval.shape), v.aval.dtype)
    if eqn.primitive is not jex_prims.triangular_solve_p or eqn.invars[0] is not v:
        return None
    flags = compat.triangular_solve_params(eqn)
    if flags.unit_diagonal or len(v.aval.shape) < 2:
        return None
    shape = tuple(int(d) for d in v.aval.shape)
    read = (np.tril if flags.lower else np.triu)(np.ones(shape[-2:], bool))
    if np.any(~mask & np.broadcast_to(read, shape)):
        return None  # (an element it reads is unknown)
    return np.zeros(shape, v.aval.dtype)
