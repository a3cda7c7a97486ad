"""The bookkeeping of one run of the inverse engine (see `_engine.py`).

`SolveState` holds what a run knows: the values found so far, which equation
produces and which read each variable, the worklist of equations to look at,
the intervals of values that depend on a principal-branch choice (see
`_branches.py`), values known only in pieces, and what each equation did. Its
methods only keep these consistent; the engine decides what to solve.

A method that solves a region when the engine is stuck (`_methods.py`) reads
the state and returns a `Solved`; `SolveState.commit` is the one place that
records it. `Solution` is what a whole run found, and `Walker` what a method
may ask of the engine (a sub-solve, a forward step, the rules).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from .._env import Env
from . import _branches as br
from ._implicit import explicit_broadcasts, explicit_powers
from ._rounding import agree
from ._rules import MaskedPiece, agree_piece, assemble, overlapping

_Literal = compat.Literal
_DropVar = compat.DropVar

# How `explain_inverse` names an equation solved on partly known values.
MASKED = "masked"

# Equation states, as reported by `explain_inverse`.
FORWARD = "forward"
INVERTED = "inverted"
BLOCKING = "blocking"
UNUSED = "unused"


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """How one run of the engine may solve (see `InverseWalker.solve`)."""

    nan_checks: bool = False
    want_ildj: bool = True
    solvers: bool = True
    # Whether discarded elements may be completed (`_gram.fill_step`): only
    # in the outermost run, whose caller then takes the ildj in the
    # coordinates the inverse reads.
    complete: bool = False
    # The methods tried, in order, when no equation can be solved alone
    # (`_methods.METHODS`, or a part of it for a sub-solve).
    methods: tuple[Any, ...] = ()


@dataclasses.dataclass
class Solution:
    """What one run of the engine found.

    Attributes:
        invals: values of the jaxpr's invars (`None` where still unknown).
        outvals: values of the jaxpr's outvars (`None` where unknown).
        ildj: the summed inverse log-det-Jacobian of the backward steps.
        status: per top-level equation, one of `forward`, `inverted`,
            `blocking` or `unused`.
        reasons: per blocking equation index, why it could not be inverted.
        branches: per invar, the interval its value is known to lie in when
            it depends on a principal-branch choice (see `_branches.py`),
            else `None`.
        nan_checks: with `nan_checks=True`, per backward step that may
            return NaN, (how many elements it made NaN from NaN-free
            results: an int32 scalar, message).
        uncovered: (variable, boolean mask of the elements no piece
            covers) for each value only partly recovered from pieces.
        methods: per equation solved by a method of `_methods.py`, its
            label (`piecewise`, `elementwise solve`, ...), or on partly
            known values (`masked`, see `_masked.py`).
        pieces: the values known only in parts at the end, with their
            pieces (for an enclosing equation's partial solve).
        chose: whether some value depends on a principal-branch choice.
        agreed: whether every second constraint held (a boolean scalar;
            `False` makes the solved inputs NaN, but an enclosing loop that
            passes them on as a carry must know it: a later step could
            solve the carry again from a copy, see `_loops.py`).
        jaxpr: the Jaxpr solved, to which the equation indices above
            refer: the one given, with implicit broadcasts made explicit
            (`_implicit.py`).
        unique_choices: whether every choice behind `chose` is either the
            preimage of an elementwise block solved numerically (the only
            one where the solver answers, see `bl.SolverOrigin`) or given
            by an enclosing equation (`out_branches`); true when nothing
            was chosen. A loop passes such choices on as carries (see
            `_loops.py`).
        tried: per blocking equation index, each method of `_methods.py`
            that looked at it and why it did not solve it (by the method's
            `title`).
    """

    invals: list[Any]
    outvals: list[Any]
    ildj: Any
    status: list[str]
    reasons: dict[int, str]
    branches: list[br.Interval | None] = dataclasses.field(default_factory=list)
    nan_checks: list[tuple[Any, str]] = dataclasses.field(default_factory=list)
    uncovered: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)
    methods: dict[int, str] = dataclasses.field(default_factory=dict)
    pieces: dict[Any, list[Any]] = dataclasses.field(default_factory=dict)
    chose: bool = False
    agreed: Any = True
    jaxpr: Any = None
    unique_choices: bool = True
    tried: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)


class Walker(Protocol):
    """What a method may ask of the engine that runs it."""

    rules: Any

    def solve(
        self,
        jaxpr: compat.Jaxpr,
        consts: Sequence[Any],
        invals: Sequence[Any],
        outvals: Sequence[Any],
        *,
        strict: bool = ...,
        out_branches: Sequence[br.Interval | None] | None = ...,
        nan_checks: bool = ...,
        want_ildj: bool = ...,
        solvers: bool = ...,
        seeds: Sequence[tuple[Any, list[Any]]] = ...,
        complete: bool = ...,
        methods: Sequence[Any] | None = ...,
    ) -> Solution:
        """A sub-solve: another run of the engine (see `InverseWalker.solve`)."""
        ...

    def forward(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        """`eqn` evaluated forwards on `invals`, in its contexts."""
        ...


@dataclasses.dataclass
class Solved:
    """What a method found for one region of a stuck run, for `commit`.

    Attributes:
        method: its label, as `explain_inverse` prints it.
        at: the equation a failed second constraint is reported at.
        indices: the equations it solved (each gets the label).
        values: the values it determined, in the order learned; one already
            known is left as it is.
        ildj: its inverse log-det-Jacobian term (`None`: none).
        checks: its NaN checks (see `Solution.nan_checks`).
        agreements: second constraints it found (boolean scalar, where).
        retired: values whose pieces it solved with: their pieces are not
            compared again. Every other piece of a value it determines is.
        pieces: (variable, mask, values) of elements it determined of a
            value known in parts (the values 1-D, in row-major order).
        chose: whether its values depend on a choice, made by `origin`.
        chosen: with `chose`, the values that depend on it (`None`: all).
        rounding: per value, a thunk of the rounding it took from its result
            (see `SolveState.rounding`).
        done: whether its equations are done (else they still run, and are
            reported inverted: a completion's projection step).
        completes: whether it chose discarded elements (`_gram.fill_step`).
    """

    method: str
    at: int
    indices: Sequence[int]
    values: Mapping[Any, Any] = dataclasses.field(default_factory=dict)
    ildj: Any = None
    checks: Sequence[tuple[Any, str]] = ()
    agreements: Sequence[tuple[Any, Any]] = ()
    retired: Collection[Any] = ()
    pieces: Sequence[tuple[Any, Any, Any]] = ()
    chose: bool = False
    origin: Any = None
    chosen: Collection[Any] | None = None
    rounding: Mapping[Any, Callable[[], Any]] = dataclasses.field(default_factory=dict)
    done: bool = True
    completes: bool = False


class SolveState:
    """The mutable state of one run of the engine over a Jaxpr.

    Args:
        jaxpr: the open Jaxpr being solved.
        consts: values of its constvars.
        invals: per invar, a value or `None` if unknown.
        outvals: per outvar, a value or `None` if not given.
        out_branches: per outvar, the interval a given output lies in when an
            enclosing equation chose its branch, else `None` (or `None` for all).
        options: how the run may solve.
    """

    def __init__(
        self,
        jaxpr: compat.Jaxpr,
        consts: Sequence[Any],
        invals: Sequence[Any],
        outvals: Sequence[Any],
        out_branches: Sequence[br.Interval | None] | None,
        options: SolveOptions,
        seeds: Sequence[tuple[Any, list[Any]]] = (),
    ) -> None:
        # (Operands `lax` broadcasts implicitly, broadcast explicitly; powers
        # written as products, as powers.)
        jaxpr = explicit_powers(explicit_broadcasts(jaxpr))
        self.jaxpr = jaxpr
        self.eqns: list[compat.JaxprEqn] = jaxpr.eqns
        self.options = options
        n = len(self.eqns)
        self.env = Env()
        # Dicts below are keyed by `Var`s, typed `Any`: JAX types a Jaxpr's
        # atoms as `Var | Literal`, and checks `type(v) is not Literal`
        # (fast) do not narrow that for type checkers.
        # Values that depend on a principal-branch choice: the interval each
        # lies in, and the equation that chose (for messages; `None` for an
        # enclosing equation, a `SolverOrigin` for a numerical solve).
        self.taint: dict[Any, br.Interval] = {}
        self.chooser: dict[Any, Any] = {}
        # Whether some choice came from neither an elementwise solve (the
        # only preimage where it answers) nor an enclosing equation (see
        # `Solution.unique_choices`); `chooser` keeps one origin per value.
        self.other_choice = False
        # Values known only in parts (see `_rules.Pieces`), and the interval
        # of the parts that came from a choice.
        self.pieces: dict[Any, list[Any]] = {}
        self.piece_branch: dict[Any, br.Interval] = {}
        # Equations that solved elements of a partly known value backwards
        # (`_masked.py`), and what each last saw (to skip unchanged retries).
        self.masked_inverted: set[int] = set()
        self.masked_seen: dict[int, Any] = {}
        # Results of `broadcast_in_dim` run forwards, as their operand
        # reshaped with size-1 axes where the step broadcasts (`compact`),
        # kept after the operand is released: the interval method builds its
        # tables from a spline's knots, not from their copy per element.
        self.compacted: dict[Any, Any] = {}
        # The unknown inputs (where each element of a value comes from among
        # theirs: `_gram._sources`).
        self.unknown_invars = [
            v for v, val in zip(jaxpr.invars, invals, strict=True) if val is None
        ]
        self.status = [UNUSED] * n
        self.reasons: dict[int, str] = {}
        # Per blocked equation, why each method that looked at it did not
        # solve it (`refuse`); `trying` is the method the engine runs.
        self.tried: dict[int, dict[str, str]] = {}
        self.trying: str | None = None
        self.methods: dict[int, str] = {}
        self.ildj_terms: list[Any] = []
        self.checks: list[tuple[Any, str]] = []
        # Whether elements a step discards were completed (`_gram.fill_step`):
        # a NaN solved after that may come from the value chosen for them,
        # not from `y` (see `InverseWalker._learn_solved`).
        self.completed = False
        # Second constraints on known values (a result the program computes
        # twice, an output that repeats an input): whether each holds, and
        # where it comes from. A `y` off the image fails one: NaN.
        self.agreements: list[tuple[Any, Any]] = []
        # The equation whose inverse rule solved each value, and the
        # operands and results then (see `InverseWalker._recheck_producer`).
        self.solved_by: dict[Any, tuple[int, list[Any], list[Any]]] = {}
        # The rounding each unknown of an elementwise block took from the
        # result it was solved from (`|y| / |g'(x)|`, elementwise): checks
        # of a value recomputed from it, or against it, allow it. A thunk
        # until a check asks (`rounding_of`).
        self.rounding: dict[Any, Any] = {}
        # A stack, last equation on top: inversion mostly runs backwards, so
        # each equation of a chain is usually looked at once.
        self.stack = list(range(n))
        self.queued = bytearray(b"\x01") * n
        self.done = bytearray(n)
        # Equations whose rule would choose a principal branch wait here until
        # no exact step can make progress (see `_branches.py`); `allowed` is
        # the one let through last.
        self.deferred: list[int] = []
        self.allowed = -1
        self._seed_known(consts, invals, outvals, out_branches)
        for v, have in seeds:
            if v not in self.env:
                self.pieces[v] = list(have)
        self._index_uses()

    def _seed_known(
        self,
        consts: Sequence[Any],
        invals: Sequence[Any],
        outvals: Sequence[Any],
        out_branches: Sequence[br.Interval | None] | None,
    ) -> None:
        """Record the values known from the start: consts, inputs, outputs."""
        jaxpr, env = self.jaxpr, self.env
        v: Any
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        for v, val in zip(jaxpr.invars, invals, strict=True):
            if val is not None:
                env[v] = val
        # Intermediate values with no elements are known: empty (a linear
        # block would otherwise differentiate scatters of no updates, which
        # crashes XLA on JAX 0.7).
        for eqn in jaxpr.eqns:
            for v in eqn.outvars:
                shape = getattr(v.aval, "shape", None)
                if shape is not None and 0 in shape and not isinstance(v, _DropVar):
                    env[v] = _empty(shape, v.aval.dtype)
        for k, (v, val) in enumerate(zip(jaxpr.outvars, outvals, strict=True)):
            if val is not None and (type(v) is _Literal or v in env):
                known = v.val if type(v) is _Literal else env[v]
                self.agreements.append((agree(val, known), ("output", k)))
            elif val is not None and type(v) is not _Literal:
                env[v] = val
                given = None if out_branches is None else out_branches[k]
                if given is not None:
                    self.taint[v] = given
                    self.chooser[v] = None

    def _index_uses(self) -> None:
        """Index which equation produces and which read each variable."""
        self.producer: dict[Any, int] = {}
        self.consumers: dict[Any, list[int]] = {}
        # How many unfinished equations still refer to each variable: a value
        # is released once none does (long programs would otherwise keep every
        # intermediate tracer alive, and the garbage collector's full passes
        # over them make tracing super-linear).
        self.pending: dict[Any, int] = {}
        producer, consumers, pending = self.producer, self.consumers, self.pending
        v: Any
        for i, eqn in enumerate(self.eqns):
            for v in eqn.outvars:
                producer[v] = i
                pending[v] = 1
            for v in eqn.invars:
                if type(v) is not _Literal:
                    uses = consumers.get(v)
                    if uses is None:
                        consumers[v] = [i]
                    elif uses[-1] == i:
                        continue  # the same variable twice in one equation
                    else:
                        uses.append(i)
                    pending[v] = pending.get(v, 0) + 1
        jaxpr = self.jaxpr
        protected: set[Any] = {*jaxpr.invars, *jaxpr.constvars}
        protected.update(v for v in jaxpr.outvars if type(v) is not _Literal)
        # The Jaxpr's own variables: never released.
        self.protected = protected

    # -- the worklist ---------------------------------------------------

    def next_equation(self) -> int | None:
        """The next equation to look at, or `None` when nothing is queued.

        A deferred equation (one that would choose a branch) is let through,
        as `allowed`, only once no other equation is queued.
        """
        while True:
            if not self.stack:
                if not self.deferred:
                    return None
                self.allowed = self.deferred.pop()
                if self.done[self.allowed]:
                    continue
                self.stack.append(self.allowed)
            i = self.stack.pop()
            self.queued[i] = 0
            if not self.done[i]:
                return i

    def learned(self, v: Any) -> None:
        """Queue the unfinished equations that produce or read `v`."""
        done, queued, stack = self.done, self.queued, self.stack
        p = self.producer.get(v)
        if p is not None and not done[p] and not queued[p]:
            queued[p] = 1
            stack.append(p)
        for c in self.consumers.get(v, ()):
            if not done[c] and not queued[c]:
                queued[c] = 1
                stack.append(c)

    def finish(self, i: int, status: str) -> None:
        """Mark equation `i` done (`status`) and release the values it held."""
        self.done[i] = 1
        self.status[i] = status
        self.reasons.pop(i, None)
        self.tried.pop(i, None)
        self.release(i)

    def refuse(self, i: int, reason: str) -> None:
        """Record why the running method did not solve blocked equation `i`
        (kept per method for the final error); outside a method, or for an
        equation not yet blocked, it is the equation's reason."""
        if self.trying is None or i not in self.reasons:
            self.reasons[i] = reason
        if self.trying is not None:
            self.tried.setdefault(i, {})[self.trying] = reason

    # -- recording what a method solved -----------------------------------

    def commit(self, solved: Solved) -> None:
        """Record what a method solved: its values (each piece already known
        of one compared with it, unless the method solved with that piece),
        the elements it determined of values known in parts, its second
        constraints, ildj term, NaN checks and label."""
        env, where = self.env, self.eqns[solved.at]
        if solved.ildj is not None and self.options.want_ildj:
            self.ildj_terms.append(solved.ildj)
        self.checks.extend(solved.checks)
        self.agreements.extend(solved.agreements)
        self.rounding.update(solved.rounding)
        for v, val in solved.values.items():
            if v in env:
                continue
            self.learn(v, val, where, compare=v not in solved.retired)
            if solved.chose and (solved.chosen is None or v in solved.chosen):
                self.mark(v, br.REALS, solved.origin)
        for v, mask, val in solved.pieces:
            self.add_piece(v, MaskedPiece(0, mask, jnp.asarray(val)), where)
        self.completed |= solved.completes
        for j in solved.indices:
            self.methods[j] = solved.method
            if solved.done:
                self.finish(j, INVERTED)
            else:
                self.masked_inverted.add(j)
        for v in solved.values:
            self.learned(v)

    def learn(self, v: Any, value: Any, where: Any, *, compare: bool = True) -> None:
        """Record `v`'s value. Pieces of it known already become second
        constraints, which a `y` off the image fails, unless `value` was
        solved from them (`compare=False`)."""
        self.env[v] = value
        pieces = self.pieces.pop(v, ())
        if compare:
            self.agreements += [(agree_piece(p, value), where) for p in pieces]

    def add_piece(
        self,
        v: Any,
        piece: Any,
        where: Any,
        chosen: br.Interval | None = None,
        origin: Any = None,
    ) -> None:
        """Record that the elements `piece` covers of `v` are known (at
        equation `where`). Of a known `v` it is a second constraint; `v`
        becomes known once its pieces cover it, and pieces that cover an
        element twice must agree. `chosen`: the branch a clamp chose for
        these elements (`origin` made the choice), which `v` inherits."""
        if type(v) is _Literal:
            return
        if v in self.env:
            self.agreements.append((agree_piece(piece, self.env[v]), where))
            return
        have = self.pieces.setdefault(v, [])
        have.append(piece)
        if chosen is not None:
            self.piece_branch[v] = br.union(self.piece_branch.get(v), chosen) or chosen
            self.chooser.setdefault(v, origin)
            self.note_choice(origin)
        whole = assemble(shape_of(v), v.aval.dtype, have)
        if whole is not None:
            if overlapping(shape_of(v), have):
                self.agreements += [(agree_piece(p, whole), where) for p in have]
            self.env[v] = whole
            del self.pieces[v]
            got = self.piece_branch.pop(v, None)
            if got is not None:
                self.taint[v] = got
        self.learned(v)

    # -- values known in parts -------------------------------------------

    def is_known(self, v: Any) -> bool:
        """Whether `v` is a literal or known in full."""
        return type(v) is _Literal or v in self.env

    def known_mask(self, v: Any) -> np.ndarray:
        """The elements of `v` known (a static boolean array of its shape)."""
        shape = shape_of(v)
        if self.is_known(v):
            return np.ones(shape, bool)
        mask = np.zeros(shape, bool)
        for piece in self.pieces.get(v, ()):
            mask[piece.index()] = True
        return mask

    def partial_value(self, v: Any) -> Any:
        """`v`'s value; for a partly known one, its pieces and zeros
        elsewhere (constants, so nothing computed from them reaches a
        gradient)."""
        if type(v) is _Literal:
            return v.val
        if v in self.env:
            return self.env[v]
        dtype = v.aval.dtype
        base = jnp.zeros(shape_of(v), dtype)
        for piece in self.pieces.get(v, ()):
            base = base.at[piece.index()].set(jnp.asarray(piece.value, dtype))
        return base

    # -- values ---------------------------------------------------------

    def release(self, i: int) -> None:
        """Equation `i` is finished: drop the values no other equation needs."""
        eqn = self.eqns[i]
        v: Any
        if eqn.primitive.name == "broadcast_in_dim" and self.status[i] == FORWARD:
            self._compact(eqn)
        for v in eqn.outvars:
            self._drop(v)
        invars = eqn.invars
        for k, v in enumerate(invars):
            if type(v) is not _Literal and not any(v is u for u in invars[:k]):
                self._drop(v)

    def _compact(self, eqn: Any) -> None:
        (w,), (v,) = eqn.invars, eqn.outvars
        if type(w) is _Literal or w not in self.env or v not in self.env:
            return
        op = self.compact(w)
        shape = [1] * v.aval.ndim
        for j, d in enumerate(compat.params_of(eqn)["broadcast_dimensions"]):
            shape[d] = jnp.shape(op)[j]
        self.compacted[v] = jnp.reshape(op, shape)

    def compact(self, v: Any) -> Any:
        """The known value of `v`, with the axes a `broadcast_in_dim` added or
        stretched kept at size 1 (one row of knots broadcast to every
        element), as the broadcasting rules of `lax` read it."""
        got = self.compacted.get(v)
        return self.env[v] if got is None else got

    def _drop(self, v: Any) -> None:
        left = self.pending[v] - 1
        self.pending[v] = left
        if not left and v not in self.protected:
            self.env.pop(v, None)
            self.compacted.pop(v, None)
            # (Its `solved_by` record stays: a recheck of a value solved from
            # it may still recompute it forwards, `_recheck_producer`.)

    def dropped(self, v: compat.Var) -> bool:
        """Whether `v` is a result nobody reads (never known)."""
        # JAX >= 0.8 leaves such results as plain `Var`s that appear nowhere
        # else, older releases use `DropVar`.
        return isinstance(v, _DropVar) or (
            v not in self.consumers and v not in self.protected
        )

    def rounding_of(self, v: Any) -> Any:
        """The rounding recorded for `v` (`None` if none), computed on the
        first request and kept."""
        got = self.rounding.get(v)
        if callable(got):
            got = self.rounding[v] = got()
        return got

    def mark(self, v: Any, interval: br.Interval | None, origin: Any) -> None:
        """Record that `v` lies in `interval`, chosen by `origin` (if any)."""
        if interval is not None:
            self.taint[v] = interval
            self.chooser[v] = origin
            self.note_choice(origin)

    def note_choice(self, origin: Any) -> None:
        """Record that `origin` chose a value (see `other_choice`)."""
        if origin is not None and getattr(origin, "unique", False) is not True:
            self.other_choice = True

    def read(self, variables: Sequence[Any]) -> list[Any]:
        """Values of `variables` (literals included), `None` where unknown."""
        env = self.env
        return [v.val if type(v) is _Literal else env.get(v) for v in variables]

    def tainted(self, variables: Sequence[Any]) -> list[compat.Var]:
        """The known `variables` whose value depends on a branch choice."""
        taint, env = self.taint, self.env
        return [
            v for v in variables if type(v) is not _Literal and v in taint and v in env
        ]


def numerical(module: str) -> Any:
    """A module of the numerical methods (`_numerical/`), imported the first
    time a method needs it: the exact methods, and `import jaxinterp`, never
    load the solver."""
    return importlib.import_module(f"{__package__}._numerical.{module}")


def shape_of(v: Any) -> tuple[int, ...]:
    """The static shape of variable `v`."""
    return tuple(int(d) for d in v.aval.shape)


def gather(value: Any, flat: np.ndarray) -> Any:
    """The elements `flat` (row-major positions) of `value`; a scalar as is.
    A concrete value stays concrete, so rules can check it."""
    if np.ndim(value) == 0:
        return value
    if compat.is_tracer(value):
        return jnp.ravel(value)[flat.astype(np.int32)]
    return np.asarray(value).reshape(-1)[flat]


def _empty(shape: Any, dtype: Any) -> Any:
    import jax.numpy as jnp

    return jnp.zeros(tuple(shape), dtype)


# The method label of an elementwise block solved numerically: its answer is
# the only preimage where it answers (`SolverOrigin.unique`).
ELEMENTWISE_SOLVE = "elementwise solve"


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
