"""`Env`, the values of Jaxpr variables during a walk, and release plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _caches, _jax_compat as compat

_Literal = compat.Literal
_DropVar = compat.DropVar
_Var = compat.Var


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
_release_plans = _caches.Cache(4096, weak=True)


def release_plan(jaxpr: compat.Jaxpr) -> list[tuple[Any, ...]]:
    """For each equation of `jaxpr`, the variables whose last use it is.

    A result no equation uses is released right after the equation that
    computes it, an input no equation uses after the first equation. Outputs
    of the jaxpr are never released. Computed once per jaxpr.
    """
    cached = _release_plans.get(jaxpr)
    if cached is not None:
        return cached
    eqns = jaxpr.eqns
    plan = last_uses(
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
    return _release_plans.put(jaxpr, plan)


def last_uses(
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
            if isinstance(v, _Var):  # not a literal (or a value put on the device)
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
