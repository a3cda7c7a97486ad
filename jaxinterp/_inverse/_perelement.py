"""Per-element blocks: elementwise maps written through extra axes.

An elementwise block (`_blocks.py`) uses only elementwise primitives of its
result's shape. Bijector libraries write maps whose result element `i`
depends only on the unknown's element `i` but pass through extra axes: a
rational-quadratic spline picks each element's bin with a one-hot mask
(`x[:, None]` compared with knots of shape `[n, K]`), multiplies the mask
with known parameters `[n, K, 3]` and sums over the bin axis.

`_block_find.find_block` finds such a block, and this module proves it
*per-element*: it tracks, for each value in the block, which of its axes
are **aligned** with the result's axes (they index the unknown's element)
and which are **free** (added by `broadcast_in_dim`, combined with known
operands, then reduced away, sliced or squeezed). A value is per-element
when each of its elements depends only on the unknown's element at the
aligned position. The invariant, for a value `v` with alignment `a` (one
entry per axis of `v`: a result axis or `None`):

- each result axis appears at most once in `a`, along an axis of the
  result's size; a result axis missing from `a` has size 1;
- `v[idx]` depends only on `x[p(idx)]`, where `p(idx)[j] = idx[k]` for
  `a[k] = j` (0 for a missing axis).

When the block's result has the unknown's alignment, `y = g(x)` elementwise,
and the elementwise methods (piecewise, elementwise solve, `block_ildj`'s
forward-mode derivative: the Jacobian is diagonal) apply as they are.

Anything not proved stays out: an aligned axis reduced, sliced, reversed,
reshaped or broadcast from size 1; two unknown operands with different
alignments; a primitive not listed below. The piecewise method keeps only
the sites (`select_n` predicates, `max`, `min`) of the result's shape and
alignment; cases picked along a free axis are left to the interval method
(`_intervals.py`) and the solver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import _jax_compat as compat
from . import _elementwise_steps as ew, _traits as tr

_Literal = compat.Literal

# An alignment: per axis of a value, the result axis it indexes, or `None`.
Alignment = tuple[int | None, ...]

# Elementwise primitives (operands of the result's rank, size-1 axes
# broadcast, or scalars), besides `_elementwise_steps`'s.
_ELEMENTWISE = tr.having(tr.ELEMENTWISE, tr.TOTAL_ORDER)
_REDUCE = tr.having(tr.REDUCE)
_SHAPE = tr.having(tr.ALONG_AXES) | {"reshape", "concatenate"}
# Lookups into a known table at per-element positions: each result element
# reads the table at an index taken from one element (or one index vector)
# of the unknown operand. `SearchSorted` is `jnp.searchsorted` (a hijax
# primitive from JAX 0.12; earlier releases stage its comparisons).
_LOOKUPS = tr.having(tr.LOOKUP)
_ALLOWED = _ELEMENTWISE | _REDUCE | _SHAPE | _LOOKUPS


def allowed(eqn: Any) -> bool:
    """Whether `eqn` may join a per-element block (checked further by
    `Analysis`): a listed primitive, a `jit` of such, or a call that is
    elementwise (`_elementwise_steps.is_elementwise`)."""
    if len(eqn.outvars) != 1:
        return False
    name = eqn.primitive.name
    if eqn.primitive is compat.jit_p:
        body = compat.jit_params(eqn.params).jaxpr.jaxpr
        reach = set(body.invars)  # what may read the unknown
        for e in body.eqns:
            if any(type(v) is not _Literal and v in reach for v in e.invars):
                if not allowed(e):
                    return False
                reach.update(e.outvars)
        return True
    if compat.construct_name(eqn) in _LOOKUPS:
        return True
    if name in ew._CALLS:
        shape = eqn.outvars[0].aval.shape
        return ew.is_elementwise(eqn, shape)
    return name in _ALLOWED


def _params(eqn: Any) -> dict[str, Any]:
    return compat.params_of(eqn)


def _elementwise(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
    """The result's alignment of an elementwise equation whose unknown
    operands have alignments `ins` (`None`: known)."""
    out = eqn.outvars[0].aval.shape
    found: Alignment | None = None
    for v, a in zip(eqn.invars, ins, strict=True):
        if a is None:
            continue
        shape = v.aval.shape
        if len(shape) != len(out):
            return None  # an unknown scalar broadcast over the result
        for k, (n, m) in enumerate(zip(shape, out, strict=True)):
            if n != m and (n != 1 or a[k] is not None):
                return None  # an aligned axis broadcast from size 1
        if found is None:
            found = a
        elif found != a:
            return None
    return found


def _broadcast(eqn: Any, a: Alignment) -> Alignment | None:
    if len(eqn.invars) != 1:
        return None
    dims = tuple(_params(eqn).get("broadcast_dimensions", ()))
    shape_in = eqn.invars[0].aval.shape
    shape_out = eqn.outvars[0].aval.shape
    out: list[int | None] = [None] * len(shape_out)
    for k, m in enumerate(dims):
        if shape_in[k] != shape_out[m]:
            if a[k] is not None:
                return None
            continue
        out[m] = a[k]
    return tuple(out)


def _reduce(eqn: Any, a: Alignment) -> Alignment | None:
    axes = {int(k) for k in _params(eqn).get("axes", ())}
    if any(a[k] is not None for k in axes):
        return None
    return tuple(j for k, j in enumerate(a) if k not in axes)


def _squeeze(eqn: Any, a: Alignment) -> Alignment | None:
    rank = len(a)
    dims = {int(k) % rank for k in _params(eqn).get("dimensions", ())}
    if any(a[k] is not None for k in dims):
        return None
    return tuple(j for k, j in enumerate(a) if k not in dims)


def _slice(eqn: Any, a: Alignment) -> Alignment | None:
    p = _params(eqn)
    shape = eqn.invars[0].aval.shape
    starts = p.get("start_indices", ())
    limits = p.get("limit_indices", ())
    strides = p.get("strides") or (1,) * len(shape)
    for k, j in enumerate(a):
        full = starts[k] == 0 and limits[k] == shape[k] and strides[k] == 1
        if j is not None and not full:
            return None
    return a


def _reshape(eqn: Any, a: Alignment) -> Alignment | None:
    """Only size-1 axes added or removed, and those free."""
    if _params(eqn).get("dimensions") is not None or len(eqn.invars) != 1:
        return None
    shape_in = eqn.invars[0].aval.shape
    shape_out = eqn.outvars[0].aval.shape
    big_in = [k for k, n in enumerate(shape_in) if n != 1]
    big_out = [m for m, n in enumerate(shape_out) if n != 1]
    if [shape_in[k] for k in big_in] != [shape_out[m] for m in big_out]:
        return None
    if any(a[k] is not None for k, n in enumerate(shape_in) if n == 1):
        return None
    out: list[int | None] = [None] * len(shape_out)
    for k, m in zip(big_in, big_out, strict=True):
        out[m] = a[k]
    return tuple(out)


def _transpose(eqn: Any, a: Alignment) -> Alignment | None:
    perm = tuple(int(k) for k in _params(eqn).get("permutation", ()))
    return tuple(a[k] for k in perm)


def _rev(eqn: Any, a: Alignment) -> Alignment | None:
    dims = {int(k) for k in _params(eqn).get("dimensions", ())}
    return None if any(a[k] is not None for k in dims) else a


def _gather(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
    """A known operand read at unknown indices, one element per index vector
    (no offset dims): the result has the indices' batch axes (all but the
    last, the index vector, which must be free)."""
    if len(ins) != 2 or ins[0] is not None or ins[1] is None:
        return None
    numbers = _params(eqn).get("dimension_numbers")
    if numbers is None or tuple(getattr(numbers, "offset_dims", (0,))):
        return None
    a = ins[1]
    if not a or a[-1] is not None:
        return None
    if eqn.outvars[0].aval.shape != eqn.invars[1].aval.shape[:-1]:
        return None
    return a[:-1]


def _searchsorted(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
    """`jnp.searchsorted(known, query)`: one index per query element."""
    if len(ins) != 2 or ins[0] is not None or ins[1] is None:
        return None
    if eqn.outvars[0].aval.shape != eqn.invars[1].aval.shape:
        return None
    return ins[1]


def _concatenate(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
    """Along a free axis, unknown operands sharing one alignment."""
    dim = int(_params(eqn).get("dimension", -1))
    found = {a for a in ins if a is not None}
    if len(found) != 1:
        return None
    (a,) = found
    return a if a[dim] is None else None


# The rule of each primitive: `(eqn, operands' alignments) -> the result's
# alignment`, or `None` where it is not per-element.
Rule = Callable[[Any, Sequence[Alignment | None]], Alignment | None]


def _one_operand(
    rule: Callable[[Any, Alignment], Alignment | None],
) -> Rule:
    def aligned(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
        return rule(eqn, ins[0]) if len(ins) == 1 and ins[0] is not None else None

    return aligned


def _elementwise_call(eqn: Any, ins: Sequence[Alignment | None]) -> Alignment | None:
    if not ew.is_elementwise(eqn, eqn.outvars[0].aval.shape):
        return None
    return _elementwise(eqn, ins)


_RULES: dict[str, Rule] = {
    **{
        name: _one_operand(rule)
        for name, rule in {
            "broadcast_in_dim": _broadcast,
            "squeeze": _squeeze,
            "slice": _slice,
            "reshape": _reshape,
            "transpose": _transpose,
            "rev": _rev,
            **dict.fromkeys(_REDUCE, _reduce),
        }.items()
    },
    "concatenate": _concatenate,
    **dict.fromkeys(_ELEMENTWISE, _elementwise),
    **dict.fromkeys(ew._CALLS, _elementwise_call),
    "SearchSorted": _searchsorted,
    "gather": _gather,
}


class Analysis:
    """The alignments of a block's values, and the paths (as `Block.run`
    numbers equations) of equations whose result has the result's shape and
    alignment."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.identity: Alignment = tuple(range(len(shape)))
        self.full: set[tuple[int, ...]] = set()
        self.inner_varying = False

    def valid(self, v: Any, a: Alignment) -> bool:
        """The invariant of the module's docstring, for `v`'s alignment."""
        shape = v.aval.shape
        seen = [j for j in a if j is not None]
        if len(seen) != len(set(seen)):
            return False
        if any(j is not None and shape[k] != self.shape[j] for k, j in enumerate(a)):
            return False
        return all(n == 1 for j, n in enumerate(self.shape) if j not in seen)

    def run(
        self, eqns: Sequence[Any], env: dict[Any, Alignment], path: tuple[int, ...]
    ) -> bool:
        """Align `eqns` in order (`env`: the unknown values' alignments, the
        rest known); whether every step is per-element."""
        for k, eqn in enumerate(eqns):
            here = (*path, k)
            ins = [None if type(v) is _Literal else env.get(v) for v in eqn.invars]
            if all(a is None for a in ins):
                continue  # known: reads no unknown
            outs = self.step(eqn, ins, here)
            if outs is None:
                return False
            for v, a in zip(eqn.outvars, outs, strict=True):
                if not self.valid(v, a):
                    return False
                env[v] = a
            if all(
                a == self.identity and v.aval.shape == self.shape
                for v, a in zip(eqn.outvars, outs, strict=True)
            ):
                self.full.add(here)
        return True

    def step(
        self, eqn: Any, ins: Sequence[Alignment | None], here: tuple[int, ...]
    ) -> list[Alignment] | None:
        name = eqn.primitive.name
        if eqn.primitive is compat.jit_p:
            body = compat.jit_params(eqn.params).jaxpr.jaxpr
            inner = {
                b: a for b, a in zip(body.invars, ins, strict=True) if a is not None
            }
            if not self.run(body.eqns, inner, here):
                return None
            outs = [None if type(v) is _Literal else inner.get(v) for v in body.outvars]
            if any(a is None for a in outs):
                return None  # a result that reads no unknown: left out
            return [a for a in outs if a is not None]
        construct = compat.construct_name(eqn)
        rule = _RULES.get(construct if construct in _LOOKUPS else name)
        if len(eqn.outvars) != 1 or rule is None:
            return None
        got = rule(eqn, ins)
        if got is not None and len(here) > 1:
            self._note_inner_known(eqn, ins, got)
        return None if got is None else [got]

    def _note_inner_known(
        self, eqn: Any, ins: Sequence[Alignment | None], got: Alignment
    ) -> None:
        """Note a known array made inside a body (`jnp.arange`) that varies
        along an aligned axis: the block is then a different map for each
        element even when its known operands are scalars."""
        lookup = eqn.primitive.name == "gather" or (
            compat.construct_name(eqn) == "SearchSorted"
        )
        for v, a in zip(eqn.invars, ins, strict=True):
            if a is not None or type(v) is _Literal:
                continue
            shape = v.aval.shape
            if lookup and any(n > 1 for n in shape):
                self.inner_varying = True
            elif len(shape) == len(got) and any(
                n > 1 and got[k] is not None for k, n in enumerate(shape)
            ):
                self.inner_varying = True
