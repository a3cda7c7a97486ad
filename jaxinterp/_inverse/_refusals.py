"""Checks and refusals of the inverse engine (see `_engine.py`).

The messages of `NotInvertibleError`s the engine raises (an unknown input
left over, a principal-branch choice meeting a second constraint, a chosen
branch a map may not produce) and the NaN counts behind `nan_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from .._env import Env
from .._errors import NotInvertibleError, source_line
from . import _blocks as bl, _branches as br
from ._dataflow import SolverOrigin
from ._rules import describe_elements

if TYPE_CHECKING:
    from ._dataflow import Solution

# Built-in rules that return NaN for elements the outputs leave undetermined
# at run time (see `_rules.undetermined`), and the constructs that may hold
# them. A `custom_inverse` (a `jit` with a marked name) is the user's own.
UNDETERMINED_NAN = frozenset(
    {
        "select_n",
        "gather",
        "mul",
        "div",
        "pow",
        "scan",
        "while",
        "convert_element_type",
        "triangular_solve",
    }
    | br.BRANCH_AWARE
)


def may_leave_undetermined(eqn: compat.JaxprEqn) -> bool:
    """Whether `eqn`'s rule may return NaN for elements left undetermined."""
    if eqn.primitive.name not in UNDETERMINED_NAN:
        return False
    if eqn.primitive is compat.jit_p:
        return "__custom_inverse_" not in compat.jit_params(eqn.params).name
    return True


def nan_checks(
    eqn: compat.JaxprEqn, outs: Sequence[Any], solved: Sequence[tuple[int, Any]]
) -> list[tuple[Any, str]]:
    """For `strict` inversion: per solved floating operand, how many of its
    elements the step made NaN (0 when a result is NaN already), and what to
    say if that is not 0."""
    given = [o for o in outs if o is not None and jnp.issubdtype(o.dtype, jnp.inexact)]
    if given:
        clean = ~jnp.any(jnp.stack([jnp.any(jnp.isnan(o)) for o in given]))
    else:
        clean = jnp.bool_(True)
    found = []
    for k, val in solved:
        if not jnp.issubdtype(jnp.result_type(val), jnp.inexact):
            continue
        count = jnp.where(clean, jnp.sum(jnp.isnan(val), dtype=jnp.int32), 0)
        aval = eqn.invars[k].aval.str_short()
        what = f"`{eqn.primitive.name}`"
        if eqn.primitive is compat.jit_p:
            what = f"`jit` of `{compat.jit_params(eqn.params).name}`"
        found.append(
            (
                count,
                f"{what} at {source_line(eqn)}: the outputs do not "
                f"determine {{count}} element(s) of operand {k} ({aval}), which "
                "would come back as NaN",
            )
        )
    return found


def disagreement(agreements: Sequence[tuple[Any, Any]], k: int, val: Any) -> str:
    """What to say when a second constraint fails: which ones there were."""
    where = []
    for _, origin in agreements[:3]:
        if isinstance(origin, tuple):
            where.append(f"output {origin[1]} (also given by another output)")
        else:
            where.append(f"`{origin.primitive.name}` at {source_line(origin)}")
    more = f" and {len(agreements) - 3} more" if len(agreements) > 3 else ""
    return (
        f"the outputs constrain some values twice ({', '.join(where)}{more}) and "
        f"disagree: no preimage, so all {{count}} element(s) of input {k} "
        f"({compat.aval_of(val).str_short()}) would come back as NaN"
    )


