"""The walkers: `Env`, `Interpreter` (forwards) and `BackwardWalker`."""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal as TypingLiteral, NamedTuple

from jax import lax

from . import _caches, _jax_compat as compat, _registry
from ._custom_types import PyTree, has_custom
from ._errors import (
    JaxinterpError,
    MissingRuleError,
    RuleError,
    describe_value,
    eqn_context,
    operands_detail,
    reraise,
    source_line,
)
from ._registry import RuleRegistry
from ._trace import Staged, check_callable, stage_flat

Policy = TypingLiteral["opaque", "recursive", "inline"]
_POLICIES = ("opaque", "recursive", "inline")
_RECURSION_LIMIT = compat.DEEP_RECURSION_LIMIT

_Literal = compat.Literal
_DropVar = compat.DropVar
_call_hi_primitive_p = compat.call_hi_primitive_p


class Env(dict):  # type: ignore[type-arg]
    """Values of jaxpr variables during a walk: a `dict` from `Var` to value.

    `read` understands `Literal`s, `write` ignores `DropVar`s, and `release`
    drops values that are no longer needed.
    """

    def read(self, var: Any) -> Any:
        """Return the value of `var` (a `Var` or a `Literal`)."""
        if type(var) is _Literal:
            return var.val
        return self[var]

    def read_many(self, variables: Sequence[Any]) -> list[Any]:
        """Return the values of several variables."""
        return [v.val if type(v) is _Literal else self[v] for v in variables]

    def known(self, var: Any) -> bool:
        """Whether `var` has a value (literals always do)."""
        return type(var) is _Literal or var in self

    def write(self, var: Any, value: Any) -> None:
        """Bind `var` to `value`; a `DropVar` is ignored."""
        if type(var) is not _DropVar:
            self[var] = value

    def write_many(self, variables: Sequence[Any], values: Sequence[Any]) -> None:
        """Bind several variables."""
        for var, value in zip(variables, values, strict=True):
            if type(var) is not _DropVar:
                self[var] = value

    def release(self, variables: Sequence[Any]) -> None:
        """Forget the values of `variables` (after their last use)."""
        for var in variables:
            self.pop(var, None)


# Per-jaxpr list, for each equation, of the variables last used there.
_release_plans: weakref.WeakKeyDictionary[Any, list[tuple[Any, ...]]] = (
    weakref.WeakKeyDictionary()
)
_release_lock = threading.Lock()
_caches.on_clear(_release_plans.clear)


def release_plan(jaxpr: Any) -> list[tuple[Any, ...]]:
    """For each equation of `jaxpr`, the variables whose last use it is.

    A result no equation uses is released right after the equation that
    computes it, an input no equation uses after the first equation. Outputs
    of the jaxpr are never released. Computed once per jaxpr.
    """
    cached = _release_plans.get(jaxpr)
    if cached is not None:
        return cached
    eqns = jaxpr.eqns
    plan = _last_uses(
        [eqn.invars for eqn in eqns], [eqn.outvars for eqn in eqns], jaxpr.outvars
    )
    if eqns:  # inputs nothing reads go with the first equation
        read = {
            v
            for vs in (*(eqn.invars for eqn in eqns), jaxpr.outvars)
            for v in vs
            if type(v) is not _Literal
        }
        unused = [v for v in (*jaxpr.constvars, *jaxpr.invars) if v not in read]
        if unused:
            plan[0] = (*plan[0], *unused)
    with _release_lock:
        _release_plans[jaxpr] = plan
    return plan


def _last_uses(
    reads: Sequence[Sequence[Any]],
    writes: Sequence[Sequence[Any]],
    outvars: Sequence[Any],
) -> list[tuple[Any, ...]]:
    """For each step reading and writing the given variables, those it reads
    (or writes) last, leaving out `outvars`. Literals and drop-vars are ignored.
    """
    keep = {v for v in outvars if type(v) is not _Literal}
    last: dict[Any, int] = {}
    for i, (ins, outs) in enumerate(zip(reads, writes, strict=True)):
        for v in ins:
            if type(v) is not _Literal and type(v) is not _Put:
                last[v] = i
        for v in outs:
            if type(v) is not _DropVar:
                last[v] = i  # moved on by a later use
    # Most steps release nothing or one value: share the empty tuple and
    # allocate only for steps that do release.
    buckets: dict[int, list[Any]] = {}
    for v, i in last.items():
        if v not in keep:
            bucket = buckets.get(i)
            if bucket is None:
                buckets[i] = [v]
            else:
                bucket.append(v)
    plan: list[tuple[Any, ...]] = [()] * len(reads)
    for i, bucket in buckets.items():
        plan[i] = tuple(bucket)
    return plan


