"""The `inverse` transformation: dataflow engine, rules, custom inverses.

Importing this package registers every built-in inverse rule: each rule
module registers its own rules into `inverse_rules` when imported, and all of
them are imported here, so a missing or renamed module fails loudly.
"""

from . import (
    _cholesky as _cholesky,
    _control_flow as _control_flow,
    _elementwise as _elementwise,
    _fft as _fft,
    _linalg as _linalg,
    _loops as _loops,
    _rules as _rules,
    _sharded as _sharded,
    _structural as _structural,
)
