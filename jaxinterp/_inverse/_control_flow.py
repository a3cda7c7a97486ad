"""Inverse rules for higher-order primitives: jit, calls, custom derivatives, cond,
scan and while.

Each rule inverts the sub-Jaxpr with the same dataflow engine and rebuilds the
construct around the inverse: the inverse of a `jit` is a `jit`, of a `cond` a
`cond` over the inverted branches, of a `scan` a `scan` running the other way.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import _caches, _jax_compat as compat
from .._errors import NotInvertibleError
from . import _branches as br
from ._engine import InverseWalker
from ._rules import InverseContext, _largest, agree, agree_solved, inverse_rules

_walker = InverseWalker()
_Literal = compat.Literal


def _ildj_dtype(values: Sequence[Any]) -> Any:
    dtypes = [
        jnp.result_type(v)
        for v in values
        if v is not None and jnp.issubdtype(jnp.result_type(v), jnp.inexact)
    ]
    if not dtypes:
        return jnp.float32
    dtype = jnp.result_type(*dtypes)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.finfo(dtype).dtype
    return jnp.promote_types(dtype, jnp.float32)


def _invert_closed(
    closed: compat.Jaxpr | compat.ClosedJaxpr,
    invals: Sequence[Any],
    outvals: Sequence[Any],
    out_branches: Sequence[br.Interval | None] | None = None,
    *,
    want_ildj: bool = True,
    solvers: bool = True,
    unique_out: list[bool] | None = None,
) -> tuple[list[Any], Any, list[br.Interval | None]]:
    """Solve `closed` for its unknown inputs.

    Returns (all invals, ildj, the principal-branch interval of each inval or
    `None`); `out_branches` gives those of the outvals (see `_branches.py`).
    `unique_out`, if given, receives `Solution.unique_choices`.
    """
    sol = _walker.solve(
        compat.open_jaxpr(closed),
        compat.jaxpr_consts(closed),
        invals,
        outvals,
        out_branches=out_branches or None,
        want_ildj=want_ildj,
        solvers=solvers,
    )
    if unique_out is not None:
        unique_out[:] = [sol.unique_choices]
    return sol.invals, sol.ildj, sol.branches


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


def _with_context(what: str, err: NotInvertibleError) -> NotInvertibleError:
    detail = getattr(err, "detail", None) or str(err)
    return NotInvertibleError(f"inside {what}: {detail}")


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
# Call-like primitives: invert the body in place.


def _inline_body_rule(get_body: Callable[[dict[str, Any]], Any], what: str) -> Any:
    def rule(
        ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
    ) -> Any:
        if any(o is None for o in outvals):
            return None
        unique: list[bool] = []
        try:
            solved, ildj, branches = _invert_closed(
                get_body(params),
                invals,
                outvals,
                ctx.result_branches,
                want_ildj=ctx.want_ildj,
                solvers=ctx.solvers,
                unique_out=unique,
            )
        except NotInvertibleError as err:
            raise _with_context(what, err) from None
        return solved, ildj, branches, unique[0]

    return rule


inverse_rules.register(
    compat.closed_call_p,
    _inline_body_rule(compat.call_jaxpr, "`closed_call`"),
)
if compat.core_call_p is not None:  # a separate primitive before JAX 0.12
    inverse_rules.register(
        compat.core_call_p,
        _inline_body_rule(compat.call_jaxpr, "`core_call`"),
    )
if compat.remat_p is not None:
    inverse_rules.register(
        compat.remat_p,
        _inline_body_rule(lambda p: compat.remat_params(p).jaxpr, "`checkpoint`"),
    )


_LOG2 = math.log(2.0)


def _logaddexp_inverse(
    ctx: InverseContext, outvals: Sequence[Any], a: Any, b: Any
) -> Any:
    """`y = logaddexp(a, b)` with one side known: `a = y + log1p(-exp(b - y))`."""
    (y,) = outvals
    if (a is None) == (b is None):
        return None
    known = b if a is None else a
    if jnp.shape(known) != jnp.shape(y) and jnp.ndim(known) != 0:
        return None
    d = lax.sub(known, y).astype(jnp.result_type(y))
    # log(1 - exp(d)) without cancellation: `log(-expm1(d))` near 0 (`exp(d)`
    # rounds to 1 there: softplus(x) = 1e-8 gave x = -inf), `log1p(-exp(d))`
    # below -log 2; each branch sees a safe `d` where it is not taken (no
    # infinite derivative times zero).
    near = d > -_LOG2
    log1mexp = jnp.where(
        near,
        jnp.log(-jnp.expm1(jnp.where(near, d, -1.0))),
        jnp.log1p(-jnp.exp(jnp.where(near, -1.0, d))),
    )
    solved = y + log1mexp
    ildj = -jnp.sum(log1mexp * jnp.ones_like(y))
    return ([solved, b] if a is None else [a, solved]), ildj


# Custom-derivative functions whose primal body is not invertible equation by
# equation, but whose whole is: matched by the name JAX records.
_NAMED_CUSTOM_JVP: dict[str, Callable[..., Any]] = {"logaddexp": _logaddexp_inverse}


def _custom_jvp_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    named = _NAMED_CUSTOM_JVP.get(compat.call_name(params))
    tainted = any(b is not None for b in ctx.result_branches)
    if named is not None and len(invals) == 2 and not tainted:
        return named(ctx, outvals, *invals)
    return _inline_body_rule(compat.call_jaxpr, "a `custom_jvp` function")(
        ctx, outvals, *invals, **params
    )


inverse_rules.register(compat.custom_jvp_call_p, _custom_jvp_inverse)
inverse_rules.register(
    compat.custom_vjp_call_p,
    _inline_body_rule(compat.call_jaxpr, "a `custom_vjp` function"),
)


def _hijax_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    """`call_hi_primitive` (JAX >= 0.11 hijax flags): `custom_jvp`,
    `custom_vjp` and `checkpoint` invert their body in place, as without the
    flags. A `Scan3` never reaches here: `inverse` makes it a classic `scan`
    first (`_state.functionalize`)."""
    h = compat.hijax_params(params)
    if h.kind == "custom_jvp":
        named = _NAMED_CUSTOM_JVP.get(h.fun_name)
        tainted = any(b is not None for b in ctx.result_branches)
        if named is not None and len(invals) == h.n_consts + 2 and not tainted:
            solved = named(ctx, outvals, *invals[h.n_consts :])
            if solved is None:
                return None
            return [*invals[: h.n_consts], *solved[0]], solved[1]
    if h.body is None or h.kind == "scan":
        raise NotInvertibleError(
            f"`inverse` has no rule for hijax primitive `{h.name}`"
        )
    if any(o is None for o in outvals):
        return None
    keep = h.keep or (True,) * len(invals)
    dropped = [v for v, k in zip(invals, keep, strict=True) if not k]
    if any(v is None for v in dropped):
        return None
    kept = [v for v, k in zip(invals, keep, strict=True) if k]
    try:
        solved, ildj, branches = _invert_closed(
            h.body,
            kept,
            outvals,
            ctx.result_branches,
            want_ildj=ctx.want_ildj,
            solvers=ctx.solvers,
        )
    except NotInvertibleError as err:
        raise _with_context(f"a `{h.kind}` function", err) from None
    it_solved, it_branch = iter(solved), iter(branches)
    merged, merged_branches = [], []
    for v, k in zip(invals, keep, strict=True):
        merged.append(next(it_solved) if k else v)
        merged_branches.append(next(it_branch) if k else None)
    return merged, ildj, merged_branches


if compat.call_hi_primitive_p is not None:
    inverse_rules.register(compat.call_hi_primitive_p, _hijax_inverse)


# ---------------------------------------------------------------------------
# jit: the inverse is a jit, traced once per (body, known mask).


def _split_known(invals: Sequence[Any]) -> tuple[dict[int, Any], list[Any]]:
    """Split the known operands of a construct into concrete and traced ones.

    Concrete ones (constants of the program) are closed over by the inverse
    body rather than passed in, so the rules inside see them as concrete and
    can check them (a `gather`'s indices, a `select_n`'s mask) instead of
    assuming. Returns `({index: concrete value}, [traced known values])`.
    """
    baked = {
        i: v for i, v in enumerate(invals) if v is not None and not compat.is_tracer(v)
    }
    traced = [v for i, v in enumerate(invals) if v is not None and i not in baked]
    return baked, traced


def _merge_known(
    mask: Sequence[bool], baked: dict[int, Any], traced: Sequence[Any]
) -> list[Any]:
    """The operands again: `None` where `mask` marks an unknown, else the known
    value, concrete from `baked` or in turn from `traced`."""
    it = iter(traced)
    return [
        None if unknown else baked[i] if i in baked else next(it)
        for i, unknown in enumerate(mask)
    ]


# Per `jit` body, its inverses by (mask, ildj wanted, branches, shardings).
_jit_cache = _caches.Cache(1024, weak=True)


def _jitted_inverse(
    closed: compat.Jaxpr | compat.ClosedJaxpr,
    mask: tuple[bool, ...],
    name: str,
    baked: dict[int, Any],
    out_branches: tuple[br.Interval | None, ...],
    wanted: bool,
    solvers: bool = True,
    shardings: tuple[Any, ...] | None = None,
) -> tuple[Any, list[br.Interval | None], list[bool]]:
    """The inverse of a `jit` body as a `jax.jit` of (outvals, traced knowns),
    the list its first trace fills with the solved operands' branch
    intervals (see `_branches.py`), and the one it fills with
    `Solution.unique_choices`.

    `mask` marks the unknown operands; `baked` holds the concrete known ones
    (see `_split_known`). Such an inverse is specific to those values and is
    not cached; it is traced once per signature anyway, since `inverse`
    caches its whole Jaxpr. `shardings` (one per unknown operand, `None`
    where unspecified) are the solved operands' `out_shardings`: those the
    forward `jit` gave its operands as `in_shardings`.
    """
    # JAX caches the trace per function: one function per (mask, ildj wanted,
    # branch intervals of the results). Tracing fills `branches_in`.
    per_body = _jit_cache.get(closed)
    if per_body is None:
        per_body = _jit_cache.put(closed, {})
    key = (mask, wanted, solvers, out_branches, shardings)
    got = None if baked else per_body.get(key)
    if got is not None:
        return got
    body_ref = weakref.ref(closed)
    branches_in: list[br.Interval | None] = []
    unique_in: list[bool] = []

    def inverse_body(outvals: list[Any], known: list[Any]) -> tuple[list[Any], Any]:
        body = body_ref()
        assert body is not None, "the jit body outlived its inverse"
        invals = _merge_known(mask, baked, known)
        solved, ildj, branches = _invert_closed(
            body,
            invals,
            outvals,
            out_branches,
            want_ildj=wanted,
            solvers=solvers,
            unique_out=unique_in,
        )
        branches_in[:] = branches
        dtype = _ildj_dtype(outvals)
        xs = [s for s, unknown in zip(solved, mask, strict=True) if unknown]
        if shardings is not None:
            xs = [
                x if s is None else compat.place_as(x, s)
                for x, s in zip(xs, shardings, strict=True)
            ]
        return xs, jnp.asarray(ildj).astype(dtype)

    inverse_body.__name__ = inverse_body.__qualname__ = f"inverse_{name}"
    # The ildj's sharding is left to JAX (`None`).
    options: dict[str, Any] = {}
    if shardings is not None:
        options["out_shardings"] = (list(shardings), None)
    got = (jax.jit(inverse_body, **options), branches_in, unique_in)
    if not baked:
        per_body[key] = got
    return got


def _solved_shardings(
    p: compat.JitParams, mask: Sequence[bool]
) -> tuple[Any, ...] | None:
    """The `in_shardings` the forward `jit` gives its unknown operands (`None`
    where unspecified), or `None` when it specifies none of them."""
    if len(p.in_shardings) != len(mask):
        return None
    shardings = tuple(
        s if isinstance(s, jax.sharding.Sharding) else None
        for s, unknown in zip(p.in_shardings, mask, strict=True)
        if unknown
    )
    return shardings if any(s is not None for s in shardings) else None


@inverse_rules.register(compat.jit_p)
def _jit_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    p = compat.jit_params(params)
    from ._custom import custom_inverse_rule

    custom = custom_inverse_rule(p.name)
    if custom is not None:
        if any(b is not None for b in ctx.result_branches):
            raise NotInvertibleError(
                f"the `custom_inverse` of `{p.name}` would be applied to a value "
                "chosen on the principal branch of a map that is not injective, "
                "which it may not accept"
            )
        res = custom(outvals, invals, p)
        if res is not None:
            return res
    if any(o is None for o in outvals):
        return None
    mask = tuple(v is None for v in invals)
    baked, known = _split_known(invals)
    out_branches = tuple(ctx.result_branches)
    fn, branches, unique = _jitted_inverse(
        p.jaxpr,
        mask,
        p.name,
        baked,
        out_branches,
        ctx.want_ildj,
        ctx.solvers,
        _solved_shardings(p, mask),
    )
    try:
        xs, ildj = fn(list(outvals), known)
    except NotInvertibleError as err:
        raise _with_context(f"`jit` of `{p.name}`", err) from None
    it = iter(xs)
    solved = [next(it) if v is None else v for v in invals]
    return solved, ildj, list(branches) or None, unique == [True]


# ---------------------------------------------------------------------------
# cond with a known index: a cond over the inverted branches.


@inverse_rules.register(compat.cond_p)
def _cond_inverse(
    ctx: InverseContext, outvals: Sequence[Any], index: Any, *ops: Any, **params: Any
) -> Any:
    if index is None:
        raise NotInvertibleError(
            "the branch index of a `cond` depends on an unknown input (such "
            "a `cond` is unfolded into a piecewise map, unless its branches "
            "have effects other than debug prints: every branch would run)"
        )
    if any(o is None for o in outvals):
        return None
    branches = compat.cond_branches(params)
    mask = [v is None for v in ops]
    baked, known = _split_known(ops)
    dtype = _ildj_dtype(outvals)
    out_branches = ctx.result_branches
    # Per operand, the union over the branches of the solved value's interval.
    op_branches: list[br.Interval | None] = [None] * len(ops)

    def branch_inverse(closed: compat.ClosedJaxpr) -> Callable[..., Any]:
        def inv(outs: list[Any], known_ops: list[Any]) -> tuple[list[Any], Any]:
            invals = _merge_known(mask, baked, known_ops)
            solved, ildj, got = _invert_closed(
                closed,
                invals,
                outs,
                out_branches,
                want_ildj=ctx.want_ildj,
                solvers=ctx.solvers,
            )
            for k, b in enumerate(got):
                op_branches[k] = br.union(op_branches[k], b)
            xs = [s for s, m in zip(solved, mask, strict=True) if m]
            return xs, jnp.asarray(ildj).astype(dtype)

        return inv

    try:
        xs, ildj = lax.switch(
            index, [branch_inverse(b) for b in branches], list(outvals), known
        )
    except NotInvertibleError as err:
        raise _with_context("a branch of a `cond`", err) from None
    it = iter(xs)
    return (
        [index, *[next(it) if v is None else v for v in ops]],
        ildj,
        [None, *op_branches],
    )


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
    final_ok: Any = None
    for got, want in zip(kc_last, known_final, strict=True):
        if want is not None:
            agrees = agree_solved(got, want)
            final_ok = agrees if final_ok is None else final_ok & agrees

    # 2. The inverse: run the other way, solving each step.
    def inverse_step_with(
        given: Sequence[br.Interval | None],
        step_branches: list[br.Interval | None],
        step_unique: list[bool],
    ) -> Callable[..., Any]:
        # The intervals of the unknown carries given by the step after
        # (`_carry_branches`); the known ones are not given.
        out_branches = [
            None if k else b for b, k in zip(given, c_known, strict=True)
        ] + [None] * len(ys)

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
                out_branches=out_branches,
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
        [_largest(v) for v in (*final, *ys) if v is not None],
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

    def full(kc: list[Any]) -> list[Any]:
        it = iter(kc)
        return [next(it) if k else None for k in c_known]

    # 1. Count the steps (and get the known carries' final values).
    def count_cond(state: tuple[Any, list[Any]]) -> Any:
        _, kc = state
        sol = _walker.solve(
            cond, cond_jconsts, [*cond_consts, *full(kc)], [None], strict=False
        )
        return sol.outvals[0]

    def count_body(state: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
        steps, kc = state
        sol = _walker.solve(
            body,
            body_jconsts,
            [*body_consts, *full(kc)],
            [None] * n_carry,
            strict=False,
        )
        return steps + 1, [o for o, k in zip(sol.outvals, c_known, strict=True) if k]

    init_known = [c for c, k in zip(init, c_known, strict=True) if k]
    steps, kc_final = lax.while_loop(
        count_cond, count_body, (jnp.zeros((), jnp.int32), init_known)
    )

    # 2. Undo the body `steps` times, solving every carry from the next one.
    kc_it = iter(kc_final)
    last = [next(kc_it) if k else o for o, k in zip(outvals, c_known, strict=True)]
    # The known carries' final values are results too: `y` must hold them.
    final_ok: Any = None
    for got, want, k in zip(last, outvals, c_known, strict=True):
        if k and want is not None:
            agrees = agree_solved(got, want)
            final_ok = agrees if final_ok is None else final_ok & agrees

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
