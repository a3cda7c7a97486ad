"""Where each element of a value comes from: which element of the unknowns.

`sources(st, v)` gives, per element of `v`, the flat index (over the run's
unknown inputs, in order) of the one unknown element it is computed from
element by element; `CONSTANT` where it reads none; `MIXED` where it mixes
several or passes a step that mixes (a product, a reduction, a solve).
`None`: no unknown reaches `v`. With `known=True` the walk stops at the
values the run knows now, which read no unknown, so the answer is relative
to what has been solved.

The completion of discarded elements (`_gram.py`) asks whether each
element it would fill comes from at most one element of `x`; the normalized
method (`_normalized.py`) asks which elements of a value do not depend on
the unknowns at all.

It is a `Rules` table walked over integer index arrays: an elementwise step
merges its operands' indices, a step that moves or copies elements is run
on the indices themselves, a `select_n` whose predicate is known picks its
cases' indices, and any other step mixes. Known values ride along as
`Known`: a `select_n`'s predicate, or an `iota` mask computed inside a
body, folded there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from . import _traits as tr
from ._abstract import Rules
from ._dataflow import SolveState, shape_of

_Literal = compat.Literal

CONSTANT, MIXED = -1, -2

# Steps that move or copy elements, run on the source indices themselves.
_MOVES = tr.having(tr.ALONG_AXES, tr.RELAYOUT) | {"concatenate", "pad"}
_COPIES = tr.having(tr.COPY, tr.ROUNDING) | {"optimization_barrier"}


class Known(NamedTuple):
    """A value that reads no unknown, with its value where it is concrete."""

    value: Any


def sources(st: SolveState, v: Any, *, known: bool = False) -> np.ndarray | None:
    """Per element of `v`, where it comes from (module docstring). Only the
    steps `v` depends on are followed, and each value's indices are dropped
    once no later one of them reads it."""

    def stops(u: Any) -> bool:
        return type(u) is _Literal or (known and u in st.env)

    steps: set[int] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        i = None if stops(u) else st.producer.get(u)
        if i is not None and i not in steps:
            steps.add(i)
            stack.extend(st.eqns[i].invars)
    order = sorted(steps)
    reads: dict[Any, int] = {}
    for i in order:
        for u in st.eqns[i].invars:
            if type(u) is not _Literal:
                reads[u] = reads.get(u, 0) + 1
    out: dict[Any, Any] = {}
    start = 0
    for u in st.unknown_invars:
        shape = shape_of(u)
        size = int(np.prod(shape, dtype=np.int64))
        if not stops(u):
            out[u] = np.arange(start, start + size, dtype=np.int32).reshape(shape)
        start += size

    def outside(u: Any) -> Any:
        return Known(st.env[u]) if u in st.env else None

    for i in order:
        eqn: Any = st.eqns[i]
        reached = [u for u in eqn.invars if type(u) is not _Literal and u in out]
        if not any(isinstance(out[u], np.ndarray) for u in reached):
            # No unknown reaches it: its values, where the run holds them.
            out.update((w, outside(w)) for w in eqn.outvars)
            continue
        try:
            _SOURCES.run(None, [eqn], out, outside)
        except _Unopened:
            out.update(zip(eqn.outvars, _mixed(None, eqn, []), strict=True))
        for u in eqn.invars:
            if type(u) is not _Literal and u is not v:
                reads[u] -= 1
                if not reads[u]:
                    out.pop(u, None)
    got = out.get(v)
    return got if isinstance(got, np.ndarray) else None


class _Unopened(Exception):
    """A call-like step whose body the walk cannot open (several bodies)."""


def _mixed(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
    return [
        np.full(w.aval.shape, MIXED, np.int32)
        if isinstance(w.aval, compat.ShapedArray)
        else None
        for w in eqn.outvars
    ]


def _concrete(s: Any) -> bool:
    return isinstance(s, Known) and not compat.is_tracer(s.value)


def _unreached(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A step no unknown reaches: computed where its operands are concrete
    (inside a body, an `iota` mask a `select_n` then reads), else `None`."""
    if any(isinstance(s, np.ndarray) for s in ins):
        return None
    if not all(_concrete(s) for s in ins):
        return [None] * len(eqn.outvars)
    with jax.ensure_compile_time_eval():
        outs = compat.bind_eqn(eqn.primitive, [s.value for s in ins], eqn.params)
    return [Known(o) for o in outs]


_SOURCES: Rules[Any] = Rules(
    "sources", _Unopened, lift=lambda ctx, c: Known(c), default=_mixed, fold=_unreached
)


def _indices(s: Any, shape: Any) -> np.ndarray:
    """An operand's indices; a known one's are `CONSTANT`."""
    if isinstance(s, np.ndarray):
        return np.broadcast_to(s, shape)
    return np.full(shape, CONSTANT, np.int32)


@_SOURCES.register(*_COPIES)
def _copy(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
    return list(ins) if len(ins) == len(eqn.outvars) else _mixed(ctx, eqn, ins)


@_SOURCES.register(*(tr.having(tr.ELEMENTWISE) - _COPIES - {"select_n"}))
def _elementwise(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
    """One unknown element, or constants, in; else mixed."""
    shape = eqn.outvars[0].aval.shape
    arrays = [s for s in ins if isinstance(s, np.ndarray)]
    if len(eqn.outvars) != 1 or any(np.shape(s) not in (shape, ()) for s in arrays):
        return _mixed(ctx, eqn, ins)
    merged = np.full(shape, CONSTANT, np.int32)
    for s in arrays:
        s = np.broadcast_to(s, shape)
        same = (s == CONSTANT) | (s == merged)
        merged = np.where(merged == CONSTANT, s, np.where(same, merged, MIXED))
    return [merged]


@_SOURCES.register("select_n")
def _select(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
    """A known predicate picks each element's case; else as elementwise."""
    which = ins[0]
    if not _concrete(which):
        return _elementwise(ctx, eqn, ins)
    shape = eqn.outvars[0].aval.shape
    pick = np.broadcast_to(np.asarray(which.value).astype(np.int32), shape)
    return [np.choose(pick, [_indices(s, shape) for s in ins[1:]])]


@_SOURCES.register(*(_MOVES - _COPIES - tr.having(tr.ELEMENTWISE)))
def _move(ctx: Any, eqn: Any, ins: list[Any]) -> list[Any]:
    """The step run on the source indices themselves: moved as it moves the
    values."""
    if len(eqn.outvars) != 1:
        return _mixed(ctx, eqn, ins)
    ops = [
        _indices(s, np.shape(u.val) if type(u) is _Literal else u.aval.shape)
        for u, s in zip(eqn.invars, ins, strict=True)
    ]
    try:
        with jax.ensure_compile_time_eval():
            moved = eqn.primitive.bind(*map(jnp.asarray, ops), **eqn.params)
    except Exception:  # noqa: BLE001 (then as a step that mixes)
        return _mixed(ctx, eqn, ins)
    return [np.asarray(moved, np.int32)]
