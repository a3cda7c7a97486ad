"""Whether a map is continuous in one of its inputs: an analysis of signs.

The scalar-bottleneck method (`_bottleneck.py`) solves `G(s) = s` on a grid
of `s`, which only finds every root where `G` has neither a pole nor a jump
between grid points. `continuous(closed)` proves that from the Jaxpr of
`G`: every equation that reads a value computed from `s` (a *moving* value)
must be continuous in it and finite wherever its operands are. A few
steps are so only on part of their domain, which the signs of their
operands decide: a `div` by a moving value only by a positive one (`1 +
|x|`, `exp(...)`), `log` of a positive value, `log1p` of a non-negative one,
`integer_pow` to a power >= 0, a `select_n` whose predicate moves only as a
NaN guard (`where(c == 0, nan, y / c)`, or `where(d != d, ...)`: false
wherever `d` is defined). So each value is abstracted to a `Sign`: whether
it is positive, non-negative or NaN, whether it is a `v != v` test, and
whether it moves; `RULES` holds the rules, per primitive name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ... import _jax_compat as compat
from .. import _traits as tr
from .._abstract import Rules, call_body


class Sign(NamedTuple):
    """What is known of a value of `G`'s Jaxpr."""

    positive: bool = False
    nonnegative: bool = False  # (or positive)
    nan: bool = False  # NaN everywhere
    nan_test: bool = False  # `v != v`
    moving: bool = False  # computed from `s`


class _Jump(Exception):
    """`G` may have a pole or a jump at this primitive."""