class Interpreter:
    """A forward walker over Jaxprs: the base of every transformation.

    By default each equation re-binds its primitive, so results are tracers
    under a JAX transformation and arrays when eager, and a subclass composes
    with `jax.jit`, `jax.grad`, `jax.vmap` and `jax.jvp`. Customise it in
    either of two ways:

    * set a class attribute `rules` to a `RuleRegistry` of forward rules
      (`rule(*invals, **params) -> list`), consulted before anything else;
    * override `process_eqn(eqn, invals)`, called for every equation, nested
      ones included; `super().process_eqn(eqn, invals)` gives the default.

    Higher-order primitives (`jit`, `cond`, `scan`, `while`, `checkpoint`,
    `custom_jvp_call`, `custom_vjp_call`, `closed_call`, `shard_map`, and
    JAX's hijax `call_hi_primitive`) follow a policy, chosen per interpreter
    and per primitive:

    * `"recursive"` (default): interpret the sub-Jaxprs with this
      interpreter and rebuild the same construct (a `jit` stays a `jit`,
      compiled once and cached; a `scan` stays a `scan`...);
    * `"opaque"`: re-bind the primitive unchanged, as `jax.core.eval_jaxpr`;
    * `"inline"` (call-like primitives only: `jit`, `closed_call`,
      `checkpoint`, `custom_jvp_call`, `custom_vjp_call`): interpret the body
      in place, dropping the construct (and any custom derivative rule).

    Eager walks (concrete arrays, no JAX trace) of a class that keeps the
    default `process_eqn` and `default_rule` take a fast path: equations
    without a rule run as cached compiled calls, with the same results (see
    "The eager fast path" in the concepts guide). Overriding `process_eqn`
    keeps every equation going through it, at the walker's usual per-equation
    cost.

    Args:
        higher_order: the policy for every higher-order primitive.
        policies: per-primitive overrides, keyed by `Primitive` or its name.

    Example:
        >>> import jax.numpy as jnp
        >>> class Counter(Interpreter):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.count = 0
        ...     def process_eqn(self, eqn, invals):
        ...         self.count += 1
        ...         return super().process_eqn(eqn, invals)
        >>> counter = Counter()
        >>> print(f"{counter.transform(lambda x: jnp.sin(x) * 2.0)(1.0):.3f}")
        1.683
        >>> counter.count
        2
    """

    #: Name of the transformation, used in error messages.
    name: ClassVar[str] = "interpret"
    #: Forward rules consulted before the default behaviour (or `None`).
    rules: ClassVar[RuleRegistry[Any] | None] = None
    #: Default policy for higher-order primitives.
    higher_order: Policy = "recursive"
    #: Cache rebuilt `jit`s (and traced bodies) per sub-Jaxpr. Turn it off when
    #: `process_eqn` has side effects that must run on every call.
    cache_subcalls: ClassVar[bool] = True

    # Whether the class keeps the default `process_eqn` and `default_rule`
    # (set per subclass): only then may eager walks skip `process_eqn`.
    _default_eqns: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._default_eqns = (
            cls.process_eqn is Interpreter.process_eqn
            and cls.default_rule is Interpreter.default_rule
        )

    def __init__(
        self,
        *,
        higher_order: Policy | None = None,
        policies: Mapping[Any, Policy] | None = None,
    ) -> None:
        if higher_order is not None:
            _check_policy(higher_order)
            self.higher_order = higher_order
        self._policies: dict[str, str] = {}
        for prim, policy in (policies or {}).items():
            _check_policy(policy)
            self._policies[prim if isinstance(prim, str) else prim.name] = policy
        self._subcalls: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()
        self._subcall_lock = threading.Lock()
        self._eager_plans: weakref.WeakKeyDictionary[Any, _EagerPlan] = (
            weakref.WeakKeyDictionary()
        )
        _caches.track_interpreter(self)

    def clear_cache(self) -> None:
        """Forget this interpreter's rebuilt `jit`s, traced bodies and eager
        plans (`jaxinterp.clear_caches()` does it for every interpreter)."""
        with self._subcall_lock:
            self._subcalls.clear()
        self._eager_plans.clear()

    # ------------------------------------------------------------------
    # Values of the interpreter's own type.

    def lift(self, value: Any, like: Any) -> Any:
        """Turn a plain array `value` into this interpreter's value type, of
        the kind of `like`.

        Called where a loop carry (`scan`, `while_loop`, `fori_loop`) starts
        as a plain array and becomes the interpreter's own value in the body
        (a dual number, an interval...), and where `cond`/`switch` branches
        return a plain array in one branch and such a value in another: the
        walker lifts the plain value so that both have one type, as JAX's
        own `jvp` of a loop does for tangents. `like` is an abstract value of
        the wanted type: the same pytree, with `jax.ShapeDtypeStruct`
        leaves (or the value itself). Values are the interpreter's own when
        they are pytrees other than plain arrays (e.g.
        `jax.tree_util.register_dataclass` dataclasses of arrays).

        The default raises `TypeError`; the walker then raises
        `jaxinterp.CustomValueError` (a `TypeError`) naming the primitive,
        the position, both types and the user's line.

        Example (a dual-number interpreter): `return Dual(value,
        jnp.zeros_like(value))`.
        """
        raise TypeError(
            f"`{self.name}` defines no `lift(value, like)` to turn a plain "
            f"array into a `{type(like).__name__}`"
        )

    # ------------------------------------------------------------------
    # Policies and equation processing.

    def policy(self, prim: Any) -> str:
        """Return the higher-order policy in force for `prim`."""
        return self._policies.get(prim.name, self.higher_order)

    def process_eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        """Evaluate one equation and return its outputs as a list.

        The default: a rule from `rules` if there is one; else, for a
        higher-order primitive under the `recursive` or `inline` policy, the
        built-in handling; else `default_rule` (re-bind the primitive).

        Args:
            eqn: the `JaxprEqn`.
            invals: the values of `eqn.invars`.

        Returns:
            One value per entry of `eqn.outvars`.
        """
        rules = self.rules
        if rules is not None:
            rule = rules.get(eqn.primitive)
            if rule is not None:
                outvals = rule(*invals, **eqn.params)
                if type(outvals) is list:
                    return outvals
                return self._as_outvals(eqn, outvals)
        handler = _higher_order_handlers.get(eqn.primitive)
        if handler is not None:
            if eqn.primitive is _call_hi_primitive_p:
                policy = self._hi_policy(eqn)
            else:
                policy = self._policies.get(eqn.primitive.name, self.higher_order)
            if policy != "opaque":
                return handler(self, eqn, invals, policy)
        elif compat.is_unhandled_higher_order(eqn):
            self._check_unhandled(eqn)
        return self.default_rule(eqn, invals)

    def _hi_policy(self, eqn: Any) -> str:
        """The policy for a hijax `call_hi_primitive` equation (JAX >= 0.11).

        The most specific key wins: the hijax class (`"RematTraced"`), the
        primitive of the construct it replaces (`"remat2"`, `"scan"`,
        `"custom_jvp_call"`, `"custom_vjp_call"`), its kind (`"checkpoint"`,
        `"custom_jvp"`, `"custom_vjp"`), then `"call_hi_primitive"`. Policies
        written for a construct keep applying when JAX's hijax flags are on.
        """
        policies = self._policies
        if policies:
            h = compat.hijax_params(eqn)
            for key in (h.name, h.replaces, h.kind, eqn.primitive.name):
                policy = policies.get(key)
                if policy is not None:
                    return policy
        return self.higher_order

    def _check_unhandled(self, eqn: Any) -> None:
        """Refuse to re-bind a higher-order primitive no handler enters, unless
        its policy is `opaque`: this interpreter would silently not see its body.

        An interpreter that changes nothing (default `process_eqn`, no rules,
        such as `evaluate`'s) re-binds it: walking the body would give the
        same values, so re-binding is exact.
        """
        name = eqn.primitive.name
        if self._policies.get(name, self.higher_order) == "opaque":
            return
        if self._default_eqns and (self.rules is None or not len(self.rules)):
            return
        raise MissingRuleError(
            f"`{self.name}` cannot reach inside higher-order primitive `{name}`, "
            f"used at {source_line(eqn)}: jaxinterp has no handler for it "
            f"(JAX {compat.JAX_VERSION_STR}).\n\n"
            "To re-bind it unchanged (the interpreter then does not see its "
            f"body), pass `policies={{{name!r}: 'opaque'}}` to the interpreter; "
            "or give the interpreter a rule for it in `rules`."
        )

    def default_rule(self, eqn: Any, invals: list[Any]) -> list[Any]:
        """Re-bind `eqn`'s primitive on `invals` (what `jax.core.eval_jaxpr` does).

        Eagerly (concrete operands, no effects), the primitive runs through a
        cached single-primitive `jax.jit`: the same compiled computation JAX's
        own eager dispatch uses, so results are identical, but dispatched by
        JAX's C++ fast path.
        """
        if not eqn.effects:
            fast = compat.eager_primitive(eqn.primitive, eqn.params, invals)
            if fast is not None:
                return fast
        return compat.bind_eqn(eqn.primitive, invals, eqn.params)

    # ------------------------------------------------------------------
    # Walking.

    def eval_jaxpr(self, jaxpr: Any, consts: Sequence[Any], *args: Any) -> list[Any]:
        """Walk an open `jaxpr` on `consts` and `args`; return its outputs.

        The signature mirrors `jax.core.eval_jaxpr`. Each value is released
        after its last use.
        """
        plan = self._eager_plan(jaxpr, consts, args)
        if plan is not None:
            return self._eval_eager(jaxpr, plan, consts, args)
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        for v, val in zip(jaxpr.invars, args, strict=True):
            env[v] = val
        process = self.process_eqn
        contexts = compat.eqn_contexts
        # `_process_in_context`, inlined: this loop runs every traced walk.
        for eqn, dead in zip(jaxpr.eqns, release_plan(jaxpr), strict=True):
            invals = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
            user_ctx, eqn_ctx = contexts(eqn)
            try:
                with user_ctx, eqn_ctx:
                    outvals = process(eqn, invals)
            except Exception as err:
                reraise(self.name, eqn, err, details=operands_detail(invals))
            outvars = eqn.outvars
            if type(outvals) is not list or len(outvals) != len(outvars):
                outvals = self._as_outvals(eqn, outvals)
            for v, val in zip(outvars, outvals, strict=True):
                if type(v) is not _DropVar:
                    env[v] = val
            for v in dead:
                del env[v]
        return [v.val if type(v) is _Literal else env[v] for v in jaxpr.outvars]

    # ------------------------------------------------------------------
    # The eager fast path.

    def _eager_plan(
        self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]
    ) -> _EagerPlan | None:
        """The plan for walking `jaxpr` eagerly, or `None` to walk it generally.

        Only for interpreters that keep the default `process_eqn` and
        `default_rule`, outside any JAX trace, on concrete inputs.
        """
        if (
            not self._default_eqns
            or not compat.is_eager()
            or not compat.all_concrete(consts)
            or not compat.all_concrete(args)
        ):
            return None
        ambient = compat.ambient_eqn_context()
        if ambient is None:
            return None
        plan = self._eager_plans.get(jaxpr)
        if (
            plan is None
            or plan.generation != _registry.generation()
            or plan.policy != self.higher_order
            or not compat.same_eqn_context(plan.context, ambient)
        ):
            plan = _EagerPlan(self, jaxpr, ambient)
            with self._subcall_lock:
                self._eager_plans[jaxpr] = plan
        return plan

    def _eval_eager(
        self, jaxpr: Any, plan: _EagerPlan, consts: Sequence[Any], args: Sequence[Any]
    ) -> list[Any]:
        """Walk `jaxpr` eagerly: planned equations call their compiled function
        directly; the others (and any planned call that raises, to report the
        error with its context) go through `process_eqn`."""
        env = dict(plan.seed)  # the literals put on the device
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
                    self._eval_eqn_in(env, member)
                self._eval_eqn_in(env, eqn)
            else:
                for k, v in writes:
                    env[v] = outvals[k]
            for v in dead:
                del env[v]
        return [v.val if type(v) is _Literal else env[v] for v in jaxpr.outvars]

    def _eval_eqn_in(self, env: dict[Any, Any], eqn: Any) -> None:
        """Evaluate `eqn` through `process_eqn`, reading and writing `env`."""
        invals = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
        outvals = self._process_in_context(eqn, invals)
        for v, val in zip(eqn.outvars, outvals, strict=True):
            if type(v) is not _DropVar:
                env[v] = val

    def _process_in_context(self, eqn: Any, invals: list[Any]) -> list[Any]:
        """`process_eqn` in the equation's contexts, errors wrapped as in a walk."""
        user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
        try:
            with user_ctx, eqn_ctx:
                outvals = self.process_eqn(eqn, invals)
        except Exception as err:
            reraise(self.name, eqn, err, details=operands_detail(invals))
        if type(outvals) is not list or len(outvals) != len(eqn.outvars):
            outvals = self._as_outvals(eqn, outvals)
        return outvals

    def eval_closed(self, closed_jaxpr: Any, *args: Any) -> list[Any]:
        """Walk a `ClosedJaxpr` on `args`; return its outputs as a list."""
        return self.eval_jaxpr(
            compat.open_jaxpr(closed_jaxpr), compat.jaxpr_consts(closed_jaxpr), *args
        )

    def run(self, staged: Staged, flat_args: Sequence[Any]) -> list[Any]:
        """Walk a `Staged` function on flat arguments; return flat outputs."""
        closed = staged.closed_jaxpr
        jaxpr, consts = compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
        if has_custom(flat_args):
            jaxpr, consts = _without_references(jaxpr, consts)
        if staged.nesting <= compat.SHALLOW_NESTING:
            return self.eval_jaxpr(jaxpr, consts, *flat_args)
        with compat.recursion_limit(_RECURSION_LIMIT):
            return self.eval_jaxpr(jaxpr, consts, *flat_args)

    def _as_outvals(self, eqn: Any, outvals: Any) -> list[Any]:
        """Return `outvals` as a list, checking it has one value per output.

        A bare array is refused even when iterating it would give the right
        count: that would silently split its leading axis.
        """
        n_out = len(eqn.outvars)
        if isinstance(outvals, list | tuple) and len(outvals) == n_out:
            return list(outvals)
        got = (
            f"{len(outvals)} values"
            if isinstance(outvals, list | tuple)
            else f"a {type(outvals).__name__} ({describe_value(outvals)})"
        )
        raise RuleError(
            f"{eqn_context(self.name, eqn)}: processing the equation gave "
            f"{got} for {n_out} outputs.\n"
            "Rules and `process_eqn` must return a list with one value per "
            "output, also for single-result primitives."
        )

    # ------------------------------------------------------------------
    # As a function transformation.

    def transform(
        self,
        fn: Callable[..., Any],
        *,
        static_argnums: int | Sequence[int] = (),
    ) -> Callable[..., PyTree]:
        """Turn this interpreter into a transformation of `fn`.

        The result takes and returns the same pytrees as `fn`. Each call stages
        `fn` (cached per signature) and walks its Jaxpr with this interpreter.

        Args:
            fn: the function to transform.
            static_argnums: positional arguments to treat as static.

        Returns:
            The transformed function, with `fn`'s name and `__wrapped__`.

        Raises:
            TypeError: if `fn` is not callable.
        """
        check_callable(fn, self.name)

        @functools.wraps(fn)
        def transformed(*args: Any, **kwargs: Any) -> PyTree:
            staged, leaves = stage_flat(fn, args, kwargs, static_argnums)
            return staged.unflatten_out(self.run(staged, leaves))

        return transformed

    def missing(self, jaxpr: Any) -> list[str]:
        """List primitives in `jaxpr` (recursively) with no rule in `rules`.

        Higher-order primitives the walker rebuilds itself are not listed.
        Interpreters whose default re-binds (like this base class) still run
        such primitives; the list is for diagnostics.
        """
        registry = self.rules if self.rules is not None else RuleRegistry(self.name)
        return registry.missing(jaxpr, handled=_higher_order_handlers.keys())

    # ------------------------------------------------------------------
    # Helpers for higher-order handlers.

    def cached(self, key: Hashable, anchor: Any, build: Callable[[], Any]) -> Any:
        """Return a per-interpreter cached object for (`key`, `anchor`).

        `anchor` (typically a sub-Jaxpr) is kept alive with the entry and
        compared by identity, so a recycled `id` never returns a stale entry.
        """
        if not self.cache_subcalls:
            return build()
        with self._subcall_lock:
            hit = self._subcalls.get(key)
            if hit is not None and hit[0] is anchor:
                self._subcalls.move_to_end(key)
                return hit[1]
        value = build()
        with self._subcall_lock:
            self._subcalls[key] = (anchor, value)
            while len(self._subcalls) > 512:
                self._subcalls.popitem(last=False)
        return value


