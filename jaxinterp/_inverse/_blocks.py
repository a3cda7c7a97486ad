"""Elementwise blocks: what `inverse` does when no single equation can be solved.

The engine solves one equation at a time. A map like softsign, `x / (1 + |x|)`,
uses its unknown twice, so neither `div` nor `add` can be solved alone; a
numerically stable sigmoid, `where(x >= 0, 1 / (1 + exp(-x)), ...)`, chooses a
formula by a predicate of the unknown, which `select_n`'s rule cannot know.
When the engine is stuck, it looks for a *block*: a known result `y` whose
unknown ancestors are all elementwise operations (of the same shape as `y`) of
one unknown value `x`. Then `y = g(x)` elementwise, and it is solved:

- **piecewise**, exactly: for each combination of the cases the block's
  `select_n`s (with a predicate that depends on `x`), `max`es, `min`s and
  `abs`es (`u` or `-u`) can take, the block with those cases fixed is
  inverted by the engine (formulas only, a linear-fractional case too:
  softsign's `x / (1 +- x)`); an element keeps the candidate whose
  predicates select the cases it was solved with, else (a threshold's jump
  hidden by rounding) the one with the most predicates agreeing. The answer
  must map back to `y`: else NaN (`y` outside the image); two candidates
  apart by more than rounding: NaN (the map is not injective there).
  `max(u, c)`, `min(u, c)` and `|u|` split at one threshold are one site,
  and a predicate computed by `|`, `&`, `~` from others follows them.
- **piecewise by intervals** (`_intervals.py`), exactly, when the cases
  are too many to enumerate or a case is a quotient of quadratics (a
  spline's bin): the block is one formula between consecutive breakpoints
  of its comparisons, solved in the interval that holds the answer.
- **elementwise solve**, numerically (`_solve.py`), when neither applies.
  The solver returns one preimage, so the engine treats it like a
  principal-branch choice: a second constraint on `x` is refused.

The block's ildj is `-sum(log|g'(x)|)`, `g'` by forward-mode differentiation.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Container, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import (
    _enclose,
    _linear_parts as lp,
    _nonsquare,
    _perelement as pe,
    _solve,
    _table,
    _turning,
)
from ._elementwise_steps import (
    _ELEMENTWISE,
    _body_jaxprs,
    _scalar_broadcast,
    is_elementwise,
)

_Literal = compat.Literal

# Methods, as `explain_inverse` names them.
PIECEWISE = "piecewise"
ELEMENTWISE_SOLVE = "elementwise solve"
LINEAR_SOLVE = "linear solve"
SYMMETRIC_SOLVE = "symmetric solve"

# Kinds of block.
ELEMENTWISE = "elementwise"
LINEAR = "linear"

# The most unknowns a linear block is solved for densely (its matrix has
# this many squared entries).
MAX_LINEAR = 2048

# At most this many case combinations are tried by the piecewise method.
MAX_CASES = 16

# At most this many values are tried as the one unknown of an elementwise
# block whose region reaches several.
_MAX_CUTS = 64


# Steps linear in their unknown operands whichever they are, and the
# conditions on the others (`unknown`: one flag per operand).
_LINEAR: dict[str, Callable[[Sequence[bool]], bool]] = {
    **{
        name: lambda unknown: True
        for name in (
            "add sub add_any neg reshape transpose squeeze expand_dims "
            "broadcast_in_dim slice concatenate rev pad reduce_sum cumsum copy "
            "copy_p split real imag conj complex fft"
        ).split()
    },
    "mul": lambda unknown: sum(unknown) == 1,
    "dot_general": lambda unknown: sum(unknown) == 1,
    "div": lambda unknown: unknown[0] and not unknown[1],
    "select_n": lambda unknown: not unknown[0],
    "dynamic_slice": lambda unknown: not any(unknown[1:]),
    "dynamic_update_slice": lambda unknown: not any(unknown[2:]),
    "gather": lambda unknown: not any(unknown[1:]),
    # Known indices: the result is the operand with the updates written
    # (`scatter`) or added (`scatter-add`) at fixed places.
    "scatter": lambda unknown: not unknown[1],
    "scatter-add": lambda unknown: not unknown[1],
}


def is_linear(eqn: Any, unknown: Sequence[bool]) -> bool:
    """Whether `eqn`'s results are an affine function of its unknown operands
    (`unknown`: one flag per operand) over the reals, all of a floating or
    complex type (complex values count as pairs of reals: `fft`, `real`,
    `imag`, `conj`, `complex` and products with known complex values are
    linear steps)."""
    if not all(_inexact(v) for v in eqn.outvars):
        return False
    name = eqn.primitive.name
    if name == "convert_element_type":
        return all(_inexact(v) for v in eqn.invars)
    if eqn.primitive is compat.jit_p:
        body = compat.jit_params(eqn.params).jaxpr.jaxpr
        inner = {v for v, u in zip(body.invars, unknown, strict=True) if u}
        for e in body.eqns:
            flags = [type(v) is not _Literal and v in inner for v in e.invars]
            if any(flags):
                if not is_linear(e, flags):
                    return False
                inner.update(e.outvars)
        return True
    check = _LINEAR.get(name)
    return check is not None and check(unknown)


def _inexact(v: Any) -> bool:
    return bool(jnp.issubdtype(v.aval.dtype, jnp.inexact))


@dataclasses.dataclass
class Site:
    """A place where the block picks a case by a value of the unknown."""

    key: Any  # sites with one key (one `select_n` predicate) agree
    n_cases: int


# Where an equation sits: its position in the block, then in each `jit` body.
Path = tuple[int, ...]


@dataclasses.dataclass
class Block:
    """`y = g(x, *known)`: the equations `eqns` (in program order), elementwise.

    `jit` equations in the block (`jnp.where` and `jnp.clip` are jitted
    functions) are evaluated body by body, so that their cases are sites too.
    """

    top: int  # index of the equation producing `y`
    indices: list[int]  # indices of `eqns` in the Jaxpr
    eqns: list[Any]
    x: Any
    y: Any
    known: list[Any]  # the known variables the block reads
    sites: dict[Path, Site]
    linear: bool  # whether every step is linear in the unknown
    kind: str  # ELEMENTWISE or LINEAR
    # Every known result the block solves from (a linear block may end at
    # several equations); `y` is the first.
    ys: list[Any] = dataclasses.field(default_factory=list)
    # Every unknown the block solves for (a linear block may have several);
    # `x` is the first. `run` takes one value per unknown when there are
    # several.
    xs: list[Any] = dataclasses.field(default_factory=list)
    # Unknowns of a linear block partly known already (from pieces): their
    # known value (zeros elsewhere) and the flat indices still unknown.
    partial: dict[Any, tuple[Any, np.ndarray]] = dataclasses.field(default_factory=dict)
    # Values inside a linear block known in parts (a slice of them passed
    # to the results): their known value (zeros elsewhere) and the flat
    # indices known, more results to solve from (see `_linear_parts.py`).
    parts: dict[Any, tuple[Any, np.ndarray]] = dataclasses.field(default_factory=dict)
    # Whether each unknown is read once (a linear block of several unknowns
    # only: see `_nonsquare.determined`).
    chain: bool = False
    # A chain that is a block only because its unknown is known in pieces
    # (`find_block`'s `partly`): solved only if its matrix is a constant of
    # full column rank (else its results may not determine the elements
    # left, which another path may give).
    from_pieces: bool = False

    def __post_init__(self) -> None:
        if not self.ys:
            self.ys = [self.y]
        if not self.xs:
            self.xs = [self.x]

    def merge(self, other: Block) -> Block:
        """The linear block solving from both blocks' results (one unknown)."""
        order = sorted(set(self.indices) | set(other.indices))
        by_index = dict(zip(self.indices, self.eqns, strict=True))
        by_index.update(zip(other.indices, other.eqns, strict=True))
        known = list(self.known) + [v for v in other.known if v not in self.known]
        xs = list(self.xs) + [v for v in other.xs if v not in self.xs]
        merged = Block(
            self.top,
            order,
            [by_index[i] for i in order],
            self.x,
            self.y,
            known,
            {},
            True,
            LINEAR,
            [*self.ys, *other.ys],
            xs,
            {**self.partial, **other.partial},
            {**self.parts, **other.parts},
        )
        merged.ys = [*self.ys, *other.ys]  # may be empty (known in parts)
        return merged

    def run(
        self,
        x: Any,
        known: Sequence[Any],
        choice: dict[Any, int] | None = None,
        selected: dict[Any, Any] | None = None,
    ) -> dict[Any, Any]:
        """Evaluate the block: the values of its variables. With `choice`, the
        sites take those cases; with `selected`, each site's key is mapped to
        which case its predicate picks (an int32 array)."""
        env: dict[Any, Any] = (
            dict(zip(self.xs, x, strict=True)) if len(self.xs) > 1 else {self.x: x}
        )
        env.update(zip(self.known, known, strict=True))
        self._run(self.eqns, env, (), choice, selected, shape=_shape_of(x))
        return env

    def discrete(self, x: Any, known: Sequence[Any], kinks: bool = False) -> Any:
        """The block's discrete choices at `x` (elementwise): per element of
        `x`, a row of numbers that changes wherever the map may jump (see
        `_turning.choices_of`, and its `kinks`); shape `(*x.shape, k)`, `k`
        possibly 0."""
        steps: list[tuple[Any, list[Any], list[Any]]] = []
        env: dict[Any, Any] = {self.x: x}
        env.update(zip(self.known, known, strict=True))
        self._run(self.eqns, env, (), None, None, steps, shape=_shape_of(x))
        return _turning.choices_of(steps, jnp.shape(x), kinks)

    def _run(
        self,
        eqns: Sequence[Any],
        env: dict[Any, Any],
        path: Path,
        choice: dict[Any, int] | None,
        selected: dict[Any, Any] | None,
        steps: list[tuple[Any, list[Any], list[Any]]] | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        # (`shape`: the unknown's shape in this run; where it is not the one
        # the block was traced at, a scalar broadcast to that one is
        # broadcast to it instead: `_replays_at_any_shape`.)
        traced_at = tuple(self.x.aval.shape)

        def at_shape(v: Any) -> tuple[int, ...]:
            # A value of the elements' shape has the unknown's shape now.
            have = tuple(v.aval.shape)
            return shape if shape is not None and have == traced_at else have

        def read(v: Any) -> Any:
            return v.val if type(v) is _Literal else env[v]

        for k, eqn in enumerate(eqns):
            ins = [read(v) for v in eqn.invars]
            here = (*path, k)
            site = self.sites.get(here)
            if site is not None and selected is not None:
                selected.setdefault(site.key, (eqn.primitive.name, ins))
            if site is not None and choice is not None:
                if eqn.primitive.name == "abs":
                    picked = ins[0] if choice[site.key] == 0 else -ins[0]
                else:
                    offset = 1 if eqn.primitive.name == "select_n" else 0
                    # (A scalar operand of `max` stands for the whole result.)
                    picked = ins[choice[site.key] + offset]
                outs = [jnp.broadcast_to(picked, at_shape(eqn.outvars[0]))]
            elif eqn.primitive is compat.jit_p or _reshaped_call(eqn, ins):
                # (`_reshaped_call`: a `custom_jvp` call, its body there.)
                body: Any = (
                    compat.jit_params(eqn.params).jaxpr
                    if eqn.primitive is compat.jit_p
                    else compat.custom_jvp_body(eqn)
                )
                consts = body.consts
                if shape is not None and shape != traced_at:
                    # (Replayed at another shape: a constant of the
                    # elements' shape holding one value, `_uniform`, as the
                    # scalar.)
                    consts = [
                        _as_scalar(c) if tuple(jnp.shape(c)) == traced_at else c
                        for c in consts
                    ]
                inner = dict(zip(body.jaxpr.constvars, consts, strict=True))
                inner.update(zip(body.jaxpr.invars, ins, strict=True))
                self._run(
                    body.jaxpr.eqns, inner, here, choice, selected, steps, shape=shape
                )
                outs = [
                    v.val if type(v) is _Literal else inner[v]
                    for v in body.jaxpr.outvars
                ]
            elif _scalar_broadcast(eqn) and at_shape(eqn.outvars[0]) != tuple(
                eqn.outvars[0].aval.shape
            ):
                outs = [jnp.broadcast_to(ins[0], at_shape(eqn.outvars[0]))]
            else:
                user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
                with user_ctx, eqn_ctx:
                    if (
                        eqn.primitive is lax.div_p
                        and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating)
                        and any(compat.is_jvp_tracer(v) for v in ins)
                    ):
                        # (Only where it is differentiated, as the solver's
                        # `jax.jvp` does; elsewhere the plain `div`: a
                        # `custom_jvp` evaluated on constants under `vmap`
                        # stages on older JAX.)
                        outs = [_solve.quotient(*ins)]
                    else:
                        outs = compat.bind_eqn(eqn.primitive, ins, eqn.params)
                if steps is not None:
                    steps.append((eqn, ins, list(outs)))
            env.update(zip(eqn.outvars, outs, strict=True))

    def g(self, x: Any, *known: Any) -> Any:
        return self.run(x, known)[self.y]