def block_nan_checks(
    block: bl.Block, method: str, env: Env, x_val: Any
) -> list[tuple[Any, str]]:
    """For `strict` inversion: how many elements a block made NaN from
    NaN-free results (no preimage, or two), and what to say if not 0."""
    given = [env[v] for v in block.ys]
    clean = (
        ~jnp.any(jnp.stack([jnp.any(jnp.isnan(y)) for y in given]))
        if given
        else jnp.asarray(True)
    )
    values = x_val if len(block.xs) > 1 else [x_val]
    count = sum(jnp.sum(jnp.isnan(v), dtype=jnp.int32) for v in values)
    count = jnp.where(clean, count, 0)
    top = block.eqns[block.indices.index(block.top)]
    what = ", ".join(v.aval.str_short() for v in block.xs)
    return [
        (
            count,
            f"the block of equations ending at `{top.primitive.name}` at "
            f"{source_line(top)} ({method}): {{count}} element(s) of {what} "
            "have no single preimage (a result outside the image, or a map "
            "that takes it more than once) and would come back as NaN",
        )
    ]


def uncovered(v: Any, have: Sequence[Any]) -> np.ndarray:
    """The elements of `v` that none of the pieces `have` covers."""
    covered = np.zeros(v.aval.shape, dtype=bool)
    for piece in have:
        covered[piece.index()] = True
    return ~covered


def reason(err: Exception) -> str:
    """Why a rule refused, as one clause for `Solution.reasons`."""
    text = (getattr(err, "detail", None) or str(err)).strip().rstrip(".")
    return text or type(err).__name__


def chooser_kind(origin: Any) -> str:
    """Which equation made a choice: `enclosing` (outside this Jaxpr), `inside`
    (in the body of a call-like equation), `rounding` or `own`."""
    if origin is None:
        return "enclosing"
    if isinstance(origin, SolverOrigin):
        return "solver"
    if origin.primitive.name in br.BRANCH_AWARE or origin.primitive.name in br.LOOPS:
        return "inside"
    if origin.primitive.name in br.ROUNDING:
        return "rounding"
    return "own"


def branch_clash(eqn: compat.JaxprEqn, origin: Any, v: Any) -> NotInvertibleError:
    """The error for a principal-branch choice meeting a second constraint."""
    kind = chooser_kind(origin)
    if kind == "enclosing":
        chose = "an enclosing equation chose a principal branch for it"
    else:
        at = f"`{origin.primitive.name}` at {source_line(origin)}"
        chose = {
            "inside": f"a map inside {at} is not injective and its rule picks one "
            "preimage (its principal branch)",
            "rounding": f"{at} rounds its operand to a narrower floating type, so "
            "its rule picks one of many preimages",
            "own": f"{at} is not injective and its rule picks one preimage (its "
            "principal branch)",
            "solver": f"the numerical solver for the elementwise block ending at "
            f"{at} returns one preimage, and the map may not be injective",
        }[kind]
    return NotInvertibleError(
        f"`inverse` cannot recover a value of type {v.aval.str_short()} "
        f"consistently: {chose}, but the outputs also constrain that value "
        f"through `{eqn.primitive.name}` at {source_line(eqn)}, which the chosen "
        "branch may contradict. Drop the redundant output, or give the function "
        "a `@jaxinterp.custom_inverse`."
    )


def check_image(
    eqn: compat.JaxprEqn,
    ins: Sequence[Any],
    result_branches: Sequence[br.Interval | None],
    chooser: dict[Any, Any],
) -> None:
    """Refuse to solve `eqn` backwards from a chosen branch it may not produce."""
    if eqn.primitive.name in br.BRANCH_AWARE:
        return  # the rule passes the intervals on to the body it inverts
    img = br.image(eqn, ins)
    for v, b in zip(eqn.outvars, result_branches, strict=True):
        if b is None or b is br.ROUNDED:
            continue
        if img is not None and br.contains(img, b):
            continue
        origin: Any = chooser.get(v)
        kind = chooser_kind(origin)
        if kind == "enclosing":
            chose = "an enclosing equation's principal branch"
        else:
            at = f"`{origin.primitive.name}` at {source_line(origin)}"
            chose = {
                "inside": f"a principal branch chosen inside {at}",
                "solver": f"the preimage the numerical solver found for {at}",
            }.get(kind, f"the principal branch of {at}")
        can = (
            f"whose results lie in {br.describe(img)}"
            if img is not None
            else "whose image jaxinterp does not know"
        )
        raise NotInvertibleError(
            f"`inverse` cannot solve `{eqn.primitive.name}` at {source_line(eqn)} "
            f"backwards: its result {v.aval.str_short()} comes from {chose}, "
            f"which lies in {br.describe(b)}, and `{eqn.primitive.name}` "
            f"({can}) may not produce such a value, so the chosen branch may "
            "have no preimage. Give the function a `@jaxinterp.custom_inverse`."
        )


