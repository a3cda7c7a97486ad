"""A `cond` whose branch index depends on the unknowns, unfolded.

`lax.cond(x > 0, f, g, x)` and `lax.switch(k(x), branches, x)` choose their
branch by a value the inverse does not know yet, so the `cond` rule cannot
invert one branch. Unfolded, every branch runs and `select_n` on the index
picks among their results, which is what JAX's `vmap` makes of such a
`cond` (and what `jnp.where` writes): a piecewise map, which the engine
inverts case by case (`_branches.py`, `_intervals.py`), recomputing the
index on each candidate.

The engine unfolds only when it is stuck at such a `cond`, and solves the
unfolded Jaxpr from the start (`solve_unfolded`; when that leaves unknowns,
the program is solved once per branch instead, `_by_branch`): a `cond` whose
index the outputs determine first (`(x, lax.cond(x > 0, ...))`) keeps its
own rule. A `cond` with effects is not unfolded (every branch would run),
unless they are debug prints and callbacks (`jax.debug.print`): those are
left out of the unfolded branches, as the inverse of a program leaves out the
prints it does not need.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError, source_line
from . import _branches as br
from ._dataflow import INVERTED, Solution

_Literal = compat.Literal


def blocked_index(st: Any) -> list[int]:
    """The `cond`s the engine is stuck at for want of their index."""
    return [
        i
        for i in sorted(st.reasons)
        if st.eqns[i].primitive is compat.cond_p
        and type(st.eqns[i].invars[0]) is not _Literal
        and st.eqns[i].invars[0] not in st.env
        and _unfoldable(st.eqns[i])
    ]


def _unfoldable(eqn: Any) -> bool:
    return (
        not eqn.effects or compat.debug_effects_only(eqn.effects)
    ) and compat.cond_platform_branch(eqn) is None


def _debug_only(eqn: Any) -> bool:
    """A debug print or callback with no results (left out when run here)."""
    return not eqn.outvars and compat.debug_effects_only(eqn.effects)


def _run(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], tainted: Sequence[bool]
) -> list[Any]:
    """`jaxpr` evaluated on `args`, each equation in its own source context
    (so that errors about the unfolded steps cite the user's lines), and a
    `cond` whose index depends on the arguments marked `tainted` (those that
    depend on the unknowns) unfolded in turn."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    dirty = {v for v, t in zip(jaxpr.invars, tainted, strict=True) if t}

    def read(v: Any) -> Any:
        return v.val if type(v) is _Literal else env[v]

    for eqn in jaxpr.eqns:
        if _debug_only(eqn):
            continue
        flags = [type(v) is not _Literal and v in dirty for v in eqn.invars]
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive is compat.cond_p and flags[0] and _unfoldable(eqn):
            outs = _select_branches(eqn, ins, flags)
        else:
            user, ctx = compat.eqn_contexts(eqn)
            with user, ctx:
                outs = compat.bind_eqn(eqn.primitive, ins, eqn.params)
        env.update(zip(eqn.outvars, outs, strict=True))
        if any(flags):
            dirty.update(eqn.outvars)
    return [read(v) for v in jaxpr.outvars]


def _select_branches(
    eqn: Any, ins: Sequence[Any], tainted: Sequence[bool]
) -> list[Any]:
    """`eqn` (a `cond`) on `ins`: every branch, then `select_n` on the
    index (clamped, as `cond` does)."""
    index, *ops = ins
    branches = compat.cond_branches(eqn)
    cases = [
        _run(compat.open_jaxpr(b), compat.jaxpr_consts(b), ops, tainted[1:])
        for b in branches
    ]
    user, ctx = compat.eqn_contexts(eqn)
    with user, ctx:
        index = lax.clamp(0, index, len(branches) - 1)
        return [lax.select_n(index, *c) for c in zip(*cases, strict=True)]


def _spliced(eqn: Any, fn: Any) -> tuple[list[Any], list[Any], list[Any], dict]:
    """The equations of `fn` staged on `eqn`'s operands, in place of `eqn`:
    their constants (variables, values), and the substitutions for `eqn`'s
    results that are no equation's (an operand or a literal passed
    through, as an identity branch does), for the equations after it."""
    specs = [compat.staging_spec(v.aval) for v in eqn.invars]
    closed = jax.make_jaxpr(fn)(*specs)
    small = compat.open_jaxpr(closed)
    rename: dict[Any, Any] = dict(zip(small.invars, eqn.invars, strict=True))
    produced = {v for e in small.eqns for v in e.outvars}
    subst: dict[Any, Any] = {}
    for inner, outer in zip(small.outvars, eqn.outvars, strict=True):
        if type(outer) is compat.DropVar:
            continue
        if type(inner) is not _Literal and inner in produced and inner not in rename:
            rename[inner] = outer
        else:
            subst[outer] = inner if type(inner) is _Literal else rename[inner]

    def renamed(v: Any) -> Any:
        return v if type(v) is _Literal else rename.get(v, v)

    eqns = [
        e.replace(
            invars=[renamed(v) for v in e.invars],
            outvars=[renamed(v) for v in e.outvars],
        )
        for e in small.eqns
    ]
    return eqns, list(small.constvars), list(compat.jaxpr_consts(closed)), subst


def _rebuilt(
    jaxpr: Any, consts: Sequence[Any], parts: dict[int, tuple]
) -> tuple[Any, list[Any]]:
    """`jaxpr` with the equations at `parts`' keys replaced (`_spliced`)."""
    constvars, values = list(jaxpr.constvars), list(consts)
    eqns: list[Any] = []
    subst: dict[Any, Any] = {}

    def sub(v: Any) -> Any:
        return v if type(v) is _Literal else subst.get(v, v)

    for i, eqn in enumerate(jaxpr.eqns):
        if subst:
            eqn = eqn.replace(invars=[sub(v) for v in eqn.invars])
        got = parts.get(i)
        if got is None:
            eqns.append(eqn)
            continue
        new_eqns, new_constvars, new_consts, new_subst = got
        eqns.extend(new_eqns)
        constvars.extend(new_constvars)
        values.extend(new_consts)
        subst.update({k: sub(v) for k, v in new_subst.items()})
    outvars = [sub(v) for v in jaxpr.outvars]
    rebuilt = compat.replace_with_consts(
        jaxpr, constvars, values, eqns=eqns, outvars=outvars
    )
    return rebuilt, values


def unfold_conds(
    jaxpr: Any,
    consts: Sequence[Any],
    targets: Sequence[int],
    unknown: Sequence[bool],
) -> tuple[Any, list[Any]] | None:
    """`jaxpr` (and its constants) with the `cond` equations at `targets`
    unfolded (module docstring), its inputs and outputs the same variables;
    `None` if none of them can be. `unknown`: per input, whether it is one
    of the unknowns (`cond`s inside the branches whose index depends on
    them are unfolded too)."""
    wanted = set(targets)
    dirty = {v for v, u in zip(jaxpr.invars, unknown, strict=True) if u}
    parts: dict[int, tuple] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        flags = [type(v) is not _Literal and v in dirty for v in eqn.invars]
        if any(flags):
            dirty.update(eqn.outvars)
        if i in wanted:

            def unfold(*ins: Any, eqn: Any = eqn, flags: list = flags) -> list[Any]:
                return _select_branches(eqn, ins, flags)

            parts[i] = _spliced(eqn, unfold)
    if not parts:
        return None
    return _rebuilt(jaxpr, consts, parts)


def with_branch(
    jaxpr: Any, consts: Sequence[Any], target: int, b: int
) -> tuple[Any, list[Any]]:
    """`jaxpr` with the `cond` at `target` replaced by its branch `b` (as
    if its index were `b`), its inputs and outputs the same variables."""
    eqn = jaxpr.eqns[target]
    branch = compat.cond_branches(eqn)[b]

    def run(index: Any, *ops: Any) -> list[Any]:
        del index
        inner = compat.open_jaxpr(branch)
        return _run(inner, compat.jaxpr_consts(branch), ops, [False] * len(ops))

    return _rebuilt(jaxpr, consts, {target: _spliced(eqn, run)})


def index_at(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], target: int
) -> Any:
    """The branch the `cond` at `target` takes (its index clamped, as
    `cond` clamps it) when `jaxpr` runs on `args`: the equations before it
    that the index needs, run by `_run`."""
    eqn = jaxpr.eqns[target]
    index = eqn.invars[0]
    needed = {index} if type(index) is not _Literal else set()
    kept = []
    for e in reversed(jaxpr.eqns[:target]):
        if any(v in needed for v in e.outvars):
            needed.update(v for v in e.invars if type(v) is not _Literal)
            kept.append(e)
    prefix = jaxpr.replace(eqns=kept[::-1], outvars=[index])
    (value,) = _run(prefix, consts, args, [False] * len(args))
    return lax.clamp(0, value, len(compat.cond_branches(eqn)) - 1)


