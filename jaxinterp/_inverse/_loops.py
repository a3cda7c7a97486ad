"""Inverse rules for loops: `scan` and `while`.

A `scan` is inverted by a `scan` running the other way: the body is
inverted once, with the dataflow engine, from its results and final carry
to its inputs and initial carry; a `while` loop whose carries determine
each other likewise, with the count of iterations recovered from the
carried counter. A carry the body solves by a principal-branch choice is
refused unless every pass over the body keeps it on one branch
(`_carry_branches`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _branches as br
from ._control_flow import _ildj_dtype, _walker, _with_context
from ._rounding import agree, agree_solved, largest
from ._rules import InverseContext, inverse_rules

_Literal = compat.Literal

_LOOP_CHOICE = (
    "inside the body of a {what}, a map that is not injective (its "
    "principal branch) determines a loop carry; later steps could not "
    "check the chosen branch against the rest of the loop"
)

# Passes over a loop body at most while its carries' intervals grow (see
# `_carry_branches`); intervals only widen, to the whole real line.
_MAX_PASSES = 4


def _same_branches(
    a: Sequence[br.Interval | None], b: Sequence[br.Interval | None]
) -> bool:
    """Whether two lists of intervals are equal (`ROUNDED` only to itself)."""
    return all(
        x is y
        or (
            x is not None
            and y is not None
            and x == y
            and x is not br.ROUNDED
            and y is not br.ROUNDED
        )
        for x, y in zip(a, b, strict=True)
    )


def _carry_branches(
    what: str,
    got: Sequence[br.Interval | None],
    given: Sequence[br.Interval | None],
    unique: bool,
) -> list[br.Interval | None] | None:
    """The intervals to solve the loop body with again, or `None` once the
    last pass found no carry outside those it was given.

    The inverse of a loop solves its body once for every step, each time
    from the carries the step after it solved. A carry chosen in one step
    is given to the next step back, whose body must treat it as chosen by
    an enclosing equation (`out_branches`): a second constraint on it there
    is refused, as in a program without the loop. So the body is solved
    again with the carries' intervals (`given`, one per carry) until the
    carries it solves (`got`) lie in them; the last pass's loop stands.

    Only choices of an elementwise solve are passed on (`unique`, see
    `Solution.unique_choices`): where it answers, the map was checked
    monotone, so its answer is the only preimage, and choosing it a step
    early loses nothing. A principal branch or a rounding picks one preimage
    among several, and the engine waits with such a choice until no exact
    step is left (`_branches.py`); the loop's inverse could not wait for the
    steps before (an earlier step's `ys` may pin the carry exactly), so it
    refuses those.
    """
    if any(b is not None for b in got) and not unique:
        raise NotInvertibleError(_LOOP_CHOICE.format(what=what))
    widened = [br.union(g, b) for g, b in zip(given, got, strict=True)]
    return None if _same_branches(widened, given) else widened


def _loop_refusal(what: str, err: NotInvertibleError) -> NotInvertibleError:
    """A body refused once solved from carries chosen in the step after."""
    detail = getattr(err, "detail", None) or str(err)
    return NotInvertibleError(
        _LOOP_CHOICE.format(what=what) + f": solved from a carry so chosen, {detail}"
    )


def _in_passes(
    what: str,
    n_carry: int,
    attempt: Callable[..., Any],
    carries: slice = slice(None),
) -> tuple[Any, list[br.Interval | None], bool]:
    """Build a loop's inverse until the carries' intervals settle.

    `attempt(given, branches, unique)` builds the inverse loop with the
    carries' intervals `given` and fills `branches` (the body's, `carries`
    picking the carries among them) and `unique` as it traces the body.
    Returns the last attempt's result, the body's branches and whether every
    choice was unique (see `_carry_branches`).
    """
    where = f"the body of a {what}"
    given: list[br.Interval | None] = [None] * n_carry
    for _ in range(_MAX_PASSES):
        branches: list[br.Interval | None] = []
        unique: list[bool] = []
        try:
            result = attempt(given, branches, unique)
        except NotInvertibleError as err:
            if any(b is not None for b in given):
                err = _loop_refusal(what, err)
            raise _with_context(where, err) from None
        try:
            widened = _carry_branches(what, branches[carries], given, all(unique))
        except NotInvertibleError as err:
            raise _with_context(where, err) from None
        if widened is None:
            return result, branches, all(unique)
        given = widened
    raise _with_context(where, NotInvertibleError(_LOOP_CHOICE.format(what=what)))


# ---------------------------------------------------------------------------
# Loops: split the carry into a known part (initial value known, updated from
# known values only) and an unknown part that is solved backwards.


def forward_known(jaxpr: compat.Jaxpr, in_known: Sequence[bool]) -> list[bool]:
    """Which outputs of `jaxpr` depend only on inputs marked known."""
    known: set[Any] = {v for v, k in zip(jaxpr.invars, in_known, strict=True) if k}
    known.update(jaxpr.constvars)
    for eqn in jaxpr.eqns:
        if all(type(v) is _Literal or v in known for v in eqn.invars):
            known.update(eqn.outvars)
    return [type(v) is _Literal or v in known for v in jaxpr.outvars]


def _known_carry(
    body: compat.Jaxpr, n_before: int, carry_known: list[bool], rest_known: list[bool]
) -> list[bool]:
    """Fixpoint of carries whose init is known and whose update stays known."""
    n_carry = len(carry_known)
    known = list(carry_known)
    while True:
        out = forward_known(body, [True] * n_before + known + rest_known)
        new = [k and o for k, o in zip(known, out[:n_carry], strict=True)]
        if new == known:
            return known
        known = new


def _nan_unless(ok: Any, value: Any) -> Any:
    """`value`, NaN (floating values only) unless `ok`."""
    if not jnp.issubdtype(jnp.result_type(value), jnp.inexact):
        return value
    return jnp.where(ok, value, jnp.asarray(jnp.nan, jnp.result_type(value)))


def _scan_known(
    body: compat.Jaxpr,
    body_consts: list[Any],
    body_invals: Callable[..., list[Any]],
    init: list[Any],
    c_known: list[bool],
    xs: list[Any],
    p: Any,
) -> tuple[list[Any], list[Any]]:
    """A `scan`'s known carries run forwards: their final values, and their
    values at the start of every step."""
    init_known = [c for c, k in zip(init, c_known, strict=True) if k]
    if not init_known:
        return [], []
    n_carry = len(init)

    def known_step(kc: list[Any], kx: list[Any]) -> tuple[list[Any], list[Any]]:
        sol = _walker.solve(
            body,
            body_consts,
            body_invals(kc, None, kx),
            [None] * len(body.outvars),
            strict=False,
        )
        new = [o for o, k in zip(sol.outvals[:n_carry], c_known, strict=True) if k]
        return new, kc

    known_xs = [x for x in xs if x is not None]
    return lax.scan(
        known_step, init_known, known_xs, length=p.length, reverse=p.reverse
    )


def _agreeing(got: Sequence[Any], want: Sequence[Any]) -> Any:
    """Whether each value `got` agrees with its known value `want` (`None`:
    not known), as one boolean; `None` if none is known."""
    oks = [agree_solved(g, w) for g, w in zip(got, want, strict=True) if w is not None]
    return functools.reduce(jnp.logical_and, oks) if oks else None


def _scan_step(
    ctx: InverseContext,
    body_and_consts: tuple[Any, Any],
    body_invals: Callable[..., list[Any]],
    known: tuple[Sequence[bool], Sequence[bool]],
    n_consts: int,
    dtype: Any,
) -> Callable[..., Any]:
    """The step of a `scan`'s inverse, given the intervals of the carries
    the step after gives (`_carry_branches`): it solves the body from the
    next carries and the step's results (`known`: which carries and which
    `xs` are known)."""
    body, body_consts = body_and_consts
    c_known, x_known = known
    n_carry = len(c_known)

    def with_given(
        given: Sequence[br.Interval | None],
        step_branches: list[br.Interval | None],
        step_unique: list[bool],
    ) -> Callable[..., Any]:
        # The intervals of the unknown carries given by the step after
        # (`_carry_branches`); the known ones are not given.
        out_branches = [None if k else b for b, k in zip(given, c_known, strict=True)]

        def inverse_step(
            carry_next: list[Any], step: tuple[list[Any], list[Any], list[Any]]
        ) -> tuple[list[Any], tuple[Any, ...]]:
            y_t, kx_t, kc_t = step
            invals_t = body_invals(kc_t, None, kx_t)
            nxt = iter(carry_next)
            outs_t = [None if k else next(nxt) for k in c_known] + list(y_t)
            sol = _walker.solve(
                body,
                body_consts,
                invals_t,
                outs_t,
                out_branches=out_branches + [None] * len(y_t),
                want_ildj=ctx.want_ildj,
                solvers=ctx.solvers,
            )
            step_branches[:] = sol.branches
            step_unique[:] = [sol.unique_choices]
            carry_in = sol.invals[n_consts : n_consts + n_carry]
            carry = [c for c, k in zip(carry_in, c_known, strict=True) if not k]
            x_t = [
                x
                for x, k in zip(sol.invals[n_consts + n_carry :], x_known, strict=True)
                if not k
            ]
            ildj_t = jnp.asarray(sol.ildj).astype(dtype)
            if sol.agreed is True:  # (nothing was determined twice)
                return carry, (x_t, ildj_t)
            return carry, (x_t, ildj_t, jnp.asarray(sol.agreed, bool))

        return inverse_step

    return with_given


@inverse_rules.register(compat.scan_p)
def _scan_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    p = compat.scan_params(params)
    n_consts, n_carry = p.num_consts, p.num_carry
    consts = list(invals[:n_consts])
    init = list(invals[n_consts : n_consts + n_carry])
    xs = list(invals[n_consts + n_carry :])
    if any(c is None for c in consts):
        raise NotInvertibleError(
            "a loop-invariant operand of a `scan` depends on an unknown input"
        )
    final = list(outvals[:n_carry])
    ys = list(outvals[n_carry:])
    if any(y is None for y in ys):
        return None
    body = compat.open_jaxpr(p.jaxpr)
    body_consts = compat.jaxpr_consts(p.jaxpr)
    x_known = [x is not None for x in xs]
    c_known = _known_carry(body, n_consts, [c is not None for c in init], x_known)
    if any(f is None for f, k in zip(final, c_known, strict=True) if not k):
        return None
    dtype = _ildj_dtype(outvals)
    known_xs = [x for x in xs if x is not None]

    def body_invals(kc: list[Any], unknown_c: Any, known_x: list[Any]) -> list[Any]:
        kc_it, x_it = iter(kc), iter(known_x)
        carry = [next(kc_it) if k else unknown_c for k in c_known]
        return [*consts, *carry, *[next(x_it) if k else None for k in x_known]]

    # 1. The known carries' value at the start of every step.
    kc_last, kc_seq = _scan_known(body, body_consts, body_invals, init, c_known, xs, p)
    # The known carries' final values are results too: `y` must hold them.
    known_final = [f for f, k in zip(final, c_known, strict=True) if k]
    final_ok = _agreeing(kc_last, known_final)

    # 2. The inverse: run the other way, solving each step.
    inverse_step_with = _scan_step(
        ctx, (body, body_consts), body_invals, (c_known, x_known), n_consts, dtype
    )

    unknown_final = [f for f, k in zip(final, c_known, strict=True) if not k]

    def attempt(
        given: Sequence[br.Interval | None],
        step_branches: list[br.Interval | None],
        step_unique: list[bool],
    ) -> Any:
        return lax.scan(
            inverse_step_with(given, step_branches, step_unique),
            unknown_final,
            (ys, known_xs, kc_seq),
            length=p.length,
            reverse=not p.reverse,
        )

    (carry0, (x_unknown, ildjs, *agreed)), step_branches, unique = _in_passes(
        "`scan`", n_carry, attempt, slice(n_consts, n_consts + n_carry)
    )
    checks = _scan_checks(agreed, final_ok, init, c_known, carry0, final, ys)
    if checks:
        ok = functools.reduce(jnp.logical_and, checks)
        carry0 = [_nan_unless(ok, c) for c in carry0]
        x_unknown = [_nan_unless(ok, x) for x in x_unknown]
        ildjs = _nan_unless(ok, ildjs)
    solved, branches = _scan_solved(
        consts, init, xs, c_known, carry0, x_unknown, step_branches
    )
    return (
        solved,
        jnp.sum(ildjs),
        branches if any(b is not None for b in branches) else None,
        unique,
    )


def _scan_checks(
    agreed: list[Any],
    final_ok: Any,
    init: list[Any],
    c_known: list[bool],
    carry0: list[Any],
    final: list[Any],
    ys: list[Any],
) -> list[Any]:
    """The second constraints of a `scan` solved backwards, each a boolean
    scalar: the steps', the known carries' final values, and each carry
    solved back to a known initial value."""
    # A step whose second constraints failed made its solved carry NaN; an
    # earlier step may solve that carry again from a copy in `ys` (where a
    # NaN on the known side is excused), so the failure is applied here.
    checks = [jnp.all(agreed[0])] if agreed else []
    if final_ok is not None:
        checks.append(final_ok)
    # A carry outside the known part whose initial value is known (a
    # constant, a known input): the value solved back must be it, else `y`
    # is off the image (`ys` holding the carry before each step repeats it).
    # Solved back through every step, it carries their rounding: of the
    # largest value the scan's outputs hold.
    scale = functools.reduce(
        jnp.maximum,
        [largest(v) for v in (*final, *ys) if v is not None],
        jnp.float32(0),
    )
    c_it = iter(carry0)
    for v, k in zip(init, c_known, strict=True):
        if not k:
            solved = next(c_it)
            if v is not None:
                checks.append(agree(solved, v, scale))
    return checks


def _scan_solved(
    consts: list[Any],
    init: list[Any],
    xs: list[Any],
    c_known: list[bool],
    carry0: list[Any],
    x_unknown: list[Any],
    step_branches: list[br.Interval | None],
) -> tuple[list[Any], list[br.Interval | None]]:
    """A `scan`'s operands, known and solved, and the interval of each that
    depends on a chosen branch."""
    n_consts, n_carry = len(consts), len(init)
    # carry0 holds every carry outside the known part, including unknown-part
    # carries whose initial value was known all along.
    c_it, x_it = iter(carry0), iter(x_unknown)
    solved_init = []
    for v, k in zip(init, c_known, strict=True):
        solved = v if k else next(c_it)
        solved_init.append(v if v is not None else solved)
    solved_xs = [v if v is not None else next(x_it) for v in xs]
    # A branch chosen for an `xs` element: its interval is not tracked
    # through the loop, so the whole real line; for an initial carry, its
    # interval in the last pass (see `_carry_branches`).
    carry_branches = [
        b if v is None else None
        for b, v in zip(step_branches[n_consts : n_consts + n_carry], init, strict=True)
    ]
    xs_branches = step_branches[n_consts + n_carry :]
    branches: list[br.Interval | None] = [None] * n_consts
    branches += carry_branches
    branches += [None if b is None else br.REALS for b in xs_branches]
    return [*consts, *solved_init, *solved_xs], branches


def _while_count(
    cond: tuple[Any, Any, list[Any]],
    body: tuple[Any, Any, list[Any]],
    init: Sequence[Any],
    c_known: Sequence[bool],
) -> tuple[Any, list[Any]]:
    """How many steps a `while` loop takes from `init`, and the final values
    of its carries known (`c_known`), by running it forwards on those.
    `cond` and `body`: each open Jaxpr, its consts and its operands."""
    cond_jaxpr, cond_jconsts, cond_consts = cond
    body_jaxpr, body_jconsts, body_consts = body
    n_carry = len(init)

    def full(kc: list[Any]) -> list[Any]:
        it = iter(kc)
        return [next(it) if k else None for k in c_known]

    def count_cond(state: tuple[Any, list[Any]]) -> Any:
        _, kc = state
        sol = _walker.solve(
            cond_jaxpr, cond_jconsts, [*cond_consts, *full(kc)], [None], strict=False
        )
        return sol.outvals[0]

    def count_body(state: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
        steps, kc = state
        sol = _walker.solve(
            body_jaxpr,
            body_jconsts,
            [*body_consts, *full(kc)],
            [None] * n_carry,
            strict=False,
        )
        return steps + 1, [o for o, k in zip(sol.outvals, c_known, strict=True) if k]

    init_known = [c for c, k in zip(init, c_known, strict=True) if k]
    return lax.while_loop(
        count_cond, count_body, (jnp.zeros((), jnp.int32), init_known)
    )


@inverse_rules.register(compat.while_p)
def _while_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    p = compat.while_params(params)
    nc, nb = p.cond_nconsts, p.body_nconsts
    cond_consts = list(invals[:nc])
    body_consts = list(invals[nc : nc + nb])
    init = list(invals[nc + nb :])
    n_carry = len(init)
    if any(c is None for c in cond_consts + body_consts):
        raise NotInvertibleError(
            "a loop-invariant operand of a `while` depends on an unknown input"
        )
    body = compat.open_jaxpr(p.body_jaxpr)
    body_jconsts = compat.jaxpr_consts(p.body_jaxpr)
    cond = compat.open_jaxpr(p.cond_jaxpr)
    cond_jconsts = compat.jaxpr_consts(p.cond_jaxpr)
    c_known = _known_carry(body, nb, [c is not None for c in init], [])
    if not forward_known(cond, [True] * nc + c_known)[0]:
        raise NotInvertibleError(
            "the trip count of a `while` loop depends on an unknown input"
        )
    if any(o is None for o, k in zip(outvals, c_known, strict=True) if not k):
        return None
    dtype = _ildj_dtype(outvals)

    # 1. Count the steps (and get the known carries' final values).
    steps, kc_final = _while_count(
        (cond, cond_jconsts, cond_consts),
        (body, body_jconsts, body_consts),
        init,
        c_known,
    )

    # 2. Undo the body `steps` times, solving every carry from the next one.
    kc_it = iter(kc_final)
    last = [next(kc_it) if k else o for o, k in zip(outvals, c_known, strict=True)]
    # The known carries' final values are results too: `y` must hold them.
    final_ok = _agreeing(
        [g for g, k in zip(last, c_known, strict=True) if k],
        [w for w, k in zip(outvals, c_known, strict=True) if k],
    )

    def undo_with(
        given: Sequence[br.Interval | None],
        undo_branches: list[br.Interval | None],
        undo_unique: list[bool],
    ) -> Callable[..., Any]:
        # The intervals of the carries given by the step after
        # (`_carry_branches`).
        def undo(_: Any, state: tuple[list[Any], Any]) -> tuple[list[Any], Any]:
            carry, total = state
            sol = _walker.solve(
                body,
                body_jconsts,
                [*body_consts, *([None] * n_carry)],
                carry,
                out_branches=list(given),
                want_ildj=ctx.want_ildj,
                solvers=ctx.solvers,
            )
            undo_branches[:] = sol.branches[nb:]
            undo_unique[:] = [sol.unique_choices]
            return list(sol.invals[nb:]), total + jnp.asarray(sol.ildj).astype(dtype)

        return undo

    def attempt(
        given: Sequence[br.Interval | None],
        undo_branches: list[br.Interval | None],
        undo_unique: list[bool],
    ) -> Any:
        return lax.fori_loop(
            0,
            steps,
            undo_with(given, undo_branches, undo_unique),
            (last, jnp.zeros((), dtype)),
        )

    (first, ildj), undo_branches, unique = _in_passes("`while` loop", n_carry, attempt)
    if final_ok is not None:
        first = [_nan_unless(final_ok, c) for c in first]
        ildj = _nan_unless(final_ok, ildj)
    branches: list[br.Interval | None] = [None] * (nc + nb)
    branches += [
        b if v is None else None for b, v in zip(undo_branches, init, strict=True)
    ]
    return (
        [*cond_consts, *body_consts, *first],
        ildj,
        branches if any(b is not None for b in branches) else None,
        unique,
    )