def _without_references(jaxpr: Any, consts: Sequence[Any]) -> tuple[Any, Any]:
    """`jaxpr` with its mutable references held as values, for a walk on an
    interpreter's own values, which references (arrays only) cannot hold:
    under `jax_scan3` a `scan` keeps its carry in references. As it is when
    it uses none, or when they cannot be made pure."""
    from ._state import functionalize  # (it subclasses `Interpreter`)

    try:
        return functionalize(jaxpr, consts)
    except JaxinterpError:
        return jaxpr, consts


def _check_policy(policy: str) -> None:
    if policy not in _POLICIES:
        raise ValueError(
            f"Unknown higher-order policy {policy!r}; expected one of {_POLICIES}."
        )


# Handlers for higher-order primitives, filled in by `_higher_order`.
# handler(interpreter, eqn, invals, policy) -> list of outputs.
_higher_order_handlers: dict[Any, Callable[..., list[Any]]] = {}


def _registering(
    table: dict[Any, Callable[..., Any]], prim: Any
) -> Callable[[Callable[..., Any]], Any]:
    """A decorator entering a function in `table` under `prim` (if it exists)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if prim is not None:
            table[prim] = fn
        return fn

    return decorate


def register_higher_order(prim: Any) -> Callable[[Callable[..., Any]], Any]:
    """Register the walker's built-in handling of a higher-order primitive."""
    return _registering(_higher_order_handlers, prim)


