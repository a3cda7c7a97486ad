"""`RuleRegistry`: one table of per-primitive rules for each transformation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, Generic, TypeVar, overload

from jax.extend import core as jex_core

from . import _jax_compat as compat
from ._errors import MissingRuleError, source_line

R = TypeVar("R", bound=Callable[..., Any])

# Bumped by every registration or removal in any registry (and of any
# interpreter's handler), so that dispatch tables built from the rules in
# force can tell they are stale.
_generation = 0


def is_builtin(handler: Any) -> bool:
    """Whether `handler` is one of jaxinterp's built-in higher-order handlers
    (`builtin_handler` marks them)."""
    return getattr(handler, "_jaxinterp_builtin", False)


def generation() -> int:
    """A counter that changes whenever any registry gains or loses a rule."""
    return _generation


def bump_generation() -> None:
    """Mark every dispatch table stale (a rule or handler was added or removed)."""
    global _generation
    _generation += 1


class RuleRegistry(Generic[R]):
    """A mapping from `jax.extend.core.Primitive` to a transformation's rule.

    A registry may extend a parent: lookups fall back to the parent, while
    registrations only ever touch the child, so a user can specialise a
    built-in table without changing it.

    Args:
        name: the transformation's name, used in error messages.
        parent: a registry whose rules this one inherits.
        qualname: how users spell the registry (`jaxinterp.inverse_rules`),
            used in the hint of `MissingRuleError`.

    Example:
        >>> from jax import lax
        >>> double_rules = RuleRegistry("double")
        >>> @double_rules.register(lax.exp_p)
        ... def _exp_double(x, **params):
        ...     return [2 * lax.exp(x)]
        >>> lax.exp_p in double_rules
        True
    """

    def __init__(
        self,
        name: str,
        parent: RuleRegistry[R] | None = None,
        *,
        qualname: str | None = None,
    ) -> None:
        self.name = name
        self.parent = parent
        self.qualname = qualname or "<registry>"
        self._rules: dict[jex_core.Primitive, R] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        parent = f", parent={self.parent.name!r}" if self.parent else ""
        return f"RuleRegistry({self.name!r}{parent}, {len(self._rules)} rules)"

    @overload
    def register(
        self, prim: jex_core.Primitive, rule: None = None, *, override: bool = False
    ) -> Callable[[R], R]: ...

    @overload
    def register(
        self, prim: jex_core.Primitive, rule: R, *, override: bool = False
    ) -> R: ...

    def register(
        self,
        prim: jex_core.Primitive,
        rule: R | None = None,
        *,
        override: bool = False,
    ) -> Any:
        """Register `rule` for `prim`; without `rule`, return a decorator.

        Args:
            prim: the primitive the rule handles.
            rule: the rule. Omit it to use `register` as a decorator.
            override: replace a rule this registry already has for `prim`.

        Returns:
            The rule (or a decorator that registers and returns it).

        Raises:
            TypeError: if `prim` is not a primitive.
            ValueError: if `prim` already has a rule here and `override` is false.
        """
        if not isinstance(prim, jex_core.Primitive):
            raise TypeError(
                f"{self.name} rules are keyed by `jax.extend.core.Primitive`, "
                f"got {type(prim).__name__}: {prim!r}."
            )

        def decorate(fn: R) -> R:
            if not callable(fn):
                raise TypeError(f"A rule must be callable, got {fn!r}.")
            with self._lock:
                if prim in self._rules and not override:
                    raise ValueError(
                        f"`{self.name}` already has a rule for primitive "
                        f"`{prim.name}`. Pass `override=True` to replace it."
                    )
                self._rules[prim] = self._adapt(fn)
                bump_generation()
            return fn

        return decorate if rule is None else decorate(rule)

    def _adapt(self, fn: R) -> R:
        """The rule to store for `fn` (subclasses adapt older rule forms)."""
        return fn

    def unregister(self, prim: jex_core.Primitive) -> None:
        """Remove this registry's own rule for `prim` (the parent is untouched).

        Raises:
            KeyError: if this registry has no rule of its own for `prim`.
        """
        with self._lock:
            if prim not in self._rules:
                raise KeyError(f"`{self.name}` has no own rule for `{prim.name}`.")
            del self._rules[prim]
            bump_generation()

    def get(self, prim: jex_core.Primitive) -> R | None:
        """Return the rule for `prim`, looking through parents, or `None`."""
        registry: RuleRegistry[R] | None = self
        while registry is not None:
            rule = registry._rules.get(prim)
            if rule is not None:
                return rule
            registry = registry.parent
        return None

    def lookup(self, eqn: Any) -> R:
        """Return the rule for `eqn.primitive`.

        Raises:
            MissingRuleError: if neither this registry nor a parent has one.
        """
        rule = self.get(eqn.primitive)
        if rule is None:
            prim = eqn.primitive
            raise MissingRuleError(
                f"`{self.name}` has no rule for primitive `{prim.name}`, used at "
                f"{source_line(eqn)}.\nRegister one with "
                f"`@{self.qualname}.register({_prim_expr(prim)})`."
            )
        return rule

    def __contains__(self, prim: object) -> bool:
        return self.get(prim) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[jex_core.Primitive]:
        seen: set[jex_core.Primitive] = set()
        registry: RuleRegistry[R] | None = self
        while registry is not None:
            for prim in list(registry._rules):
                if prim not in seen:
                    seen.add(prim)
                    yield prim
            registry = registry.parent

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def primitives(self) -> frozenset[jex_core.Primitive]:
        """Return every primitive with a rule here or in a parent."""
        return frozenset(self)

    def missing(
        self, jaxpr: Any, *, handled: Collection[jex_core.Primitive] = ()
    ) -> list[str]:
        """List the primitives in `jaxpr` (and its sub-jaxprs) that have no rule.

        Args:
            jaxpr: a `Jaxpr` or `ClosedJaxpr`.
            handled: primitives to treat as covered even without a rule (for
                example those a walker handles itself).

        Returns:
            The sorted, de-duplicated primitive names without a rule.
        """
        names: set[str] = set()
        for eqn in iter_eqns(jaxpr):
            prim = eqn.primitive
            if prim not in handled and self.get(prim) is None:
                names.add(prim.name)
        return sorted(names)


iter_eqns = compat.iter_eqns


def _prim_expr(prim: jex_core.Primitive) -> str:
    """Spell `prim` as the user would import it, when JAX exports it."""
    import jax.extend.core.primitives as jex_prims
    from jax import lax

    attr = f"{prim.name}_p"
    if getattr(lax, attr, None) is prim:
        return f"lax.{attr}"
    if getattr(jex_prims, attr, None) is prim:
        return f"jax.extend.core.primitives.{attr}"
    return "<your primitive>"
