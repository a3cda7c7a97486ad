"""The `JaxinterpError` family and the helpers that make messages cite user code."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NoReturn

import jax
from jax.extend import source_info_util

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames inside jaxinterp are never "the user's line".
source_info_util.register_exclusion(_PACKAGE_DIR)


class JaxinterpError(Exception):
    """Base class of every error jaxinterp raises on user input."""


class MissingRuleError(JaxinterpError, NotImplementedError):
    """A transformation met a primitive for which it has no rule."""


class NotInvertibleError(JaxinterpError, ValueError):
    """`inverse` could not recover an input from the outputs."""


class RuleError(JaxinterpError, RuntimeError):
    """A rule raised while a transformation processed one equation.

    The original exception is kept as `__cause__`.
    """


class CustomValueError(JaxinterpError, TypeError):
    """A value of an interpreter's own type (a dual number, an interval) went
    where the walk cannot take it: a loop carry or `cond` output the
    interpreter cannot `lift`, or a loop condition that is not a plain
    boolean."""


class StagingError(JaxinterpError, TypeError):
    """A function could not be staged, or was called with arguments that do
    not match what was staged."""


def source_line(eqn: Any) -> str:
    """Return the user's source line of `eqn` as `file.py:42 (fn)`, or `unknown`."""
    info = getattr(eqn, "source_info", None)
    if info is None:
        return "an unknown location"
    try:
        text = source_info_util.summarize(info)
    except Exception:  # defensive: summarize must never mask the real error
        return "an unknown location"
    return text or "an unknown location"


def describe_aval(aval: Any) -> str:
    """Describe an abstract value by dtype and shape, as `f32[3,4]`."""
    try:
        return str(aval.str_short(short_dtypes=True))
    except TypeError:
        return str(aval.str_short())


def describe_value(value: Any) -> str:
    """Describe a value by dtype and shape, as `f32[3,4]` or `f32[] (Python float)`."""
    aval = getattr(value, "aval", None)
    if aval is not None and hasattr(aval, "str_short"):
        return describe_aval(aval)
    if isinstance(value, bool | int | float | complex):
        try:
            aval = jax.typeof(value)
        except (TypeError, OverflowError):
            return f"Python {type(value).__name__}"
        return f"{describe_aval(aval)} (Python {type(value).__name__})"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{dtype}[{','.join(map(str, shape))}]"
    if value is None:
        return "unknown"
    return type(value).__name__


def describe_values(values: Sequence[Any]) -> str:
    """Describe several values, comma separated."""
    return ", ".join(describe_value(v) for v in values) or "no operands"


def eqn_context(transform: str, eqn: Any) -> str:
    """Return the opening clause most messages share."""
    return (
        f"`{transform}` at primitive `{eqn.primitive.name}`, used at {source_line(eqn)}"
    )


def reraise(
    transform: str,
    eqn: Any,
    err: BaseException,
    *,
    doing: str = "",
    details: str = "",
) -> NoReturn:
    """Raise `err` in the context of `eqn`: the one place rule failures are wrapped.

    A `JaxinterpError` (already explained to the user) goes through as it is;
    any other exception becomes a `RuleError` naming the transformation, the
    primitive and the user's line, with `err` kept as `__cause__`.

    Call it from an `except Exception as err:` clause around a rule, a
    handler or `process_eqn`: `reraise(self.name, eqn, err, details=...)`.

    Args:
        transform: the transformation's name, for the message.
        eqn: the equation being processed.
        err: the exception caught.
        doing: what was being done, as `"the inverse rule"` (default: the
            equation's processing).
        details: a sentence to append (operands, results).
    """
    if isinstance(err, JaxinterpError):
        raise err
    subject = f", {doing}" if doing else ""
    tail = f"\n\n{details}" if details else ""
    raise RuleError(
        f"{eqn_context(transform, eqn)}{subject} raised "
        f"{type(err).__name__}: {err}{tail}"
    ) from err


def operands_detail(values: Sequence[Any], label: str = "Operands") -> str:
    """`Operands: f32[3], f32[]`: the `details` most rule failures give."""
    return f"{label}: {describe_values(values)}."
