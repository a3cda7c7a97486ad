"""The dataflow engine behind `inverse`: a worklist over known and unknown variables.

Variables start known (consts, literals, known inputs, the given outputs) or
unknown. An equation fires forwards when all its operands are known and some
result is not, and backwards when all its results are known and its inverse
rule can solve for the unknown operands. Each variable becomes known at most
once, and an equation is revisited only when one of its variables becomes
known, so the total work is linear in the number of equations. Solving
emits JAX operations into the current trace; `inverse` traces the engine once
per signature and removes dead code from the resulting Jaxpr.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import _jax_compat as compat
from .._backward import BackwardWalker
from .._custom_types import InverseRule
from .._env import Env
from .._errors import (
    NotInvertibleError,
    describe_values,
    eqn_context,
    operands_detail,
    reraise,
    source_line,
)
from .._registry import RuleRegistry
from . import _blocks as bl, _branches as br
from ._rules import InverseContext, describe_elements, inverse_rules

_Literal = compat.Literal
_DropVar = compat.DropVar

# Equation states, as reported by `explain_inverse`.
FORWARD = "forward"
INVERTED = "inverted"
BLOCKING = "blocking"
UNUSED = "unused"


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
            (`piecewise` or `elementwise solve`, see `_blocks.py`).
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


class InverseWalker(BackwardWalker):
    """Solves a Jaxpr for its unknown inputs given its outputs.

    Args:
        rules: the inverse rule table.
    """

    name: ClassVar[str] = "inverse"

    def __init__(self, rules: RuleRegistry[InverseRule] = inverse_rules) -> None:
        self.rules = rules

    def process_eqn_backward(self, eqn: Any, outvals: list[Any]) -> list[Any]:
        """Solve one equation whose operands are all unknown (plain backward walk)."""
        rule = self.rules.lookup(eqn)
        res = rule(
            InverseContext.of(eqn), outvals, *([None] * len(eqn.invars)), **eqn.params
        )
        if res is None or not isinstance(res, tuple):
            raise NotInvertibleError(
                f"{eqn_context(self.name, eqn)}: cannot solve for its operands."
            )
        return list(res[0])

    # ------------------------------------------------------------------

    def solve(
        self,
        jaxpr: Any,
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

        Returns:
            A `Solution`.
        """
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        for v, val in zip(jaxpr.invars, invals, strict=True):
            if val is not None:
                env[v] = val
        # Values that depend on a principal-branch choice: the interval each
        # lies in, and the equation that chose (for messages).
        taint: dict[Any, br.Interval] = {}
        chooser: dict[Any, Any] = {}
        for k, (v, val) in enumerate(zip(jaxpr.outvars, outvals, strict=True)):
            if val is not None and type(v) is not _Literal and v not in env:
                env[v] = val
                given = None if out_branches is None else out_branches[k]
                if given is not None:
                    taint[v] = given
                    chooser[v] = None

        eqns = jaxpr.eqns
        n = len(eqns)
        producer: dict[Any, int] = {}
        consumers: dict[Any, list[int]] = {}
        # How many unfinished equations still refer to each variable: a value
        # is released once none does (long programs would otherwise keep every
        # intermediate tracer alive, and the garbage collector's full passes
        # over them make tracing super-linear).
        pending: dict[Any, int] = {}
        for i, eqn in enumerate(eqns):
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
        protected = {*jaxpr.invars, *jaxpr.constvars}
        protected.update(v for v in jaxpr.outvars if type(v) is not _Literal)
        jaxpr_outs = protected

        def drop(v: Any) -> None:
            left = pending[v] - 1
            pending[v] = left
            if not left and v not in protected:
                env.pop(v, None)

        def release(i: int) -> None:
            eqn = eqns[i]
            for v in eqn.outvars:
                drop(v)
            invars = eqn.invars
            for k, v in enumerate(invars):
                if type(v) is not _Literal and not any(v is u for u in invars[:k]):
                    drop(v)

        def dropped(v: Any) -> bool:
            # Results nobody reads: JAX >= 0.8 leaves them as plain `Var`s that
            # appear nowhere else, older releases use `DropVar`.
            return isinstance(v, _DropVar) or (
                v not in consumers and v not in jaxpr_outs
            )

        status = [UNUSED] * n
        reasons: dict[int, str] = {}
        methods: dict[int, str] = {}
        pieces: dict[Any, list[Any]] = {}
        piece_branch: dict[Any, br.Interval] = {}
        ildj_terms: list[Any] = []
        checks: list[tuple[Any, str]] = []
        # A stack, last equation on top: inversion mostly runs backwards, so
        # each equation of a chain is usually looked at once.
        stack = list(range(n))
        queued = bytearray(b"\x01") * n
        done = bytearray(n)
        # Equations whose rule would choose a principal branch wait here until
        # no exact step can make progress (see `_branches.py`).
        deferred: list[int] = []
        allowed = -1

        def learned(v: Any) -> None:
            p = producer.get(v)
            if p is not None and not done[p] and not queued[p]:
                queued[p] = 1
                stack.append(p)
            for c in consumers.get(v, ()):
                if not done[c] and not queued[c]:
                    queued[c] = 1
                    stack.append(c)

        def mark(v: Any, interval: br.Interval | None, origin: Any) -> None:
            if interval is not None:
                taint[v] = interval
                chooser[v] = origin

        def solve_block() -> bool:
            """Solve an elementwise block; whether one was found."""
            found = self._block_step(
                eqns, producer, env, reasons, taint, pieces, want_ildj, solvers
            )
            if found is None:
                return False
            block, x_val, block_ildj, method = found
            ildj_terms.append(block_ildj)
            if nan_checks:
                checks.extend(_block_nan_checks(block, method, env, x_val))
            # Both methods check that `x` maps back to `y` (else NaN), so they
            # may start from a value chosen on a branch; what they find is
            # then a choice too, as is a numerical solve's preimage.
            chosen_from = [v for v in (*block.ys, *block.known) if v in taint]
            tainted = method == bl.ELEMENTWISE_SOLVE or bool(chosen_from)
            origin: Any = None
            if method == bl.ELEMENTWISE_SOLVE:
                origin = bl.SolverOrigin(eqns[block.top])
            elif chosen_from:
                origin = chooser[chosen_from[0]]
            values = block.run(x_val, [env[v] for v in block.known])
            new_vars = [*block.xs, *(v for e in block.eqns for v in e.outvars)]
            for v in new_vars:
                if v not in env:
                    env[v] = values[v]
                    pieces.pop(v, None)
                    if tainted:
                        mark(v, br.REALS, origin)
            for j in block.indices:
                done[j] = 1
                status[j] = INVERTED
                methods[j] = method
                reasons.pop(j, None)
                release(j)
            for v in new_vars:
                learned(v)
            return True

        while True:
            if not stack and not deferred:
                # Stuck: an elementwise block of one unknown may still be solved.
                if not blocks or not reasons or not solve_block():
                    break
                continue
            if not stack:
                allowed = deferred.pop()
                if done[allowed]:
                    continue
                stack.append(allowed)
            i = stack.pop()
            queued[i] = 0
            if done[i]:
                continue
            eqn = eqns[i]
            all_in = True
            for v in eqn.invars:
                if type(v) is not _Literal and v not in env:
                    all_in = False
                    break
            if all_in:
                done[i] = 1
                reasons.pop(i, None)
                tainted = (
                    [v for v in eqn.invars if type(v) is not _Literal and v in taint]
                    if taint
                    else ()
                )
                if tainted or piece_branch or taint:
                    for v in eqn.outvars:
                        # A known result that depends on a choice, recomputed
                        # from values that do not: the choice may contradict.
                        if v in taint and v in env and not tainted:
                            raise _branch_clash(eqn, chooser[v], v)
                        # A result already known, or partly known from pieces,
                        # is a second constraint: a chosen branch may
                        # contradict it.
                        if tainted and (v in env or v in pieces):
                            raise _branch_clash(eqn, chooser[tainted[0]], tainted[0])
                        if v in piece_branch:
                            raise _branch_clash(eqn, chooser[v], v)
                if not all(v in env for v in eqn.outvars):
                    ins = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
                    outs = self._forward(eqn, ins)
                    status[i] = FORWARD
                    for v, val in zip(eqn.outvars, outs, strict=True):
                        if v not in env:
                            env[v] = val
                            if tainted:
                                rounded = all(taint[u] is br.ROUNDED for u in tainted)
                                mark(
                                    v,
                                    br.ROUNDED if rounded else br.REALS,
                                    chooser[tainted[0]],
                                )
                            learned(v)
                release(i)
                continue
            # Dropped results are never known; a rule sees them as `None`.
            any_out, all_out = False, True
            for v in eqn.outvars:
                if v in env:
                    any_out = True
                elif not dropped(v):
                    all_out = False
                    break
            if not (any_out and all_out):
                continue
            rule = self.rules.get(eqn.primitive)
            if rule is None:
                reasons[i] = "it has no inverse rule"
                continue
            ins = [v.val if type(v) is _Literal else env.get(v) for v in eqn.invars]
            outs = [env.get(v) for v in eqn.outvars]
            branch = br.principal_range(eqn, ins)
            if branch is not None and i != allowed:
                deferred.append(i)
                continue
            # A known operand that depends on a choice, used with given
            # results: unless the results are a bijection of the unknown
            # operands given it (elementwise arithmetic), they constrain it too.
            if taint and eqn.primitive.name not in br.KNOWN_OPERAND_SAFE:
                for v in eqn.invars:
                    if type(v) is not _Literal and v in taint and v in env:
                        raise _branch_clash(eqn, chooser[v], v)
            # Taint bookkeeping only once some value depends on a choice.
            if taint:
                result_branches = [taint.get(v) for v in eqn.outvars]
                tainted_results = any(b is not None for b in result_branches)
            else:
                result_branches, tainted_results = [], False
            ctx = InverseContext.of(
                eqn,
                want_ildj=want_ildj,
                result_branches=result_branches if tainted_results else (),
                solvers=solvers,
            )
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
                reasons[i] = _reason(err)
                continue
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
                reasons[i] = (
                    "its unknown operands cannot be solved for from its results "
                    "and the operands known "
                    f"({_known_summary(eqn, ins)})"
                )
                continue
            if tainted_results:
                # Checked once the rule accepts: a refusal of its own says more.
                _check_image(eqn, ins, result_branches, chooser)
            # What the solved operands inherit: the chosen branch, or the
            # taint of the values the rule used.
            origin = eqn
            used: list[tuple[Any, br.Interval]] = []
            known_tainted = False
            if taint:
                if tainted_results:
                    used = [
                        (v, b)
                        for v, b in zip(eqn.outvars, result_branches, strict=True)
                        if b is not None
                    ]
                for v in eqn.invars:
                    if type(v) is not _Literal and v in taint and v in env:
                        used.append((v, taint[v]))
                        known_tainted = True
            if branch is not None:
                # A rule's own branch bounds what it returns, whatever it was
                # given; rounding a chosen branch bounds nothing.
                if branch is br.ROUNDED and any(b is not br.ROUNDED for _, b in used):
                    branch = br.REALS
                elif eqn.primitive.name in br.CLAMPS:
                    for _, b in used:
                        branch = br.union(branch, b)
            else:
                if used and all(b is br.ROUNDED for _, b in used):
                    # Exact steps from a rounded value: still within rounding.
                    origin = chooser[used[0][0]]
                    branch = br.ROUNDED
                elif used:
                    origin = chooser[used[0][0]]
                    if eqn.primitive.name in br.VALUE_PRESERVING and not known_tainted:
                        for _, b in used:
                            branch = br.union(branch, b)
                    else:
                        branch = br.REALS
            pieces_of = getattr(res, "pieces", None)
            if pieces_of is not None:
                self._add_pieces(
                    eqn,
                    pieces_of,
                    pieces,
                    env,
                    learned,
                    branch,
                    origin,
                    piece_branch,
                    taint,
                    chooser,
                )
                done[i] = 1
                status[i] = INVERTED
                reasons.pop(i, None)
                release(i)
                continue
            solved, ildj = res[0], res[1]
            if eqn.primitive.name in br.CLAMPS:
                methods[i] = "clamp"
            reported = res[2] if len(res) > 2 else None
            ildj_terms.append(ildj)
            if nan_checks and _may_leave_undetermined(eqn):
                new = [
                    (k, val)
                    for k, (v, val) in enumerate(zip(eqn.invars, solved, strict=True))
                    if val is not None and type(v) is not _Literal and v not in env
                ]
                checks.extend(_nan_checks(eqn, outs, new))
            for k, (v, val) in enumerate(zip(eqn.invars, solved, strict=True)):
                if val is not None and type(v) is not _Literal and v not in env:
                    got = branch
                    if reported is not None and reported[k] is not None:
                        got = br.union(got, reported[k])
                        if branch is None:
                            origin = eqn
                    if v in pieces and (got is not None or v in piece_branch):
                        raise _branch_clash(eqn, origin, v)
                    pieces.pop(v, None)
                    env[v] = val
                    mark(v, got, origin)
                    learned(v)
            done[i] = 1
            status[i] = INVERTED
            reasons.pop(i, None)
            release(i)
        for i in reasons:
            status[i] = BLOCKING
        in_out = [
            env.get(v) if type(v) is not _Literal else v.val for v in jaxpr.invars
        ]
        out_out = [v.val if type(v) is _Literal else env.get(v) for v in jaxpr.outvars]
        branches = [None if type(v) is _Literal else taint.get(v) for v in jaxpr.invars]
        uncovered = [(v, _uncovered(v, have)) for v, have in pieces.items()]
        solution = Solution(
            in_out,
            out_out,
            _sum_terms(ildj_terms),
            status,
            reasons,
            branches,
            checks,
            uncovered,
            methods,
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

    def _block_step(
        self,
        eqns: Sequence[Any],
        producer: dict[Any, int],
        env: Env,
        reasons: dict[int, str],
        taint: dict[Any, br.Interval],
        pieces: dict[Any, list[Any]],
        want_ildj: bool,
        solvers: bool,
    ) -> tuple[bl.Block, Any, Any, str] | None:
        """Solve the first elementwise block ending at a blocked equation:
        (the block, its unknown's value, its ildj, the method), or `None`."""
        for top in sorted(reasons, reverse=True):
            known_now = env.__contains__
            block = bl.find_block(top, eqns, producer, known_now) or bl.find_block(
                top, eqns, producer, known_now, kind=bl.LINEAR
            )
            if block is None:
                continue
            if block.kind == bl.LINEAR:
                block = self._join_linear(block, eqns, producer, env, reasons)
                for v in block.xs:
                    if v in pieces:
                        block.partial[v] = bl.partly_known(
                            v.aval.shape, v.aval.dtype, pieces[v]
                        )
            elif block.x in pieces:
                continue
            y = env[block.y]
            known = [env[v] for v in block.known]
            ildj: Any = 0.0
            try:
                if block.kind == bl.LINEAR:
                    size = bl.unknown_size(block)
                    if size > sum(math.prod(v.aval.shape) for v in block.ys):
                        reasons[top] = bl.too_few(block)
                        continue
                    if size > bl.MAX_LINEAR:
                        reasons[top] = bl.too_large(block)
                        continue
                    if not solvers:
                        reasons[top] = bl.SOLVERS_OFF
                        continue
                    ys = [env[v] for v in block.ys]
                    x, ildj = bl.solve_linear(block, ys, known)
                    return block, x, ildj if want_ildj else 0.0, bl.LINEAR_SOLVE
                if block.linear:
                    x = bl.solve_linear_elementwise(block, y, known)
                    method = bl.LINEAR_SOLVE
                else:
                    x = bl.solve_piecewise(block, y, known, self._invert_case)
                    method = bl.PIECEWISE
                if x is None:
                    if not solvers:
                        reasons[top] = bl.SOLVERS_OFF
                        continue
                    x = bl.solve_numerically(block, y, known)
                    method = bl.ELEMENTWISE_SOLVE
                if want_ildj:
                    ildj = bl.block_ildj(block, x, known)
            except NotInvertibleError as err:
                reasons[top] = _reason(err)
                continue
            except Exception as err:
                reraise(
                    self.name,
                    eqns[top],
                    err,
                    doing="solving the block of equations that ends there",
                )
            return block, x, ildj, method
        return None

    def _join_linear(
        self,
        block: bl.Block,
        eqns: Sequence[Any],
        producer: dict[Any, int],
        env: Env,
        reasons: dict[int, str],
    ) -> bl.Block:
        """`block` joined with the other blocked linear blocks that share an
        unknown with it (sums and differences of halves: each alone has too
        few results)."""
        changed = True
        while changed:
            changed = False
            for other_top in sorted(reasons):
                if other_top in block.indices:
                    continue
                other = bl.find_block(
                    other_top, eqns, producer, env.__contains__, kind=bl.LINEAR
                )
                if other is not None and set(other.xs) & set(block.xs):
                    joined = block.merge(other)
                    if bl.independent(
                        joined.xs, joined.indices, eqns, producer, env.__contains__
                    ):
                        block = joined
                        changed = True
        return block

    def _invert_case(self, closed: Any, invals: Sequence[Any], y: Any) -> Any | None:
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
        if x is None or sol.branches[0] is not None:
            return None
        return x

    def _forward(self, eqn: Any, invals: list[Any]) -> list[Any]:
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

    def _add_pieces(
        self,
        eqn: Any,
        new_pieces: Sequence[Any],
        pieces: dict[Any, list[Any]],
        env: Env,
        learned: Any,
        branch: br.Interval | None,
        origin: Any,
        piece_branch: dict[Any, br.Interval],
        taint: dict[Any, br.Interval],
        chooser: dict[Any, Any],
    ) -> None:
        from ._rules import assemble

        for piece in new_pieces:
            v = eqn.invars[piece.operand]
            if type(v) is _Literal:
                continue
            if v in env:
                # A second constraint on a known value: harmless for exact
                # solutions, a possible contradiction for a chosen branch.
                if branch is not None or v in taint:
                    raise _branch_clash(eqn, origin if branch else chooser[v], v)
                continue
            have = pieces.setdefault(v, [])
            have.append(piece)
            if branch is not None:
                piece_branch[v] = br.union(piece_branch.get(v), branch) or branch
                chooser.setdefault(v, origin)
            value = assemble(v.aval.shape, v.aval.dtype, have)
            if value is not None:
                env[v] = value
                del pieces[v]
                got = piece_branch.pop(v, None)
                if got is not None:
                    taint[v] = got
                learned(v)


# Built-in rules that return NaN for elements the outputs leave undetermined
# at run time (see `_rules.undetermined`), and the constructs that may hold
# them. A `custom_inverse` (a `jit` with a marked name) is the user's own.
_UNDETERMINED_NAN = frozenset(
    {"select_n", "gather", "mul", "div", "pow", "scan", "while"} | br.BRANCH_AWARE
)


def _may_leave_undetermined(eqn: Any) -> bool:
    if eqn.primitive.name not in _UNDETERMINED_NAN:
        return False
    if eqn.primitive is compat.jit_p:
        return "__custom_inverse_" not in compat.jit_params(eqn.params).name
    return True


def _nan_checks(
    eqn: Any, outs: Sequence[Any], solved: Sequence[tuple[int, Any]]
) -> list[tuple[Any, str]]:
    """For `strict` inversion: per solved floating operand, how many of its
    elements the step made NaN (0 when a result is NaN already), and what to
    say if that is not 0."""
    given = [o for o in outs if o is not None and jnp.issubdtype(o.dtype, jnp.inexact)]
    if given:
        clean = ~jnp.any(jnp.stack([jnp.any(jnp.isnan(o)) for o in given]))
    else:
        clean = jnp.bool_(True)
    found = []
    for k, val in solved:
        if not jnp.issubdtype(jnp.result_type(val), jnp.inexact):
            continue
        count = jnp.where(clean, jnp.sum(jnp.isnan(val), dtype=jnp.int32), 0)
        aval = eqn.invars[k].aval.str_short()
        what = f"`{eqn.primitive.name}`"
        if eqn.primitive is compat.jit_p:
            what = f"`jit` of `{compat.jit_params(eqn.params).name}`"
        found.append(
            (
                count,
                f"{what} at {source_line(eqn)}: the outputs do not "
                f"determine {{count}} element(s) of operand {k} ({aval}), which "
                "would come back as NaN",
            )
        )
    return found


def _block_nan_checks(
    block: bl.Block, method: str, env: Env, x_val: Any
) -> list[tuple[Any, str]]:
    """For `strict` inversion: how many elements a block made NaN from
    NaN-free results (no preimage, or two), and what to say if not 0."""
    given = [env[v] for v in block.ys]
    clean = ~jnp.any(jnp.stack([jnp.any(jnp.isnan(y)) for y in given]))
    values = x_val if len(block.xs) > 1 else [x_val]
    count = sum(jnp.sum(jnp.isnan(v), dtype=jnp.int32) for v in values)
    count = jnp.where(clean, count, 0)
    top = block.eqns[block.indices.index(block.top)]
    what = ", ".join(v.aval.str_short() for v in block.xs)
    return [
        (
            count,
            f"the block of equations ending at `{top.primitive.name}` at "
            f"{source_line(top)} ({method}): {{count}} element(s) of {what} "
            "have no single preimage (a result outside the image, or a map "
            "that takes it more than once) and would come back as NaN",
        )
    ]


def _uncovered(v: Any, have: Sequence[Any]) -> np.ndarray:
    """The elements of `v` that none of the pieces `have` covers."""
    covered = np.zeros(v.aval.shape, dtype=bool)
    for piece in have:
        stride = piece.stride or (1,) * len(piece.start)
        covered[
            tuple(
                slice(a, b, c)
                for a, b, c in zip(piece.start, piece.limit, stride, strict=True)
            )
        ] = True
    return ~covered


def _reason(err: Exception) -> str:
    text = (getattr(err, "detail", None) or str(err)).strip().rstrip(".")
    return text or type(err).__name__


def _chooser_kind(origin: Any) -> str:
    """Which equation made a choice: `enclosing` (outside this Jaxpr), `inside`
    (in the body of a call-like equation), `rounding` or `own`."""
    if origin is None:
        return "enclosing"
    if isinstance(origin, bl.SolverOrigin):
        return "solver"
    if origin.primitive.name in br.BRANCH_AWARE:
        return "inside"
    if origin.primitive.name in br.ROUNDING:
        return "rounding"
    return "own"


def _branch_clash(eqn: Any, origin: Any, v: Any) -> NotInvertibleError:
    """The error for a principal-branch choice meeting a second constraint."""
    kind = _chooser_kind(origin)
    if kind == "enclosing":
        chose = "an enclosing equation chose a principal branch for it"
    else:
        at = f"`{origin.primitive.name}` at {source_line(origin)}"
        chose = {
            "inside": f"a map inside {at} is not injective and its rule picks one "
            "preimage (its principal branch)",
            "rounding": f"{at} rounds its operand to a narrower floating type, so "
            "its rule picks one of many preimages",
            "own": f"{at} is not injective and its rule picks one preimage (its "
            "principal branch)",
            "solver": f"the numerical solver for the elementwise block ending at "
            f"{at} returns one preimage, and the map may not be injective",
        }[kind]
    return NotInvertibleError(
        f"`inverse` cannot recover a value of type {v.aval.str_short()} "
        f"consistently: {chose}, but the outputs also constrain that value "
        f"through `{eqn.primitive.name}` at {source_line(eqn)}, which the chosen "
        "branch may contradict. Drop the redundant output, or give the function "
        "a `@jaxinterp.custom_inverse`."
    )


def _check_image(
    eqn: Any,
    ins: Sequence[Any],
    result_branches: Sequence[br.Interval | None],
    chooser: dict[Any, Any],
) -> None:
    """Refuse to solve `eqn` backwards from a chosen branch it may not produce."""
    if eqn.primitive.name in br.BRANCH_AWARE:
        return  # the rule passes the intervals on to the body it inverts
    img = br.image(eqn, ins)
    for v, b in zip(eqn.outvars, result_branches, strict=True):
        if b is None or b is br.ROUNDED:
            continue
        if img is not None and br.contains(img, b):
            continue
        origin: Any = chooser.get(v)
        kind = _chooser_kind(origin)
        if kind == "enclosing":
            chose = "an enclosing equation's principal branch"
        else:
            at = f"`{origin.primitive.name}` at {source_line(origin)}"
            chose = {
                "inside": f"a principal branch chosen inside {at}",
                "solver": f"the preimage the numerical solver found for {at}",
            }.get(kind, f"the principal branch of {at}")
        can = (
            f"whose results lie in {br.describe(img)}"
            if img is not None
            else "whose image jaxinterp does not know"
        )
        raise NotInvertibleError(
            f"`inverse` cannot solve `{eqn.primitive.name}` at {source_line(eqn)} "
            f"backwards: its result {v.aval.str_short()} comes from {chose}, "
            f"which lies in {br.describe(b)}, and `{eqn.primitive.name}` "
            f"({can}) may not produce such a value, so the chosen branch may "
            "have no preimage. Give the function a `@jaxinterp.custom_inverse`."
        )


def _known_summary(eqn: Any, ins: list[Any]) -> str:
    parts = []
    for k, (v, val) in enumerate(zip(eqn.invars, ins, strict=True)):
        state = "known" if val is not None else "unknown"
        parts.append(f"operand {k} {v.aval.str_short()} {state}")
    return ", ".join(parts)


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
    rule: Any, ctx: InverseContext, eqn: Any, outs: list[Any], ins: list[Any]
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


def not_invertible_error(
    jaxpr: Any, solution: Solution, missing: Sequence[int]
) -> NotInvertibleError:
    """Build the `NotInvertibleError` for unknown inputs `missing` of `jaxpr`."""
    names = ", ".join(
        f"input {k} ({jaxpr.invars[k].aval.str_short()})" for k in missing
    )
    lines = []
    for i, reason in sorted(solution.reasons.items()):
        eqn = jaxpr.eqns[i]
        lines.append(f"  `{eqn.primitive.name}` at {source_line(eqn)}: {reason}.")
    if lines:
        prims = ", ".join(
            f"`{jaxpr.eqns[i].primitive.name}`" for i in sorted(solution.reasons)
        )
        detail = f"Blocked at {prims}.\n\n" + "\n".join(lines)
    else:
        detail = (
            "No equation could be solved backwards for them: the outputs do not "
            "determine these inputs (is an input unused, or reduced away?)."
        )
    partial = []
    for v, mask in solution.uncovered:
        if v in jaxpr.invars:
            what = f"input {jaxpr.invars.index(v)}"
        else:
            what = f"an intermediate value {v.aval.str_short()}"
        partial.append(
            f"  {what}: the outputs determine some elements but not "
            f"{describe_elements(mask)}."
        )
    if partial and not lines:
        detail = "The outputs determine only some of its elements:\n" + "\n".join(
            partial
        )
    elif partial:
        detail += "\n\nPartly recovered:\n" + "\n".join(partial)
    err = NotInvertibleError(
        f"`inverse` cannot recover {names} from the outputs. {detail}\n"
        "Register a rule with `@jaxinterp.inverse_rules.register(...)`, or give "
        "the function a `@jaxinterp.custom_inverse`."
    )
    # For an enclosing equation's message: what blocked, without the advice.
    err.detail = f"{names} cannot be recovered. {detail}"  # type: ignore[attr-defined]
    return err
