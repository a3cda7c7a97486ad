"""Inverse rules for higher-order primitives: jit, calls, custom derivatives
and cond (loops: `_loops.py`).

Each rule inverts the sub-Jaxpr with the same dataflow engine and rebuilds the
construct around the inverse: the inverse of a `jit` is a `jit`, of a `cond` a
`cond` over the inverted branches.
"""

from __future__ import annotations

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
from ._rules import InverseContext, inverse_rules

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


def _with_context(what: str, err: NotInvertibleError) -> NotInvertibleError:
    detail = getattr(err, "detail", None) or str(err)
    return NotInvertibleError(f"inside {what}: {detail}")


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
