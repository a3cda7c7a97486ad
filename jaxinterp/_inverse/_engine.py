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
stuck, try the methods of `_methods.METHODS` in order (blocks, a Gram
product, discarded elements...), the first that solves a region recorded by
`SolveState.commit`; finally check that every input was found (`_solution`).
The messages of its refusals live in `_refusals.py`.
"""

from __future__ import annotations

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
)
from .._registry import RuleRegistry
from . import (
    _branches as br,
    _elementwise_steps as ew,
    _masked as mk,
    _refusals as rf,
    _unfold as uf,
)
from ._dataflow import (
    BLOCKING as BLOCKING,
    FORWARD as FORWARD,
    INVERTED as INVERTED,
    UNUSED as UNUSED,
    Solution as Solution,
    SolveOptions,
    SolveState,
    UniqueInside,
)
from ._ildj import log_det
from ._methods import METHODS, Method
from ._refusals import not_invertible_error as not_invertible_error
from ._rounding import (
    agree_recomputed,
    agree_solved,
    floating,
    forward_differentiable,
    inherited_rounding,
)
from ._rules import InverseContext, inverse_rules

_Literal = compat.Literal


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
        seeds: Sequence[tuple[Any, list[Any]]] = (),
        complete: bool = False,
        methods: Sequence[Method] | None = None,
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
            seeds: (variable, pieces) of values known in parts from the
                start (an enclosing equation's partly known operands and
                results, see `_masked.py`).
            complete: whether elements that a step discards may be taken
                from its result when nothing determines them (`_gram.py`);
                the ildj then needs the caller's care (the steps' ildjs may
                count discarded elements).
            methods: the methods tried in turn when no equation can be
                solved alone (default: all of `_methods.METHODS`; none for
                the engine's own runs on one case of a piecewise block).

        Returns:
            A `Solution`.
        """
        if methods is None:
            methods = METHODS
        options = SolveOptions(nan_checks, want_ildj, solvers, complete, tuple(methods))
        st = SolveState(jaxpr, consts, invals, outvals, out_branches, options, seeds)
        while True:
            i = st.next_equation()
            if i is None and (conds := uf.blocked_index(st)):
                # Stuck at a `cond` whose index depends on the unknowns:
                # solved again with it unfolded into a piecewise map, else
                # once per branch.
                again = functools.partial(
                    self.solve,
                    out_branches=out_branches,
                    nan_checks=nan_checks,
                    want_ildj=want_ildj,
                    solvers=solvers,
                    seeds=seeds,
                    complete=complete,
                    methods=methods,
                )
                # (`st.jaxpr`: the indices are its equations', implicit
                # broadcasts written out.)
                sol = uf.solve_unfolded(
                    again, st.jaxpr, consts, conds, invals, outvals, strict, seeds
                )
                if sol is not None:
                    return sol
            if i is None:
                if not (st.reasons or (complete and st.pieces)):
                    break
                if not self._unstick(st):
                    break
                continue
            eqn = st.eqns[i]
            if all(type(v) is _Literal or v in st.env for v in eqn.invars):
                self._evaluate(st, i)
            else:
                self._invert(st, i)
        return self._solution(st, invals, strict)

    def _unstick(self, st: SolveState) -> bool:
        """Stuck: the first method of the table that solves a region, its
        result recorded; whether one did."""
        for method in st.options.methods:
            if method.applies(st):
                st.trying = method.title
                try:
                    found = method.step(self, st)
                finally:
                    st.trying = None
                if found is not None:
                    st.commit(found)
                    return True
        return False

    # -- forwards -------------------------------------------------------

    def _evaluate(self, st: SolveState, i: int) -> None:
        """Evaluate equation `i`, whose operands are all known, forwards."""
        eqn, env, taint = st.eqns[i], st.env, st.taint
        st.done[i] = 1
        st.reasons.pop(i, None)
        st.tried.pop(i, None)
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
                lambda *a: self.forward(eqn, list(a)),
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
            outs = self.forward(eqn, ins)
            st.status[i] = FORWARD
            for v, val in zip(eqn.outvars, outs, strict=True):
                if v not in env:
                    # Pieces of it solved backwards (the operand a
                    # `dynamic_update_slice` leaves alone) are compared.
                    st.learn(v, val, eqn)
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

    def forward(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
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
        inside: Any = UniqueInside(eqn) if len(res) > 3 and res[3] is True else eqn
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
                st.learn(v, val, eqn)
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
            or not floating(solved)
            or not forward_differentiable(eqn)
            or not ew.is_elementwise(eqn, jnp.shape(solved))
            or any(x is None for x in operands)
        ):
            return None

        def step(xk: Any) -> Any:
            ins = [
                xk if u is v else x for u, x in zip(eqn.invars, operands, strict=True)
            ]
            return self.forward(eqn, ins)[0]

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
        if not floating(solved) or jnp.shape(recomputed) != jnp.shape(solved):
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
            lambda *a: self.forward(eqn, list(a)),
            ins,
            known,
            forward_differentiable(eqn),
            solved=True,
        )
        st.agreements.append((ok | ~jnp.any(nan), eqn))
        outs = self.forward(eqn, ins)
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
            lambda *a: self.forward(eqn, list(a)),
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
            again = self.forward(eqn, list(ins))
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
        """Record pieces of operands a rule solved for."""
        chosen = None if branch is None else br.plain(branch)
        for piece in new_pieces:
            v = eqn.invars[piece.operand]
            clash = branch is not None or v in st.taint
            if type(v) is not _Literal and v in st.env and clash:
                # A second constraint on a value a clamp chose: refused.
                raise rf.branch_clash(eqn, origin if branch else st.chooser[v], v)
            st.add_piece(v, piece, eqn, chosen, origin)

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
            tried=st.tried,
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

    return log_det(jax.jacfwd(solve)(flat_outs))
