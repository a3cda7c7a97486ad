"""How the forward walker reaches inside higher-order primitives.

Each handler interprets the sub-Jaxprs with the calling interpreter and
rebuilds the same construct through JAX's public API (`jax.jit`,
`lax.switch`, `lax.scan`, `lax.while_loop`, `jax.checkpoint`,
`jax.shard_map`, `jax.pmap`), or swaps the body of a custom-derivative call
while keeping its derivative rule. Params are read through `_jax_compat` only.
Control flow and mapped bodies (`cond`, `scan`, `while`, `shard_map`,
`xla_pmap`) cannot be inlined: the `inline` policy treats them as
`recursive`.
"""

from __future__ import annotations

import itertools as it
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax

from . import _jax_compat as compat
from ._custom_types import has_custom, is_plain
from ._eager import jit_callable
from ._errors import CustomValueError, MissingRuleError, eqn_context, source_line
from ._interpreter import Interpreter, builtin_handler
from ._trace import spec_of


def _closed_fn(
    interp: Interpreter, closed: compat.ClosedJaxpr
) -> Callable[..., list[Any]]:
    """A stable function that walks `closed` with `interp` (for JAX's caches)."""

    def build() -> Callable[..., list[Any]]:
        def walk(*args: Any) -> list[Any]:
            return interp.eval_closed(closed, *args)

        return walk

    return interp.cached(("closed_fn", id(closed)), closed, build)


# --------------------------------------------------------------------------
# Interpreters whose values are their own pytrees (dual numbers, intervals):
# JAX's constructs take pytrees, but a loop carry or a branch output may be a
# plain array on one side and such a value on the other, and a custom
# derivative call cannot re-bind them.


def _describe(value: Any) -> str:
    if is_plain(value):
        return f"plain array {compat.aval_of(value).str_short(short_dtypes=True)}"
    return f"`{type(value).__name__}`"


def _lift_to(
    interp: Interpreter, eqn: compat.JaxprEqn, where: str, value: Any, like: Any
) -> Any:
    """`value` with the pytree type of `like`, lifting a plain array with
    `interp.lift`; a clear `TypeError` naming the construct otherwise."""
    tree: Callable[[Any], Any] = jax.tree_util.tree_structure
    if tree(value) == tree(like):
        return value
    at = f"{eqn_context(interp.name, eqn)}: {where} of `{eqn.primitive.name}`"
    if type(value) is type(like):
        # One class, different static fields (a unit, a tag...).
        raise CustomValueError(
            f"{at} has the pytree structure {tree(value)} where the construct "
            f"needs {tree(like)}: both sides of a construct must agree on the "
            "static fields of a value."
        )
    context = (
        f"{at} is a {_describe(value)} where the construct needs a {_describe(like)}"
    )
    if not is_plain(value):
        raise CustomValueError(f"{context}; only a plain array can be lifted.")
    try:
        return interp.lift(value, like)
    except TypeError as err:
        raise CustomValueError(
            f"{context}.\n\nDefine `lift(self, value, like)` on the interpreter to "
            f"turn a plain array into its value type ({err})."
        ) from err


def _settle_carry(
    interp: Interpreter,
    eqn: compat.JaxprEqn,
    init: list[Any],
    carry_out: Callable[[list[Any]], Sequence[Any]],
) -> list[Any]:
    """Lift the plain initial carries that the body turns into the
    interpreter's values, until the types reach a fixpoint (as JAX's `jvp`
    of a loop does for tangents). `carry_out(init)` gives the body's output
    carries, abstractly."""
    init = list(init)
    for _ in range(len(init) + 1):
        changed = False
        for k, (c, o) in enumerate(zip(init, carry_out(init), strict=True)):
            if is_plain(c) and not is_plain(o):
                init[k] = _lift_to(interp, eqn, f"carry {k}", c, o)
                changed = True
        if not changed:
            break
    return init