def _shape_of(x: Any) -> tuple[int, ...] | None:
    """The shape of a block's unknown (`None` for several unknowns)."""
    return None if isinstance(x, (list, tuple)) else tuple(jnp.shape(x))


def _reshaped_call(eqn: Any, ins: Sequence[Any]) -> bool:
    """Whether `eqn` is a `custom_jvp` call replayed on operands of another
    shape than it was traced at (the solver's later tiers on the elements it
    gathers): its body, elementwise (`_replays_at_any_shape`), runs equation
    by equation there, differentiated as written rather than by the call's
    rule (the same values; the rule is for the derivative's rounding at
    extremes, and the solver's roots are checked by value). Elsewhere the
    call is bound whole, its rule kept (the implicit function theorem's
    slope at the answer)."""
    return compat.custom_jvp_body(eqn) is not None and any(
        tuple(jnp.shape(v)) != tuple(var.aval.shape)
        for v, var in zip(ins, eqn.invars, strict=True)
    )


def _picks(name: str, ins: Sequence[Any], case: int) -> Any:
    """Where a piecewise equation with operands `ins` picks `case` (NaN
    picks no case of `|u|`)."""
    if name == "select_n":
        which = ins[0]
        if which.dtype == jnp.bool_:
            return which if case else ~which
        return which == case
    if name == "abs":
        (u,) = ins
        return u >= 0 if case == 0 else u < 0
    a, b = ins
    first = a >= b if name == "max" else a <= b
    return first if case == 0 else ~first


def find_block(
    top: int,
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    kind: str = ELEMENTWISE,
    partly: Container[Any] = (),
) -> Block | None:
    """The block ending at equation `top` (whose one result is known), or
    `None` if its unknown ancestors are not a function of one floating value
    of the kind asked for: `ELEMENTWISE` (every step elementwise, of the
    result's shape, or else per-element through extra axes, see
    `_perelement.py`) or `LINEAR` (every step linear in the unknown).
    `partly`: unknowns known in pieces already (a linear chain from one of
    them is a block: its single-equation rules cannot use the pieces)."""
    block = _find_block(top, eqns, producer, known, kind, partly)
    if block is None and kind == ELEMENTWISE:
        block = _find_per_element_block(top, eqns, producer, known)
    return block


