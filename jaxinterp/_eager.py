"""The eager fast path: walking concrete arrays with compiled calls.

An interpreter that keeps the default `process_eqn` and `default_rule` and
walks concrete arrays outside any JAX trace does not need to visit each
equation in Python: every equation without a rule of the interpreter's runs
as a cached compiled call (`jax.jit` of the primitive alone, or of a few
movers fused into the elementwise equation that consumes them), with the same
results as re-binding it. This module is all of that path: the plans
(`EagerPlan`), the compiled callables, and the walk that runs a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import jax
from jax import lax

from . import _caches, _jax_compat as compat
from ._env import last_uses
from ._registry import is_builtin


class Interpreter(Protocol):
    """What the eager path reads of an `Interpreter` (which calls into this
    module, so it is described here rather than imported)."""

    cache_subcalls: ClassVar[bool]
    higher_order: Any
    _default_eqns: ClassVar[bool]
    _eager_plans: Any

    @classmethod
    def dispatch_table(cls) -> Mapping[Any, Any]: ...

    def policy(self, prim: Any) -> str: ...

    def rebinds(self) -> bool: ...

    def process_in_context(self, eqn: Any, invals: list[Any]) -> list[Any]: ...

    def eval_closed(self, closed_jaxpr: Any, *args: Any) -> list[Any]: ...

    def cached(self, key: Any, anchor: Any, build: Callable[[], Any]) -> Any: ...


_Literal = compat.Literal
_DropVar = compat.DropVar

# --------------------------------------------------------------------------
# Compiled callables, shared by every interpreter.

_eager_cache = _caches.Cache(4096)


def eager_callable(prim: Any, params: dict[str, Any]) -> Any:
    """A cached compiled call applying `prim` with `params` alone, or `None`.

    It calls JAX's own single-primitive `jax.jit`, the one eager `bind`
    calls (`compat.primitive_callable`), so the bits are the same and a
    primitive the program already ran eagerly is not compiled again; but it
    is reached by JAX's C++ dispatch path instead of the Python one. The
    call returns a list. `None` for primitives with their own Python `impl`
    (which may have no lowering), unhashable params, and primitives carrying
    sub-Jaxprs. Only call the result on concrete operands outside any trace
    (see `compat.is_eager`): under a trace it would stage a `jit` equation.
    """
    try:
        key = (prim, tuple(params.items()))
        fn = _eager_cache.get(key)
    except TypeError:  # unhashable params
        return None
    if fn is not None:
        return fn
    if any(True for _ in compat.jaxprs_in_params(params)):
        return None
    fn = compat.primitive_callable(prim, params)
    if fn is None:
        return None
    return _eager_cache.put(key, fn)


def eager_chain(program: Sequence[tuple[Any, dict[str, Any], Any]]) -> Any:
    """A cached `jax.jit` binding several primitives in turn, or `None`.

    `program` lists `(prim, params, refs)`; `refs` says where each operand
    comes from: `(0, k)` the `k`-th argument, `(1, m)` the result of entry
    `m`; `None` means the arguments in order. Every entry but the last has a
    single result; the function returns the last entry's results as a list.
    `None` under the same conditions as `eager_callable`, for any entry.
    """
    try:
        key = tuple(
            (prim, tuple(params.items()), refs) for prim, params, refs in program
        )
        fn = _eager_cache.get(key)
    except TypeError:  # unhashable params
        return None
    if fn is None:
        for prim, params, _ in program:
            if not compat.dispatches_by_compiling(prim) or any(
                True for _ in compat.jaxprs_in_params(params)
            ):
                return None

        def apply(*args: Any) -> list[Any]:
            results: list[Any] = []
            outs: list[Any] = []
            for prim, params, refs in program:
                operands = (
                    args
                    if refs is None
                    else [args[k] if src == 0 else results[k] for src, k in refs]
                )
                outs = compat.bind_eqn(prim, operands, params)
                results.append(outs[0] if len(outs) == 1 else None)
            return outs

        apply.__name__ = apply.__qualname__ = "_".join(p.name for p, _, _ in program)
        fn = _eager_cache.put(key, jax.jit(apply))
    return fn


def eager_primitive(
    prim: Any, params: dict[str, Any], invals: Sequence[Any]
) -> list[Any] | None:
    """Apply `prim` to concrete operands through `eager_callable`, or return `None`.

    `None` (the caller then binds) outside the eval trace, when an operand is
    a tracer or not an array or scalar, or when `eager_callable` has nothing.
    """
    if not compat.dispatches_by_compiling(prim) or not compat.is_eager():
        return None
    if not compat.all_concrete(invals):
        return None
    fn = eager_callable(prim, params)
    return None if fn is None else fn(*invals)


def device_literal(literal: Any) -> Any:
    """The value of a `Literal` as a device array of the same type, if possible.

    JAX's C++ dispatch takes device arrays faster than NumPy scalars. The
    literal's own value is returned when the array's type (dtype, weak type)
    would differ from the literal's.
    """
    value = literal.val
    try:
        put = jax.device_put(value)
    except Exception:  # an unusual literal: keep it as it is
        return value
    return put if jax.typeof(put) == literal.aval else value


# --------------------------------------------------------------------------
# Plans.


class _Put:
    """A literal operand already on the device, for the eager fast path."""

    __slots__ = ("val",)

    def __init__(self, val: Any) -> None:
        self.val = val


class _Step(NamedTuple):
    """One compiled call of the eager fast path.

    `fn(*operands)` computes the results of the equation at this position of
    the plan; `inputs` are the Jaxpr variables (or `_Put` literals) giving the
    operands. `absorbed` lists earlier equations compiled into `fn` as well
    (broadcasts and reshapes feeding an elementwise equation), in order.
    """

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    absorbed: tuple[Any, ...] = ()


# Marks an equation compiled into a later step of the plan.
_ABSORBED = _Step(fn=lambda *args: None, inputs=())

# Equations that only move or replicate values, and elementwise equations that
# compute each output element with one correctly rounded operation. Compiling a
# mover together with the elementwise equation consuming it (as `jnp` does for
# `x + b` with a broadcast `b`) cannot change a bit of the result, and saves a
# dispatch. Division is left out: XLA rewrites `a / broadcast(b)` as
# `a * broadcast(1 / b)`.
_MOVERS = frozenset(
    {lax.broadcast_in_dim_p, lax.reshape_p, lax.squeeze_p, lax.transpose_p}
)
_ELEMENTWISE = frozenset(
    {
        lax.add_p,
        lax.sub_p,
        lax.mul_p,
        lax.max_p,
        lax.min_p,
        lax.and_p,
        lax.or_p,
        lax.xor_p,
        lax.eq_p,
        lax.ne_p,
        lax.lt_p,
        lax.le_p,
        lax.gt_p,
        lax.ge_p,
        lax.select_n_p,
    }
)


class EagerPlan:
    """How to run each equation of one Jaxpr eagerly, for one interpreter.

    Each equation gets a `_Step` computing it with one compiled call,
    `_ABSORBED` if a later step computes it, or `None` if it goes through
    `process_eqn`: equations with effects, a context other than the ambient
    one, a handler of the interpreter's (other than the built-in `jit`), or a
    primitive with its own Python implementation. `program` is what a walk
    runs; `seed` holds the literal operands. A plan is valid while the
    interpreter's dispatch table (`table`), its policy and the ambient
    context are those it was built for.

    A first plan (`fused=False`) compiles nothing of its own: it binds each
    primitive in its equation's context, as `jax.core.eval_jaxpr` does, so
    it reuses the single-primitive executables that the program's own eager
    calls compiled (JAX 0.7 to 0.10 key them by that context and by the
    thread's `disable_jit`, so calling them from elsewhere compiles them
    again) and a first call costs about what `jax.core.eval_jaxpr` costs.
    From the second walk, steps call those executables directly and movers
    are fused into their consumers (new executables, compiled once).
    """

    __slots__ = ("context", "fused", "policy", "program", "seed", "straight", "table")

    def __init__(
        self, interp: Interpreter, jaxpr: compat.Jaxpr, context: Any, *, fused: bool
    ) -> None:
        self.context = context
        self.table = type(interp).dispatch_table()
        self.policy = interp.higher_order
        self.fused = fused
        eqns = jaxpr.eqns
        compiled = [self._compiles(interp, eqn, context) for eqn in eqns]
        steps: list[_Step | None] = [
            self._single(interp, eqn, fused) if ok else None
            for eqn, ok in zip(eqns, compiled, strict=True)
        ]
        if fused:
            self._absorb_movers(jaxpr, steps)
        reads = [
            () if step is _ABSORBED else (eqn.invars if step is None else step.inputs)
            for eqn, step in zip(eqns, steps, strict=True)
        ]
        writes = [
            () if step is _ABSORBED else eqn.outvars
            for eqn, step in zip(eqns, steps, strict=True)
        ]
        dead = last_uses(reads, writes, jaxpr.outvars)
        # What the walk runs: (eqn, step, [(result index, var) to write], dead)
        # for every equation not absorbed into a later step.
        self.program = [
            (
                eqn,
                step,
                tuple(
                    (k, v) for k, v in enumerate(eqn.outvars) if type(v) is not _DropVar
                ),
                released,
            )
            for eqn, step, released in zip(eqns, steps, dead, strict=True)
            if step is not _ABSORBED
        ]
        self.seed = {
            v: v.val
            for step in steps
            if step is not None
            for v in step.inputs
            if type(v) is _Put
        }
        # A fused plan whose every equation is a compiled call also runs as
        # one generated function, with no per-equation bookkeeping.
        self.straight = (
            _straight_line(jaxpr, self.program)
            if fused and all(step is not None for _, step, _, _ in self.program)
            else None
        )

    @staticmethod
    def _compiles(interp: Interpreter, eqn: compat.JaxprEqn, context: Any) -> bool:
        """Whether `eqn` may run as a compiled call, outside `process_eqn`.

        Not when it has effects or touches a mutable reference (`free_ref`
        and a hijax `Scan3` change a reference without declaring an effect):
        those run through `process_eqn`, in order.
        """
        if eqn.effects or not compat.same_eqn_context(eqn.ctx, context):
            return False
        if compat.touches_ref(eqn):
            return False
        handler = type(interp).dispatch_table().get(eqn.primitive)
        return handler is None or is_builtin(handler)

    @staticmethod
    def _single(interp: Interpreter, eqn: compat.JaxprEqn, fused: bool) -> _Step | None:
        prim = eqn.primitive
        if prim is compat.jit_p:
            # An interpreter that changes nothing re-binds a `jit` (JAX has
            # compiled it already) until the plan is worth compiling for.
            identity = not fused and interp.rebinds() and not contains_hijax(eqn)
            fn = None if identity else _jit_callable(interp, eqn)
        elif prim in type(interp).dispatch_table():
            fn = None  # a built-in higher-order handler, through `process_eqn`
        elif not fused:
            fn = None  # `bind`, as `jax.core.eval_jaxpr` (see the class docstring)
        else:
            fn = eager_callable(prim, eqn.params)
        if fn is None:
            return None
        return _Step(fn, tuple(_operand(v) for v in eqn.invars))

    @staticmethod
    def _absorb_movers(jaxpr: compat.Jaxpr, steps: list[Any]) -> None:
        """Compile movers into the elementwise equation that alone consumes them."""
        uses: dict[Any, int] = {}
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if type(v) is not _Literal:
                    uses[v] = uses.get(v, 0) + 1
        for v in jaxpr.outvars:
            if type(v) is not _Literal:
                uses[v] = uses.get(v, 0) + 2  # never absorb a Jaxpr output
        movers = {
            eqn.outvars[0]: i
            for i, eqn in enumerate(jaxpr.eqns)
            if eqn.primitive in _MOVERS and steps[i] is not None
        }
        if not movers:
            return
        for j, eqn in enumerate(jaxpr.eqns):
            if eqn.primitive not in _ELEMENTWISE or steps[j] is None:
                continue
            members = sorted(_mover_tree(eqn, jaxpr.eqns, movers, uses))
            if not members:
                continue
            group = [jaxpr.eqns[i] for i in members] + [eqn]
            position = {g.outvars[0]: m for m, g in enumerate(group[:-1])}
            inputs: list[Any] = []
            where: dict[Any, int] = {}
            program = []
            for g in group:
                refs = []
                for v in g.invars:
                    if type(v) is not _Literal and v in position:
                        refs.append((1, position[v]))
                        continue
                    key = id(v) if type(v) is _Literal else v
                    if key not in where:
                        where[key] = len(inputs)
                        inputs.append(_operand(v))
                    refs.append((0, where[key]))
                program.append((g.primitive, g.params, tuple(refs)))
            fn = eager_chain(program)
            if fn is None:
                continue
            steps[j] = _Step(fn, tuple(inputs), tuple(group[:-1]))
            for i in members:
                steps[i] = _ABSORBED


def _mover_tree(
    eqn: compat.JaxprEqn,
    eqns: Sequence[Any],
    movers: dict[Any, int],
    uses: dict[Any, int],
) -> set[int]:
    """Indices of the movers feeding `eqn` (through other movers) used only there."""
    found: set[int] = set()
    stack = [eqn]
    while stack:
        for v in stack.pop().invars:
            if type(v) is _Literal:
                continue
            i = movers.get(v)
            if i is not None and uses.get(v) == 1 and i not in found:
                found.add(i)
                stack.append(eqns[i])
    return found


def _operand(var: Any) -> Any:
    """How a step reads an operand: the variable, or a literal put on the device."""
    return _Put(device_literal(var)) if type(var) is _Literal else var


def _jit_callable(
    interp: Interpreter, eqn: compat.JaxprEqn
) -> Callable[..., Any] | None:
    """Eagerly, a recursive `jit` is a call of its rebuilt, compiled `jax.jit`."""
    if interp.policy(eqn.primitive) != "recursive" or not interp.cache_subcalls:
        return None
    return jit_callable(interp, compat.jit_params(eqn.params))


def jit_callable(interp: Interpreter, p: compat.JitParams) -> Callable[..., Any]:
    """The rebuilt `jax.jit` of a `jit` equation's body, cached per interpreter
    (the `jit` handler calls it too)."""

    def build() -> Callable[..., Any]:
        def body(*args: Any) -> tuple[Any, ...]:
            # A tuple, so that `out_shardings` (a tuple) is a pytree prefix.
            return tuple(interp.eval_closed(p.jaxpr, *args))

        body.__name__ = body.__qualname__ = p.name
        donate = tuple(i for i, d in enumerate(p.donated) if d)
        return jax.jit(
            body,
            inline=p.inline,
            keep_unused=p.keep_unused,
            donate_argnums=donate,
            **compat.jit_options(p),
        )

    key = ("jit", id(p.jaxpr), *p[1:])
    return interp.cached(key, p.jaxpr, build)


# --------------------------------------------------------------------------
# Walking a plan.


def plan_for(
    interp: Interpreter, jaxpr: compat.Jaxpr, consts: Sequence[Any], args: Sequence[Any]
) -> EagerPlan | None:
    """The plan for walking `jaxpr` eagerly, or `None` to walk it generally.

    Only for interpreters that keep the default `process_eqn` and
    `default_rule`, outside any JAX trace, on concrete inputs.
    """
    if (
        not interp._default_eqns
        or not compat.is_eager()
        or not compat.all_concrete(consts)
        or not compat.all_concrete(args)
    ):
        return None
    ambient = compat.ambient_eqn_context()
    if ambient is None:
        return None
    plans = interp._eager_plans
    plan = plans.get(jaxpr)
    if (
        plan is None
        or plan.table is not type(interp).dispatch_table()
        or plan.policy != interp.higher_order
        or not compat.same_eqn_context(plan.context, ambient)
    ):
        # A first walk (or one after a change): no compilation of our own.
        return plans.put(jaxpr, EagerPlan(interp, jaxpr, ambient, fused=False))
    if not plan.fused:  # walked before: worth compiling the fused steps
        plan = plans.put(jaxpr, EagerPlan(interp, jaxpr, ambient, fused=True))
    return plan


def _straight_line(
    jaxpr: compat.Jaxpr, program: Sequence[Any]
) -> Callable[[Sequence[Any], Sequence[Any]], list[Any]]:
    """`program` (every step a compiled call) as one generated function of
    `(consts, args)`: the calls in order, each value a local variable, deleted
    after its last use as the walk's environment would release it."""
    names: dict[Any, str] = {}
    scope: dict[str, Any] = {}

    def name(v: Any) -> str:
        if type(v) is _Put:
            key = f"p{len(scope)}"
            scope[key] = v.val
            return key
        got = names.get(v)
        if got is None:
            got = names[v] = f"v{len(names)}"
        return got

    consts = [name(v) for v in jaxpr.constvars]
    args = [name(v) for v in jaxpr.invars]
    lines = ["def run(consts, args):"]
    if consts:
        lines.append(f"    {', '.join(consts)}, = consts")
    if args:
        lines.append(f"    {', '.join(args)}, = args")
    for k, (_, step, writes, dead) in enumerate(program):
        fn = f"f{k}"
        scope[fn] = step.fn
        call = f"{fn}({', '.join(name(v) for v in step.inputs)})"
        if writes:
            targets = ", ".join(f"{name(v)}" for _, v in writes)
            picks = ", ".join(f"r[{i}]" for i, _ in writes)
            lines.append(f"    r = {call}; {targets}, = {picks},")
        else:
            lines.append(f"    {call}")
        released = [name(v) for v in dead if type(v) is not _Put]
        if released:
            lines.append(f"    del {', '.join(released)}")
    outs = []
    for v in jaxpr.outvars:
        if type(v) is _Literal:
            key = f"p{len(scope)}"
            scope[key] = v.val
            outs.append(key)
        else:
            outs.append(name(v))
    lines.append(f"    return [{', '.join(outs)}]")
    exec("\n".join(lines), scope)  # generated from the plan alone
    run: Callable[[Sequence[Any], Sequence[Any]], list[Any]] = scope["run"]
    return run


