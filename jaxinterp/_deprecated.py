"""Public names renamed in 0.2: each warns, then calls its new name.

They go in the next release; deleting this module (and its imports in
`__init__.py` and docs/api.md) removes them.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._custom_types import InverseRule
from ._eval._api import eval_closed_jaxpr
from ._inverse._rules import (
    Solve,
    inverse_rules,
    register_binary_inverse,
    register_elementwise_inverse,
)
from ._registry import RuleRegistry


def _warn_renamed(old: str, new: str) -> None:
    warnings.warn(
        f"`jaxinterp.{old}` is deprecated since 0.2, removed in the next release: "
        f"use `jaxinterp.{new}`, which takes the same arguments.",
        DeprecationWarning,
        stacklevel=3,
    )


def register_elementwise(
    prim: Any,
    inverse_fn: Solve,
    log_abs_dinv: Solve | None = None,
    *,
    registry: RuleRegistry[InverseRule] = inverse_rules,
    override: bool = False,
    pass_params: bool = False,
) -> InverseRule:
    """Deprecated alias of `register_elementwise_inverse`.

    Deprecated since 0.2, removed in the next release: it registers an
    *inverse* rule, which the new name says. Warns with `DeprecationWarning`.
    """
    _warn_renamed("register_elementwise", "register_elementwise_inverse")
    return register_elementwise_inverse(
        prim,
        inverse_fn,
        log_abs_dinv,
        registry=registry,
        override=override,
        pass_params=pass_params,
    )


def register_binary(
    prim: Any,
    solve_lhs: Solve | None,
    solve_rhs: Solve | None,
    *,
    log_abs_dlhs: Solve | None = None,
    log_abs_drhs: Solve | None = None,
    registry: RuleRegistry[InverseRule] = inverse_rules,
    override: bool = False,
) -> InverseRule:
    """Deprecated alias of `register_binary_inverse`.

    Deprecated since 0.2, removed in the next release: it registers an
    *inverse* rule, which the new name says. Warns with `DeprecationWarning`.
    """
    _warn_renamed("register_binary", "register_binary_inverse")
    return register_binary_inverse(
        prim,
        solve_lhs,
        solve_rhs,
        log_abs_dlhs=log_abs_dlhs,
        log_abs_drhs=log_abs_drhs,
        registry=registry,
        override=override,
    )


def eval_jaxpr(closed_jaxpr: Any, *args: Any) -> list[Any]:
    """Deprecated alias of `eval_closed_jaxpr`.

    Deprecated since 0.2, removed in the next release: it shared its name, but
    not its signature, with `Interpreter.eval_jaxpr(jaxpr, consts, *args)`.
    Warns with `DeprecationWarning`.
    """
    _warn_renamed("eval_jaxpr", "eval_closed_jaxpr")
    return eval_closed_jaxpr(closed_jaxpr, *args)