def _find_block(
    top: int,
    eqns: Sequence[Any],
    producer: dict[Any, int],
    known: Callable[[Any], bool],
    kind: str,
    partly: Container[Any] = (),
) -> Block | None:
    eqn = eqns[top]
    if len(eqn.outvars) != 1:
        return None
    y = eqn.outvars[0]
    shape = y.aval.shape
    if not jnp.issubdtype(
        y.aval.dtype, jnp.floating if kind == ELEMENTWISE else jnp.inexact
    ):
        return None

    def member(e: Any) -> bool:
        if len(e.outvars) != 1:
            return False
        if kind == ELEMENTWISE:
            return is_elementwise(e, shape)
        unknown = [type(v) is not _Literal and not known(v) for v in e.invars]
        return is_linear(e, unknown)

    if not member(eqn):
        return None

    def grow(
        stop: Any = None, shared: frozenset[Any] = frozenset()
    ) -> tuple[set[int], set[Any]]:
        grown = grow_region([top], eqns, producer, known, member, stop, shared)
        assert grown is not None  # (no limit asked)
        return grown

    region, leaves = grow()
    if kind == LINEAR and len(leaves) > 1:
        region, leaves = cut_shared(region, leaves, grow, eqns, producer, known)
    if kind == ELEMENTWISE and len(leaves) > 1:
        region, leaves = cut_to_one_leaf(top, region, leaves, eqns, grow)
    if not leaves or (kind == ELEMENTWISE and len(leaves) != 1):
        return None
    if not all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in leaves):
        return None
    xs = sorted(leaves, key=lambda v: producer.get(v, -1))
    if len(xs) > 1 and not independent(xs, region, eqns, producer, known):
        return None
    x = xs[0]
    if kind == ELEMENTWISE and x.aval.shape != shape:
        return None
    indices = sorted(region)
    block_eqns = [eqns[i] for i in indices]
    # A chain (each unknown read once) is the single-equation rules' to
    # solve; their refusals stand (`where` with a constant mask, `x * 0`).
    chain = is_chain(block_eqns, known)
    from_pieces = False
    if chain and not (
        kind == LINEAR and (len(xs) > 1 or lp.through_complex(block_eqns))
    ):
        from_pieces = kind == LINEAR and any(v in partly for v in xs)
        if not from_pieces:
            return None
    known_vars: list[Any] = []
    seen: set[Any] = set()
    for inner in block_eqns:
        for v in inner.invars:
            if type(v) is not _Literal and known(v) and v not in seen:
                seen.add(v)
                known_vars.append(v)
    sites: dict[Path, Site] = {}
    if kind == ELEMENTWISE:
        _sites(block_eqns, {x}, (), sites, {})
    linear = kind == LINEAR or all(
        is_linear(e, [type(v) is not _Literal and not known(v) for v in e.invars])
        for e in block_eqns
    )
    block = Block(
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
) -> Block | None:
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
    sites: dict[Path, Site] = {}
    _sites(block_eqns, {x}, (), sites, {})
    # Cases picked along a free axis differ within one result element: the
    # piecewise method's combinations would not cover them.
    sites = {path: site for path, site in sites.items() if path in analysis.full}
    linear = all(
        is_linear(e, [type(v) is not _Literal and not known(v) for v in e.invars])
        for e in block_eqns
    )
    return Block(top, indices, block_eqns, x, y, known_vars, sites, linear, ELEMENTWISE)


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
    region as it was if there is none among the first `_MAX_CUTS`."""
    shape = eqns[top].outvars[0].aval.shape
    for p in sorted(region)[:_MAX_CUTS]:
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
    path: Path,
    found: dict[Path, Site],
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
            found[here] = Site(keys.get(which, which), len(eqn.invars) - 1)
        elif name in ("max", "min") and any(depends):
            found[here] = Site(_threshold_key(eqn, keys) or here, 2)
        elif name == "abs" and depends[0] and _floating(eqn.invars[0]):
            # `|u|` is `u` where `u >= 0`, else `-u`: two cases.
            u = eqn.invars[0]
            found[here] = Site(("ge", keys.get(u, u), 0.0), 2)
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


_BOOLEAN: dict[str, Callable[..., bool]] = {
    "or": lambda a, b: a or b,
    "and": lambda a, b: a and b,
    "not": lambda a: not a,
}


def _derived_keys(block: Block, keys: dict[Any, int]) -> dict[Any, Any]:
    """Keys that are a boolean function of other keys (`jnp.where(small |
    large, 1, x)` beside `jnp.where(small, ...)` and `jnp.where(large, ...)`):
    their equations, in program order. Their case follows from the others',
    so that no choice of cases is counted that no `x` can make (a constant
    case there would mark its value NaN)."""
    derived: dict[Any, Any] = {}
    for eqn in block.eqns:
        out = eqn.outvars[0]
        if (
            out in keys
            and keys[out] == 2
            and out.aval.dtype == jnp.bool_
            and eqn.primitive.name in _BOOLEAN
            and all(
                type(v) is not _Literal and (v in derived or keys.get(v) == 2)
                for v in eqn.invars
            )
        ):
            derived[out] = eqn
    return derived


def _case_choices(block: Block) -> list[dict[Any, int]] | None:
    keys: dict[Any, int] = {}
    for site in block.sites.values():
        keys.setdefault(site.key, site.n_cases)
    derived = _derived_keys(block, keys)
    free = {k: n for k, n in keys.items() if k not in derived}
    count = 1
    for n in free.values():
        count *= n
    if count > MAX_CASES:
        return None
    choices = []
    for combo in itertools.product(*(range(n) for n in free.values())):
        choice = dict(zip(free, combo, strict=True))
        for out, eqn in derived.items():
            value = _BOOLEAN[eqn.primitive.name](*(bool(choice[v]) for v in eqn.invars))
            choice[out] = int(value)
        choices.append(choice)
    return choices


def flattened(
    block: Block, y: Any, known: Sequence[Any], compacts: Sequence[Any]
) -> tuple[Any, list[Any], list[Any], tuple[int, ...]] | None:
    """An elementwise block's result, known operands and their compact
    forms reshaped to one axis, and the shape to restore: where `y` has
    several axes, the block's equations replay at another shape
    (`_replays_at_any_shape`), each operand is a scalar, of `y`'s shape, or
    one value with an axis of size 1 for each of `y`'s, and the program runs
    on one device (no sharding to keep). XLA's CPU code vectorizes a fusion
    along its last axis, so a block on `(n, 5)` (a batch of small vectors)
    ran about 8 times slower than on `(5 n,)`: TFP's `Invert(Softplus())`
    at 10^4 elements, 0.89 against 0.11 ms. A reshape of the whole array is
    free. `None` where not done."""
    shape = tuple(jnp.shape(y))
    if len(shape) < 2 or tuple(block.x.aval.shape) != shape:
        return None
    if jax.device_count() > 1 or compat.in_manual_body():
        return None
    # (A compact form of one value keeps a size-1 axis per axis of `y`.)
    ones = (1,) * len(shape)
    values = [*known, *compacts]
    if not all(jnp.shape(k) in ((), shape, ones) for k in values):
        return None
    if not _replays_at_any_shape(block.eqns):
        return None

    def flat(v: Any) -> Any:
        # (Behind a barrier: else XLA moves the reshape past the block's
        # elementwise steps, and their fusion is on `y`'s shape again.)
        if not jnp.shape(v):
            return v
        size = (1,) if jnp.shape(v) == ones else (-1,)
        if not compat.is_tracer(v):
            # (A constant stays one, NumPy: the table of starts, the grid
            # and the folds are built from it while tracing.)
            return np.reshape(np.asarray(v), size)
        if jnp.shape(v) == ones:
            return jnp.reshape(v, size)
        return lax.optimization_barrier(jnp.reshape(v, size))

    return flat(y), [flat(k) for k in known], [flat(k) for k in compacts], shape


def solve_piecewise(
    block: Block,
    y: Any,
    known: Sequence[Any],
    invert: Callable[[Any, Sequence[Any], Any], Any | None],
) -> Any | None:
    """`x` by inverting each case exactly (`invert(closed, invals, y)` runs
    the engine on a Jaxpr), or `None` if some case has no formula.

    `invert` gives the case's candidate, or `(candidate, flat)` where
    `flat` marks elements at which the case is constant at `y` (every point
    of its region a preimage: NaN there)."""
    choices = _case_choices(block)
    if not block.sites or choices is None:
        return None
    # (`y`'s shape, not the block's: `flattened`.)
    x_spec = jax.ShapeDtypeStruct(jnp.shape(y), block.x.aval.dtype)
    specs = [jax.ShapeDtypeStruct(jnp.shape(k), jnp.result_type(k)) for k in known]
    candidates = []
    flat = jnp.zeros(jnp.shape(y), bool)
    for choice in choices:

        def case(x: Any, *kn: Any, choice: dict[Any, int] = choice) -> Any:
            return block.run(x, kn, choice=choice)[block.y]

        # (Without the steps this case does not use: the predicates.)
        closed = compat.dce_closed_jaxpr(jax.make_jaxpr(case)(x_spec, *specs))
        x_c = invert(closed, [None, *known], y)
        if x_c is None:
            return None
        if isinstance(x_c, tuple):
            x_c, flat_c = x_c
            flat = flat | flat_c
        candidates.append(x_c)
    # Per candidate, how many sites pick its case at it (-1 if it is NaN).
    scores = [
        _agreeing(block, x_c, known, choice)
        for x_c, choice in zip(candidates, choices, strict=True)
    ]
    n_keys = len({site.key for site in block.sites.values()})
    oks = [score == n_keys for score in scores]
    dtype = jnp.result_type(y)
    x = jnp.full(jnp.shape(y), jnp.nan, dtype)
    found = jnp.zeros(jnp.shape(y), bool)
    for x_c, ok in reversed(list(zip(candidates, oks, strict=True))):
        x = jnp.where(ok, x_c, x)
        found = found | ok
    # Where cases meet (`|u|` at `u == 0`, a threshold `x < t`), a candidate
    # within rounding of the edge may pick the other case, and then no
    # candidate picks its own. There the candidate with the most sites
    # agreeing is kept; whether it is a preimage (within rounding: a jump of
    # the program that rounding hides), the check of the answer below
    # decides.
    # (With one site, that is the first candidate that is not NaN.)
    best_score = functools.reduce(jnp.maximum, scores)
    best = jnp.full(jnp.shape(y), jnp.nan, dtype)
    for x_c, score in reversed(list(zip(candidates, scores, strict=True))):
        if n_keys == 1:
            best = jnp.where(jnp.isnan(x_c), best, x_c)
        else:
            best = jnp.where(score == best_score, x_c, best)
    x = jnp.where(found, x, best)
    slope = _solve.derivative(block.g, x, known)
    tol = one_preimage(x, y, slope)
    ambiguous = jnp.zeros(jnp.shape(y), bool)
    for x_c, ok in zip(candidates, oks, strict=True):
        ambiguous = ambiguous | (ok & ~(jnp.abs(x_c - x) <= tol))
    # The answer must be a preimage: the block maps it back to `y` (within
    # rounding). Checked once, on the candidate kept: a candidate of another
    # case that picks its own case but does not map back can only make the
    # answer NaN (ambiguous), never another number.
    back = maps_back(block, x, block.g(x, *known), y, known, slope)
    return jnp.where(~ambiguous & ~flat & back, x, jnp.nan)


def one_preimage(x: Any, y: Any, slope: Any, y_scale: Any = 0.0) -> Any:
    """How far apart two candidates may be and still count as one preimage:
    a few ulps of `x`, or as far as rounding of `y` moves it (`16 (eps |y|
    + tiny) / |g'(x)|`: at a jump of the program that rounding hides, two
    cases' candidates; `tiny`, the smallest normal number, for `y` near 0,
    which XLA's CPU code rounds to 0 below it). `y_scale`: the magnitude
    the block's values are computed to rounding of, where larger than `|y|`
    (a spline's value near 0 is its knot's height plus the bin's part)."""
    finfo = jnp.finfo(jnp.result_type(y))
    steep = jnp.isfinite(slope) & (slope != 0)
    rounding = 16 * (finfo.eps * jnp.maximum(jnp.abs(y), y_scale) + finfo.tiny)
    moved = rounding / jnp.where(steep, jnp.abs(slope), 1)
    return 8 * finfo.eps * jnp.maximum(jnp.abs(x), finfo.tiny) + jnp.where(
        steep, moved, 0
    )


def _agreeing(
    block: Block, x: Any, known: Sequence[Any], choice: dict[Any, int]
) -> Any:
    """How many site keys pick their case of `choice` at `x` (int32; -1
    where `x` is NaN)."""
    selected: dict[Any, Any] = {}
    block.run(x, known, selected=selected)
    count = sum(
        _picks(name, ins, choice[key]).astype(jnp.int32)
        for key, (name, ins) in selected.items()
    )
    return jnp.where(jnp.isnan(x), -1, count)


def maps_back(
    block: Block, x: Any, y_x: Any, y: Any, known: Sequence[Any], slope: Any = None
) -> Any:
    """Where `g(x) = y_x` is `y` within rounding (of `y`, and of `x` through
    `g'(x)`, `slope` if given)."""
    eps = jnp.finfo(jnp.result_type(y)).eps
    if slope is None:
        slope = _solve.derivative(block.g, x, known)
    scale = jnp.abs(y) + jnp.abs(x * jnp.where(jnp.isfinite(slope), slope, 0.0))
    return (
        jnp.abs(y_x - y) <= 16 * eps * scale + 16 * jnp.finfo(jnp.result_type(y)).tiny
    )


def solve_linear_elementwise(block: Block, y: Any, known: Sequence[Any]) -> Any:
    """`x = (y - g(0)) / g'(0)` for an elementwise block linear in `x`: exact;
    NaN where the slope is 0."""
    zero = jnp.zeros(jnp.shape(y), jnp.result_type(y))
    offset = block.g(zero, *known)
    slope = _solve.derivative(block.g, zero, known)
    nan = jnp.asarray(jnp.nan, jnp.result_type(y))
    return jnp.where(slope == 0, nan, (y - offset) / jnp.where(slope == 0, 1, slope))


def solve_linear(
    block: Block, ys: Sequence[Any], known: Sequence[Any]
) -> tuple[Any, Any, str]:
    """The unknowns (one value, or a list for several) and `-log|det J|`
    for a linear block `ys = J u + c`: an LU solve when `J` is square, least
    squares by a QR factorization when there are more results than unknowns
    (the results hold the unknowns redundantly, as a vector filled into a
    triangular matrix does; the ildj is then `-0.5 log det(J^T J)`, minus
    the log of the volume factor of the map onto its image: 0 when each
    unknown is copied to some results). NaN unless the
    residual is within rounding (`ys` outside the image, or `J` singular).
    Complex results count as their real and imaginary parts. A block that
    reads only the symmetric part of its one unknown matrix is solved on
    symmetric matrices (`lp.symmetric_basis`; method `SYMMETRIC_SOLVE`)."""
    jac, offset = lp.linear_matrix(block, known)
    rhs = lp.flatten_values(block, ys) - offset
    slack = lp.value_scales(block, ys)
    basis = lp.symmetric_basis(block, jac)
    if basis is not None:
        reduced = jac @ basis
        lp.check_rank(block, reduced)
        v, ildj, ok = _least_squares(reduced, rhs, slack)
        u = basis @ v
        parts = lp.place(block, jnp.where(ok, u, jnp.nan))
        return (parts if len(parts) > 1 else parts[0]), ildj, SYMMETRIC_SOLVE
    lp.check_rank(block, jac)
    u, ildj, ok = _least_squares(jac, rhs, slack)
    parts = lp.place(block, jnp.where(ok, u, jnp.nan))
    return (parts if len(parts) > 1 else parts[0]), ildj, LINEAR_SOLVE


def _least_squares(jac: Any, rhs: Any, slack: Any = 0.0) -> tuple[Any, Any, Any]:
    """`u` with `J u = rhs` (LU when square, else least squares), the ildj
    (`-log|det J|`, or `-0.5 log det(J^T J)`), and whether `J` has full
    column rank and the residual is within rounding (of `|J| |u| + |rhs|`
    and of `slack`, each row's rounding made before, see
    `lp.value_scales`)."""
    m, n = jac.shape
    finfo = jnp.finfo(jnp.result_type(rhs))
    eps = finfo.eps
    full_rank: Any = True
    if m == n:
        if compat.is_tracer(jac):
            # Singular values: `J` must have full rank at this precision (else
            # the unknowns are not determined, and LU would return one
            # preimage among many). A concrete `J` was checked while tracing
            # (`lp.check_rank`). (A tall `J`: the QR's diagonal, below.)
            sv = jnp.linalg.svd(jac, compute_uv=False)
            full_rank = sv[-1] > n * eps * sv[0]
        u = jnp.linalg.solve(jac, rhs)
        ildj = -jnp.linalg.slogdet(jac)[1]
    else:
        u, ildj, full_rank = _nonsquare.least_squares(jac, rhs)
    scale = jnp.abs(jac) @ jnp.abs(u) + jnp.abs(rhs) + slack
    # (`16 tiny`: near the smallest normal number the bound itself is
    # subnormal, which XLA's CPU code flushes to 0, as it does the products.)
    bound = 8 * n * eps * scale + 16 * finfo.tiny
    ok = full_rank & jnp.all(jnp.abs(jac @ u - rhs) <= bound)
    return u, ildj, ok


def _same_for_every_element(k: Any, shape: tuple[int, ...]) -> bool:
    """Whether a known operand of an elementwise block is the same for every
    element: a scalar, a table the block indexes or reduces (`_table_of`),
    or a concrete array holding one value (a constant the program
    broadcast: TFP's `Softfloor` compares with `tf.constant(0.)` through a
    `where` that broadcasts it)."""
    if not jnp.shape(k) or _table_of(k, shape):
        return True
    return _one_value(k)


def _table_of(k: Any, shape: tuple[int, ...]) -> bool:
    """Whether a known operand of shape other than scalar is a table the
    block indexes or reduces: a shape that does not broadcast against the
    elements' (a spline's knots)."""
    try:
        np.broadcast_shapes(tuple(jnp.shape(k)), tuple(shape))
    except ValueError:
        return True
    return False


def _one_value(k: Any) -> bool:
    """Whether `k` is a concrete array (not traced) whose elements are all
    equal (NaN equal to NaN)."""
    if compat.is_tracer(k) or not jnp.size(k):
        return False
    flat = np.ravel(np.asarray(k))
    return bool(
        np.array_equal(
            flat,
            np.broadcast_to(flat[0], flat.shape),
            equal_nan=flat.dtype.kind in "fc",
        )
    )


def _as_scalar(k: Any) -> Any:
    """A known operand that holds one value (`_one_value`) as a scalar."""
    if jnp.shape(k) and _one_value(k):
        # (NumPy, not a JAX array: inside the inverse's trace, a constant of
        # the enclosures' own trace, not a value of the outer one.)
        return np.ravel(np.asarray(k))[0]
    return k


def _constants(eqns: Sequence[Any]) -> list[Any]:
    """The constants the equations read besides their operands: literals,
    and the consts of the bodies they run (a `jit` body closing over an
    array), recursively."""
    found: list[Any] = []
    for eqn in eqns:
        found.extend(v.val for v in eqn.invars if type(v) is _Literal)
        if eqn.primitive is compat.jit_p:
            body = compat.jit_params(eqn.params).jaxpr
            found.extend(compat.jaxpr_consts(body))
            found.extend(_constants(compat.open_jaxpr(body).eqns))
            continue
        for sub in compat.jaxprs_in_params(compat.params_of(eqn)):
            found.extend(compat.jaxpr_consts(sub))
        for sub in compat.sub_jaxprs(eqn):
            found.extend(_constants(sub.eqns))
    return found


def _uniform(block: Block, known: Sequence[Any], shape: tuple[int, ...]) -> bool:
    """Whether the block is the same map for every element: its known
    operands, and the constants inside it (a per-element array closed over
    by a `jit` body in the block is no operand), are all
    `_same_for_every_element`."""
    values = [*known, *_constants(block.eqns)]
    return all(_same_for_every_element(k, shape) for k in values)


def _replays_at_any_shape(eqns: Sequence[Any]) -> bool:
    """Whether `Block.run` of `eqns` works on operands of another shape:
    elementwise primitives, broadcasts of scalars (to the new shape), and
    `jit` and `custom_jvp` calls of them (run equation by equation,
    `_reshaped_call`); not a call bound whole (its body is typed at the
    shape it was traced at) nor another step with a shape among its
    parameters."""
    for eqn in eqns:
        if eqn.primitive is compat.jit_p:
            body = compat.jit_params(eqn.params).jaxpr
            if not _replays_at_any_shape(compat.open_jaxpr(body).eqns):
                return False
        elif (body := compat.custom_jvp_body(eqn)) is not None:
            if not _replays_at_any_shape(body.jaxpr.eqns):
                return False
        elif eqn.primitive.name not in _ELEMENTWISE and not _scalar_broadcast(eqn):
            return False
    return True


# Steps at which a map may have a corner: on one side of it the map may be
# constant (`relu(x) + relu(x)**2` for `x <= 0`).
_CORNERS = frozenset("max min abs sign select_n clamp floor ceil round rem".split())


def _has_corners(eqns: Sequence[Any]) -> bool:
    return any(
        eqn.primitive.name in _CORNERS
        or (eqn.primitive is compat.jit_p and _has_corners(_body_jaxprs(eqn).eqns))
        for eqn in eqns
    )


def _folds(
    block: Block, known: Sequence[Any], dtype: Any, extra: Sequence[float]
) -> _enclose.Turns | None:
    """The turns of a uniform map between the solver's grid points (and the
    switches `extra`) that enclosing its slope finds (`_enclose.py`), with
    points about them to sample: none where the map is proven monotone,
    `None` where it is left to the samplers. Only for scalar known operands
    and equations that run on scalars. A map with turns found and intervals
    left undecided (where more turns may hide) is refused."""
    slope = _scalar_slope(block, known, dtype)
    if slope is None:
        return None
    points = _solve.grid(dtype)
    if len(extra):
        points = np.unique(np.concatenate([points, np.asarray(extra, dtype)]))
    turns = _enclose.turn_points(slope, points, dtype)
    if turns.points.size and not turns.complete:
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value that "
            "is not monotone (its slope changes sign between sample points more "
            "often than enclosing the slope locates), so it takes some values "
            "more than once and has no inverse"
        )
    return turns


def _scalar_slope(
    block: Block, known: Sequence[Any], dtype: Any
) -> _enclose.Slope | None:
    """The enclosable slope of the block's map with its known operands as
    scalars (`_as_scalar`), or `None` where one is not a scalar, the
    equations do not run on scalars, or a step has no enclosure rule."""
    known = [_as_scalar(k) for k in known]
    if any(np.shape(k) for k in known) or not _replays_at_any_shape(block.eqns):
        return None
    with jax.ensure_compile_time_eval():
        return _enclose.Slope.of(lambda u: block.g(u, *known), dtype)


def _per_element_slope(block: Block, known: Sequence[Any], y: Any) -> Any:
    """The slope of the block's map with its known operands as inputs
    (`_enclose.Slope`), where each is a scalar or one value per element and
    its equations run on scalars; else `None`."""
    shape = tuple(jnp.shape(y))
    if not known or not _replays_at_any_shape(block.eqns):
        return None
    if any(jnp.shape(k) and _table_of(k, shape) for k in known):
        return None  # (a table the block indexes)
    if not all(_same_for_every_element(k, shape) for k in _constants(block.eqns)):
        return None  # (a per-element constant inside the block)
    with jax.ensure_compile_time_eval():
        return _enclose.Slope.of(block.g, jnp.result_type(y), known)


def _refuse_folds_per_element(block: Block, known: Sequence[Any], y: Any) -> None:
    """For known operands that are concrete and differ between elements:
    refused where the map is proven to turn between grid points for some
    element (`_enclose.turning_boxes`), as where the samples show it."""
    slope = _per_element_slope(block, known, y)
    if slope is None:
        return
    dtype = jnp.result_type(y)
    values = [np.asarray(k) for k in known]
    boxes = _enclose.turning_boxes(slope, _solve.grid(dtype), dtype, values)
    turned = _enclose.inside(boxes, values)
    if turned.any():
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value that "
            f"is not monotone for {int(turned.sum())} of {turned.size} elements "
            "of its known operands (its slope changes sign between sample "
            "points), so it takes some values more than once and has no inverse"
        )