# -- solving a program stuck at such a `cond` -----------------------------------

# At most this many branches of a `cond` whose index depends on the
# unknowns are each solved (`_by_branch`).
MAX_BRANCHES = 8
# How `explain_inverse` names that method.
BY_BRANCH = "by branch"


def solve_unfolded(
    again: Callable[..., Solution],
    jaxpr: compat.Jaxpr,
    consts: Sequence[Any],
    conds: list[int],
    invals: Sequence[Any],
    outvals: Sequence[Any],
    strict: bool,
    seeds: Sequence[Any],
) -> Solution | None:
    """The program stuck at the `cond`s `conds` (whose indices depend on the
    unknowns) solved again by `again` (`InverseWalker.solve` with the run's
    options): unfolded, else once per branch of the first; `None` when they
    cannot be unfolded."""
    unknown = [v is None for v in invals]
    unfolded = unfold_conds(jaxpr, consts, conds, unknown)
    if unfolded is None:
        return None
    sol = again(*unfolded, invals, outvals, strict=False)
    if _complete(sol, invals):
        return sol
    if seeds:
        return again(*unfolded, invals, outvals, strict=strict)
    enumerated = _by_branch(jaxpr, consts, conds[0], invals, outvals, again)
    if isinstance(enumerated, Solution):
        return enumerated
    try:
        return again(*unfolded, invals, outvals, strict=strict)
    except NotInvertibleError as err:
        # (Why solving it by branch did not answer either.)
        raise NotInvertibleError(f"{err}\n{enumerated}") from None


