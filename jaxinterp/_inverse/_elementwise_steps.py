"""Which equations act element by element.

An elementwise block (`_blocks.py`) is made of such equations, of its
result's shape, and a per-element block (`_perelement.py`) passes through
them besides its steps along extra axes; other parts of the engine ask the
same of the equations they walk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .. import _jax_compat as compat
from . import _traits as tr

_Literal = compat.Literal

# First-order primitives that act element by element on operands of one shape.
_ELEMENTWISE = tr.having(tr.ELEMENTWISE)

# Call-like primitives that count as elementwise when everything they run is.
# (Not `custom_vjp_call`: a block's derivative is taken in forward mode, which
# a `custom_vjp` function refuses.)
_CALLS = tr.having(tr.CALL) - tr.having(tr.CUSTOM_VJP)
_NO_FORWARD_MODE = tr.having(tr.CUSTOM_VJP)


def _scalar_broadcast(eqn: Any) -> bool:
    """A `broadcast_in_dim` of a scalar: elementwise inside a called body."""
    return eqn.primitive.name == "broadcast_in_dim" and all(
        type(v) is _Literal or not v.aval.shape for v in eqn.invars
    )


def _elementwise_call(eqn: Any) -> bool:
    if compat.construct_name(eqn) in _NO_FORWARD_MODE:
        return False
    for inner in compat.iter_eqns(_body_jaxprs(eqn)):
        if compat.construct_name(inner) in _NO_FORWARD_MODE:
            return False
        name = inner.primitive.name
        if name not in _ELEMENTWISE and name not in _CALLS:
            if not _scalar_broadcast(inner):
                return False
    return True


def _body_jaxprs(eqn: Any) -> Any:
    """A Jaxpr holding `eqn`'s bodies as equations' bodies, for `iter_eqns`."""
    return _Bodies(compat.sub_jaxprs(eqn))


class _Bodies:
    """Quacks like a Jaxpr whose `eqns` are the equations of several bodies."""

    def __init__(self, bodies: Sequence[Any]) -> None:
        self.eqns = [e for body in bodies for e in body.eqns]


def is_elementwise(eqn: Any, shape: tuple[int, ...]) -> bool:
    """Whether `eqn` maps operands of `shape` (or scalars) to results of
    `shape` element by element."""
    name = eqn.primitive.name
    if name in _CALLS:
        if not _elementwise_call(eqn):
            return False
    elif name not in _ELEMENTWISE:
        return False
    if any(v.aval.shape != shape for v in eqn.outvars):
        return False
    return all(type(v) is _Literal or v.aval.shape in (shape, ()) for v in eqn.invars)


def derivative(g: Callable[..., Any], x: Any, known: Sequence[Any]) -> Any:
    """`g'(x)`, elementwise (`g` is elementwise in `x`)."""
    return jax.jvp(lambda x_: g(x_, *known), (x,), (jnp.ones_like(x),))[1]