# Known operands small enough to key the runtime search's cache by value.
_CACHED_ELEMENTS = 64


def _runtime_turns(block: Block, known: Sequence[Any], y: Any) -> Any:
    """For known operands traced (values not known until the program runs):
    `turns(*known)`, per element, where the map is proven to turn between
    grid points. A host callback encloses the map's slope for the operands'
    values and returns boxes of them within which it turns
    (`_enclose.turning_boxes`, padded to a fixed number with empty ones);
    each element is then tested against the boxes where it lives, so its
    sharding is kept. `None` where the map has no enclosure
    (`_per_element_slope`). The searches of the last few operand values are
    kept (an evaluation loop over fixed parameters searches once)."""
    slope = _per_element_slope(block, known, y)
    if slope is None:
        return None
    dtype = np.dtype(jnp.result_type(y))
    points = _solve.grid(dtype)
    count = _enclose.MAX_BOXES
    ranks = [jnp.ndim(k) for k in known]

    def search(values: list[np.ndarray]) -> list[np.ndarray]:
        return _enclose.turning_boxes(slope, points, dtype, values)

    @functools.lru_cache(maxsize=16)
    def cached(key: tuple[Any, ...]) -> list[np.ndarray]:
        return search([np.frombuffer(raw, kind).reshape(sh) for sh, kind, raw in key])

    # The boxes come back as one array (several results of a callback do
    # not lower on a sharded program in JAX 0.7) of float32, their ends
    # rounded outwards: an element within a box is within the rounded one
    # too (rounding keeps order), and one just outside may be taken as in
    # it (NaN, never a wrong answer). Not float64 even with 64-bit values:
    # under `jax.enable_x64` as a context (per thread) JAX casts a callback's
    # float64 results to float32, since it runs in another thread.
    kind = np.dtype(np.float32)

    def host(*values: Any) -> np.ndarray:
        # Under `vmap`, leading axes of batch: the batch's elements are
        # searched together, as more elements (a box holds for whichever
        # element lies in it), and every batch element gets the same boxes.
        batch = np.shape(values[0])[: np.ndim(values[0]) - ranks[0]]
        top = max(ranks)
        row = [
            np.reshape(v, (*batch, *(1,) * (top - r), *np.shape(v)[len(batch) :]))
            for v, r in zip(values, ranks, strict=True)
        ]
        if sum(v.size for v in row) <= _CACHED_ELEMENTS:
            boxes = cached(tuple((v.shape, v.dtype.str, v.tobytes()) for v in row))
        else:
            boxes = search(row)
        out = np.empty((len(values), count, 2), kind)
        out[..., 0], out[..., 1] = np.inf, -np.inf  # (empty)
        for i, box in enumerate(boxes):
            lo, hi = box[:, 0].astype(kind), box[:, 1].astype(kind)
            out[:, i, 0] = np.where(
                lo > box[:, 0], np.nextafter(lo, kind.type(-np.inf)), lo
            )
            out[:, i, 1] = np.where(
                hi < box[:, 1], np.nextafter(hi, kind.type(np.inf)), hi
            )
        return np.broadcast_to(out, (*batch, *out.shape))

    def turns(*operands: Any) -> Any:
        boxes = _on_host(host, ((len(operands), count, 2), kind), operands)
        # (Tested in the float type both promote to, cast explicitly: JAX's
        # strict type promotion refuses an int operand against a float box.)
        hit = []
        for k, box in zip(operands, boxes, strict=True):
            t = jnp.promote_types(jnp.result_type(k), kind)
            v = jnp.expand_dims(jnp.asarray(k).astype(t), -1)
            hit.append((v >= box[:, 0].astype(t)) & (v <= box[:, 1].astype(t)))
        return jnp.any(functools.reduce(jnp.logical_and, hit), axis=-1)

    return turns


