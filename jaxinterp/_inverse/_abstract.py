"""Abstract interpretations of a Jaxpr: a table of rules and one walk.

Some inverse analyses evaluate a block's equations on values that are not
arrays: affine enclosures of a map over an interval (`_enclose_forms`),
quotients of polynomials, signs. Each such analysis is a `Rules` table,
a rule per primitive, and `Rules.walk` runs it: it reads each equation's
operands, calls the rule of its primitive and binds the results. A
call-like primitive (`_traits.CALL`) without a rule of its own is walked
into. A primitive without a rule raises the table's `unsupported`
exception, which names it: the analysis does not apply to that program.

Rules are keyed by primitive name, as the trait table is: several
primitives exist only in some JAX releases (`copy_p`, `pjit`), and many are
not public objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from .. import _jax_compat as compat
from . import _traits as tr

V = TypeVar("V")
# A rule: (the analysis's context, the equation, its operands' values) ->
# its results' values.
Rule = Callable[[Any, Any, list[Any]], list[Any]]


class Rules(Generic[V]):
    """The rules of one abstract interpretation, by primitive name.

    Args:
        name: the analysis, for messages.
        unsupported: the exception type raised, with the primitive's name,
            for a primitive without a rule.
        lift: the context and a constant array -> its abstract value.
        check: called with each result's `aval` before a rule runs; raises
            `unsupported` for values the analysis cannot represent.
        default: the rule of a primitive without one of its own (and not
            call-like); by default, `unsupported` is raised.
        eqns: the equations of a Jaxpr the walk takes (all, by default; an
            analysis may leave out those whose results go nowhere).
        fold: tried before the rule: the results of an equation the
            analysis computes from its operands alone (operands all known
            values, say), or `None` to go on to the rule.
    """

    def __init__(
        self,
        name: str,
        unsupported: type[Exception],
        lift: Callable[[Any, Any], V],
        check: Callable[[Any], None] | None = None,
        default: Rule | None = None,
        eqns: Callable[[Any], Sequence[Any]] | None = None,
        fold: Callable[[Any, Any, list[V]], list[V] | None] | None = None,
    ) -> None:
        self.name = name
        self.unsupported = unsupported
        self.lift = lift
        self.check = check
        self.default = default
        self.eqns = eqns or (lambda jaxpr: jaxpr.eqns)
        self.fold = fold
        self._rules: dict[str, Rule] = {}

    def register(self, *names: str) -> Callable[[Rule], Rule]:
        """A decorator registering a rule for each of `names`."""

        def decorate(rule: Rule) -> Rule:
            for name in names:
                if name in self._rules:
                    raise ValueError(f"`{self.name}` already has a rule for `{name}`.")
                self._rules[name] = rule
            return rule

        return decorate

    def each(self, rules: dict[str, Rule]) -> None:
        """Register `rules` (name -> rule)."""
        for name, rule in rules.items():
            self.register(name)(rule)

    def step(self, ctx: Any, eqn: Any, ins: list[V]) -> list[V]:
        """The abstract values of `eqn`'s results."""
        if self.fold is not None:
            folded = self.fold(ctx, eqn, ins)
            if folded is not None:
                return folded
        name = compat.construct_name(eqn)
        rule = self._rules.get(name)
        if rule is not None:
            return rule(ctx, eqn, ins)
        if tr.has(name, tr.CALL) and not tr.has(name, tr.CUSTOM_VJP):
            body, consts = call_body(eqn, self.unsupported)
            return self.walk(ctx, body, consts, ins)
        if self.default is not None:
            return self.default(ctx, eqn, ins)
        raise self.unsupported(name)

    def walk(
        self, ctx: Any, jaxpr: Any, consts: Sequence[Any], args: Sequence[V]
    ) -> list[V]:
        """The abstract values of the open `jaxpr`'s results, given its
        consts (arrays) and its inputs' abstract values."""
        env: dict[Any, V] = {}
        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = self.lift(ctx, c)
        env.update(zip(jaxpr.invars, args, strict=True))
        self.run(ctx, self.eqns(jaxpr), env)
        return [self.read(ctx, env, v) for v in jaxpr.outvars]

    def run(
        self,
        ctx: Any,
        eqns: Sequence[Any],
        env: dict[Any, V],
        outside: Callable[[Any], V] | None = None,
    ) -> None:
        """Run `eqns` (a Jaxpr's, or a stretch of them), binding their
        results' abstract values in `env`, which holds their operands';
        `outside(var)` gives an operand's that `env` does not hold."""
        for eqn in eqns:
            if self.check is not None:
                for v in eqn.outvars:
                    self.check(v.aval)
            ins = [self.read(ctx, env, v, outside) for v in eqn.invars]
            env.update(zip(eqn.outvars, self.step(ctx, eqn, ins), strict=True))

    def read(
        self,
        ctx: Any,
        env: dict[Any, V],
        v: Any,
        outside: Callable[[Any], V] | None = None,
    ) -> V:
        """The abstract value of `v`: a literal lifted, else `env`'s (or
        `outside`'s, for one `env` does not hold)."""
        if isinstance(v, compat.Literal):
            return self.lift(ctx, v.val)
        if outside is not None and v not in env:
            return outside(v)
        return env[v]


def call_body(eqn: Any, unsupported: type[Exception]) -> tuple[Any, Sequence[Any]]:
    """The open Jaxpr a call-like equation runs, and its consts; raises
    `unsupported` where it runs more than one body."""
    params = compat.params_of(eqn)
    if eqn.primitive is compat.jit_p:
        closed = compat.jit_params(params).jaxpr
        return compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
    if "call_jaxpr" in params:
        closed = compat.call_jaxpr(params)
        return compat.open_jaxpr(closed), compat.jaxpr_consts(closed)
    bodies = compat.sub_jaxprs(eqn)
    if len(bodies) != 1 or bodies[0].constvars:
        raise unsupported(compat.construct_name(eqn))
    return bodies[0], ()
