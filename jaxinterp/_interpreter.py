"""The forward walker, `Interpreter`, and its dispatch table.

One table per interpreter class maps primitives to handlers
`handler(interp, eqn, invals) -> list`: the built-in handlers of higher-order
primitives (registered on `Interpreter` by `_higher_order`), handlers users
register with `Interpreter.register`, and the first-order rules of the
class's `rules` registry. `process_eqn` looks the equation up there and
otherwise re-binds it (`default_rule`). The eager fast path is in `_eager`,
`Env` and release plans in `_env`, `BackwardWalker` in `_backward`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal as TypingLiteral, Protocol

import jax
import numpy as np

from . import _caches, _eager, _jax_compat as compat, _recursion, _registry
from ._custom_types import PyTree, has_custom
from ._env import Env as Env, release_plan
from ._errors import (
    CustomValueError,
    MissingRuleError,
    RuleError,
    describe_value,
    describe_values,
    eqn_context,
    operands_detail,
    reraise,
    source_line,
)
from ._registry import RuleRegistry
from ._trace import Staged, check_callable, stage_flat

Policy = TypingLiteral["opaque", "recursive", "inline"]
_POLICIES = ("opaque", "recursive", "inline")

_Literal = compat.Literal
# The values `_check_results` checks: arrays, tracers among them.
_ARRAYS = (jax.Array, np.ndarray, np.generic)
_DropVar = compat.DropVar
_call_hi_primitive_p = compat.call_hi_primitive_p


class Handler(Protocol):
    """What `Interpreter.register` registers: how an interpreter evaluates
    the equations of one primitive.

    `handler(interp, eqn, invals)` gets the interpreter, the `JaxprEqn` and
    the values of its operands, and returns one value per output (a list).
    A handler of a higher-order primitive walks its sub-Jaxprs with
    `interp.eval_closed` (or `interp.eval_jaxpr`) and may read the policy in
    force with `interp.policy_of(eqn)`.
    """

    def __call__(
        self, interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any], /
    ) -> Sequence[Any]: ...


class Interpreter:
    """A forward walker over Jaxprs: the base of every transformation.

    By default each equation re-binds its primitive, so results are tracers
    under a JAX transformation and arrays when eager, and a subclass composes
    with `jax.jit`, `jax.grad`, `jax.vmap` and `jax.jvp`. Customise it in
    any of three ways:

    * set a class attribute `rules` to a `RuleRegistry` of first-order
      rules (`rule(*invals, **params) -> list`);
    * register a handler `handler(interp, eqn, invals) -> list` with
      `MyInterpreter.register(prim)`: the general form, which sees the
      equation, for first-order and higher-order primitives alike (your own
      higher-order primitives included);
    * override `process_eqn(eqn, invals)`, called for every equation, nested
      ones included; `super().process_eqn(eqn, invals)` gives the default.

    Both registrations go into one table per class (`dispatch_table()`):
    a subclass inherits its bases' handlers and may replace them, never
    changing the base's; `rules` take precedence over handlers.

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
    #: Whether rules and handlers may return results of another dtype than
    #: their equation's (a mixed-precision rewrite). Off, such a result is a
    #: `RuleError` where it is returned; shapes are checked either way.
    changes_dtypes: ClassVar[bool] = False

    # Whether the class keeps the default `process_eqn` and `default_rule`
    # (set per subclass): only then may eager walks skip `process_eqn`.
    _default_eqns: ClassVar[bool] = True
    # The handlers registered on this very class (not its bases), and the
    # class's dispatch table with the registry generation it was built at.
    _own_handlers: ClassVar[dict[Any, Handler]] = {}
    _table: ClassVar[dict[Any, Handler]] = {}
    _table_generation: ClassVar[int] = -1
    _identity: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._default_eqns = (
            cls.process_eqn is Interpreter.process_eqn
            and cls.default_rule is Interpreter.default_rule
        )
        cls._own_handlers = {}
        cls._table_generation = -1

    # ------------------------------------------------------------------
    # The dispatch table.

    @classmethod
    def register(
        cls, prim: Any, handler: Handler | None = None, *, override: bool = False
    ) -> Any:
        """Register `handler(interp, eqn, invals) -> list` for `prim` on this class.

        The handler applies to this class and its subclasses (a subclass may
        register its own for the same primitive); registering on
        `Interpreter` itself applies to every interpreter. Without `handler`,
        return a decorator.

        A handler of a higher-order primitive walks its body with
        `interp.eval_closed(closed_jaxpr, *args)` and rebuilds the construct
        (or not); it may honour the interpreter's policy, read with
        `interp.policy_of(eqn)`. Such a primitive is one whose params hold
        Jaxprs: without a handler, an interpreter with rules refuses it
        (`MissingRuleError`) rather than re-bind it unseen.

        Args:
            prim: the `jax.extend.core.Primitive`.
            handler: the handler; omit it to use `register` as a decorator.
            override: replace a handler this class already registered.

        Raises:
            TypeError: if `prim` is not a primitive or `handler` not callable.
            ValueError: if this class already has a handler for `prim` and
                `override` is false.

        Example:
            >>> from jax import lax
            >>> class Doubler(Interpreter):
            ...     pass
            >>> @Doubler.register(lax.sin_p)
            ... def _sin(interp, eqn, invals):
            ...     return [2 * lax.sin(*invals)]
            >>> print(f"{Doubler().transform(lax.sin)(0.5):.4f}")
            0.9589
        """
        if not isinstance(prim, compat.Primitive):
            raise TypeError(
                f"Handlers are keyed by `jax.extend.core.Primitive`, got "
                f"{type(prim).__name__}: {prim!r}."
            )

        def decorate(fn: Handler) -> Handler:
            if not callable(fn):
                raise TypeError(f"A handler must be callable, got {fn!r}.")
            own = cls.__dict__["_own_handlers"]
            if prim in own and not override:
                raise ValueError(
                    f"`{cls.__name__}` already has a handler for primitive "
                    f"`{prim.name}`. Pass `override=True` to replace it."
                )
            own[prim] = fn
            _registry.bump_generation()
            return fn

        return decorate if handler is None else decorate(handler)

    @classmethod
    def unregister(cls, prim: Any) -> None:
        """Remove the handler this class registered for `prim` (bases keep theirs).

        Raises:
            KeyError: if this class registered none for `prim`.
        """
        own = cls.__dict__.get("_own_handlers", {})
        if prim not in own:
            raise KeyError(f"`{cls.__name__}` has no own handler for `{prim.name}`.")
        del own[prim]
        _registry.bump_generation()

    @classmethod
    def inherited_handler(cls, prim: Any) -> Handler | None:
        """The handler `prim` has on this class's bases: the one a handler
        registered on this class replaces (the built-in handler of a
        higher-order primitive, or a base class's), or `None`.

        A replacement calls it to fall back, for the equations it does not
        treat itself.

        Example:
            >>> from jax import lax
            >>> class Unrolled(Interpreter):
            ...     pass
            >>> @Unrolled.register(lax.while_p)
            ... def _while(interp, eqn, invals):
            ...     # (unroll some loops here; leave the rest to the built-in)
            ...     builtin = Unrolled.inherited_handler(lax.while_p)
            ...     return builtin(interp, eqn, invals)
            >>> count = lambda n: lax.while_loop(lambda i: i < n, lambda i: i + 1, 0)
            >>> int(Unrolled().transform(count)(3))
            3
        """
        for klass in cls.__mro__[1:]:
            own = klass.__dict__.get("_own_handlers")
            if own and prim in own:
                return own[prim]
        return None

    @classmethod
    def dispatch_table(cls) -> Mapping[Any, Handler]:
        """The table `process_eqn` dispatches on: primitive to handler.

        Built from the handlers registered on the class and its bases (the
        most derived wins) and the class's `rules` (which win over
        handlers); rebuilt after any registration. Read it, do not change it.
        """
        if cls._table_generation == _registry.generation():
            return cls._table
        generation = _registry.generation()
        table: dict[Any, Handler] = {}
        for klass in reversed(cls.__mro__):
            own = klass.__dict__.get("_own_handlers")
            if own:
                table.update(own)
        rules = cls.rules
        if rules is not None:
            for prim in rules:
                rule = rules.get(prim)
                if rule is not None:
                    table[prim] = _rule_handler(rule)
        cls._identity = cls._default_eqns and all(
            _registry.is_builtin(h) for h in table.values()
        )
        cls._table, cls._table_generation = table, generation
        return table

    @classmethod
    def changes_nothing(cls) -> bool:
        """Whether the class evaluates every equation as `jax.core.eval_jaxpr`
        does: it keeps the default `process_eqn` and `default_rule` and has no
        rule or handler but the built-in ones (as `jaxinterp.evaluate`).

        Such an interpreter re-binds a higher-order primitive under the
        `recursive` policy rather than walk and rebuild it: the result is
        the same construct, without tracing and compiling it again.
        """
        cls.dispatch_table()
        return cls._identity

    def rebinds(self) -> bool:
        """Whether this interpreter re-binds higher-order primitives under
        `recursive` (see `changes_nothing`): its class changes nothing and no
        policy of its is `inline` (which would drop constructs nested in
        the bodies)."""
        return (
            type(self).changes_nothing()
            and self.higher_order != "inline"
            and "inline" not in self._policies.values()
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
        self._subcalls = _caches.Cache(512, register=False)
        self._eager_plans = _eager.new_plan_table()
        _caches.track_interpreter(self)

    def clear_cache(self) -> None:
        """Forget this interpreter's rebuilt `jit`s, traced bodies and eager
        plans (`jaxinterp.clear_caches()` does it for every interpreter)."""
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

    def custom_derivative(
        self, eqn: compat.JaxprEqn, invals: list[Any], kind: str
    ) -> Sequence[Any] | None:
        """How this interpreter's own values go through a custom-derivative call.

        Called where such values (see `lift`) reach a `custom_jvp` or
        `custom_vjp` call (`kind` is `"custom_jvp"` or `"custom_vjp"`; with
        JAX's hijax flags on the equation is a `call_hi_primitive`). Their
        primitive cannot be bound to them, so by default (`None`) the walker
        walks the call's primal body, dropping the custom rule.

        Return the outputs instead to use the rule: `self.default_rule(eqn,
        arrays)` re-binds the call on plain arrays, so under `jax.jvp` JAX
        applies the custom JVP. A dual-number interpreter, for instance:

            primals = [v.primal for v in invals]
            tangents = [v.tangent for v in invals]
            outs, touts = jax.jvp(lambda *p: self.default_rule(eqn, list(p)),
                                  primals, tangents)
            return [Dual(o, t) for o, t in zip(outs, touts)]
        """
        return None

    # ------------------------------------------------------------------
    # Policies and equation processing.

    def policy(self, prim: Any) -> str:
        """Return the higher-order policy in force for `prim`."""
        return self._policies.get(prim.name, self.higher_order)

    def policy_of(self, eqn: compat.JaxprEqn) -> str:
        """Return the higher-order policy in force for equation `eqn`.

        As `policy(eqn.primitive)`, except for a hijax `call_hi_primitive`
        (JAX >= 0.11), where the most specific key wins: the hijax class
        (`"RematTraced"`), the primitive of the construct it replaces
        (`"remat2"`, `"scan"`, `"custom_jvp_call"`, `"custom_vjp_call"`), its
        kind (`"checkpoint"`, `"custom_jvp"`, `"custom_vjp"`), then
        `"call_hi_primitive"`. Policies written for a construct keep applying
        when JAX's hijax flags are on.
        """
        policies = self._policies
        if eqn.primitive is not _call_hi_primitive_p:
            return policies.get(eqn.primitive.name, self.higher_order)
        if policies:
            h = compat.hijax_params(eqn)
            for key in (h.name, h.replaces, h.kind, eqn.primitive.name):
                policy = policies.get(key)
                if policy is not None:
                    return policy
        return self.higher_order

    def process_eqn(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        """Evaluate one equation and return its outputs as a list.

        The default: the handler of `eqn.primitive` in the class's
        `dispatch_table()` (a rule of `rules`, a registered handler, or the
        built-in handling of a higher-order primitive, which follows the
        policy); else `default_rule` (re-bind the primitive).

        Args:
            eqn: the `JaxprEqn`.
            invals: the values of `eqn.invars`.

        Returns:
            One value per entry of `eqn.outvars`.
        """
        cls = type(self)
        table = (
            cls._table
            if cls._table_generation == _registry.generation()
            else cls.dispatch_table()
        )
        handler = table.get(eqn.primitive)
        if handler is not None:
            outvals = handler(self, eqn, invals)
            if type(outvals) is not list:
                outvals = self._as_outvals(eqn, outvals)
            _check_results(self, eqn, outvals, handler)
            return outvals
        if compat.is_unhandled_higher_order(eqn):
            self._check_unhandled(eqn)
        return self.default_rule(eqn, invals)

    def _check_unhandled(self, eqn: compat.JaxprEqn) -> None:
        """Refuse to re-bind a higher-order primitive no handler enters, unless
        its policy is `opaque`: this interpreter would silently not see its body.

        An interpreter that changes nothing (default `process_eqn`, no rules,
        such as `evaluate`'s) re-binds it: walking the body would give the
        same values, so re-binding is exact.
        """
        name = eqn.primitive.name
        if self._policies.get(name, self.higher_order) == "opaque":
            return
        if type(self).changes_nothing():
            return
        raise MissingRuleError(
            f"`{self.name}` cannot reach inside higher-order primitive `{name}`, "
            f"used at {source_line(eqn)}: jaxinterp has no handler for it "
            f"(JAX {compat.JAX_VERSION_STR}).\n\n"
            "To re-bind it unchanged (the interpreter then does not see its "
            f"body), pass `policies={{{name!r}: 'opaque'}}` to the interpreter; "
            "or register a handler for it with "
            f"`{type(self).__name__}.register(<the primitive>)`."
        )

    def default_rule(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        """Re-bind `eqn`'s primitive on `invals` (what `jax.core.eval_jaxpr` does).

        Eagerly (concrete operands, no effects), the primitive runs through a
        cached single-primitive `jax.jit`: the same compiled computation JAX's
        own eager dispatch uses, so results are identical, but dispatched by
        JAX's C++ fast path.
        """
        if not eqn.effects:
            fast = _eager.eager_primitive(eqn.primitive, eqn.params, invals)
            if fast is not None:
                return fast
        try:
            return compat.bind_eqn(eqn.primitive, invals, eqn.params)
        except TypeError as err:
            if not has_custom(invals):
                raise
            kinds = ", ".join(
                f"operand {k} is a `{type(v).__name__}`"
                for k, v in enumerate(invals)
                if has_custom([v])
            )
            raise CustomValueError(
                f"{eqn_context(self.name, eqn)}: no rule, so the primitive is "
                f"re-bound, but {kinds}, which JAX cannot take. "
                f"Register a rule for `{eqn.primitive.name}` in the "
                "interpreter's `rules` (or handle it in `default_rule`)."
            ) from err

    # ------------------------------------------------------------------
    # Walking.

    def eval_jaxpr(
        self, jaxpr: compat.Jaxpr, consts: Sequence[Any], *args: Any
    ) -> list[Any]:
        """Walk an open `jaxpr` on `consts` and `args`; return its outputs.

        The signature mirrors `jax.core.eval_jaxpr`. Each value is released
        after its last use.
        """
        plan = _eager.plan_for(self, jaxpr, consts, args)
        if plan is not None:
            return _eager.run_plan(self, jaxpr, plan, consts, args)
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        for v, val in zip(jaxpr.invars, args, strict=True):
            env[v] = val
        process = self.process_eqn
        contexts = compat.eqn_contexts
        # `process_in_context`, inlined: this loop runs every traced walk.
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

    def process_in_context(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        """`process_eqn` in the equation's contexts (name stack, compute
        type...), errors wrapped with the equation's context, as in a walk."""
        user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
        try:
            with user_ctx, eqn_ctx:
                outvals = self.process_eqn(eqn, invals)
        except Exception as err:
            reraise(self.name, eqn, err, details=operands_detail(invals))
        if type(outvals) is not list or len(outvals) != len(eqn.outvars):
            outvals = self._as_outvals(eqn, outvals)
        return outvals

    def eval_closed(self, closed_jaxpr: compat.ClosedJaxpr, *args: Any) -> list[Any]:
        """Walk a `ClosedJaxpr` on `args`; return its outputs as a list."""
        return self.eval_jaxpr(
            compat.open_jaxpr(closed_jaxpr), compat.jaxpr_consts(closed_jaxpr), *args
        )

    @staticmethod
    def _without_references(
        jaxpr: compat.Jaxpr, consts: Sequence[Any]
    ) -> tuple[Any, Sequence[Any]]:
        """`jaxpr` with its mutable references held as values, for a walk on
        custom values, which references (arrays only) cannot hold. `_state`
        installs the pass that does it: the pass is itself an interpreter."""
        return jaxpr, consts

    def run(self, staged: Staged, flat_args: Sequence[Any]) -> list[Any]:
        """Walk a `Staged` function on flat arguments; return flat outputs.

        Raises:
            TypeError: if `flat_args` has not one value per flat input.
        """
        if len(flat_args) != len(staged.in_avals):
            wanted = ", ".join(a.str_short() for a in staged.in_avals)
            raise TypeError(
                f"`{self.name}`: `run` of `{staged.fn_name}` takes "
                f"{len(staged.in_avals)} flat arguments ({wanted}), got "
                f"{len(flat_args)}. Flatten the arguments as staged "
                "(`jax.tree_util.tree_leaves((args, kwargs))`)."
            )
        closed = staged.closed_jaxpr
        jaxpr, consts = compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
        if has_custom(flat_args):
            jaxpr, consts = self._without_references(jaxpr, consts)
        if staged.nesting <= _recursion.SHALLOW_NESTING:
            return self.eval_jaxpr(jaxpr, consts, *flat_args)
        with _recursion.recursion_limit(_recursion.DEEP_RECURSION_LIMIT):
            return self.eval_jaxpr(jaxpr, consts, *flat_args)

    def _as_outvals(self, eqn: compat.JaxprEqn, outvals: Any) -> list[Any]:
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

    def missing(self, jaxpr: compat.Jaxpr) -> list[str]:
        """List primitives in `jaxpr` (recursively) with no rule in `rules`.

        Higher-order primitives the walker rebuilds itself are not listed.
        Interpreters whose default re-binds (like this base class) still run
        such primitives; the list is for diagnostics.
        """
        registry = self.rules if self.rules is not None else RuleRegistry(self.name)
        return registry.missing(jaxpr, handled=type(self).dispatch_table().keys())

    # ------------------------------------------------------------------
    # Helpers for higher-order handlers.

    def cached(self, key: Hashable, anchor: Any, build: Callable[[], Any]) -> Any:
        """Return a per-interpreter cached object for (`key`, `anchor`).

        `anchor` (typically a sub-Jaxpr) is kept alive with the entry and
        compared by identity, so a recycled `id` never returns a stale entry.
        An entry built before a rule or handler was registered is stale too:
        what it traced may have dispatched differently.
        """
        if not self.cache_subcalls:
            return build()
        table = type(self).dispatch_table()
        hit = self._subcalls.get(key)
        if hit is not None and hit[0] is anchor and hit[1] is table:
            return hit[2]
        value = build()
        self._subcalls.put(key, (anchor, table, value))
        return value

    def forget(self, key: Hashable) -> None:
        """Drop the cached object for `key` (one that captured a tracer of an
        enclosing trace, valid only now)."""
        self._subcalls.pop(key)


def _check_results(
    interp: Interpreter, eqn: compat.JaxprEqn, outvals: list[Any], handler: Any
) -> None:
    """Refuse a rule's or handler's array result whose shape or dtype (unless
    the interpreter `changes_dtypes`) is not its equation's: downstream it
    would be a silent wrong answer (a result broadcast, or a later equation
    blamed). Values of an interpreter's own type are its own to check."""
    for k, (v, val) in enumerate(zip(eqn.outvars, outvals, strict=False)):
        if not isinstance(val, _ARRAYS):
            continue
        aval = v.aval
        want, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
        if want is None or dtype is None:
            continue
        if tuple(val.shape) == tuple(want) and (
            interp.changes_dtypes or _same_dtype(val.dtype, dtype)
        ):
            continue
        fn = getattr(handler, "__wrapped__", handler)
        who = getattr(fn, "__qualname__", None) or repr(fn)
        got = describe_values([val])
        raise RuleError(
            f"{eqn_context(interp.name, eqn)}: its rule `{who}` returned {got} for "
            f"result {k}, where the equation's result is {aval.str_short()}.\n"
            "A rule or handler must return one value per result, of the "
            "result's shape and dtype (or a value of the interpreter's own "
            "type); an interpreter that changes dtypes on purpose sets "
            "`changes_dtypes = True`."
        )


def _same_dtype(got: Any, want: Any) -> bool:
    """Whether a result of dtype `got` is one of dtype `want` once JAX takes
    it (a NumPy float64 is a float32 without x64)."""
    if got == want:
        return True
    try:
        return jax.dtypes.canonicalize_dtype(got) == want
    except TypeError:  # (an extended dtype, such as a PRNG key's)
        return False


def _check_policy(policy: str) -> None:
    if policy not in _POLICIES:
        raise ValueError(
            f"Unknown higher-order policy {policy!r}; expected one of {_POLICIES}."
        )


def _rule_handler(rule: Callable[..., Any]) -> Handler:
    """A `rules` entry (`rule(*invals, **params)`) as a handler."""

    def handler(interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any]) -> Any:
        return rule(*invals, **eqn.params)

    handler.__wrapped__ = rule  # type: ignore[attr-defined]
    return handler


def builtin_handler(
    prim: Any, *, rebind_when_identity: bool = True
) -> Callable[[Callable[[Interpreter, Any, list[Any], str], Any]], Any]:
    """Register the built-in handling of higher-order primitive `prim` on
    `Interpreter` (for every interpreter); nothing if `prim` is `None` (a
    primitive this JAX lacks).

    The decorated function also gets the policy in force. The equation is
    re-bound (`default_rule`) without calling it under `opaque`, and under
    `recursive` for an interpreter that `changes_nothing()` (unless
    `rebind_when_identity` is false: walking the construct then does more
    than rebuild it).
    """

    def decorate(fn: Callable[[Interpreter, Any, list[Any], str], Any]) -> Any:
        def handler(
            interp: Interpreter, eqn: compat.JaxprEqn, invals: list[Any]
        ) -> Any:
            policy = interp.policy_of(eqn)
            if policy == "opaque" or (
                policy == "recursive"
                and rebind_when_identity
                and interp.rebinds()
                and not _eager.contains_hijax(eqn)
            ):
                return interp.default_rule(eqn, invals)
            return fn(interp, eqn, invals, policy)

        handler.__name__ = handler.__qualname__ = fn.__name__
        handler.__doc__ = fn.__doc__
        handler._jaxinterp_builtin = True  # type: ignore[attr-defined]
        if prim is not None:
            Interpreter.register(prim, handler)
        return fn

    return decorate


def higher_order_primitives() -> frozenset[Any]:
    """Return the higher-order primitives every interpreter can reach inside
    (the built-in handlers, and handlers registered on `Interpreter` itself)."""
    return frozenset(Interpreter.dispatch_table())
