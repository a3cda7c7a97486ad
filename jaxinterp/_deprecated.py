"""Public names renamed in 0.2.0: each warns, then calls its new name.

Deprecated in 0.2.0, removed in 0.3.0: deleting this module (and its imports
in `__init__.py` and docs/api.md) removes them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from ._eval._api import eval_closed_jaxpr
from ._inverse._rules import register_binary_inverse, register_elementwise_inverse


def _renamed(new: Callable[..., Any], old: str, why: str) -> Callable[..., Any]:
    """`new` under its old name `old`, warning with `DeprecationWarning`."""

    @functools.wraps(new)
    def alias(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"`jaxinterp.{old}` is deprecated in 0.2.0, removed in 0.3.0: "
            f"use `jaxinterp.{new.__name__}`, which takes the same arguments.",
            DeprecationWarning,
            stacklevel=2,
        )
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = (
        f"Deprecated alias of `{new.__name__}`.\n\n"
        f"Deprecated in 0.2.0, removed in 0.3.0: {why} Warns with "
        "`DeprecationWarning`."
    )
    return alias


register_elementwise = _renamed(
    register_elementwise_inverse,
    "register_elementwise",
    "it registers an *inverse* rule, which the new name says.",
)
register_binary = _renamed(
    register_binary_inverse,
    "register_binary",
    "it registers an *inverse* rule, which the new name says.",
)
eval_jaxpr = _renamed(
    eval_closed_jaxpr,
    "eval_jaxpr",
    "it shared its name, but not its signature, with "
    "`Interpreter.eval_jaxpr(jaxpr, consts, *args)`.",
)