# Compiled callables for higher-order primitives on the eager fast path, filled
# in by `_higher_order`: fn(interpreter, eqn) -> callable or None. The callable
# takes the equation's operands and returns its outputs (a list or tuple).
_eager_callables: dict[Any, Callable[[Any, Any], Any]] = {}


def register_eager_callable(prim: Any) -> Callable[[Callable[..., Any]], Any]:
    """Register how the eager fast path runs higher-order primitive `prim`."""
    return _registering(_eager_callables, prim)


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


class _EagerPlan:
    """How to run each equation of one Jaxpr eagerly, for one interpreter.

    Each equation gets a `_Step` computing it with one compiled call,
    `_ABSORBED` if a later step computes it, or `None` if it goes through
    `process_eqn`: equations with effects, a context other than the ambient
    one, a rule of the interpreter's, a higher-order primitive without an
    eager callable, or a primitive with its own Python implementation.
    `program` is what a walk runs; `seed` holds the literal operands.
    """

    __slots__ = ("context", "generation", "policy", "program", "seed")

    def __init__(self, interp: Interpreter, jaxpr: Any, context: Any) -> None:
        self.context = context
        self.generation = _registry.generation()
        self.policy = interp.higher_order
        eqns = jaxpr.eqns
        compiled = [self._compiles(interp, eqn, context) for eqn in eqns]
        steps: list[_Step | None] = [
            self._single(interp, eqn) if ok else None
            for eqn, ok in zip(eqns, compiled, strict=True)
        ]
        self._absorb_movers(jaxpr, steps)
        reads = [
            () if step is _ABSORBED else (eqn.invars if step is None else step.inputs)
            for eqn, step in zip(eqns, steps, strict=True)
        ]
        writes = [
            () if step is _ABSORBED else eqn.outvars
            for eqn, step in zip(eqns, steps, strict=True)
        ]
        dead = _last_uses(reads, writes, jaxpr.outvars)
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

    @staticmethod
    def _compiles(interp: Interpreter, eqn: Any, context: Any) -> bool:
        """Whether `eqn` may run as a compiled call, outside `process_eqn`.

        Not when it has effects or touches a mutable reference (`free_ref`
        and a hijax `Scan3` change a reference without declaring an effect):
        those run through `process_eqn`, in order.
        """
        if eqn.effects or not compat.same_eqn_context(eqn.ctx, context):
            return False
        if compat.touches_ref(eqn):
            return False
        rules = interp.rules
        return rules is None or rules.get(eqn.primitive) is None

    @staticmethod
    def _single(interp: Interpreter, eqn: Any) -> _Step | None:
        prim = eqn.primitive
        if prim in _higher_order_handlers:
            make = _eager_callables.get(prim)
            fn = None if make is None else make(interp, eqn)
        else:
            fn = compat.eager_callable(prim, eqn.params)
        if fn is None:
            return None
        return _Step(fn, tuple(_operand(v) for v in eqn.invars))

    @staticmethod
    def _absorb_movers(jaxpr: Any, steps: list[Any]) -> None:
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
            fn = compat.eager_chain(program)
            if fn is None:
                continue
            steps[j] = _Step(fn, tuple(inputs), tuple(group[:-1]))
            for i in members:
                steps[i] = _ABSORBED