def _on_host(host: Callable[..., Any], result: Any, operands: Sequence[Any]) -> Any:
    """`host(*operands)` (NumPy) when the program runs, by `jax.pure_callback`
    with `result = (shape, dtype)`: the runtime searches for turns. Under
    `vmap` every operand gets the batch's leading axes (`broadcast_all`); the
    operands are not differentiated through (`stop_gradient`)."""
    return jax.pure_callback(
        host,
        jax.ShapeDtypeStruct(*result),
        *(jax.lax.stop_gradient(jnp.asarray(k)) for k in operands),
        vmap_method="broadcast_all",
    )


def scalar_turns(g: Callable[..., Any], dtype: Any, known: Sequence[Any]) -> Any:
    """For `g(s, *known)` with a scalar unknown `s` and known operands of any
    shape (the gap function of a scalar bottleneck, `_bottleneck.py`):
    `turns(*known)`, whether `g` is proven to turn between grid points of
    `s` for these operands (`_enclose.turn_points`, the operands as exact
    arrays), by a host callback when the program runs; `None` where `g` has
    no enclosure. Under `vmap` the batch's operands are searched as one box
    first (each element of each operand between its least and greatest over
    the batch), then halved where that leaves it undecided
    (`_enclose.turning_rows`)."""
    with jax.ensure_compile_time_eval():
        slope = _enclose.Slope.of(g, dtype, known, shaped=True)
    if slope is None:
        return None
    dtype = np.dtype(dtype)
    points = _solve.grid(dtype)
    ranks = [jnp.ndim(k) for k in known]

    def search(box: list[tuple[np.ndarray, np.ndarray]]) -> _enclose.Turns:
        return _enclose.turn_points(slope, points, dtype, box)

    def host(*values: Any) -> np.ndarray:
        values = tuple(np.asarray(v, np.float64) for v in values)
        batch = values[0].shape[: values[0].ndim - ranks[0]]
        if not batch:
            return np.asarray(search([(v, v) for v in values]).turned)
        shapes = [v.shape[len(batch) :] for v in values]
        return _in_rows(
            values,
            batch,
            lambda lo, hi: search(
                list(zip(_unflat(lo, shapes), _unflat(hi, shapes), strict=True))
            ),
        )

    def turns(*operands: Any) -> Any:
        return _on_host(host, ((), jnp.bool_), operands)

    return turns


