"""Value numbering: which values of a Jaxpr are one computation written twice.

`jnp.sum(x * x)` written in a numerator and again in a divisor gives two
equations, and two variables, for one value. A block that takes such values
as unknowns (`_normalized.py`'s projective block) would count it twice and
find too few results to solve for both. `ValueNumbers` gives each value a
number; two values get the same one only when their equations have one
primitive, equal params and operands that are, in turn, the same: the same
variable of the Jaxpr's inputs or constants, the same literal (compared by
dtype, shape and bytes, so `0.0` and `-0.0` differ) or values numbered alike.
Anything it cannot compare exactly is its own value: an equation with
effects or a stateful random primitive, a param that is not plain data (a
Jaxpr, a sharding: kept by identity), a literal whose value cannot be read.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .. import _jax_compat as compat
from . import _traits as tr

_Literal = compat.Literal

# Primitives whose results differ between two equations with the same
# operands (a hidden RNG state) although they declare no effects.
_STATEFUL = tr.having(tr.STATEFUL)


class ValueNumbers:
    """Numbers the values of a Jaxpr's equations so that one computation,
    written several times, gets one number.

    Args:
        eqns: the Jaxpr's equations.
        producer: the index in `eqns` of the equation producing each variable.
    """

    def __init__(self, eqns: Sequence[Any], producer: dict[Any, int]) -> None:
        self._eqns = eqns
        self._producer = producer
        # Variables are keys by identity; a `Literal` never is (it is not
        # hashable on every JAX release).
        self._numbers: dict[Any, int] = {}
        self._table: dict[Hashable, int] = {}

    def number(self, v: Any) -> int:
        """The number of `v` (a variable or a literal)."""
        if type(v) is _Literal:
            return self._intern(_literal_key(v))
        numbers, producer, eqns = self._numbers, self._producer, self._eqns
        todo = [v]
        while todo:
            a = todo[-1]
            if a in numbers:
                todo.pop()
                continue
            p = producer.get(a)
            if p is None:
                numbers[a] = self._intern(("var", a))
                todo.pop()
                continue
            eqn = eqns[p]
            if not _comparable(eqn):
                for k, o in enumerate(eqn.outvars):
                    numbers[o] = self._intern(("eqn", p, k))
                todo.pop()
                continue
            waiting = [
                u for u in eqn.invars if type(u) is not _Literal and u not in numbers
            ]
            if waiting:
                todo.extend(waiting)
                continue
            ins = tuple(
                self._intern(_literal_key(u)) if type(u) is _Literal else numbers[u]
                for u in eqn.invars
            )
            base = (eqn.primitive, _params_key(compat.params_of(eqn)), ins)
            for k, o in enumerate(eqn.outvars):
                numbers[o] = self._intern((*base, k, _aval_key(o)))
            todo.pop()
        return numbers[v]

    def same(self, a: Any, b: Any) -> bool:
        """Whether `a` and `b` are one computation of the same inputs."""
        return self.number(a) == self.number(b)

    def _intern(self, key: Hashable) -> int:
        return self._table.setdefault(key, len(self._table))


def _comparable(eqn: Any) -> bool:
    """Whether two equations like `eqn` with the same operands give the same
    results."""
    return not getattr(eqn, "effects", None) and eqn.primitive.name not in _STATEFUL


def _aval_key(v: Any) -> Hashable:
    aval = v.aval
    return (
        tuple(getattr(aval, "shape", ())),
        str(getattr(aval, "dtype", "")),
        bool(getattr(aval, "weak_type", False)),
    )


def _literal_key(v: Any) -> Hashable:
    """A literal by value: its type, dtype, shape and bytes (never hashing
    the `Literal` itself)."""
    try:
        arr = np.asarray(v.val)
        return ("literal", _aval_key(v), str(arr.dtype), arr.shape, arr.tobytes())
    except Exception:  # a value NumPy cannot read: only itself
        return ("literal id", id(v))


def _params_key(params: dict[str, Any]) -> Hashable:
    return tuple((name, _param_key(params[name])) for name in sorted(params))


def _param_key(value: Any) -> Hashable:
    """A param as plain data (with its type, so `1`, `1.0` and `True`
    differ), or by identity when it is not plain data."""
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, np.dtype):
        return ("dtype", value.str, value.name)
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    if isinstance(value, enum.Enum):
        return ("enum", type(value), value.name)
    if type(value) in (tuple, list) or (
        isinstance(value, tuple) and hasattr(value, "_fields")
    ):
        return (type(value), tuple(_param_key(a) for a in value))
    if isinstance(value, frozenset):
        keys = [_param_key(a) for a in value]
        return ("frozenset", frozenset(keys))
    return ("id", id(value))