def _mover_tree(
    eqn: Any, eqns: Sequence[Any], movers: dict[Any, int], uses: dict[Any, int]
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
    return _Put(compat.device_literal(var)) if type(var) is _Literal else var


def higher_order_primitives() -> frozenset[Any]:
    """Return the higher-order primitives the walker can reach inside."""
    return frozenset(_higher_order_handlers)


class BackwardWalker:
    """Walks a Jaxpr from its outputs to its inputs, equations in reverse.

    Subclasses implement `process_eqn_backward(eqn, outvals) -> list`, which
    returns one value per `eqn.invars` entry (`None` where the equation does
    not determine that input). It shares `Env` and the error machinery with
    `Interpreter`. `inverse` builds a richer dataflow walker on the same
    pieces.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax import lax
        >>> class Undo(BackwardWalker):
        ...     name = "undo"
        ...     def process_eqn_backward(self, eqn, outvals):
        ...         (y,) = outvals
        ...         return {"exp": [jnp.log(y)], "sin": [jnp.arcsin(y)]}[
        ...             eqn.primitive.name]
        >>> closed = stage(lambda x: jnp.exp(jnp.sin(x)), 0.5).closed_jaxpr
        >>> (x,) = Undo().eval_jaxpr_backward(closed.jaxpr, closed.consts,
        ...                                   jnp.exp(jnp.sin(0.5)))
        >>> print(f"{x:.4f}")
        0.5000
    """

    #: Name of the transformation, used in error messages.
    name: ClassVar[str] = "backward"

    def process_eqn_backward(self, eqn: Any, outvals: list[Any]) -> list[Any]:
        """Return the equation's input values given its output values."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `process_eqn_backward`."
        )

    def eval_jaxpr_backward(
        self, jaxpr: Any, consts: Sequence[Any], *outvals: Any
    ) -> list[Any]:
        """Walk `jaxpr` backwards from `outvals`; return the values of its invars.

        Equations whose outputs were not all reached are skipped.

        Raises:
            RuleError: if an input was not reached, or a rule failed.
        """
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        env.write_many(jaxpr.outvars, outvals)
        for eqn in reversed(jaxpr.eqns):
            if not all(env.known(v) for v in eqn.outvars if type(v) is not _DropVar):
                continue
            outs = [None if type(v) is _DropVar else env.read(v) for v in eqn.outvars]
            try:
                invals = self.process_eqn_backward(eqn, outs)
            except Exception as err:
                reraise(self.name, eqn, err, details=operands_detail(outs, "Outputs"))
            for v, val in zip(eqn.invars, invals, strict=True):
                if val is not None and type(v) is not _Literal and v not in env:
                    env[v] = val
        missing = [v for v in jaxpr.invars if v not in env]
        if missing:
            raise RuleError(
                f"`{self.name}` could not reach inputs "
                f"{', '.join(map(str, missing))} walking backwards."
            )
        return [env[v] for v in jaxpr.invars]