def _in_rows(
    values: Sequence[np.ndarray],
    batch: tuple[int, ...],
    search: Callable[[np.ndarray, np.ndarray], _enclose.Turns],
) -> np.ndarray:
    """Per batch element of `values` (each with the leading axes `batch`),
    whether `search(lo, hi)` over the box of the flattened operand values
    proves a turn (`_enclose.turning_rows`)."""
    n = math.prod(batch)
    rows = np.concatenate([np.reshape(v, (n, -1)) for v in values], axis=1)
    return _enclose.turning_rows(rows, search).reshape(batch)


def _unflat(flat: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """`flat` cut into arrays of `shapes`, in order."""
    cuts = np.cumsum([math.prod(sh) for sh in shapes])[:-1]
    return [
        np.reshape(p, sh) for p, sh in zip(np.split(flat, cuts), shapes, strict=True)
    ]


def row_turns(
    flat: Callable[..., Any], rows: np.ndarray, dtype: Any, known: Sequence[Any]
) -> Any:
    """For a sequential solve's level (`_sequential.py`): `turns(prev, on,
    *known)`, per element `j` solved at this level (`on[j]`), whether its
    row, `x -> flat(prev with x at j, *known)[rows[j]]`, is proven to turn
    between grid points (`_enclose.turn_points`), by a host callback when
    the program runs; `None` where `flat` has no enclosure. The row's map
    picks its element and its result with one-hot operands, so one
    enclosure serves every row. Under `vmap`, each element's batch is
    searched as one box, then halved (`_enclose.turning_rows`)."""
    n = len(rows)

    def row(s: Any, prev: Any, pick: Any, out: Any, *kn: Any) -> Any:
        return jnp.sum(out * flat(jnp.where(pick, s, prev), *kn))

    prev = jnp.zeros((n,), dtype)
    with jax.ensure_compile_time_eval():
        m = int(jnp.shape(jax.eval_shape(flat, prev, *known))[0])
        pick, out = np.zeros(n, bool), np.zeros(m, dtype)
        slope = _enclose.Slope.of(row, dtype, (prev, pick, out, *known), shaped=True)
    if slope is None:
        return None
    dtype = np.dtype(dtype)
    points = _solve.grid(dtype)
    ranks = [1, 1, *(jnp.ndim(k) for k in known)]

    shapes = [(n,), *(tuple(jnp.shape(k)) for k in known)]

    def host(prev: Any, on: Any, *kn: Any) -> np.ndarray:
        values = [np.asarray(v, np.float64) for v in (prev, *kn)]
        on = np.asarray(on) != 0
        batch = values[0].shape[: values[0].ndim - ranks[0]]
        out = np.zeros((*batch, n), bool)
        for j in range(n):
            pick = np.zeros(n, np.float64)
            pick[j] = 1
            one = np.zeros(m, np.float64)
            one[rows[j]] = 1

            def search(
                lo: np.ndarray, hi: np.ndarray, pick: Any = pick, one: Any = one
            ) -> _enclose.Turns:
                box = list(zip(_unflat(lo, shapes), _unflat(hi, shapes), strict=True))
                box[1:1] = [(pick, pick), (one, one)]
                return _enclose.turn_points(slope, points, dtype, box)

            # (The batch elements that solve element `j` at this level.)
            solving = on[..., j]
            if not solving.any():
                continue
            picked = [v[solving] for v in values]
            out[..., j][solving] = _in_rows(picked, (len(picked[0]),), search)
        return out

    def turns(prev: Any, on: Any, *kn: Any) -> Any:
        return _on_host(host, ((n,), jnp.bool_), (prev, on, *kn))

    return turns


def solve_numerically(block: Block, y: Any, known: Sequence[Any]) -> Any:
    """`x` by the elementwise solver (NaN where no root is found). A map that
    turns (`_solve.monotone_on_grid`) is not injective: refused now when its
    known operands are constants, else NaN where it turns. A map with
    corners is NaN where its root lies at the edge of a stretch on which it
    is constant (`_solve.edge_of_plateau`): every point of the stretch is a
    preimage too."""
    x = _solve_numerically(block, y, known)
    if not _has_corners(block.eqns):
        return x
    runs = _unproven(block, known, y)
    if runs is None:
        edge = _solve.edge_of_plateau(lambda u: block.g(u, *known), x)
    else:
        edge = _edges_in(block.g, x, known, runs)
    return jnp.where(edge, jnp.asarray(jnp.nan, jnp.result_type(x)), x)


# At most this many runs where a map with corners is not proven to move
# (`_unproven`) are looked up at run time; beyond, every element is tested
# for the edge of a plateau. Up to `_FEW_RUNS`, by a comparison with each.
_MAX_RUNS = 256
_FEW_RUNS = 8


def _unproven(block: Block, known: Sequence[Any], y: Any) -> np.ndarray | None:
    """For a map `g` the same for every element, known now (constant scalar
    operands, equations that run on scalars): the runs of `x` outside of
    which `g(x - d) != g(x) != g(x + d)` is proven, as computed in its
    dtype, for `_solve.edge_of_plateau`'s step `d` (`_solve.plateau_step`),
    so that no `x` there is the edge of a plateau (`_enclose.unmoving`);
    `None` where there is no proof to use, or more than `_MAX_RUNS` runs."""
    if (
        any(compat.is_tracer(k) for k in known)
        or compat.in_manual_body()
        or not _uniform(block, known, tuple(jnp.shape(y)))
    ):
        return None
    dtype = jnp.result_type(y)
    slope = _scalar_slope(block, known, dtype)
    if slope is None:
        return None
    step = _solve.plateau_step_size(dtype)
    runs = _enclose.unmoving(slope, _solve.grid(dtype), dtype, step)
    return runs if len(runs) <= _MAX_RUNS else None


def _at_or_below(ends: np.ndarray, x: Any) -> Any:
    """Per element of `x`, how many of the sorted `ends` are at or below it:
    a binary search unrolled over the bits of the count, each step a
    comparison with one gathered end. (`jnp.searchsorted` batches a scan
    with `vmap`, which JAX's hijax scan does not take; its `compare_all`
    was 384 ms at 10^6 elements and 214 ends, against 5.6 ms searched.)"""
    table = jnp.asarray(ends)
    count = jnp.zeros(jnp.shape(x), jnp.int32)
    step = 1 << (len(ends).bit_length() - 1)
    while step:
        # (`count + step` ends are at or below `x` if the last of them is.)
        take = count + step
        last = jnp.take(table, jnp.minimum(take, len(ends)) - 1, mode="clip")
        count = jnp.where((take <= len(ends)) & (last <= x), take, count)
        step >>= 1
    return count


def _edges_in(
    g: Callable[..., Any], x: Any, known: Sequence[Any], runs: np.ndarray
) -> Any:
    """`_solve.edge_of_plateau` of `g(., *known)` at `x` where `x` lies in
    one of `runs`, false elsewhere (where `g(x)` is proven to differ from
    its values at `edge_of_plateau`'s nearest neighbours either side). The
    elements in a run are tested gathered with their known operands,
    lazily (`_solve.gather_where`): none of them, usually, when the runs
    are short stretches about a map's corners."""
    x = lax.stop_gradient(x)
    if len(runs) <= _FEW_RUNS:
        near: Any = jnp.zeros(jnp.shape(x), bool)
        for lo, hi in runs.tolist():
            near = near | ((x >= lo) & (x <= hi))
    else:
        # (Sorted, apart: `x` lies in a run where an odd number of ends are
        # at or below it; the ends a float apart outwards, so that one equal
        # to an end counts too.)
        dtype = np.dtype(jnp.result_type(x))
        inf = np.asarray(np.inf, dtype)
        lo = np.nextafter(runs[:, 0].astype(dtype), -inf)
        hi = np.nextafter(runs[:, 1].astype(dtype), inf)
        near = _at_or_below(np.stack([lo, hi], axis=1).ravel(), x) % 2 == 1
    nan = jnp.asarray(jnp.nan, jnp.result_type(x))

    def test(x: Any, *known: Any) -> Any:
        edge = _solve.edge_of_plateau(lambda u: g(u, *known), x)
        return jnp.where(edge, nan, x)

    tested = _solve.gather_where(near, x, test, known)
    return jnp.isnan(tested) & ~jnp.isnan(x)


def _solve_numerically(block: Block, y: Any, known: Sequence[Any]) -> Any:

    def choices(x: Any, *known: Any) -> list[Any]:
        return block.discrete(x, known)

    # (A map that differs between elements through a constant inside it is
    # checked element by element, whatever its operands.)
    inside = all(
        _same_for_every_element(k, jnp.shape(y)) for k in _constants(block.eqns)
    )
    # The undecided elements are solved apart, gathered, only where the
    # block's equations run at any shape (not a call whose body is typed at
    # the elements' shape, a `custom_jvp` function's).
    gather = inside and _replays_at_any_shape(block.eqns)
    if not any(compat.is_tracer(k) for k in known) and not compat.in_manual_body():
        shape, dtype = jnp.shape(y), jnp.result_type(y)
        uniform = _uniform(block, known, tuple(shape))
        try:
            # A piecewise map may jump between grid points where a case
            # switches: sampled either side of each switch too.
            extra, crowded = (
                _turning.switch_points(block, known, tuple(shape), dtype)
                if uniform
                else ([], False)
            )
            # Turns between the grid points, found by enclosing the slope.
            folds = _folds(block, known, dtype, extra) if uniform else None
            if not uniform:
                _refuse_folds_per_element(block, known, y)
            # (And either side of the switches the enclosures could not
            # decide between grid points: the map may jump back there.)
            more = (
                [*folds.points.tolist(), *folds.switches.tolist()]
                if folds is not None
                else []
            )
            with jax.ensure_compile_time_eval():
                ok = np.asarray(
                    _solve.monotone_on_grid(
                        lambda x: block.g(x, *known),
                        shape,
                        dtype,
                        uniform=uniform,
                        extra=[*extra, *more],
                        # (Per element: its switches located there.)
                        choices=None if uniform else lambda x: choices(x, *known),
                    )
                )
        except jax.errors.TracerArrayConversionError:
            # Some bodies stage even here (a `custom_jvp` on older JAX): the
            # check then runs with the solve, NaN where the map turns.
            return _solve.solver(
                block.g, choices=choices, uniform=inside, gather=gather
            )(y, *known)
        # (A turn the enclosures prove is one, whatever the samples show.)
        if not ok.all() or (folds is not None and folds.turns):
            # It turns: inverted where `y` has one preimage (`_turning.py`),
            # if it has one anywhere.
            turns = folds.turns if folds is not None else ()
            walk = (extra, more, turns)
            searched = uniform and not crowded
            return _solve_turning(block, y, known, searched, walk, gather)
        # The same map for every element, known now: a table of starts.
        try:
            table = (
                _table.build(lambda x: block.g(x, *known), shape, dtype)
                if uniform
                else None
            )
        except jax.errors.TracerArrayConversionError:
            table = None  # (a body that stages even here: no table)
        return _solve.solver(
            block.g, check_grid=False, table=table, choices=choices, gather=gather
        )(y, *known)
    # Turns between grid points, found when the program runs.
    turns = _runtime_turns(block, known, y)
    # Inside a `shard_map` body the solver's trial values vary as the
    # unknown does in the Jaxpr, so the block's equations replay as typed.
    axes = compat.varying_axes(block.x.aval)
    if axes:
        g = block.g
        return _solve.solver(
            lambda x, *k: g(compat.vary_over(x, axes), *k),
            choices=lambda x, *k: block.discrete(compat.vary_over(x, axes), k),
            uniform=inside,
            turns=turns,
        )(y, *known)
    # (The undecided elements gathered: not inside a `shard_map` body, above.)
    return _solve.solver(
        block.g,
        choices=choices,
        uniform=inside,
        gather=gather,
        turns=turns,
        kinks=lambda x, *known: block.discrete(x, known, kinks=True),
    )(y, *known)


def _solve_turning(
    block: Block,
    y: Any,
    known: Sequence[Any],
    searched: bool,
    walk: tuple[Any, Any, Any],
    gather: bool,
) -> Any:
    """The block's unknown where `y` has one preimage, for a map known now
    (the same for every element) that turns; refused if no `y` has one.
    `searched`: whether to look for its monotone stretches; `walk`: the
    extra sample points, switches and proven turns found; `gather`: as for
    `_solve.solver`."""
    shape, dtype = jnp.shape(y), jnp.result_type(y)
    extra, more, turns = walk

    def choices(x: Any, *known: Any) -> list[Any]:
        return block.discrete(x, known)

    found = None
    if searched:
        try:
            found = _turning.stretches(
                lambda x: block.g(x, *known), dtype, tuple(shape), extra, more, turns
            )
        except jax.errors.TracerArrayConversionError:
            found = None  # (a body that stages even here: refused)
    if found is None or not found.any_single():
        every = (
            " (every value it takes, as far as the sample points and "
            "the refinement of its turns show)"
            if found is not None
            else ""
        )
        raise NotInvertibleError(
            "its unknown operand is an elementwise function of one value "
            "that is not monotone (it turns between sample points of "
            f"{_solve.grid(dtype)[[0, -1]].tolist()}), so it takes "
            f"some values more than once{every} and has no inverse"
        )
    # A table of starts on the stretches (`found` only exists for the same
    # map for every element, known now).
    try:
        table = _table.build(lambda x: block.g(x, *known), shape, dtype, found.pieces())
    except jax.errors.TracerArrayConversionError:
        table = None
    x = _solve.solver(
        block.g, check_grid=False, table=table, choices=choices, gather=gather
    )(y, *known)
    ok_y = found.single(y) & found.holds(y, x)
    return jnp.where(ok_y, x, jnp.asarray(jnp.nan, jnp.result_type(x)))


def block_ildj(block: Block, x: Any, known: Sequence[Any]) -> Any:
    """`-sum(log|g'(x)|)`: the block's inverse log-det-Jacobian."""
    slope = _solve.derivative(block.g, x, known)
    return -jnp.sum(jnp.log(jnp.abs(slope)))


def unknown_size(block: Block) -> int:
    return sum(lp.unknown_count(block, v) for v in block.xs)


def partly_known(shape: Sequence[int], dtype: Any, pieces: Sequence[Any]) -> Any:
    """A value of `shape` holding `pieces` (see `_rules.Piece`), 0 elsewhere,
    and the flat indices no piece covers."""
    covered = np.zeros(tuple(shape), bool)
    base = jnp.zeros(tuple(shape), dtype)
    for piece in pieces:
        covered[piece.index()] = True
        base = base.at[piece.index()].set(jnp.asarray(piece.value, dtype))
    return base, np.flatnonzero(~covered)


def _describe_unknowns(block: Block) -> str:
    if len(block.xs) == 1:
        return f"one value {block.x.aval.str_short()}"
    return "values " + ", ".join(v.aval.str_short() for v in block.xs)


def too_large(block: Block) -> str:
    return (
        f"its unknown operand is a linear function of "
        f"{_describe_unknowns(block)}: {unknown_size(block)} unknowns, more "
        f"than jaxinterp solves for densely ({MAX_LINEAR})"
    )


def too_few(block: Block) -> str:
    names = [v.aval.str_short() for v in block.ys]
    if block.parts:
        names.append(f"{lp.parts_size(block)} elements known of values inside")
    results = ", ".join(names)
    return (
        f"its unknown operand is a linear function of "
        f"{_describe_unknowns(block)}, and the known results it reaches "
        f"({results}) have fewer elements"
    )


SOLVERS_OFF = (
    "its unknown operand is an elementwise function of one value that no "
    "formula inverts, and numerical solvers are off (`solvers=False`)"
)


class SolverOrigin:
    """Stands for the equation ending a block solved numerically, in the
    engine's record of which step chose a preimage.

    `method` tells the two solves apart: an `ELEMENTWISE_SOLVE` answers only
    where the map passed its monotonicity check (NaN elsewhere), so where it
    answers its preimage is the only one; a `SYMMETRIC_SOLVE` picks the
    symmetric preimage among many.
    """

    def __init__(self, top: Any, method: str = ELEMENTWISE_SOLVE) -> None:
        self.primitive = top.primitive
        self.source_info = top.source_info
        self.method = method

    @property
    def unique(self) -> bool:
        """Whether the solve's answer is the only preimage where it answers."""
        return self.method == ELEMENTWISE_SOLVE


class UniqueInside:
    """Stands for a call-like or loop equation whose rule reported values
    chosen inside its body only by elementwise solves (`SolverOrigin.unique`),
    in the engine's record of which step chose a preimage."""

    unique = True

    def __init__(self, eqn: Any) -> None:
        self.primitive = eqn.primitive
        self.source_info = eqn.source_info