def _complete(sol: Solution, invals: Sequence[Any]) -> bool:
    """Whether `sol` found every unknown input."""
    return all(
        v is not None or got is not None
        for v, got in zip(invals, sol.invals, strict=True)
    )


def _by_branch(
    jaxpr: compat.Jaxpr,
    consts: Sequence[Any],
    target: int,
    invals: Sequence[Any],
    outvals: Sequence[Any],
    again: Callable[..., Solution],
) -> Solution | str:
    """The unknowns, solved once per branch of the `cond` at `target`
    (its index fixed), each candidate kept where the index it gives is
    that branch's: `lax.cond(jnp.sum(x) > 0, f, g, x)`, whose index no
    elementwise piecewise method reads. NaN where no branch's candidate
    takes its own branch (`y` off the image) or several different ones
    do (not injective). Where it cannot be solved so (a branch is
    refused, more than `MAX_BRANCHES` branches), why, in words."""
    eqn = jaxpr.eqns[target]
    n = len(compat.cond_branches(eqn))
    where = f"The `cond` at {source_line(eqn)}, solved once per branch"
    unknown = [k for k, v in enumerate(invals) if v is None]
    floating = all(
        jnp.issubdtype(getattr(jaxpr.invars[k].aval, "dtype", bool), jnp.inexact)
        for k in unknown
    )
    if n > MAX_BRANCHES:
        return f"{where}, has {n} branches: at most {MAX_BRANCHES} are tried."
    if not floating:
        return f"{where}, has unknowns that are not floating: not tried."
    sols = []
    for b in range(n):
        fixed, fixed_consts = with_branch(jaxpr, consts, target, b)
        try:
            sol = again(fixed, fixed_consts, invals, outvals, strict=True)
        except NotInvertibleError as err:
            line = str(err).splitlines()[0]
            return f"{where}: its branch {b} alone is refused ({line})"
        if sol.pieces or sol.uncovered:
            return f"{where}: its branch {b} leaves unknowns known in parts."
        sols.append(sol)
    return _the_consistent_branch(jaxpr, consts, target, invals, outvals, sols)