def known_summary(eqn: compat.JaxprEqn, ins: list[Any]) -> str:
    """Which operands of `eqn` are known, e.g. `operand 0 f32[3] known`."""
    parts = []
    for k, (v, val) in enumerate(zip(eqn.invars, ins, strict=True)):
        state = "known" if val is not None else "unknown"
        parts.append(f"operand {k} {v.aval.str_short()} {state}")
    return ", ".join(parts)


def tried_lines(solution: Solution, i: int) -> list[str]:
    """What each method that looked at blocked equation `i` said, one line
    each (leaving out a reason the equation's own line gives)."""
    own = solution.reasons.get(i)
    return [
        f"tried as {title}: {reason}"
        for title, reason in solution.tried.get(i, {}).items()
        if reason != own
    ]


def not_invertible_error(
    jaxpr: compat.Jaxpr, solution: Solution, missing: Sequence[int]
) -> NotInvertibleError:
    """Build the `NotInvertibleError` for unknown inputs `missing` of `jaxpr`."""
    names = ", ".join(
        f"input {k} ({jaxpr.invars[k].aval.str_short()})" for k in missing
    )
    lines = []
    for i, reason in sorted(solution.reasons.items()):
        eqn = jaxpr.eqns[i]
        lines.append(f"  `{eqn.primitive.name}` at {source_line(eqn)}: {reason}.")
        name = eqn.primitive.name
        lines += [f"  `{name}` {line}." for line in tried_lines(solution, i)]
    if lines:
        prims = ", ".join(
            f"`{jaxpr.eqns[i].primitive.name}`" for i in sorted(solution.reasons)
        )
        detail = f"Blocked at {prims}.\n\n" + "\n".join(lines)
    else:
        detail = (
            "No equation could be solved backwards for them: the outputs do not "
            "determine these inputs (is an input unused, or reduced away?)."
        )
    partial = []
    for v, mask in solution.uncovered:
        if v in jaxpr.invars:
            what = f"input {jaxpr.invars.index(v)}"
        else:
            what = f"an intermediate value {v.aval.str_short()}"
        partial.append(
            f"  {what}: the outputs determine some elements but not "
            f"{describe_elements(mask)}."
        )
    if partial and not lines:
        detail = "The outputs determine only some of its elements:\n" + "\n".join(
            partial
        )
    elif partial:
        detail += "\n\nPartly recovered:\n" + "\n".join(partial)
    err = NotInvertibleError(
        f"`inverse` cannot recover {names} from the outputs. {detail}\n"
        "Register a rule with `@jaxinterp.inverse_rules.register(...)`, or give "
        "the function a `@jaxinterp.custom_inverse`."
    )
    # For an enclosing equation's message: what blocked, without the advice.
    err.detail = f"{names} cannot be recovered. {detail}"  # type: ignore[attr-defined]
    return err


def piece_checks(st: Any, v: Any, value: Any, i: int) -> list[tuple[Any, str]]:
    """The NaN checks of elements of `v` solved by equation `i` of the engine
    state `st`: after a completion, as for a whole value, a NaN solved there
    may come from the value chosen for discarded elements."""
    if not (st.completed and st.options.nan_checks):
        return []
    eqn: Any = st.eqns[i]
    k = next((j for j, u in enumerate(eqn.invars) if u is v), None)
    if k is None or not jnp.issubdtype(v.aval.dtype, jnp.inexact):
        return []
    return nan_checks(eqn, [], [(k, jnp.asarray(value))])