def _as_carry_types(
    interp: Interpreter, eqn: compat.JaxprEqn, new: list[Any], carry: Sequence[Any]
) -> list[Any]:
    """A loop body's output carries, lifted back to the input carries' types
    where the body made them plain."""
    return [
        _lift_to(interp, eqn, f"carry {k}", o, c)
        for k, (o, c) in enumerate(zip(new, carry, strict=True))
    ]


def _slice_spec(x: Any) -> Any:
    """The abstract per-iteration slice of a scanned operand (a pytree)."""
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), x
    )


@builtin_handler(compat.jit_p)
def _jit(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    p = compat.jit_params(eqn.params)
    if policy == "inline":
        return interp.eval_closed(p.jaxpr, *invals)
    return list(jit_callable(interp, p)(*invals))


@builtin_handler(compat.cond_p)
def _cond(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    index, *ops = invals
    branches = [_closed_fn(interp, br) for br in compat.cond_branches(eqn.params)]
    if not is_plain(index):
        return _cond_on_custom_index(interp, eqn, branches, index, ops)
    if has_custom(ops):
        branches = _joined_branches(interp, eqn, branches, ops)
    return list(lax.switch(index, branches, *ops))


def _cond_on_custom_index(
    interp: Interpreter,
    eqn: compat.JaxprEqn,
    branches: list[Any],
    index: Any,
    ops: list[Any],
) -> list[Any]:
    """A `cond` whose index is the interpreter's own value (an interval of
    indices, a tagged index): every branch runs, and `select_n` equations
    walked by the interpreter pick among their results, as JAX's `vmap` of a
    `cond` with a batched predicate does."""
    if eqn.effects:
        raise CustomValueError(
            f"{eqn_context(interp.name, eqn)}: the index of "
            f"`{eqn.primitive.name}` is a {_describe(index)} and its "
            "branches have effects: every branch would run, so the walker "
            "refuses. Compute the index from plain values."
        )
    outs = [br(*ops) for br in branches]
    in_avals = (eqn.invars[0].aval, *(v.aval for v in eqn.outvars))

    def build() -> Any:
        n = len(branches)

        def select(i: Any, *cases: Any) -> list[Any]:
            return [lax.select_n(i, *cases[k : k + n]) for k in range(0, len(cases), n)]

        index_spec, *out_specs = map(spec_of, in_avals)
        return jax.make_jaxpr(select)(
            index_spec, *[s for s in out_specs for _ in range(n)]
        )

    selects = interp.cached(("cond_select", len(branches), in_avals), None, build)
    cases = [out[k] for k in range(len(eqn.outvars)) for out in outs]
    return interp.eval_closed(selects, index, *cases)


def _joined_branches(
    interp: Interpreter, eqn: compat.JaxprEqn, branches: list[Any], ops: list[Any]
) -> list[Any]:
    """Branches whose plain outputs are lifted where another branch returns
    the interpreter's own value at the same position."""
    outs = [jax.eval_shape(br, *ops) for br in branches]
    target: list[Any] = [None] * len(outs[0])
    for out in outs:
        for k, o in enumerate(out):
            if target[k] is None and not is_plain(o):
                target[k] = o
    if all(t is None for t in target):
        return branches

    def joined(i: int, br: Any) -> Callable[..., list[Any]]:
        def run(*args: Any) -> list[Any]:
            return [
                o
                if t is None
                else _lift_to(interp, eqn, f"output {k} of branch {i}", o, t)
                for k, (o, t) in enumerate(zip(br(*args), target, strict=True))
            ]

        return run

    return [joined(i, br) for i, br in enumerate(branches)]


@builtin_handler(compat.scan_p)
def _scan(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    p = compat.scan_params(eqn.params)
    n_consts, n_carry = p.num_consts, p.num_carry
    consts = invals[:n_consts]
    init = list(invals[n_consts : n_consts + n_carry])
    xs = list(invals[n_consts + n_carry :])
    walk = _closed_fn(interp, p.jaxpr)
    custom = has_custom(invals)

    def body(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = walk(*consts, *carry, *x)
        new = outs[:n_carry]
        if custom:
            new = _as_carry_types(interp, eqn, new, carry)
        return new, outs[n_carry:]

    if custom:
        x_specs = [_slice_spec(x) for x in xs]
        init = _settle_carry(
            interp,
            eqn,
            init,
            lambda c: jax.eval_shape(lambda c, x: walk(*consts, *c, *x), c, x_specs)[
                :n_carry
            ],
        )

    # A classic `scan` stays one under `jax_scan3` (whose `Scan3` ignores
    # `reverse` in JAX 0.12.0.1).
    with compat.classic_scan():
        carry, ys = lax.scan(
            body, init, xs, length=p.length, reverse=p.reverse, unroll=p.unroll
        )
    return [*carry, *ys]


@builtin_handler(compat.while_p)
def _while(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    p = compat.while_params(eqn.params)
    cond_consts = invals[: p.cond_nconsts]
    body_consts = invals[p.cond_nconsts : p.cond_nconsts + p.body_nconsts]
    init = list(invals[p.cond_nconsts + p.body_nconsts :])
    cond_walk = _closed_fn(interp, p.cond_jaxpr)
    body_walk = _closed_fn(interp, p.body_jaxpr)
    custom = has_custom(invals)

    def cond_fun(carry: Any) -> Any:
        pred = cond_walk(*cond_consts, *carry)[0]
        if custom and not is_plain(pred):
            raise CustomValueError(
                f"{eqn_context(interp.name, eqn)}: the condition of `while` is "
                f"a {_describe(pred)}, not a plain "
                "boolean: the number of iterations cannot depend on the "
                "interpreter's own values. Keep the condition on plain values "
                "(a counter), or make the interpreter's rules give a plain "
                "boolean for it."
            )
        return pred

    def body_fun(carry: Any) -> Any:
        new = body_walk(*body_consts, *carry)
        return _as_carry_types(interp, eqn, new, carry) if custom else new

    if custom:
        init = _settle_carry(
            interp,
            eqn,
            init,
            lambda c: jax.eval_shape(lambda c: body_walk(*body_consts, *c), c),
        )
    return list(lax.while_loop(cond_fun, body_fun, init))


@builtin_handler(compat.remat_p)
def _checkpoint(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    p = compat.remat_params(eqn.params)
    if policy == "inline":
        return interp.eval_closed(p.jaxpr, *invals)

    def build() -> Callable[..., Any]:
        def body(*args: Any) -> list[Any]:
            return interp.eval_closed(p.jaxpr, *args)

        return jax.checkpoint(body, prevent_cse=p.prevent_cse, policy=p.policy)

    key = ("checkpoint", id(p.jaxpr), p.prevent_cse, id(p.policy))
    return list(interp.cached(key, p.jaxpr, build)(*invals))


def _retrace(
    interp: Interpreter, closed: compat.ClosedJaxpr, invals: list[Any], name: str = ""
) -> Any:
    """Trace `interp` walking `closed` into a new `ClosedJaxpr` for these avals.

    `name` (the wrapped function's name) is kept in the new Jaxpr's debug
    info, where JAX reads the `name` of a custom-derivative call and
    `inverse` looks up named inverses.
    """
    return _retrace_avals(interp, closed, tuple(map(compat.aval_of, invals)), name)


def _retrace_avals(
    interp: Interpreter,
    closed: compat.ClosedJaxpr,
    avals: tuple[Any, ...],
    name: str = "",
) -> Any:
    """`_retrace` for given input avals."""

    def build() -> Any:
        walk = _closed_fn(interp, closed)

        def named(*args: Any) -> list[Any]:
            return walk(*args)

        named.__name__ = named.__qualname__ = name or "walk"
        return jax.make_jaxpr(named)(*[spec_of(a) for a in avals])

    key = ("retrace", id(closed), avals)
    new = interp.cached(key, closed, build)
    if any(compat.is_tracer(c) for c in compat.jaxpr_consts(new)):
        # The interpreter captured a value of an enclosing trace: only valid
        # now, so do not keep it.
        interp.forget(key)
    return new


def _custom_call(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    """`custom_jvp_call` / `custom_vjp_call`: swap the primal body, keep the rules.

    The custom derivative rule still describes the original function. That is
    exact when the interpreter does not change values; when it does, use the
    `inline` policy so JAX differentiates the transformed body instead.
    """
    body = compat.call_jaxpr(eqn.params)
    if policy == "inline":
        return interp.eval_closed(body, *invals)
    if has_custom(invals):
        # The interpreter's own values cannot be bound to the primitive: the
        # interpreter's choice, or the primal body without the rule.
        kind = (
            "custom_jvp" if eqn.primitive is compat.custom_jvp_call_p else "custom_vjp"
        )
        outs = interp.custom_derivative(eqn, invals, kind)
        if outs is not None:
            return list(outs)
        return interp.eval_closed(body, *invals)
    new = _retrace(interp, body, invals, compat.call_name(eqn.params))
    params = compat.replace_call_jaxpr(eqn.params, new)
    return compat.bind_eqn(eqn.primitive, invals, params)


builtin_handler(compat.custom_jvp_call_p)(_custom_call)
builtin_handler(compat.custom_vjp_call_p)(_custom_call)


@builtin_handler(compat.closed_call_p)
def _closed_call(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    body = compat.call_jaxpr(eqn.params)
    if policy == "inline" or has_custom(invals):
        return interp.eval_closed(body, *invals)
    new = _retrace(interp, body, invals, compat.call_name(eqn.params))
    return compat.bind_eqn(
        compat.closed_call_p, invals, compat.replace_call_jaxpr(eqn.params, new)
    )


def _core_call(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    """`core_call` carries an open Jaxpr; it is rebuilt as a `closed_call`."""
    body = compat.call_jaxpr(eqn.params)
    if policy == "inline" or has_custom(invals):
        return interp.eval_closed(body, *invals)
    new = _retrace(interp, body, invals)
    return compat.bind_eqn(compat.closed_call_p, invals, {"call_jaxpr": new})


if compat.core_call_p is not None:  # a separate primitive before JAX 0.12
    builtin_handler(compat.core_call_p)(_core_call)


@builtin_handler(compat.shard_map_p)
def _shard_map(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    p = compat.shard_map_params(eqn.params)

    def body(*args: Any) -> tuple[Any, ...]:
        return tuple(interp.eval_closed(p.jaxpr, *args))

    return list(compat.shard_map(body, p)(*invals))


@builtin_handler(compat.pmap_p)
def _pmap(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    """`xla_pmap`, what `jax.pmap` stages before JAX 0.10 (later releases
    stage a `jit` of a `shard_map`): the per-device body is walked and
    rebuilt as a `jax.pmap` with the same axis name and size, devices,
    backend, mapped axes, donations and name. A mapped body cannot be
    inlined: `inline` treats it as `recursive`."""
    p = compat.pmap_params(eqn.params)

    def build() -> Callable[..., Any]:
        def body(*args: Any) -> tuple[Any, ...]:
            return tuple(interp.eval_closed(p.jaxpr, *args))

        body.__name__ = body.__qualname__ = p.name
        donate = tuple(i for i, d in enumerate(p.donated) if d)
        return compat.pmap(body, p, p.in_axes, p.out_axes, donate_argnums=donate)

    key = ("pmap", id(p.jaxpr), *p[1:])
    return list(interp.cached(key, p.jaxpr, build)(*invals))


@builtin_handler(compat.linear_solve_p)
def _linear_solve(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    """`custom_linear_solve` (`jnp.linalg.solve`, `lax.custom_linear_solve`).

    Its value is its `solve` Jaxpr applied to the right-hand sides; the other
    Jaxprs define its derivatives and transpose. `recursive` walks every one
    of them and re-binds the primitive; `inline` walks `solve` in place,
    dropping the custom derivative.
    """
    p = compat.linear_solve_params(eqn.params)
    starts = [sum(p.const_lengths[:i]) for i in range(len(p.roles))]
    rhs = invals[sum(p.const_lengths) :]
    if policy == "inline":
        k = p.roles.index("solve")
        consts = invals[starts[k] : starts[k] + p.const_lengths[k]]
        return interp.eval_closed(p.jaxprs[k], *consts, *rhs)
    new: list[Any] = []
    for start, n, closed in zip(starts, p.const_lengths, p.jaxprs, strict=True):
        if closed is None:
            new.append(None)
            continue
        in_avals = [v.aval for v in compat.open_jaxpr(closed).invars]
        consts_avals = tuple(compat.aval_of(c) for c in invals[start : start + n])
        new.append(_retrace_avals(interp, closed, consts_avals + tuple(in_avals[n:])))
    params = compat.replace_linear_solve_jaxprs(eqn.params, new)
    return compat.bind_eqn(eqn.primitive, invals, params)


# --------------------------------------------------------------------------
# JAX's hijax primitives (JAX >= 0.11, opt-in flags `jax_custom_jvp3`,
# `jax_custom_vjp3`, `jax_remat3`, `jax_scan3`): one `call_hi_primitive`
# equation whose body and rules live in a primitive object, read through
# `compat.hijax_params`.


def _body_avals(body: Any) -> tuple[Any, ...]:
    return tuple(v.aval for v in compat.open_jaxpr(body).invars)


def _retrace_traced(interp: Interpreter, h: compat.HijaxParams) -> Any:
    """The `custom_jvp`/`custom_vjp` body walked by `interp`, as a new `Traced`
    with the same signature and name as the old one."""
    traced = h.prim.traced

    def build() -> Any:
        walk = _closed_fn(interp, h.body)
        in_tree, out_tree = compat.traced_in_tree(traced), traced.out_tree

        def body(*args: Any, **kwargs: Any) -> Any:
            flat = in_tree.flatten_up_to((args, kwargs))
            return jax.tree_util.tree_unflatten(out_tree, walk(*flat))

        body.__name__ = body.__qualname__ = traced.fun_name
        specs = [spec_of(a) for a in _body_avals(h.body)]
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, specs)
        return jax.jit(body).trace(*args, **kwargs)

    return interp.cached(("hi_traced", id(traced)), traced, build)


def _rebuilt_hi(
    interp: Interpreter, h: compat.HijaxParams, invals: list[Any]
) -> list[Any]:
    """Bind a hijax primitive like `h.prim` whose body `interp` walks."""
    if h.kind in ("custom_jvp", "custom_vjp"):
        prim = compat.rebuild_hi_primitive(h, _retrace_traced(interp, h))
        return compat.bind_hi_primitive(prim, invals)
    # `checkpoint` and `scan`: a Jaxpr body on (per-iteration) operands.
    new = _retrace_avals(interp, h.body, _body_avals(h.body), h.kind)
    jaxpr, consts = compat.hoist_consts(new)
    prim = compat.rebuild_hi_primitive(h, jaxpr, len(consts))
    return compat.bind_hi_primitive(prim, [*consts, *invals])


def _scan3_as_scan(
    interp: Interpreter, eqn: compat.JaxprEqn, h: compat.HijaxParams, invals: list[Any]
) -> list[Any]:
    """A hijax `Scan3` rebuilt as the classic `scan` it replaces.

    Used while JAX cannot differentiate or batch `Scan3`
    (`compat.hi_transformable`), so that an interpreted program keeps
    composing with `jax.grad` and `jax.vmap`. The loop carries the values of
    the carry references; each iteration puts them in fresh references, which
    the walked body reads and writes as the original body did, and the final
    values are written back to the caller's references.
    """
    is_ref = [compat.is_ref_aval(compat.aval_of(v)) for v in invals]
    if any(r and ext for r, ext in zip(is_ref, h.extensives, strict=True)):
        return _rebuilt_hi(interp, h, invals)  # a reference sliced per iteration
    refs = [v for v, r in zip(invals, is_ref, strict=True) if r]
    xs = [
        v
        for v, r, ext in zip(invals, is_ref, h.extensives, strict=True)
        if ext and not r
    ]
    walk = _closed_fn(interp, h.body)

    def step(carry: list[Any], x_t: list[Any]) -> tuple[list[Any], list[Any]]:
        local = [jax.new_ref(c) for c in carry]
        c_it, x_it = iter(local), iter(x_t)
        args = [
            next(c_it) if r else (next(x_it) if ext else v)
            for v, r, ext in zip(invals, is_ref, h.extensives, strict=True)
        ]
        ys = walk(*args)
        return [jax.freeze(ref) for ref in local], ys

    reverse = bool(h.prim.reverse) and compat.SCAN3_HONOURS_REVERSE
    with compat.classic_scan():
        final, ys = lax.scan(
            step, [ref[...] for ref in refs], xs, length=h.length, reverse=reverse
        )
    for ref, value in zip(refs, final, strict=True):
        ref[...] = value
    return list(ys)


def _expanded_hi(
    interp: Interpreter, eqn: compat.JaxprEqn, h: compat.HijaxParams, invals: list[Any]
) -> list[Any]:
    """A user-defined hijax primitive, walked through its `expand` in place."""

    def build() -> Any:
        try:
            return compat.expand_hi_primitive(h.prim)
        except (NotImplementedError, TypeError) as err:
            raise MissingRuleError(
                f"`{interp.name}` cannot reach inside hijax primitive "
                f"`{h.name}` (`call_hi_primitive`), used at {source_line(eqn)}: "
                f"tracing its `expand` failed with {type(err).__name__}: {err}\n\n"
                "To re-bind it unchanged (the interpreter then does not see its "
                f"body), pass `policies={{{h.name!r}: 'opaque'}}` to the "
                "interpreter; or give the interpreter a rule for "
                "`call_hi_primitive` in `rules`."
            ) from err

    expanded = interp.cached(("hi_expand", id(h.prim)), h.prim, build)
    return interp.eval_closed(expanded, *invals)


_CUSTOM_KINDS = ("custom_jvp", "custom_vjp")


@builtin_handler(compat.call_hi_primitive_p, rebind_when_identity=False)
def _call_hi(
    interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], policy: str
) -> list[Any]:
    """`call_hi_primitive`: `custom_jvp`, `custom_vjp`, `checkpoint` and `scan`
    under JAX's hijax flags, and users' own hijax primitives.

    `recursive` rebuilds the same hijax primitive around the walked body,
    keeping its derivative rules (for `custom_jvp`/`custom_vjp` they still
    describe the original function, as for `custom_jvp_call`); `inline` walks
    the body in place (a `scan` stays a loop); a user-defined hijax primitive
    is walked through its `expand` under both. A `Scan3` that JAX cannot
    differentiate or batch is rebuilt as a classic `scan` (`_scan3_as_scan`).
    """
    h = compat.hijax_params(eqn)
    if h.kind == "other":
        return _expanded_hi(interp, eqn, h, invals)
    if has_custom(invals) and policy != "inline" and h.kind in _CUSTOM_KINDS:
        outs = interp.custom_derivative(eqn, invals, h.kind)
        if outs is not None:
            return list(outs)
    if (policy == "inline" or has_custom(invals)) and h.kind != "scan":
        # (An interpreter's own values cannot be bound to a hijax primitive:
        # its body is walked in place for them, as for `custom_jvp_call`.)
        kept = invals if h.keep is None else list(it.compress(invals, h.keep))
        return interp.eval_closed(h.body, *kept)
    if h.kind == "scan" and not compat.hi_transformable(h.prim):
        return _scan3_as_scan(interp, eqn, h, invals)
    return _rebuilt_hi(interp, h, invals)