def run_plan(
    interp: Interpreter,
    jaxpr: compat.Jaxpr,
    plan: EagerPlan,
    consts: Sequence[Any],
    args: Sequence[Any],
) -> list[Any]:
    """Walk `jaxpr` eagerly: planned equations call their compiled function
    directly; the others (and any planned call that raises, to report the
    error with its context) go through `process_eqn`."""
    if plan.straight is not None:
        try:
            return plan.straight(consts, args)
        except Exception:  # redone below, step by step, to report it
            pass
    env: dict[Any, Any] = dict(plan.seed)  # the literals put on the device
    for v, val in zip(jaxpr.constvars, consts, strict=True):
        env[v] = val
    for v, val in zip(jaxpr.invars, args, strict=True):
        env[v] = val
    for eqn, step, writes, dead in plan.program:
        outvals = None
        if step is not None:
            try:
                outvals = step.fn(*[env[v] for v in step.inputs])
            except Exception:  # redone below, to report it with its context
                outvals = None
        if outvals is None:
            for member in () if step is None else step.absorbed:
                _process_in(interp, env, member)
            _process_in(interp, env, eqn)
        else:
            for k, v in writes:
                env[v] = outvals[k]
        for v in dead:
            del env[v]
    return [v.val if type(v) is _Literal else env[v] for v in jaxpr.outvars]