def _the_consistent_branch(
    jaxpr: compat.Jaxpr,
    consts: Sequence[Any],
    target: int,
    invals: Sequence[Any],
    outvals: Sequence[Any],
    sols: list[Solution],
) -> Solution:
    """The solutions of each branch joined: the one whose candidate takes its
    own branch, NaN unless exactly one answer does."""
    unknown = [k for k, v in enumerate(invals) if v is None]
    takes = [
        (index_at(jaxpr, consts, sol.invals, target) == b)
        & ~functools.reduce(
            jnp.logical_or, [jnp.any(jnp.isnan(sol.invals[k])) for k in unknown]
        )
        for b, sol in enumerate(sols)
    ]
    first = jnp.argmax(jnp.stack(takes)).astype(jnp.int32)

    def pick(values: Sequence[Any]) -> Any:
        return lax.select_n(first, *jnp.broadcast_arrays(*values))

    # An element is determined where every consistent candidate gives it
    # the same value: NaN stays with the elements the branches disagree on
    # (an input the `cond` does not touch is recovered whatever it picks).
    invals_out = list(sols[0].invals)
    some = jnp.any(jnp.stack(takes))
    same = some
    for k in unknown:
        chosen = pick([sol.invals[k] for sol in sols])
        agree = some
        for took, sol in zip(takes, sols, strict=True):
            agree = agree & (~took | (sol.invals[k] == chosen))
        invals_out[k] = jnp.where(agree, chosen, jnp.nan)
        same = same & jnp.all(agree)
    ildjs = [jnp.asarray(sol.ildj) for sol in sols]
    ildj = jnp.where(same, pick(ildjs), jnp.nan).astype(ildjs[0].dtype)
    outs = list(sols[0].outvals)
    for j, v in enumerate(outvals):
        if v is None and all(sol.outvals[j] is not None for sol in sols):
            outs[j] = pick([sol.outvals[j] for sol in sols])
    checks = [
        (jnp.where(first == b, count, 0), message)
        for b, sol in enumerate(sols)
        for count, message in sol.nan_checks
    ]
    status, methods = _reported_on(jaxpr, target, sols[0])
    return dataclasses.replace(
        sols[0],
        jaxpr=jaxpr,
        status=status,
        methods=methods,
        reasons={},
        invals=invals_out,
        outvals=outs,
        ildj=ildj,
        nan_checks=checks,
        branches=[
            functools.reduce(br.union, [sol.branches[k] for sol in sols])
            for k in range(len(invals))
        ],
        # (The branch is not a choice: every one is tried, and the
        # answer must be the only one consistent.)
        chose=any(sol.chose for sol in sols),
        agreed=pick([jnp.asarray(sol.agreed) for sol in sols]),
        unique_choices=all(sol.unique_choices for sol in sols),
    )


def _reported_on(
    jaxpr: compat.Jaxpr, target: int, first: Solution
) -> tuple[list[str], dict[int, str]]:
    """Each equation's status and method on `jaxpr` itself: its other
    equations as the first branch's run treated them, the `cond` solved by
    branch."""
    shift = len(first.jaxpr.eqns) - len(jaxpr.eqns)

    def moved(i: int) -> int:
        return i if i < target else i + shift

    outer = [i for i in range(len(jaxpr.eqns)) if i != target]
    status = [INVERTED] * len(jaxpr.eqns)
    for i in outer:
        status[i] = first.status[moved(i)]
    methods = {i: first.methods[moved(i)] for i in outer if moved(i) in first.methods}
    methods[target] = BY_BRANCH
    return status, methods
