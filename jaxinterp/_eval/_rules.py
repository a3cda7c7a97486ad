"""The `evaluate` rule table.

Empty by default: evaluation re-binds every primitive. Users may register
rules here to change how `evaluate` treats a primitive of their own.
"""

from __future__ import annotations

from .._custom_types import Rule
from .._registry import RuleRegistry

eval_rules: RuleRegistry[Rule] = RuleRegistry(
    "evaluate", qualname="jaxinterp.eval_rules"
)
"""Forward rules of `evaluate`: `rule(*invals, **params) -> list` per primitive."""