def _process_in(interp: Interpreter, env: dict[Any, Any], eqn: compat.JaxprEqn) -> None:
    """Evaluate `eqn` through `process_eqn`, reading and writing `env`."""
    invals = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
    outvals = interp.process_in_context(eqn, invals)
    for v, val in zip(eqn.outvars, outvals, strict=True):
        if type(v) is not _DropVar:
            env[v] = val


def new_plan_table() -> _caches.Cache:
    """An interpreter's plans, per Jaxpr (held weakly)."""
    return _caches.Cache(1024, weak=True, register=False)


# Per sub-Jaxpr, whether a hijax `call_hi_primitive` is inside it.
_hijax_inside = _caches.Cache(4096, weak=True)


def contains_hijax(eqn: compat.JaxprEqn) -> bool:
    """Whether a hijax `call_hi_primitive` (JAX's future-default constructs)
    is nested in `eqn`'s bodies. Such a construct is walked even by an
    interpreter that changes nothing: the walker rebuilds a `Scan3` that JAX
    cannot differentiate or batch (and that JAX 0.12.0.1 mishandles inside
    `jit`) as the classic `scan`."""
    hi = compat.call_hi_primitive_p
    if hi is None:
        return False
    for sub in compat.sub_jaxprs(eqn):
        try:
            inside = _hijax_inside.get(sub)
        except TypeError:  # not weakly referenceable
            inside = None
        if inside is None:
            inside = any(e.primitive is hi for e in compat.iter_eqns(sub))
            try:
                _hijax_inside.put(sub, inside)
            except TypeError:
                pass
        if inside:
            return True
    return False
