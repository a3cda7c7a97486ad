"""`explain_inverse`: a readable report of how `inverse` treats each equation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from .. import _jax_compat as compat
from .._errors import JaxinterpError, source_line
from .._state import functionalize
from .._trace import check_callable, normalize_argnums, spec_of, stage
from . import _refusals as rf
from ._engine import BLOCKING, FORWARD, INVERTED, UNUSED, InverseWalker

_MARKS = {
    INVERTED: "inverted",
    FORWARD: "forward ",
    BLOCKING: "BLOCKING",
    UNUSED: "unused  ",
}


class _Names:
    """Short names for jaxpr variables: a, b, ..., z, ba, bb, ..."""

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}

    def __call__(self, v: Any) -> str:
        if type(v) is compat.Literal:
            return str(v.val)
        if type(v) is compat.DropVar:
            return "_"
        name = self._names.get(v)
        if name is None:
            n, letters = len(self._names), ""
            while True:
                letters = chr(ord("a") + n % 26) + letters
                n //= 26
                if n == 0:
                    break
            name = self._names[v] = letters
        return name

    def typed(self, v: Any) -> str:
        if type(v) is compat.Literal:
            return str(v.val)
        return f"{self(v)}:{v.aval.str_short(short_dtypes=True)}"


def _report(
    fn_name: str, unknown: Sequence[int], mask: list[bool], jaxpr: Any, sol: Any
) -> str:
    """`explain_inverse`'s report of the solution `sol` of `jaxpr` (`mask`:
    which of its inputs are unknown)."""
    names = _Names()
    lines = [
        f"explain_inverse: {fn_name} with unknown arguments {list(unknown)}",
        "  inputs:  "
        + ", ".join(
            f"{names.typed(v)} ({'unknown' if m else 'known'})"
            for v, m in zip(jaxpr.invars, mask, strict=True)
        ),
        "  outputs: " + ", ".join(names.typed(v) for v in jaxpr.outvars),
    ]
    # (The equations solved: implicit broadcasts written out, `_implicit.py`.)
    for i, eqn in enumerate(sol.jaxpr.eqns):
        state = sol.status[i]
        outs = " ".join(names.typed(v) for v in eqn.outvars)
        ins = " ".join(names(v) for v in eqn.invars)
        line = f"  [{_MARKS[state]}] {outs} = {eqn.primitive.name} {ins}"
        method = sol.methods.get(i)
        if method is not None:
            line += f"  ({method})"
        if state == BLOCKING:
            line += f"\n      at {source_line(eqn)}: {sol.reasons[i]}"
            line += "".join(f"\n        {t}" for t in rf.tried_lines(sol, i))
        lines.append(line)
    missing = [
        k
        for k, (val, m) in enumerate(zip(sol.invals, mask, strict=True))
        if m and val is None
    ]
    if missing:
        what = ", ".join(
            f"input {k} ({jaxpr.invars[k].aval.str_short(short_dtypes=True)})"
            for k in missing
        )
        lines.append(f"NOT invertible: {what} cannot be recovered.")
    else:
        lines.append("Invertible: every unknown input is recovered.")
    return "\n".join(lines)


def explain_inverse(
    fn: Callable[..., Any],
    *example_args: Any,
    argnums: int | Sequence[int] | None = None,
) -> str:
    """Return a report of how `inverse` would invert `fn` on these arguments.

    Each top-level equation of `fn`'s Jaxpr is marked `inverted` (solved
    backwards), `forward` (computed from known values), `BLOCKING` (its
    results are known but its unknown operands cannot be solved for; the
    user's source line and the reason follow) or `unused`. An inverted
    equation that is not solved by its own formula says how it was solved:
    `(piecewise)`, `(piecewise by intervals)` or `(elementwise solve)` for
    the equations of an elementwise block (one unknown used several times, or
    a formula chosen by a predicate of the unknown), `(sequential solve)` for
    a triangular map of one unknown solved level by level, `(scalar
    bottleneck solve)` for a map that reaches its result through one number
    computed from all of its unknown (a planar flow, a map onto a ball),
    `(linear solve)`
    / `(symmetric solve)` for a linear block, `(normalization)` for a value
    divided by a function of itself and pinned by elements no unknown
    reaches, `(projective solve)` for a ratio of affine maps, `(clamp)` for a
    clamp inverted on its unsaturated range, `(by branch)` for a `cond`
    whose index is computed from a whole vector of unknowns, solved once
    per branch.

    Args:
        fn: the function.
        *example_args: all of `fn`'s positional arguments (arrays or
            `jax.ShapeDtypeStruct`s), unknown and known ones alike.
        argnums: the unknown arguments; all by default.

    Returns:
        The report, one line per equation, ending with a verdict.

    Example:
        >>> report = jaxinterp.explain_inverse(
        ...     lambda x: jnp.sum(jnp.exp(x)), jnp.ones(3))
        >>> print(report.splitlines()[-1])
        NOT invertible: input 0 (f32[3]) cannot be recovered.
    """
    check_callable(fn, "explain_inverse")
    n = len(example_args)
    if argnums is None:
        unknown = tuple(range(n))
    else:
        unknown = normalize_argnums(argnums, n, what="`explain_inverse`: argnums")
    staged = stage(fn, *example_args)
    # What `inverse` solves: mutable references (and `scan` under
    # `jax_scan3`) made pure first.
    jaxpr, consts = functionalize(staged.jaxpr, staged.consts)
    mask: list[bool] = []
    for i, arg in enumerate(example_args):
        mask.extend([i in unknown] * len(jtu.tree_leaves(arg)))
    walker = InverseWalker()
    out_specs = [spec_of(a) for a in staged.out_avals]
    in_specs = [spec_of(a) for a in staged.in_avals]
    result: dict[str, Any] = {}

    def run(ys: list[Any], xs: list[Any]) -> list[Any]:
        invals = [None if m else x for x, m in zip(xs, mask, strict=True)]
        result["solution"] = walker.solve(
            jaxpr, consts, invals, ys, strict=False, complete=True
        )
        return []

    try:
        # (NumPy's warnings of the analyses, as in `inverse`.)
        with compat.classic_scan(), np.errstate(all="ignore"):
            jax.make_jaxpr(run)(out_specs, in_specs)
    except JaxinterpError as err:
        return f"explain_inverse: the analysis itself failed: {err}"
    return _report(staged.fn_name, unknown, mask, jaxpr, result["solution"])
