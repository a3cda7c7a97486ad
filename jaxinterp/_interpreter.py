"""The walkers: `Env`, `Interpreter` (forwards) and `BackwardWalker`."""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal as TypingLiteral

from . import _jax_compat as compat
from ._custom_types import PyTree
from ._errors import (
    JaxinterpError,
    RuleError,
    describe_value,
    describe_values,
    eqn_context,
)
from ._registry import RuleRegistry
from ._trace import Staged, check_callable, stage_flat

Policy = TypingLiteral["opaque", "recursive", "inline"]
_POLICIES = ("opaque", "recursive", "inline")
# Deep enough for 100+ nested `jit`s: each level adds a few walker frames on
# top of JAX's own tracing frames.
_RECURSION_LIMIT = 12_000

_Literal = compat.Literal
_DropVar = compat.DropVar


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


def release_plan(jaxpr: Any) -> list[tuple[Any, ...]]:
    """For each equation of `jaxpr`, the variables whose last use it is.

    A result no equation uses is released right after the equation that
    computes it. Outputs of the jaxpr are never released. Computed once per
    jaxpr.
    """
    cached = _release_plans.get(jaxpr)
    if cached is not None:
        return cached
    keep = {v for v in jaxpr.outvars if type(v) is not _Literal}
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if type(v) is not _Literal:
                last[v] = i
        for v in eqn.outvars:
            if type(v) is not _DropVar:
                last[v] = i  # moved on by a later use
    # Most equations release nothing or one value: share the empty tuple and
    # allocate only for equations that do release.
    buckets: dict[int, list[Any]] = {}
    for v, i in last.items():
        if v not in keep:
            bucket = buckets.get(i)
            if bucket is None:
                buckets[i] = [v]
            else:
                bucket.append(v)
    plan: list[tuple[Any, ...]] = [()] * len(jaxpr.eqns)
    for i, bucket in buckets.items():
        plan[i] = tuple(bucket)
    with _release_lock:
        _release_plans[jaxpr] = plan
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
    `custom_jvp_call`, `custom_vjp_call`, `closed_call`, `shard_map`) follow a
    policy, chosen per interpreter and per primitive:

    * `"recursive"` (default): interpret the sub-Jaxprs with this
      interpreter and rebuild the same construct (a `jit` stays a `jit`,
      compiled once and cached; a `scan` stays a `scan`...);
    * `"opaque"`: re-bind the primitive unchanged, as `jax.core.eval_jaxpr`;
    * `"inline"` (call-like primitives only: `jit`, `closed_call`,
      `checkpoint`, `custom_jvp_call`, `custom_vjp_call`): interpret the body
      in place, dropping the construct (and any custom derivative rule).

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
            policy = self._policies.get(eqn.primitive.name, self.higher_order)
            if policy != "opaque":
                return handler(self, eqn, invals, policy)
        return self.default_rule(eqn, invals)

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
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        for v, val in zip(jaxpr.invars, args, strict=True):
            env[v] = val
        process = self.process_eqn
        contexts = compat.eqn_contexts
        for eqn, dead in zip(jaxpr.eqns, release_plan(jaxpr), strict=True):
            invals = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
            user_ctx, eqn_ctx = contexts(eqn)
            try:
                with user_ctx, eqn_ctx:
                    outvals = process(eqn, invals)
            except JaxinterpError:
                raise
            except Exception as err:
                raise self._rule_error(eqn, invals, err) from err
            outvars = eqn.outvars
            if type(outvals) is not list or len(outvals) != len(outvars):
                outvals = self._as_outvals(eqn, outvals)
            for v, val in zip(outvars, outvals, strict=True):
                if type(v) is not _DropVar:
                    env[v] = val
            for v in dead:
                del env[v]
        return [v.val if type(v) is _Literal else env[v] for v in jaxpr.outvars]

    def eval_closed(self, closed_jaxpr: Any, *args: Any) -> list[Any]:
        """Walk a `ClosedJaxpr` on `args`; return its outputs as a list."""
        return self.eval_jaxpr(
            compat.open_jaxpr(closed_jaxpr), compat.jaxpr_consts(closed_jaxpr), *args
        )

    def run(self, staged: Staged, flat_args: Sequence[Any]) -> list[Any]:
        """Walk a `Staged` function on flat arguments; return flat outputs."""
        with compat.recursion_limit(_RECURSION_LIMIT):
            return self.eval_closed(staged.closed_jaxpr, *flat_args)

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

    def _rule_error(self, eqn: Any, invals: list[Any], err: Exception) -> RuleError:
        return RuleError(
            f"{eqn_context(self.name, eqn)}, raised "
            f"{type(err).__name__}: {err}\n\n"
            f"Operands: {describe_values(invals)}."
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
            # Staging deeply nested `jit`s needs as much stack as walking them.
            with compat.recursion_limit(_RECURSION_LIMIT):
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


def _check_policy(policy: str) -> None:
    if policy not in _POLICIES:
        raise ValueError(
            f"Unknown higher-order policy {policy!r}; expected one of {_POLICIES}."
        )


# Handlers for higher-order primitives, filled in by `_higher_order`.
# handler(interpreter, eqn, invals, policy) -> list of outputs.
_higher_order_handlers: dict[Any, Callable[..., list[Any]]] = {}


def register_higher_order(prim: Any) -> Callable[[Callable[..., Any]], Any]:
    """Register the walker's built-in handling of a higher-order primitive."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if prim is not None:
            _higher_order_handlers[prim] = fn
        return fn

    return decorate


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
            except JaxinterpError:
                raise
            except Exception as err:
                raise RuleError(
                    f"{eqn_context(self.name, eqn)}, raised "
                    f"{type(err).__name__}: {err}\n\nOutputs: {describe_values(outs)}."
                ) from err
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