def _lift(_: Any, value: Any) -> Sign:
    """The sign of a constant (none of a traced one)."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - a traced constant: no sign
        return Sign()
    if arr.dtype.kind not in "fiu" or not arr.size:
        return Sign()
    with np.errstate(invalid="ignore"):
        nan = arr.dtype.kind == "f" and bool(np.all(np.isnan(arr)))
        return Sign(bool(np.all(arr > 0)), bool(np.all(arr >= 0)), nan)


def _live(jaxpr: Any) -> list[Any]:
    """The equations of `jaxpr` that its results depend on, in order (those
    whose results go nowhere, an ildj's `log` the formulas leave behind, do
    not count)."""
    need = {v for v in jaxpr.outvars if not isinstance(v, compat.Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in need for v in eqn.outvars) or eqn.effects:
            kept.append(eqn)
            need.update(v for v in eqn.invars if not isinstance(v, compat.Literal))
    return kept[::-1]


def _nonneg(a: Sign) -> bool:
    return a.nonnegative or a.positive


def _of(positive: bool, nonnegative: bool) -> Sign:
    return Sign(positive=positive, nonnegative=nonnegative and not positive)


def _sum_sign(eqn: Any, ins: list[Sign]) -> Sign:
    a, b = ins
    return _of(
        (a.positive and _nonneg(b)) or (_nonneg(a) and b.positive),
        _nonneg(a) and _nonneg(b),
    )


def _product_sign(eqn: Any, ins: list[Sign]) -> Sign:
    a, b = ins
    return _of(a.positive and b.positive, _nonneg(a) and _nonneg(b))


def _same_sign(eqn: Any, ins: list[Sign]) -> Sign:
    a = ins[0]
    return Sign(a.positive, a.nonnegative, a.nan)


# The sign of a primitive's one result, from its operands'.
_SIGN_OF: dict[str, Callable[[Any, list[Sign]], Sign]] = {
    **dict.fromkeys(tr.having(tr.POSITIVE), lambda eqn, ins: Sign(positive=True)),
    **dict.fromkeys(tr.having(tr.NONNEGATIVE), lambda eqn, ins: Sign(nonnegative=True)),
    **dict.fromkeys(tr.having(tr.KEEPS_SIGN), _same_sign),
    "sqrt": lambda eqn, ins: _of(ins[0].positive, True),
    "integer_pow": lambda eqn, ins: _of(False, compat.params_of(eqn)["y"] % 2 == 0),
    "add": _sum_sign,
    "max": _sum_sign,
    "mul": _product_sign,
    "div": _product_sign,
    "reduce_sum": lambda eqn, ins: _of(False, _nonneg(ins[0])),
    "ne": lambda eqn, ins: Sign(
        nan_test=eqn.invars[0] is eqn.invars[1]
        and not isinstance(eqn.invars[0], compat.Literal)
    ),
}


def _guard(eqn: Any, ins: list[Sign]) -> bool:
    # A NaN guard leaves `G` continuous where it is defined; a choice between
    # values does not.
    which, *cases = ins
    return sum(not c.nan for c in cases) <= 1 or which.nan_test


# Where a step continuous in its operands is so only on part of its domain
# (or for some params): whether it is, given its operands' signs.
_CONDITION: dict[str, Callable[[Any, list[Sign]], bool]] = {
    "div": lambda eqn, ins: not ins[1].moving or ins[1].positive,
    "integer_pow": lambda eqn, ins: compat.params_of(eqn)["y"] >= 0,
    "log1p": lambda eqn, ins: _nonneg(ins[0]),  # (softplus: `log1p(exp(-|x|))`)
    "log": lambda eqn, ins: ins[0].positive,
    "select_n": lambda eqn, ins: not ins[0].moving or _guard(eqn, ins),
    "convert_element_type": lambda eqn, ins: bool(
        jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.inexact)
    ),
}

# Continuous in every operand, finite wherever the operands are (an
# overflow to infinity aside), under `_CONDITION` where it has one.
_CONTINUOUS = tr.having(tr.CONTINUOUS, tr.COMPARE) | {"is_finite", "not", "and", "or"}


def _rule(eqn: Any, ins: list[Sign]) -> list[Sign]:
    name = compat.construct_name(eqn)
    moving = any(a.moving for a in ins)
    if moving:
        condition = _CONDITION.get(name)
        if name not in _CONTINUOUS or not (condition is None or condition(eqn, ins)):
            raise _Jump(name)
    sign = _SIGN_OF.get(name)
    out = sign(eqn, ins) if sign is not None and len(eqn.outvars) == 1 else Sign()
    return [out._replace(moving=moving)] * len(eqn.outvars)


def _default(_: Any, eqn: Any, ins: list[Sign]) -> list[Sign]:
    """A step with no rule: nothing known of its results, if it reads no
    moving value; else a possible jump (a `cond` on `s` jumps between its
    branches, a loop's count of steps may change with `s`)."""
    if any(a.moving for a in ins):
        raise _Jump(compat.construct_name(eqn))
    return [Sign()] * len(eqn.outvars)


def _call(_: Any, eqn: Any, ins: list[Sign]) -> list[Sign]:
    """A call reading a moving value is as continuous as its body; one that
    reads none computes values nothing is known of."""
    if not any(a.moving for a in ins):
        return [Sign()] * len(eqn.outvars)
    body, consts = call_body(eqn, _Jump)
    return RULES.walk(None, body, consts, ins)


RULES: Rules[Sign] = Rules("signs", _Jump, lift=_lift, default=_default, eqns=_live)
RULES.each(dict.fromkeys(_CONTINUOUS | set(_SIGN_OF), lambda _, e, ins: _rule(e, ins)))
RULES.each(dict.fromkeys(tr.having(tr.CALL) - tr.having(tr.CUSTOM_VJP), _call))


def continuous(closed: Any) -> bool:
    """Whether the closed Jaxpr's values are continuous in its first input
    and finite wherever defined (see the module's docstring)."""
    jaxpr = compat.open_jaxpr(closed)
    args: Sequence[Sign] = [Sign(moving=True)] + [Sign()] * (len(jaxpr.invars) - 1)
    try:
        RULES.walk(None, jaxpr, compat.jaxpr_consts(closed), args)
    except (_Jump, ValueError):  # (`ValueError`: a call whose body does not fit)
        return False
    return True
