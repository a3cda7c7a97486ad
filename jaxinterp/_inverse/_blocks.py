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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from .. import _jax_compat as compat
from . import _linear_parts as lp
from ._dataflow import ELEMENTWISE_SOLVE as ELEMENTWISE_SOLVE
from ._elementwise_steps import _ELEMENTWISE, _scalar_broadcast, derivative
from ._ildj import of_slope

_Literal = compat.Literal

# Methods, as `explain_inverse` names them.
PIECEWISE = "piecewise"
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

    def steps(self, x: Any, known: Sequence[Any]) -> list[Any]:
        """The block's equations evaluated at `x` (elementwise), `jit`
        bodies included: `(eqn, ins, outs)` each, in order."""
        steps: list[tuple[Any, list[Any], list[Any]]] = []
        env: dict[Any, Any] = {self.x: x}
        env.update(zip(self.known, known, strict=True))
        self._run(self.eqns, env, (), None, None, steps, shape=_shape_of(x))
        return steps

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
        # broadcast to it instead: `replays_at_any_shape`.)
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
                    # elements' shape holding one value, `uniform`, as the
                    # scalar.)
                    consts = [
                        as_scalar(c) if tuple(jnp.shape(c)) == traced_at else c
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
                        outs = [quotient(*ins)]
                    else:
                        outs = compat.bind_eqn(eqn.primitive, ins, eqn.params)
                if steps is not None:
                    steps.append((eqn, ins, list(outs)))
            env.update(zip(eqn.outvars, outs, strict=True))

    def g(self, x: Any, *known: Any) -> Any:
        return self.run(x, known)[self.y]


@jax.custom_jvp
def quotient(a: Any, b: Any) -> Any:
    """`div` as the solver's maps evaluate it: the same value (the equation's
    own `div`), and a derivative with one more division, `(da - q db) / b`
    with `q = a / b`, where `lax.div`'s rule takes two more (`da / b` and
    `-a db / b**2`). The first tier of the solver is bound by divisions (a
    Newton step and its test evaluate `g` and `g'` twice): softsign's
    `g, g'` go from three divisions to two."""
    return lax.div_p.bind(a, b)


@functools.partial(quotient.defjvp, symbolic_zeros=True)
def _quotient_jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
    a, b = primals
    da, db = tangents
    q = lax.div_p.bind(a, b)
    if type(db) is SymbolicZero:
        # (`b` known: the one division `lax.div`'s rule takes too.)
        dq = jnp.zeros_like(q) if type(da) is SymbolicZero else da / b
    else:
        # (Not `(da - q db) / b`: XLA's CPU backend does not fuse a
        # division into a consumer that reads it twice, here `q` or `g'`;
        # it writes it to memory, in a pass of its own.)
        da_b = 0 if type(da) is SymbolicZero else da * b
        dq = (da_b - a * db) / (b * b)
    return q, jnp.broadcast_to(dq, jnp.shape(q)).astype(q.dtype)


def _shape_of(x: Any) -> tuple[int, ...] | None:
    """The shape of a block's unknown (`None` for several unknowns)."""
    return None if isinstance(x, (list, tuple)) else tuple(jnp.shape(x))


def _reshaped_call(eqn: Any, ins: Sequence[Any]) -> bool:
    """Whether `eqn` is a `custom_jvp` call replayed on operands of another
    shape than it was traced at (the solver's later tiers on the elements it
    gathers): its body, elementwise (`replays_at_any_shape`), runs equation
    by equation there, differentiated as written rather than by the call's
    rule (the same values; the rule is for the derivative's rounding at
    extremes, and the solver's roots are checked by value). Elsewhere the
    call is bound whole, its rule kept (the implicit function theorem's
    slope at the answer)."""
    return compat.custom_jvp_body(eqn) is not None and any(
        tuple(jnp.shape(v)) != tuple(var.aval.shape)
        for v, var in zip(ins, eqn.invars, strict=True)
    )


def picks(name: str, ins: Sequence[Any], case: int) -> Any:
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


def same_for_every_element(k: Any, shape: tuple[int, ...]) -> bool:
    """Whether a known operand of an elementwise block is the same for every
    element: a scalar, a table the block indexes or reduces (`table_of`),
    or a concrete array holding one value (a constant the program
    broadcast: TFP's `Softfloor` compares with `tf.constant(0.)` through a
    `where` that broadcasts it)."""
    if not jnp.shape(k) or table_of(k, shape):
        return True
    return _one_value(k)


def table_of(k: Any, shape: tuple[int, ...]) -> bool:
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


def as_scalar(k: Any) -> Any:
    """A known operand that holds one value (`_one_value`) as a scalar."""
    if jnp.shape(k) and _one_value(k):
        # (NumPy, not a JAX array: inside the inverse's trace, a constant of
        # the enclosures' own trace, not a value of the outer one.)
        return np.ravel(np.asarray(k))[0]
    return k


def constants(eqns: Sequence[Any]) -> list[Any]:
    """The constants the equations read besides their operands: literals,
    and the consts of the bodies they run (a `jit` body closing over an
    array), recursively."""
    found: list[Any] = []
    for eqn in eqns:
        found.extend(v.val for v in eqn.invars if type(v) is _Literal)
        if eqn.primitive is compat.jit_p:
            body = compat.jit_params(eqn.params).jaxpr
            found.extend(compat.jaxpr_consts(body))
            found.extend(constants(compat.open_jaxpr(body).eqns))
            continue
        for sub in compat.jaxprs_in_params(compat.params_of(eqn)):
            found.extend(compat.jaxpr_consts(sub))
        for sub in compat.sub_jaxprs(eqn):
            found.extend(constants(sub.eqns))
    return found


def uniform(block: Block, known: Sequence[Any], shape: tuple[int, ...]) -> bool:
    """Whether the block is the same map for every element: its known
    operands, and the constants inside it (a per-element array closed over
    by a `jit` body in the block is no operand), are all
    `same_for_every_element`."""
    values = [*known, *constants(block.eqns)]
    return all(same_for_every_element(k, shape) for k in values)


def replays_at_any_shape(eqns: Sequence[Any]) -> bool:
    """Whether `Block.run` of `eqns` works on operands of another shape:
    elementwise primitives, broadcasts of scalars (to the new shape), and
    `jit` and `custom_jvp` calls of them (run equation by equation,
    `_reshaped_call`); not a call bound whole (its body is typed at the
    shape it was traced at) nor another step with a shape among its
    parameters."""
    for eqn in eqns:
        if eqn.primitive is compat.jit_p:
            body = compat.jit_params(eqn.params).jaxpr
            if not replays_at_any_shape(compat.open_jaxpr(body).eqns):
                return False
        elif (body := compat.custom_jvp_body(eqn)) is not None:
            if not replays_at_any_shape(body.jaxpr.eqns):
                return False
        elif eqn.primitive.name not in _ELEMENTWISE and not _scalar_broadcast(eqn):
            return False
    return True


def block_ildj(block: Block, x: Any, known: Sequence[Any]) -> Any:
    """`-sum(log|g'(x)|)`: the block's inverse log-det-Jacobian."""
    return of_slope(derivative(block.g, x, known))


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
