"""The dataflow engine behind `inverse`: a worklist over known and unknown variables.

Variables start known (consts, literals, known inputs, the given outputs) or
unknown. An equation fires forwards when all its operands are known and some
result is not, and backwards when all its results are known and its inverse
rule can solve for the unknown operands. Each variable becomes known at most
once, and an equation is revisited only when one of its variables becomes
known, so the total work is linear in the number of equations. Solving
emits JAX operations into the current trace; `inverse` traces the engine once
per signature and removes dead code from the resulting Jaxpr.

`InverseWalker.solve` runs these steps over a `SolveState` (`_dataflow.py`):
seed the known values, then until nothing is queued either evaluate an
equation forwards (`_evaluate`) or apply its inverse rule (`_invert`); when
stuck, solve an elementwise or linear block (`_solve_block`, see `_blocks.py`;
last, a sequential block, `_sequential.py`); finally
check that every input was found (`_solution`). The messages of its refusals
live in `_refusals.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .. import _jax_compat as compat
from .._custom_types import InverseRule
from .._errors import (
    NotInvertibleError,
    describe_values,
    operands_detail,
    reraise,
    source_line,
)
from .._registry import RuleRegistry
from . import (
    _blocks as bl,
    _bottleneck as bn,
    _branches as br,
    _fractional as fr,
    _gram as gm,
    _intervals as iv,
    _linear_parts as lp,
    _masked as mk,
    _nonsquare as nsq,
    _normalized as nz,
    _refusals as rf,
    _sequential as sq,
    _unfold as uf,
)
from ._dataflow import (
    BLOCKING as BLOCKING,
    FORWARD as FORWARD,
    INVERTED as INVERTED,
    UNUSED as UNUSED,
    SolveOptions,
    SolveState,
)
from ._refusals import not_invertible_error as not_invertible_error
from ._rules import (
    InverseContext,
    _floating,
    agree_piece,
    agree_recomputed,
    agree_solved,
    assemble,
    forward_differentiable,
    inherited_rounding,
    inverse_rules,
    overlapping,
)

_Literal = compat.Literal


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
        methods: per equation solved as part of an elementwise block, how
            (`piecewise` or `elementwise solve`, see `_blocks.py`), or on
            partly known values (`masked`, see `_masked.py`).
        pieces: the values known only in parts at the end, with their
            pieces (for an enclosing equation's partial solve).
        chose: whether some value depends on a principal-branch choice.
        agreed: whether every second constraint held (a boolean scalar;
            `False` makes the solved inputs NaN, but an enclosing loop that
            passes them on as a carry must know it: a later step could
            solve the carry again from a copy, see `_control_flow.py`).
        jaxpr: the Jaxpr solved, to which the equation indices above
            refer: the one given, with implicit broadcasts made explicit
            (`_implicit.py`).
        unique_choices: whether every choice behind `chose` is either the
            preimage of an elementwise block solved numerically (the only
            one where the solver answers, see `bl.SolverOrigin`) or given
            by an enclosing equation (`out_branches`); true when nothing
            was chosen. A loop passes such choices on as carries (see
            `_control_flow.py`).
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


# At most this many branches of a `cond` whose index depends on the
# unknowns are each solved (`InverseWalker._by_branch`).
MAX_BRANCHES = 8
# How `explain_inverse` names that method.
BY_BRANCH = "by branch"


def _complete(sol: Solution, invals: Sequence[Any]) -> bool:
    """Whether `sol` found every unknown input."""
    return all(
        v is not None or got is not None
        for v, got in zip(invals, sol.invals, strict=True)
    )


class InverseWalker:
    """Solves a Jaxpr for its unknown inputs given its outputs.

    A dataflow walker: it evaluates forwards what the known values determine
    and inverts backwards what the results determine, in whatever order the
    program allows (`BackwardWalker` is the plain backward walk).

    Args:
        rules: the inverse rule table.
    """

    name: ClassVar[str] = "inverse"

    def __init__(self, rules: RuleRegistry[InverseRule] = inverse_rules) -> None:
        self.rules = rules

    def solve(
        self,
        jaxpr: compat.Jaxpr,
        consts: Sequence[Any],
        invals: Sequence[Any],
        outvals: Sequence[Any],
        *,
        strict: bool = True,
        out_branches: Sequence[br.Interval | None] | None = None,
        nan_checks: bool = False,
        want_ildj: bool = True,
        solvers: bool = True,
        blocks: bool = True,
        seeds: Sequence[tuple[Any, list[Any]]] = (),
        complete: bool = False,
        bottlenecks: bool = True,
    ) -> Solution:
        """Find the unknown inputs of `jaxpr` (and any outputs not given).

        Args:
            jaxpr: an open Jaxpr.
            consts: values of its constvars.
            invals: one entry per invar: a value, or `None` if unknown.
            outvals: one entry per outvar: a value, or `None` if not given.
            strict: raise `NotInvertibleError` if an unknown input remains.
            out_branches: per outvar, the interval a given output lies in
                when it comes from a principal-branch choice outside this
                Jaxpr (an enclosing equation's), else `None`.
            nan_checks: count, per backward step, the elements it returns
                as NaN although its results are not (see `Solution`).
            want_ildj: whether the ildj is wanted (rules may skip it if not).
            solvers: whether an elementwise block with no formula may be
                solved numerically (see `_blocks.py`).
            blocks: whether to solve elementwise blocks at all (off for the
                engine's own runs on one case of a piecewise block).
            seeds: (variable, pieces) of values known in parts from the
                start (an enclosing equation's partly known operands and
                results, see `_masked.py`).
            complete: whether elements that a step discards may be taken
                from its result when nothing determines them (`_gram.py`);
                the ildj then needs the caller's care (the steps' ildjs may
                count discarded elements).
            bottlenecks: whether a block may be solved through a scalar
                bottleneck (`_bottleneck.py`; off in that method's own runs).

        Returns:
            A `Solution`.
        """
        options = SolveOptions(
            nan_checks, want_ildj, solvers, blocks, complete, bottlenecks
        )
        st = SolveState(jaxpr, consts, invals, outvals, out_branches, options, seeds)
        while True:
            i = st.next_equation()
            if i is None and (conds := uf.blocked_index(st)):
                # Stuck at a `cond` whose index depends on the unknowns:
                # solved again with it unfolded into a piecewise map, else
                # once per branch (`_by_branch`).
                again = functools.partial(
                    self.solve,
                    out_branches=out_branches,
                    nan_checks=nan_checks,
                    want_ildj=want_ildj,
                    solvers=solvers,
                    blocks=blocks,
                    seeds=seeds,
                    complete=complete,
                    bottlenecks=bottlenecks,
                )
                unknown = [v is None for v in invals]
                # (`st.jaxpr`: the indices are its equations', implicit
                # broadcasts written out.)
                unfolded = uf.unfold_conds(st.jaxpr, consts, conds, unknown)
                if unfolded is not None:
                    sol = again(*unfolded, invals, outvals, strict=False)
                    if _complete(sol, invals):
                        return sol
                    if seeds:
                        return again(*unfolded, invals, outvals, strict=strict)
                    enumerated = self._by_branch(
                        st.jaxpr, consts, conds[0], invals, outvals, again
                    )
                    if isinstance(enumerated, Solution):
                        return enumerated
                    try:
                        return again(*unfolded, invals, outvals, strict=strict)
                    except NotInvertibleError as err:
                        # (Why solving it by branch did not answer either.)
                        raise NotInvertibleError(f"{err}\n{enumerated}") from None
            if i is None:
                # Stuck: a principal factor of `L @ L.T` may be taken (first:
                # a block solve of the product, with the factor filled in by
                # a scatter, picks no branch and gives NaN), an elementwise
                # block of one unknown solved, else discarded elements chosen
                # (also with nothing blocked: a `triangular_solve` solved for
                # the triangle of its matrix it reads is done).
                if not blocks or not (st.reasons or (complete and st.pieces)):
                    break
                if not (
                    gm.gram_step(self, st)
                    or self._solve_block(st)
                    or (complete and gm.fill_step(self, st))
                ):
                    break
                continue
            eqn = st.eqns[i]
            if all(type(v) is _Literal or v in st.env for v in eqn.invars):
                self._evaluate(st, i)
            else:
                self._invert(st, i)
        return self._solution(st, invals, strict)

    def _by_branch(
        self,
        jaxpr: compat.Jaxpr,
        consts: Sequence[Any],
        target: int,
        invals: Sequence[Any],
        outvals: Sequence[Any],
        again: Any,
    ) -> Solution | str:
        """The unknowns, solved once per branch of the `cond` at `target`
        (its index fixed), each candidate kept where the index it gives is
        that branch's: `lax.cond(jnp.sum(x) > 0, f, g, x)`, whose index no
        elementwise piecewise method reads. NaN where no branch's candidate
        takes its own branch (`y` off the image) or several different ones
        do (not injective). Where it cannot be solved so (a branch is
        refused, more than `MAX_BRANCHES` branches), why, in words."""
        eqn = jaxpr.eqns[target]
        n = len(compat.cond_branches(eqn))
        where = f"The `cond` at {source_line(eqn)}, solved once per branch"
        unknown = [k for k, v in enumerate(invals) if v is None]
        floating = all(
            jnp.issubdtype(getattr(jaxpr.invars[k].aval, "dtype", bool), jnp.inexact)
            for k in unknown
        )
        if n > MAX_BRANCHES:
            return f"{where}, has {n} branches: at most {MAX_BRANCHES} are tried."
        if not floating:
            return f"{where}, has unknowns that are not floating: not tried."
        sols = []
        for b in range(n):
            fixed, fixed_consts = uf.with_branch(jaxpr, consts, target, b)
            try:
                sol = again(fixed, fixed_consts, invals, outvals, strict=True)
            except NotInvertibleError as err:
                line = str(err).splitlines()[0]
                return f"{where}: its branch {b} alone is refused ({line})"
            if sol.pieces or sol.uncovered:
                return f"{where}: its branch {b} leaves unknowns known in parts."
            sols.append(sol)
        takes = [
            (uf.index_at(jaxpr, consts, sol.invals, target) == b)
            & ~functools.reduce(
                jnp.logical_or, [jnp.any(jnp.isnan(sol.invals[k])) for k in unknown]
            )
            for b, sol in enumerate(sols)
        ]
        first = jnp.argmax(jnp.stack(takes)).astype(jnp.int32)

        def pick(values: Sequence[Any]) -> Any:
            return jax.lax.select_n(first, *jnp.broadcast_arrays(*values))

        invals_out = list(sols[0].invals)
        same = jnp.any(jnp.stack(takes))
        for k in unknown:
            chosen = pick([sol.invals[k] for sol in sols])
            for took, sol in zip(takes, sols, strict=True):
                same = same & (~took | jnp.all(sol.invals[k] == chosen))
            invals_out[k] = chosen
        for k in unknown:
            invals_out[k] = jnp.where(same, invals_out[k], jnp.nan)
        ildjs = [jnp.asarray(sol.ildj) for sol in sols]
        ildj = jnp.where(same, pick(ildjs), jnp.nan).astype(ildjs[0].dtype)
        outs = list(sols[0].outvals)
        for j, v in enumerate(outvals):
            if v is None and all(sol.outvals[j] is not None for sol in sols):
                outs[j] = pick([sol.outvals[j] for sol in sols])
        checks = [
            (jnp.where(first == b, count, 0), message)
            for b, sol in enumerate(sols)
            for count, message in sol.nan_checks
        ]
        # Reported on `jaxpr` itself: its other equations as the first
        # branch's run treated them, the `cond` solved by branch.
        shift = len(sols[0].jaxpr.eqns) - len(jaxpr.eqns)

        def moved(i: int) -> int:
            return i if i < target else i + shift

        outer = [i for i in range(len(jaxpr.eqns)) if i != target]
        status = [INVERTED] * len(jaxpr.eqns)
        for i in outer:
            status[i] = sols[0].status[moved(i)]
        methods = {
            i: sols[0].methods[moved(i)] for i in outer if moved(i) in sols[0].methods
        }
        methods[target] = BY_BRANCH
        return dataclasses.replace(
            sols[0],
            jaxpr=jaxpr,
            status=status,
            methods=methods,
            reasons={},
            invals=invals_out,
            outvals=outs,
            ildj=ildj,
            nan_checks=checks,
            branches=[
                functools.reduce(br.union, [sol.branches[k] for sol in sols])
                for k in range(len(invals))
            ],
            # (The branch is not a choice: every one is tried, and the
            # answer must be the only one consistent.)
            chose=any(sol.chose for sol in sols),
            agreed=pick([jnp.asarray(sol.agreed) for sol in sols]),
            unique_choices=all(sol.unique_choices for sol in sols),
        )

    # -- forwards -------------------------------------------------------

    def _evaluate(self, st: SolveState, i: int) -> None:
        """Evaluate equation `i`, whose operands are all known, forwards."""
        eqn, env, taint = st.eqns[i], st.env, st.taint
        st.done[i] = 1
        st.reasons.pop(i, None)
        tainted = (
            [v for v in eqn.invars if type(v) is not _Literal and v in taint]
            if taint
            else ()
        )
        if taint or st.piece_branch:
            self._check_recomputed(st, eqn, tainted)
        known = [env[v] if v in env else None for v in eqn.outvars]
        if any(k is not None for k in known):
            # A result known already (an output, or solved from later steps):
            # a second constraint, which a `y` off the image fails.
            ins = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
            ok = agree_recomputed(
                lambda *a: self._forward(eqn, list(a)),
                ins,
                known,
                forward_differentiable(eqn),
                inherited=[self._inherited(st, v) for v in eqn.invars],
                known_rounding=[st.rounding_of(v) for v in eqn.outvars],
            )
            st.agreements.append((ok, eqn))
            self._recheck_results(st, eqn, ins)
        if not all(v in env for v in eqn.outvars):
            ins = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
            outs = self._forward(eqn, ins)
            st.status[i] = FORWARD
            for v, val in zip(eqn.outvars, outs, strict=True):
                if v not in env:
                    env[v] = val
                    # Pieces of it solved backwards (the operand a
                    # `dynamic_update_slice` leaves alone): a second
                    # constraint, which a `y` off the image fails.
                    for p in st.pieces.pop(v, ()):
                        st.agreements.append((agree_piece(p, val), eqn))
                    if tainted:
                        rounded = all(taint[u] is br.ROUNDED for u in tainted)
                        st.mark(
                            v,
                            br.ROUNDED if rounded else br.REALS,
                            st.chooser[tainted[0]],
                        )
                    st.learned(v)
        if i in st.masked_inverted:
            st.status[i] = INVERTED  # its partly known values were solved
        st.release(i)

    @staticmethod
    def _check_recomputed(
        st: SolveState, eqn: compat.JaxprEqn, tainted: Sequence[Any]
    ) -> None:
        """Refuse a forward step whose results a chosen branch may contradict."""
        for v in eqn.outvars:
            # A known result that depends on a choice, recomputed from values
            # that do not: the choice may contradict.
            if v in st.taint and v in st.env and not tainted:
                raise rf.branch_clash(eqn, st.chooser[v], v)
            # A result already known, or partly known from pieces, is a
            # second constraint: a chosen branch may contradict it.
            if tainted and (v in st.env or v in st.pieces):
                raise rf.branch_clash(eqn, st.chooser[tainted[0]], tainted[0])
            if v in st.piece_branch:
                raise rf.branch_clash(eqn, st.chooser[v], v)

    def _forward(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
        try:
            with user_ctx, eqn_ctx:
                if any(compat.is_tracer(x) for x in invals):
                    return compat.bind_eqn(eqn.primitive, invals, eqn.params)
                # Only constants in: fold them now, so rules downstream see
                # concrete values (gather indices, `select_n` predicates);
                # not a value varying over manual mesh axes (`pvary` of a
                # constant in a `shard_map` body), which only a trace holds.
                if not compat.varies_over_manual_axes(eqn):
                    with jax.ensure_compile_time_eval():
                        return compat.bind_eqn(eqn.primitive, invals, eqn.params)
                return compat.bind_eqn(eqn.primitive, invals, eqn.params)
        except Exception as err:
            reraise(
                self.name,
                eqn,
                err,
                doing="evaluating it forwards",
                details=operands_detail(invals),
            )

    # -- backwards ------------------------------------------------------

    def _invert(self, st: SolveState, i: int) -> None:
        """Apply the inverse rule of equation `i` once all its results are known.

        On success the solved operands (or pieces of them) become known and
        the equation is done; a refusal is kept in `st.reasons`.
        """
        eqn = st.eqns[i]
        if (st.pieces and mk.touches(st, eqn)) or mk.zero_product(st, eqn):
            # Partly known values: only their unknown elements are solved.
            mk.step(self, st, i)
            return
        # Dropped results are never known; a rule sees them as `None`.
        any_out, all_out = False, True
        for v in eqn.outvars:
            if v in st.env:
                any_out = True
            elif not st.dropped(v):
                all_out = False
                break
        if not (any_out and all_out):
            return
        rule = self.rules.get(eqn.primitive)
        if rule is None:
            st.reasons[i] = "it has no inverse rule"
            return
        ins = st.read(eqn.invars)
        outs = [st.env.get(v) for v in eqn.outvars]
        branch = br.principal_range(eqn, ins)
        if branch is not None and i != st.allowed:
            st.deferred.append(i)
            return
        # A known operand that depends on a choice, used with given results:
        # unless the results are a bijection of the unknown operands given it
        # (elementwise arithmetic), they constrain it too.
        if st.taint and eqn.primitive.name not in br.KNOWN_OPERAND_SAFE:
            for v in st.tainted(eqn.invars):
                raise rf.branch_clash(eqn, st.chooser[v], v)
        # Taint bookkeeping only once some value depends on a choice.
        if st.taint:
            result_branches = [st.taint.get(v) for v in eqn.outvars]
            tainted_results = any(b is not None for b in result_branches)
        else:
            result_branches, tainted_results = [], False
        ctx = InverseContext.of(
            eqn,
            want_ildj=st.options.want_ildj,
            result_branches=result_branches if tainted_results else (),
            solvers=st.options.solvers,
        )
        res = self._apply_rule(st, i, rule, ctx, outs, ins)
        if res is None:
            if mk.may_split(eqn):
                mk.step(self, st, i)
            return
        if tainted_results:
            # Checked once the rule accepts: a refusal of its own says more.
            rf.check_image(eqn, ins, result_branches, st.chooser)
        branch, origin = _inherited_branch(
            st, eqn, branch, result_branches, tainted_results
        )
        pieces_of = getattr(res, "pieces", None)
        if pieces_of is not None:
            if getattr(res, "ildj", None) is not None and st.options.want_ildj:
                st.ildj_terms.append(res.ildj)
            self._add_pieces(st, eqn, pieces_of, branch, origin)
        else:
            self._learn_solved(st, i, res, outs, branch, origin)
        st.finish(i, INVERTED)

    def _apply_rule(
        self,
        st: SolveState,
        i: int,
        rule: InverseRule,
        ctx: InverseContext,
        outs: list[Any],
        ins: list[Any],
    ) -> Any:
        """The rule's result for equation `i` (its ildj filled in if it gave
        none), or `None` with the reason recorded if it refused."""
        eqn = st.eqns[i]
        try:
            user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
            with user_ctx, eqn_ctx:
                res = rule(ctx, outs, *ins, **eqn.params)
                if res is not None and not hasattr(res, "pieces"):
                    if res[1] is None:
                        res = (
                            res[0],
                            _generic_ildj(rule, ctx, eqn, outs, ins),
                            *res[2:],
                        )
        except NotInvertibleError as err:
            st.reasons[i] = rf.reason(err)
            return None
        except Exception as err:
            reraise(
                self.name,
                eqn,
                err,
                doing="the inverse rule",
                details=f"Operands: {describe_values(ins)}; results: "
                f"{describe_values(outs)}.",
            )
        if res is None:
            st.reasons[i] = (
                "its unknown operands cannot be solved for from its results "
                "and the operands known "
                f"({rf.known_summary(eqn, ins)})"
            )
        return res

    def _learn_solved(
        self,
        st: SolveState,
        i: int,
        res: Any,
        outs: list[Any],
        branch: br.Interval | None,
        origin: Any,
    ) -> None:
        """Record the operands a rule solved for, its ildj and NaN checks."""
        eqn, env = st.eqns[i], st.env
        solved, ildj = res[0], res[1]
        if eqn.primitive.name in br.CLAMPS:
            st.methods[i] = "clamp"
        reported = res[2] if len(res) > 2 else None
        # A call-like or loop rule says, fourth, whether its body chose only
        # by elementwise solves (`Solution.unique_choices`).
        inside: Any = bl.UniqueInside(eqn) if len(res) > 3 and res[3] is True else eqn
        st.ildj_terms.append(ildj)
        # After a completion, any step may turn the value chosen for the
        # discarded elements into NaN (`where(m, cosh(x), c)` completed with
        # `c < 1`): elements left undetermined, which `strict` reports.
        if st.options.nan_checks and (st.completed or rf.may_leave_undetermined(eqn)):
            new = [
                (k, val)
                for k, (v, val) in enumerate(zip(eqn.invars, solved, strict=True))
                if val is not None and type(v) is not _Literal and v not in env
            ]
            st.checks.extend(rf.nan_checks(eqn, outs, new))
        again = False
        newly: list[Any] = []  # (operands learned here, in order)
        for k, (v, val) in enumerate(zip(eqn.invars, solved, strict=True)):
            if (
                val is not None
                and type(v) is not _Literal
                and v in env
                and val is not env[v]  # (a known operand handed back as is)
            ):
                # Solved again (an operand read twice, `concatenate([x, x])`):
                # the two must agree, else `y` is off the image. Read twice by
                # this step, the step recomputed forwards from the value kept
                # must give its results (`_check_again`): that check is exact,
                # while the two values solved here may differ by rounding this
                # level cannot bound (`log(exp(x))` inside a call keeps the
                # rounding of `exp(x)`, not of `x`).
                if v in newly:
                    again = True
                else:
                    st.agreements.append((agree_solved(val, env[v]), eqn))
                if v in st.solved_by:
                    self._recheck_producer(st, v, val)
            if val is not None and type(v) is not _Literal and v not in env:
                got = branch
                if reported is not None and reported[k] is not None:
                    got = br.union(got, reported[k])
                    if branch is None:
                        origin = inside
                if v in st.pieces and (got is not None or v in st.piece_branch):
                    raise rf.branch_clash(eqn, origin, v)
                for p in st.pieces.pop(v, ()):
                    st.agreements.append((agree_piece(p, val), eqn))
                env[v] = val
                newly.append(v)
                st.mark(v, got, origin)
                st.learned(v)
        if newly:
            operands = [
                u.val if type(u) is _Literal else env.get(u) for u in eqn.invars
            ]
            for v in newly:
                st.solved_by[v] = (i, operands, list(outs))
        if again:
            self._check_again(st, eqn, outs)

    def _inherited(self, st: SolveState, v: Any) -> Any:
        """The rounding `v` took from the result it was solved from, if an
        elementwise step of one result solved it backwards (else `None`)."""
        if type(v) is not _Literal and v in st.rounding:
            return st.rounding_of(v)
        by = None if type(v) is _Literal else st.solved_by.get(v)
        if by is None:
            return None
        i, operands, known = by
        eqn, solved = st.eqns[i], st.env.get(v)
        if solved is None:
            return None
        if (
            len(known) != 1
            or known[0] is None
            or not _floating(solved)
            or not forward_differentiable(eqn)
            or not bl.is_elementwise(eqn, jnp.shape(solved))
            or any(x is None for x in operands)
        ):
            return None

        def step(xk: Any) -> Any:
            ins = [
                xk if u is v else x for u, x in zip(eqn.invars, operands, strict=True)
            ]
            return self._forward(eqn, ins)[0]

        return inherited_rounding(step, solved, known[0])

    def _recheck_producer(
        self, st: SolveState, v: Any, recomputed: Any, depth: int = 0
    ) -> None:
        """`v`, solved backwards by an inverse rule, was computed again
        forwards as `recomputed`. `agree` excuses a NaN in the solved value
        (an element the rule left undetermined, `0 / 0`), but the rule also
        returns NaN off its domain (`log` of a negative result): where `v`
        is NaN, the equation that solved it is recomputed from `recomputed`
        and must give its known results, else `y` is off the image
        (`(exp(2 x), x)` with a negative first result). Its results solved
        backwards in turn are checked the same way."""
        by = st.solved_by.get(v)
        if by is None or depth > len(st.eqns):
            return
        # The equation, its operands and results then (since released). `v`
        # itself may be released too: a recheck reaching it through a chain
        # of steps solved backwards (`h` in `g = h[None]`, `h = k / j`) must
        # still recheck the step that gave it NaN.
        i, operands, known = by
        solved = st.env.get(v)
        if solved is None:
            solved = next(
                (x for u, x in zip(st.eqns[i].invars, operands, strict=True) if u is v),
                None,
            )
        if solved is None:
            return
        if not _floating(solved) or jnp.shape(recomputed) != jnp.shape(solved):
            return
        nan = jnp.isnan(solved)
        filled = jnp.where(
            nan, jnp.asarray(recomputed, jnp.result_type(solved)), solved
        )
        eqn = st.eqns[i]
        ins = [
            filled if u is v else x for u, x in zip(eqn.invars, operands, strict=True)
        ]
        if any(x is None for x in ins):
            return
        ok = agree_recomputed(
            lambda *a: self._forward(eqn, list(a)),
            ins,
            known,
            forward_differentiable(eqn),
            solved=True,
        )
        st.agreements.append((ok | ~jnp.any(nan), eqn))
        outs = self._forward(eqn, ins)
        for w, val in zip(eqn.outvars, outs, strict=True):
            if w in st.solved_by:
                self._recheck_producer(st, w, val, depth + 1)

    def _check_again(
        self, st: SolveState, eqn: compat.JaxprEqn, outs: Sequence[Any]
    ) -> None:
        """After an operand was solved a second time: `eqn` recomputed from the
        values kept must give its known results. `agree_solved` excuses a NaN
        on the second path (an element it leaves undetermined, `0 / 0`); this
        tells that apart from a second path off its domain (`log` of a
        negative result), which would otherwise let a `y` off the image
        through."""
        ins = [v.val if type(v) is _Literal else st.env.get(v) for v in eqn.invars]
        if any(x is None for x in ins):
            return
        ok = agree_recomputed(
            lambda *a: self._forward(eqn, list(a)),
            ins,
            list(outs),
            forward_differentiable(eqn),
            solved=True,
        )
        st.agreements.append((ok, eqn))
        # Its results solved backwards (NaN off a rule's domain) likewise.
        self._recheck_results(st, eqn, ins)

    def _recheck_results(
        self, st: SolveState, eqn: compat.JaxprEqn, ins: Sequence[Any]
    ) -> None:
        """`eqn` recomputed from `ins`: each of its results that a rule
        solved backwards is rechecked through its producer."""
        if any(w in st.solved_by for w in eqn.outvars):
            again = self._forward(eqn, list(ins))
            for w, val in zip(eqn.outvars, again, strict=True):
                if w in st.solved_by:
                    self._recheck_producer(st, w, val)

    @staticmethod
    def _add_pieces(
        st: SolveState,
        eqn: compat.JaxprEqn,
        new_pieces: Sequence[Any],
        branch: br.Interval | None,
        origin: Any,
    ) -> None:
        """Record pieces of operands a rule solved for; a value whose pieces
        cover it becomes known."""
        env, pieces, taint = st.env, st.pieces, st.taint
        for piece in new_pieces:
            v = eqn.invars[piece.operand]
            if type(v) is _Literal:
                continue
            if v in env:
                # A second constraint on a known value: checked for exact
                # solutions (NaN off the image), refused for a chosen branch.
                if branch is not None or v in taint:
                    raise rf.branch_clash(eqn, origin if branch else st.chooser[v], v)
                st.agreements.append((agree_piece(piece, env[v]), eqn))
                continue
            have = pieces.setdefault(v, [])
            have.append(piece)
            if branch is not None:
                st.piece_branch[v] = br.union(st.piece_branch.get(v), branch) or branch
                st.chooser.setdefault(v, origin)
                st.note_choice(origin)
            value = assemble(v.aval.shape, v.aval.dtype, have)
            if value is not None and overlapping(v.aval.shape, have):
                # Pieces that cover some elements twice: they must agree.
                st.agreements.extend((agree_piece(p, value), eqn) for p in have)
            if value is not None:
                env[v] = value
                del pieces[v]
                got = st.piece_branch.pop(v, None)
                if got is not None:
                    taint[v] = got
                st.learned(v)

    # -- elementwise blocks ----------------------------------------------

    def _solve_block(self, st: SolveState) -> bool:
        """Solve an elementwise block; whether one was found."""
        found = self._block_step(st)
        if found is None:
            # A value divided by a function of itself (`_normalized.py`).
            found = nz.normalized_step(st)
        if found is None and st.options.solvers:
            # Last: a triangular map of one unknown (`_sequential.py`).
            found = sq.sequential_step(st)
        if found is None and st.options.solvers:
            # A map through one number computed from all of its unknown
            # (`_bottleneck.py`).
            found = bn.bottleneck_step(self, st)
        if found is None:
            return False
        block, x_val, block_ildj, method = found
        env = st.env
        st.ildj_terms.append(block_ildj)
        if st.options.nan_checks:
            st.checks.extend(rf.block_nan_checks(block, method, env, x_val))
        # Both methods check that `x` maps back to `y` (else NaN), so they
        # may start from a value chosen on a branch; what they find is then a
        # choice too, as is a numerical solve's preimage.
        chosen_from = [v for v in (*block.ys, *block.known) if v in st.taint]
        chosen_from += [v for v in block.parts if v in st.piece_branch]
        chooses = method in (bl.ELEMENTWISE_SOLVE, bl.SYMMETRIC_SOLVE)
        tainted = chooses or bool(chosen_from)
        origin: Any = None
        if chooses:
            origin = bl.SolverOrigin(st.eqns[block.top], method)
        elif chosen_from:
            origin = st.chooser[chosen_from[0]]
        known = [env[v] for v in block.known]
        if block.kind == bl.ELEMENTWISE and _floating(x_val):
            y_val = env[block.y]
            # (Traced only if a check asks for it: `SolveState.rounding_of`.)
            st.rounding[block.x] = lambda: inherited_rounding(
                lambda u: block.g(u, *known), x_val, y_val
            )
        values = block.run(x_val, known)
        top_eqn = st.eqns[block.top]
        new_vars = [*block.xs, *(v for e in block.eqns for v in e.outvars)]
        # A symmetric solve chooses only what depends on the antisymmetric part.
        chosen = (
            lp.chosen_values(block, known)
            if method == bl.SYMMETRIC_SOLVE and not chosen_from
            else None
        )
        for v in new_vars:
            if v not in env:
                env[v] = values[v]
                # Pieces of it solved from other results (a `pad` that crops
                # it) and not solved for with the block (`block.parts`): a
                # second constraint, which a `y` off the image fails.
                pieces = st.pieces.pop(v, ())
                if v not in block.parts and v not in block.partial:
                    st.agreements += [(agree_piece(p, env[v]), top_eqn) for p in pieces]
                if tainted and (chosen is None or v in chosen):
                    st.mark(v, br.REALS, origin)
        for j in block.indices:
            st.methods[j] = method
            st.finish(j, INVERTED)
        for v in new_vars:
            st.learned(v)
        return True

    def _block_step(self, st: SolveState) -> tuple[bl.Block, Any, Any, str] | None:
        """Solve the first elementwise block ending at a blocked equation:
        (the block, its unknown's value, its ildj, the method), or `None`."""
        eqns, producer, env, reasons = st.eqns, st.producer, st.env, st.reasons
        # Also linear blocks ending at a value known only in parts (the
        # lower triangle of a symmetrized matrix, see `_cholesky.py`).
        tops = set(reasons) | lp.partial_tops(st)
        for top in sorted(tops, reverse=True):
            known_now = env.__contains__
            partial = not all(v in env for v in eqns[top].outvars)
            block = None if partial else bl.find_block(top, eqns, producer, known_now)
            block = block or bl.find_block(
                top, eqns, producer, known_now, kind=bl.LINEAR, partly=st.pieces
            )
            if block is None:
                continue
            if block.kind == bl.LINEAR:
                if partial:
                    block.ys = []  # its known elements are `parts`
                if not block.from_pieces:
                    # (A chain from pieces stands alone: joined, its
                    # constant-rank condition would no longer hold.)
                    block = self._join_linear(st, block)
                for v in block.xs:
                    if v in st.pieces:
                        block.partial[v] = bl.partly_known(
                            v.aval.shape, v.aval.dtype, st.pieces[v]
                        )
                lp.add_parts(block, st, bl.partly_known)
            elif block.x in st.pieces:
                continue
            try:
                found = self._solve_found_block(st, block)
            except NotInvertibleError as err:
                reasons[top] = rf.reason(err)
                continue
            except Exception as err:
                reraise(
                    self.name,
                    eqns[top],
                    err,
                    doing="solving the block of equations that ends there",
                )
            if isinstance(found, str):
                reasons[top] = found
                continue
            return found
        return None

    def _solve_found_block(
        self, st: SolveState, block: bl.Block
    ) -> tuple[bl.Block, Any, Any, str] | str:
        """Solve `block`: (the block, its unknown's value, its ildj, the
        method), or why it was not tried."""
        env, want_ildj, solvers = st.env, st.options.want_ildj, st.options.solvers
        y = env.get(block.y)
        known = [env[v] for v in block.known]
        ildj: Any = 0.0
        if block.kind == bl.LINEAR:
            size = bl.unknown_size(block)
            if size > lp.result_size(block) and not lp.may_be_symmetric(block):
                return bl.too_few(block)
            if size > bl.MAX_LINEAR:
                return bl.too_large(block)
            if not solvers:
                return bl.SOLVERS_OFF
            if block.chain and not nsq.determined(
                block, known, traced=not block.from_pieces
            ):
                # Its equations' refusals stand.
                return st.reasons.get(
                    block.top,
                    "its unknown operand, known in parts, is a linear function "
                    "of the elements left that its results do not determine",
                )
            ys = [env[v] for v in block.ys]
            x, ildj, method = bl.solve_linear(block, ys, known)
            return block, x, ildj if want_ildj else 0.0, method
        compacts = [st.compact(v) for v in block.known]
        # (On one value per element, flattened where that is free: XLA's
        # CPU code for a block on `(n, 5)` is not vectorized.)
        flat = bl.flattened(block, y, known, compacts)
        if flat is not None:
            y, known, compacts, shape = flat
        if block.linear:
            x = bl.solve_linear_elementwise(block, y, known)
            method = bl.LINEAR_SOLVE
        else:
            x = fr.solve(block, y, known)
            method = fr.LINEAR_FRACTIONAL
        if x is None:
            x = bl.solve_piecewise(block, y, known, self._invert_case)
            method = bl.PIECEWISE
        if x is None:
            x = iv.solve(block, y, known, compacts)
            method = iv.INTERVALS
        if x is None:
            if not solvers:
                return bl.SOLVERS_OFF
            x = bl.solve_numerically(block, y, known)
            method = bl.ELEMENTWISE_SOLVE
        if want_ildj:
            ildj = bl.block_ildj(block, x, known)
        if flat is not None:
            x = jnp.reshape(jax.lax.optimization_barrier(x), shape)
        return block, x, ildj, method

    def _join_linear(self, st: SolveState, block: bl.Block) -> bl.Block:
        """`block` joined with the other blocked linear blocks that share an
        unknown with it (sums and differences of halves: each alone has too
        few results)."""
        eqns, producer, known = st.eqns, st.producer, st.env.__contains__
        changed = True
        while changed:
            changed = False
            for other_top in sorted(st.reasons):
                if other_top in block.indices:
                    continue
                other = bl.find_block(other_top, eqns, producer, known, kind=bl.LINEAR)
                if other is not None and not all(
                    known(v) for v in eqns[other_top].outvars
                ):
                    other.ys = []  # known in parts only (see `_block_step`)
                if other is not None and set(other.xs) & set(block.xs):
                    joined = block.merge(other)
                    if bl.independent(joined.xs, joined.indices, eqns, producer, known):
                        block = joined
                        changed = True
        return block

    def _invert_case(
        self, closed: compat.ClosedJaxpr, invals: Sequence[Any], y: Any
    ) -> Any | None:
        """One case of a piecewise block, inverted by formulas alone."""
        sol = self.solve(
            compat.open_jaxpr(closed),
            compat.jaxpr_consts(closed),
            invals,
            [y],
            strict=False,
            want_ildj=False,
            blocks=False,
        )
        x = sol.invals[0]
        if x is None:
            # A case that uses its unknown twice may be linear-fractional
            # (softsign's `x / (1 + x)` once `|x|` is a case).
            return fr.solve_case(closed, invals[1:], y)
        if sol.branches[0] is not None:
            return None
        return x

    # -- the result -----------------------------------------------------

    @staticmethod
    def _solution(st: SolveState, invals: Sequence[Any], strict: bool) -> Solution:
        """What the run found; with `strict`, refuse if an unknown input remains."""
        jaxpr, env = st.jaxpr, st.env
        for i in st.reasons:
            st.status[i] = BLOCKING
        in_out = [
            env.get(v) if type(v) is not _Literal else v.val for v in jaxpr.invars
        ]
        ildj = _sum_terms(st.ildj_terms)
        if st.agreements:
            in_out, ildj = _unless_disagreeing(st, in_out, invals, ildj)
        out_out = st.read(jaxpr.outvars)
        branches = [
            None if type(v) is _Literal else st.taint.get(v) for v in jaxpr.invars
        ]
        uncovered = [(v, rf.uncovered(v, have)) for v, have in st.pieces.items()]
        solution = Solution(
            in_out,
            out_out,
            ildj,
            st.status,
            st.reasons,
            branches,
            st.checks,
            uncovered,
            st.methods,
            dict(st.pieces),
            bool(st.taint or st.piece_branch),
            _all_agreed(st),
            jaxpr,
            unique_choices=not st.other_choice,
        )
        if strict:
            missing = [
                k
                for k, (val, given) in enumerate(zip(in_out, invals, strict=True))
                if val is None and given is None
            ]
            if missing:
                raise not_invertible_error(jaxpr, solution, missing)
        return solution


def _all_agreed(st: SolveState) -> Any:
    """Whether every second constraint of the run held, as one boolean."""
    if not st.agreements:
        return True
    return functools.reduce(
        jnp.logical_and, [a for a, _ in st.agreements], jnp.bool_(True)
    )


def _unless_disagreeing(
    st: SolveState, in_out: list[Any], invals: Sequence[Any], ildj: Any
) -> tuple[list[Any], Any]:
    """The solved inputs and the ildj, NaN (all of them) unless every second
    constraint holds: a `y` off the image has no preimage. Counted for
    `strict`."""
    ok = functools.reduce(
        jnp.logical_and, [a for a, _ in st.agreements], jnp.bool_(True)
    )
    out = list(in_out)
    for k, (val, given) in enumerate(zip(in_out, invals, strict=True)):
        if val is None or given is not None:
            continue
        if not jnp.issubdtype(jnp.result_type(val), jnp.inexact):
            continue
        out[k] = jnp.where(ok, val, jnp.asarray(jnp.nan, jnp.result_type(val)))
        if st.options.nan_checks:
            st.checks.append(
                (
                    jnp.where(ok, 0, jnp.size(val)).astype(jnp.int32),
                    rf.disagreement(st.agreements, k, val),
                )
            )
    if st.options.want_ildj:
        ildj = jnp.where(ok, ildj, jnp.nan)
    return out, ildj


def _inherited_branch(
    st: SolveState,
    eqn: compat.JaxprEqn,
    branch: br.Interval | None,
    result_branches: Sequence[br.Interval | None],
    tainted_results: bool,
) -> tuple[br.Interval | None, Any]:
    """What the operands a backward step solves for inherit: the interval
    they lie in (the rule's own principal branch, or the taint of the values
    it used), and the equation that chose it."""
    origin: Any = eqn
    used: list[tuple[compat.Var, br.Interval]] = []
    known_tainted = False
    if st.taint:
        if tainted_results:
            used = [
                (v, b)
                for v, b in zip(eqn.outvars, result_branches, strict=True)
                if b is not None
            ]
        known = st.tainted(eqn.invars)
        used.extend((v, st.taint[v]) for v in known)
        known_tainted = bool(known)
    if branch is not None:
        # A rule's own branch bounds what it returns, whatever it was given;
        # rounding a chosen branch bounds nothing.
        if branch is br.ROUNDED and any(b is not br.ROUNDED for _, b in used):
            branch = br.REALS
        elif eqn.primitive.name in br.CLAMPS:
            for _, b in used:
                branch = br.union(branch, b)
    elif used and all(b is br.ROUNDED for _, b in used):
        # Exact steps from a rounded value: still within rounding.
        origin = st.chooser[used[0][0]]
        branch = br.ROUNDED
    elif used:
        origin = st.chooser[used[0][0]]
        if eqn.primitive.name in br.VALUE_PRESERVING and not known_tainted:
            for _, b in used:
                branch = br.union(branch, b)
        else:
            branch = br.REALS
    return branch, origin


def _sum_terms(terms: list[Any]) -> Any:
    # Rules give volume-preserving steps a plain `0.0`: no operation to add.
    traced = [t for t in terms if not (isinstance(t, (int, float)) and t == 0)]
    if not traced:
        return jnp.zeros((), jnp.float32)
    result = traced[0]
    for t in traced[1:]:
        result = result + t
    return jnp.asarray(result)


def _generic_ildj(
    rule: Any,
    ctx: InverseContext,
    eqn: compat.JaxprEqn,
    outs: list[Any],
    ins: list[Any],
) -> Any:
    """`log|det|` of the Jacobian of the rule's solution w.r.t. the results.

    Used when a rule does not give its ildj. `nan` when the map is not square.
    """
    unknown = [k for k, val in enumerate(ins) if val is None]
    flat_outs, unravel = ravel_pytree(list(outs))

    def solve(flat: Any) -> Any:
        res = rule(ctx, unravel(flat), *ins, **eqn.params)
        solved = res[0]
        return ravel_pytree([solved[k] for k in unknown])[0]

    jac = jax.jacfwd(solve)(flat_outs)
    if jac.ndim != 2 or jac.shape[0] != jac.shape[1]:
        return jnp.full((), jnp.nan, jnp.float32)
    return jnp.linalg.slogdet(jac)[1]
