"""The `inverse` transformation: dataflow engine, rules, custom inverses.

Importing this package registers every built-in inverse rule.
"""

from importlib import import_module as _import_module

from . import _control_flow as _control_flow, _rules as _rules

# Rule families written alongside; each registers into `inverse_rules`.
for _name in ("_elementwise", "_structural", "_linalg"):
    try:
        _import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _err:  # pragma: no cover - during development
        if _err.name != f"{__name__}.{_name}":
            raise
