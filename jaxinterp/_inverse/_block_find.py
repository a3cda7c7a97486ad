"""Finding a block: the region of equations one method solves at once.

When the engine is stuck, `find_block` grows a region from a known result
down through the equations it depends on, while they are elementwise (or
linear) in one unknown value, and stops at values known or shared with
other results (`grow_region`, `cut_shared`). The region's discrete choices
(`select_n` on a predicate of the unknown, `max`, `abs`) are its sites
(`sites`), which the piecewise method enumerates.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from . import _blocks as bl, _linear_parts as lp, _perelement as pe
from ._elementwise_steps import is_elementwise

_Literal = compat.Literal

# At most this many values are tried as the one unknown of an elementwise
# block whose region reaches several.
MAX_CUTS = 64


def find_block(
    top: int,
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    kind: str = bl.ELEMENTWISE,
    partly: Container[Any] = (),
) -> bl.Block | None:
    """The block ending at equation `top` (whose one result is known), or
    `None` if its unknown ancestors are not a function of one floating value
    of the kind asked for: `bl.ELEMENTWISE` (every step elementwise, of the
    result's shape, or else per-element through extra axes, see
    `_perelement.py`) or `bl.LINEAR` (every step linear in the unknown).
    `partly`: unknowns known in pieces already (a linear chain from one of
    them is a block: its single-equation rules cannot use the pieces)."""
    block = _find_block(top, eqns, producer, known, kind, partly)
    if block is None and kind == bl.ELEMENTWISE:
        block = _find_per_element_block(top, eqns, producer, known)
    return block


def _find_block(
    top: int,
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    kind: str,
    partly: Container[Any] = (),
) -> bl.Block | None:
    eqn = eqns[top]
    if len(eqn.outvars) != 1:
        return None
    y = eqn.outvars[0]
    shape = y.aval.shape
    if not jnp.issubdtype(
        y.aval.dtype, jnp.floating if kind == bl.ELEMENTWISE else jnp.inexact
    ):
        return None

    def member(e: Any) -> bool:
        if len(e.outvars) != 1:
            return False
        if kind == bl.ELEMENTWISE:
            return is_elementwise(e, shape)
        unknown = [type(v) is not _Literal and not known(v) for v in e.invars]
        return bl.is_linear(e, unknown)

    if not member(eqn):
        return None

    def grow(
        stop: Any = None, shared: frozenset[Any] = frozenset()
    ) -> tuple[set[int], set[Any]]:
        grown = grow_region([top], eqns, producer, known, member, stop, shared)
        assert grown is not None  # (no limit asked)
        return grown

    region, leaves = grow()
    if kind == bl.LINEAR and len(leaves) > 1:
        region, leaves = cut_shared(region, leaves, grow, eqns, producer, known)
    if kind == bl.ELEMENTWISE and len(leaves) > 1:
        region, leaves = cut_to_one_leaf(top, region, leaves, eqns, grow)
    if not leaves or (kind == bl.ELEMENTWISE and len(leaves) != 1):
        return None
    if not all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in leaves):
        return None
    xs = sorted(leaves, key=lambda v: producer.get(v, -1))
    if len(xs) > 1 and not independent(xs, region, eqns, producer, known):
        return None
    x = xs[0]
    if kind == bl.ELEMENTWISE and x.aval.shape != shape:
        return None
    indices = sorted(region)
    block_eqns = [eqns[i] for i in indices]
    # A chain (each unknown read once) is the single-equation rules' to
    # solve; their refusals stand (`where` with a constant mask, `x * 0`).
    chain = is_chain(block_eqns, known)
    from_pieces = False
    if chain and not (
        kind == bl.LINEAR and (len(xs) > 1 or lp.through_complex(block_eqns))
    ):
        from_pieces = kind == bl.LINEAR and any(v in partly for v in xs)
        if not from_pieces:
            return None
    known_vars: list[Any] = []
    seen: set[Any] = set()
    for inner in block_eqns:
        for v in inner.invars:
            if type(v) is not _Literal and known(v) and v not in seen:
                seen.add(v)
                known_vars.append(v)
    sites: dict[bl.Path, bl.Site] = {}
    if kind == bl.ELEMENTWISE:
        _sites(block_eqns, {x}, (), sites, {})
    linear = kind == bl.LINEAR or all(
        bl.is_linear(e, [type(v) is not _Literal and not known(v) for v in e.invars])
        for e in block_eqns
    )
    block = bl.Block(
        top, indices, block_eqns, x, y, known_vars, sites, linear, kind, [y], xs
    )
    # Several unknowns meeting in one linear step (`z + diag(d)`): a block
    # even when each is read once, if its results determine them all.
    block.chain = chain
    block.from_pieces = from_pieces
    return block


def _find_per_element_block(
    top: int,
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
) -> bl.Block | None:
    """The per-element block ending at equation `top` (whose one result is
    known and floating), or `None` if it is not one: its unknown ancestors
    through `pe.allowed` steps are one floating value `x` of the result's
    shape, and `pe.Analysis` proves each result element a function of `x`'s
    element at the same position alone."""
    eqn = eqns[top]
    if len(eqn.outvars) != 1 or not pe.allowed(eqn):
        return None
    y = eqn.outvars[0]
    shape = y.aval.shape
    if not jnp.issubdtype(y.aval.dtype, jnp.floating):
        return None

    def grow(stop: Any = None) -> tuple[set[int], set[Any]]:
        grown = grow_region([top], eqns, producer, known, pe.allowed, stop)
        assert grown is not None  # (no limit asked)
        return grown

    region, leaves = grow()
    if len(leaves) > 1:
        region, leaves = cut_to_one_leaf(top, region, leaves, eqns, grow)
    if len(leaves) != 1:
        return None
    (x,) = leaves
    if x.aval.shape != shape or not jnp.issubdtype(x.aval.dtype, jnp.floating):
        return None
    indices = sorted(region)
    block_eqns = [eqns[i] for i in indices]
    if is_chain(block_eqns, known):
        return None  # the single-equation rules' (see `_find_block`)
    analysis = pe.Analysis(shape)
    env: dict[Any, pe.Alignment] = {x: analysis.identity}
    if not analysis.run(block_eqns, env, ()) or env.get(y) != analysis.identity:
        return None
    known_vars: list[Any] = []
    for inner in block_eqns:
        for v in inner.invars:
            if type(v) is not _Literal and known(v) and v not in known_vars:
                known_vars.append(v)
    if analysis.inner_varying and all(not v.aval.shape for v in known_vars):
        # The solver would take the block for one map shared by every
        # element (its known operands are scalars) and check it once.
        return None
    sites: dict[bl.Path, bl.Site] = {}
    _sites(block_eqns, {x}, (), sites, {})
    # Cases picked along a free axis differ within one result element: the
    # piecewise method's combinations would not cover them.
    sites = {path: site for path, site in sites.items() if path in analysis.full}
    linear = all(
        bl.is_linear(e, [type(v) is not _Literal and not known(v) for v in e.invars])
        for e in block_eqns
    )
    return bl.Block(
        top, indices, block_eqns, x, y, known_vars, sites, linear, bl.ELEMENTWISE
    )


def grow_region(
    tops: Sequence[int],
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    member: Callable[[Any], bool] | None = None,
    stop: Any = None,
    shared: frozenset[Any] = frozenset(),
    max_eqns: int | None = None,
) -> tuple[set[int], set[Any]] | None:
    """The equations between the results of `tops` and the unknown values
    they depend on, and those values (the leaves), by a walk back from
    `tops`' unknown operands.

    The walk does not go past `stop`, nor past an equation that is not a
    `member` or that reads a value in `shared`: their values are leaves.
    With `max_eqns`, `None` if the region grows larger or takes in an
    equation with effects.
    """
    region = set(tops)
    leaves: set[Any] = set()
    todo = [v for t in tops for v in eqns[t].invars if _unknown(v, known)]
    while todo:
        v = todo.pop()
        p = producer.get(v)
        if p is None or v is stop:
            leaves.add(v)
            continue
        if p in region:
            continue
        inner = eqns[p]
        if (member is not None and not member(inner)) or (
            shared
            and any(type(u) is not _Literal and u in shared for u in inner.invars)
        ):
            leaves.add(v)
            continue
        region.add(p)
        if max_eqns is not None and (
            len(region) > max_eqns or getattr(inner, "effects", None)
        ):
            return None
        todo.extend(u for u in inner.invars if _unknown(u, known))
    return region, leaves


def cut_to_one_leaf(
    top: int,
    region: set[int],
    leaves: set[Any],
    eqns: Sequence[Any],
    grow: Callable[[Any], tuple[set[int], set[Any]]],
) -> tuple[set[int], set[Any]]:
    """Where several unknowns reach equation `top`'s result (the rest of the
    program feeds the block at more than one point): the region cut at the
    earliest value of the result's shape inside it that every path back
    passes through (`grow(cut)` then has that value as its one leaf), or the
    region as it was if there is none among the first `MAX_CUTS`."""
    shape = eqns[top].outvars[0].aval.shape
    for p in sorted(region)[:MAX_CUTS]:
        cut = eqns[p].outvars[0]
        if p == top or cut.aval.shape != shape:
            continue
        region, leaves = grow(cut)
        if leaves == {cut}:
            break
    return region, leaves


def cut_shared(
    region: set[int],
    leaves: set[Any],
    grow: Callable[..., tuple[set[int], set[Any]]],
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
) -> tuple[set[int], set[Any]]:
    """A linear region whose leaves depend on one another (fill-triangular of
    `x[:-n]` plus a diagonal `exp(x[-n:])`: the block grows up to `x`, which
    `exp`'s operand also reads) regrown to stop below the shared ancestors:
    its leaves are then `x[:-n]` and `exp(...)`, solved as free values and
    the rest left to the engine. The region as is when that does not help."""
    shared: set[Any] = set()
    for leaf in leaves:
        todo = [leaf]
        while todo:
            p = producer.get(todo.pop())
            if p is None:
                continue
            for u in eqns[p].invars:
                if type(u) is not _Literal and not known(u) and u not in shared:
                    shared.add(u)
                    todo.append(u)
    if not shared & leaves:
        return region, leaves
    cut_region, cut_leaves = grow(shared=frozenset(shared))
    if len(cut_leaves) > 1 and not independent(
        sorted(cut_leaves, key=lambda v: producer.get(v, -1)),
        cut_region,
        eqns,
        producer,
        known,
    ):
        return region, leaves
    return cut_region, cut_leaves


def is_chain(block_eqns: Sequence[Any], known: Callable[[Any], bool]) -> bool:
    """Whether the equations read each unknown value once: a chain, which the
    single-equation rules solve (and whose refusals stand: `where` with a
    constant mask, `x * 0`)."""
    reads = [v for e in block_eqns for v in e.invars if _unknown(v, known)]
    return len(reads) == len(set(reads))


def _unknown(v: Any, known: Callable[[Any], bool]) -> bool:
    return type(v) is not _Literal and not known(v)


def independent(
    xs: Sequence[Any],
    region: set[int] | Sequence[int],
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
) -> bool:
    """Whether no unknown of a block depends on another or on the block's own
    values (`softplus` of a diagonal taken from the block's other unknown):
    solving them as free variables would lose that link."""
    inside = {v for i in region for v in eqns[i].outvars} | set(xs)
    for x in xs:
        seen: set[Any] = set()
        todo = [x]
        while todo:
            v = todo.pop()
            p = producer.get(v)
            if p is None:
                continue
            for u in eqns[p].invars:
                if type(u) is _Literal or known(u) or u in seen:
                    continue
                if u in inside:
                    return False
                seen.add(u)
                todo.append(u)
    return True


def _sites(
    eqns: Sequence[Any],
    unknown: set[Any],
    path: bl.Path,
    found: dict[bl.Path, bl.Site],
    keys: dict[Any, Any],
) -> None:
    """Record in `found` the sites among `eqns` (and in their `jit` bodies):
    the `select_n`s whose predicate, and the `max`es, `min`s and `abs`es
    whose operands, depend on the unknown (`unknown`: the variables that
    do).

    Sites whose predicate is one value share a key, also across `jit` bodies
    (`keys` maps a body's inputs to the keys of the operands they stand for):
    the three `jnp.where(x >= 0, ...)` of a double-`where` formula pick their
    cases together.
    """
    for k, eqn in enumerate(eqns):
        here = (*path, k)
        name = eqn.primitive.name
        depends = [type(v) is not _Literal and v in unknown for v in eqn.invars]
        if name == "select_n" and depends[0]:
            which = eqn.invars[0]
            found[here] = bl.Site(keys.get(which, which), len(eqn.invars) - 1)
        elif name in ("max", "min") and any(depends):
            found[here] = bl.Site(_threshold_key(eqn, keys) or here, 2)
        elif name == "abs" and depends[0] and _floating(eqn.invars[0]):
            # `|u|` is `u` where `u >= 0`, else `-u`: two cases.
            u = eqn.invars[0]
            found[here] = bl.Site(("ge", keys.get(u, u), 0.0), 2)
        elif eqn.primitive is compat.jit_p and any(depends):
            body = compat.jit_params(eqn.params).jaxpr.jaxpr
            inner = {v for v, d in zip(body.invars, depends, strict=True) if d}
            inner_keys = {
                b: keys.get(v, v)
                for b, v in zip(body.invars, eqn.invars, strict=True)
                if type(v) is not _Literal
            }
            _sites(body.eqns, inner, here, found, inner_keys)
        if any(depends):
            unknown.update(eqn.outvars)


def _threshold_key(eqn: Any, keys: dict[Any, Any]) -> Any:
    """The key of `max(u, c)` (`min(u, c)`) with a scalar literal `c`: it
    picks `u` exactly where `u >= c` (`u <= c`), as `|u|` picks `u` where
    `u >= 0`, so that `max(x, 0) + log1p(exp(-|x|))` has one site, not two
    whose mixed cases no `x` picks."""
    u, c = eqn.invars
    if type(u) is _Literal or type(c) is not _Literal or np.ndim(c.val) != 0:
        return None
    direction = "ge" if eqn.primitive.name == "max" else "le"
    return (direction, keys.get(u, u), float(c.val))


def _floating(v: Any) -> bool:
    return jnp.issubdtype(v.aval.dtype, jnp.floating)
