"""Type aliases and rule Protocols shared across jaxinterp."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from ._jax_compat import array_impl_type

_ArrayImpl = array_impl_type()

# A pytree: any nesting of tuples, lists, dicts, None and registered nodes with
# array leaves. Spelled `Any` because pytrees cannot be typed precisely.
PyTree = Any


class Rule(Protocol):
    """A forward rule: operands positionally, equation params as keywords.

    It returns a list with one value per equation output, also for primitives
    with a single result.
    """

    def __call__(self, *invals: Any, **params: Any) -> Sequence[Any]: ...


class InverseRule(Protocol):
    """An inverse rule for one primitive.

    Args:
        ctx: a `jaxinterp.InverseContext`: the operands' and results' avals
            (`ctx.operand_aval(k)`), and whether the ildj is wanted
            (`ctx.want_ildj`; when false, return `0.0` for it).
        outvals: the values of the equation's outputs (all known).
        *invals: the operands, with `None` standing for each unknown one.
        **params: the equation params.

    Returns:
        `None` when the unknown operands cannot be solved for given what is
        known, or a pair `(solved, ildj)`: `solved` lists one value per operand
        (known operands may be returned as they were), and `ildj` is the
        scalar `log|det|` of the Jacobian of the map from the outputs to the
        unknown operands (`0.0` for volume-preserving maps; `None` to let the
        engine compute it with `jax.jacfwd`), or a `PieceResult`.
    """

    def __call__(
        self, ctx: Any, outvals: Sequence[Any], *invals: Any, **params: Any
    ) -> Any: ...


def is_plain(value: Any) -> bool:
    """Whether `value` is a plain array or scalar (one pytree leaf), not an
    interpreter's own value type (a dual number, an interval...)."""
    if type(value) is _ArrayImpl or isinstance(
        value, jax.Array | np.ndarray | np.generic | int | float | complex
    ):
        return True
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value))


def has_custom(values: Sequence[Any]) -> bool:
    """Whether any of `values` is an interpreter's own value, not an array."""
    for v in values:
        # (A concrete array first: `jax.Array` is an abstract base class,
        # whose `isinstance` check costs a microsecond per value.)
        if type(v) is not _ArrayImpl and not is_plain(v):
            return True
    return False
