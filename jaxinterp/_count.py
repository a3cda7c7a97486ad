"""Count equations and estimate FLOPs of a staged function (`jaxinterp count`).

`OpCounter` is an `Interpreter` whose values are abstract values (`ShapedArray`s)
rather than arrays: it never binds a primitive, so counting a large model costs
one walk over its Jaxpr. Nested Jaxprs are walked in place with a multiplier:

* `jit`, `closed_call`, `checkpoint`, `custom_jvp_call`, `custom_vjp_call`
  and any other call-like primitive: the body, once (also their hijax
  `call_hi_primitive` forms under JAX's future-default flags, and a user's
  hijax primitive through its `expand`);
* `scan` (and its hijax `Scan3`): the body, times the trip count (`length`);
* `cond`: the most expensive branch (by FLOPs, then equations), as XLA's
  cost analysis does, since which branch runs is a runtime value;
* `while`: the condition and the body once each, since the trip count is a
  runtime value. `Counts.while_loops` says how many were met, so reports can
  flag the estimate (XLA's cost analysis also counts one iteration).

FLOPs follow XLA's `HloCostAnalysis` conventions, so totals match
`jax.jit(f).lower(*args).cost_analysis()` for the primitives below:

* `dot_general`: 2 x (output elements) x (contracted size);
* `conv_general_dilated`: 2 x (output batch x features) x (input features per
  group) x (kernel taps that land on real input, padding excluded);
* arithmetic and comparisons: one FLOP per output element (`integer_pow`: the
  multiplications of binary exponentiation);
* `exp`, `log`, `tanh`, `sqrt`, `sin`, ...: one *transcendental* per element
  and no FLOPs, as XLA reports them separately;
* reductions: (input elements - output elements); cumulative ops: one per
  element;
* structural ops (`reshape`, `broadcast_in_dim`, `slice`,
  `convert_element_type`, ...): none.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

from jax import lax

from . import _jax_compat as compat
from ._interpreter import Interpreter
from ._registry import RuleRegistry
from ._trace import Staged


class Cost(NamedTuple):
    """The arithmetic cost of one equation."""

    flops: int = 0
    transcendentals: int = 0


# A cost rule: `rule(out_avals, *in_avals, **params) -> Cost`.
CostRule = Callable[..., Cost]

cost_rules: RuleRegistry[CostRule] = RuleRegistry(
    "count", qualname="jaxinterp._count.cost_rules"
)


def _size(aval: Any) -> int:
    return math.prod(getattr(aval, "shape", ()))


def register_elementwise_cost(
    prims: Iterable[Any], *, transcendental: bool = False
) -> None:
    """Register one FLOP (or transcendental) per output element for each of `prims`."""

    def rule(out_avals: Sequence[Any], *in_avals: Any, **params: Any) -> Cost:
        n = sum(_size(a) for a in out_avals)
        return Cost(0, n) if transcendental else Cost(n, 0)

    for prim in prims:
        if prim is not None:
            cost_rules.register(prim, rule)


def _prims(*names: str) -> list[Any]:
    """The `lax` primitives with these names (absent ones are skipped)."""
    return [getattr(lax, f"{name}_p", None) for name in names]


register_elementwise_cost(
    _prims(
        "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign",
        "floor", "ceil", "round", "nextafter", "square", "select_n", "clamp",
        "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor",
        "shift_left", "shift_right_logical", "shift_right_arithmetic",
        "is_finite", "add_any",
    )
)  # fmt: skip
register_elementwise_cost(
    _prims(
        "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos",
        "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh",
        "atanh", "sqrt", "rsqrt", "cbrt", "pow", "erf", "erfc", "erf_inv",
        "lgamma", "digamma",
    ),
    transcendental=True,
)  # fmt: skip


@cost_rules.register(lax.integer_pow_p)
def _integer_pow_count(out_avals: Sequence[Any], x: Any, *, y: int) -> Cost:
    n = abs(int(y))
    muls = n.bit_length() + bin(n).count("1") - 2 if n > 0 else 0
    return Cost((muls + (y < 0)) * _size(out_avals[0]), 0)


def _reduction_cost(out_avals: Sequence[Any], *in_avals: Any, **params: Any) -> Cost:
    return Cost(max(_size(in_avals[0]) - _size(out_avals[0]), 0), 0)


for _prim in _prims(
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
    "reduce_or", "reduce_xor", "argmax", "argmin",
):  # fmt: skip
    if _prim is not None:
        cost_rules.register(_prim, _reduction_cost)
register_elementwise_cost(_prims("cumsum", "cumprod", "cummax", "cummin"))


@cost_rules.register(lax.dot_general_p)
def _dot_general_count(
    out_avals: Sequence[Any], lhs: Any, rhs: Any, *, dimension_numbers: Any, **params
) -> Cost:
    (lhs_contract, _), _ = dimension_numbers
    contracted = math.prod(lhs.shape[d] for d in lhs_contract)
    return Cost(2 * _size(out_avals[0]) * contracted, 0)


def _valid_taps(
    in_size: int,
    k_size: int,
    out_size: int,
    stride: int,
    pad_lo: int,
    lhs_dil: int,
    rhs_dil: int,
) -> int:
    """Pairs (output position, kernel tap) that read a real input element."""
    last = (in_size - 1) * lhs_dil
    taps = 0
    for o in range(out_size):
        for j in range(k_size):
            pos = o * stride + j * rhs_dil - pad_lo
            taps += 0 <= pos <= last and pos % lhs_dil == 0
    return taps


@cost_rules.register(lax.conv_general_dilated_p)
def _conv_general_dilated_count(
    out_avals: Sequence[Any],
    lhs: Any,
    rhs: Any,
    *,
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int],
    rhs_dilation: Sequence[int],
    dimension_numbers: Any,
    **params: Any,
) -> Cost:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    out = out_avals[0]
    taps = 1
    for i, (ld, rd, od) in enumerate(
        zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:], strict=True)
    ):
        taps *= _valid_taps(
            lhs.shape[ld],
            rhs.shape[rd],
            out.shape[od],
            window_strides[i],
            padding[i][0],
            lhs_dilation[i],
            rhs_dilation[i],
        )
    batch, features = out.shape[out_spec[0]], out.shape[out_spec[1]]
    in_per_group = rhs.shape[rhs_spec[1]]
    return Cost(2 * batch * features * in_per_group * taps, 0)


@dataclasses.dataclass
class Counts:
    """Equations and estimated costs of a function, per primitive name.

    Attributes:
        eqns: equations executed, per primitive (scan bodies times the trip
            count; the higher-order equations themselves count once each, a
            hijax `call_hi_primitive` under the name of the construct it
            stands for: `scan`, `remat2`, `custom_jvp_call`, ...).
        flops: FLOPs per primitive.
        transcendentals: transcendental operations per primitive.
        while_loops: `while` equations met; each body was counted once.
    """

    eqns: Counter[str] = dataclasses.field(default_factory=Counter)
    flops: Counter[str] = dataclasses.field(default_factory=Counter)
    transcendentals: Counter[str] = dataclasses.field(default_factory=Counter)
    while_loops: int = 0

    @property
    def total_eqns(self) -> int:
        """Equations in all."""
        return sum(self.eqns.values())

    @property
    def total_flops(self) -> int:
        """FLOPs in all."""
        return sum(self.flops.values())

    @property
    def total_transcendentals(self) -> int:
        """Transcendental operations in all."""
        return sum(self.transcendentals.values())

    def add(self, other: Counts, times: int = 1) -> None:
        """Add `times` copies of `other` into these counts."""
        for mine, theirs in (
            (self.eqns, other.eqns),
            (self.flops, other.flops),
            (self.transcendentals, other.transcendentals),
        ):
            for name, n in theirs.items():
                mine[name] += n * times
        self.while_loops += other.while_loops * times

    def key(self) -> tuple[int, int, int]:
        """Order by cost, for choosing the most expensive `cond` branch."""
        return (self.total_flops, self.total_transcendentals, self.total_eqns)

    def table(self) -> str:
        """Format the counts as a text table, most FLOPs first."""
        names = sorted(
            self.eqns, key=lambda n: (-self.flops[n], -self.transcendentals[n], n)
        )
        rows = [("primitive", "eqns", "flops", "transcendentals")]
        for name in names:
            rows.append(
                (
                    name,
                    f"{self.eqns[name]:,}",
                    f"{self.flops[name]:,}",
                    f"{self.transcendentals[name]:,}",
                )
            )
        rows.append(
            (
                "total",
                f"{self.total_eqns:,}",
                f"{self.total_flops:,}",
                f"{self.total_transcendentals:,}",
            )
        )
        width = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [
            "  ".join(
                cell.ljust(width[i]) if i == 0 else cell.rjust(width[i])
                for i, cell in enumerate(row)
            ).rstrip()
            for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines.insert(len(lines) - 1, "-" * len(lines[0]))
        if self.while_loops:
            lines.append(
                f"note: {self.while_loops} `while` loop(s) with a runtime trip "
                "count: each body is counted once."
            )
        return "\n".join(lines)


class OpCounter(Interpreter):
    """Walks a Jaxpr on abstract values, counting equations and their costs."""

    name: ClassVar[str] = "count"

    def __init__(self) -> None:
        super().__init__(higher_order="opaque")
        self.counts = Counts()

    def process_eqn(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        """Count `eqn` (and any sub-Jaxprs); return its output avals."""
        prim = eqn.primitive
        counts = self.counts
        # A hijax equation as the construct it stands for (`scan`, ...), so
        # that a table reads the same with JAX's hijax flags on.
        counts.eqns[compat.construct_name(eqn)] += 1
        if prim is compat.scan_p:
            scan = compat.scan_params(eqn.params)
            counts.add(self.count_closed(scan.jaxpr), scan.length)
        elif prim is compat.cond_p:
            branches = [
                self.count_closed(br) for br in compat.cond_branches(eqn.params)
            ]
            counts.add(max(branches, key=Counts.key))
        elif prim is compat.call_hi_primitive_p:
            # JAX >= 0.11 hijax: `custom_jvp`, `custom_vjp`, `checkpoint` and
            # `scan` under the future-default flags, or a user's primitive.
            # (One without an `expand` counts as one equation, like a
            # first-order one.)
            hi = compat.hijax_params(eqn.params)
            times = hi.length if hi.kind == "scan" else 1
            for body in compat.sub_jaxprs(eqn):
                counts.add(self.count_closed(body), times)
        elif prim is compat.while_p:
            counts.while_loops += 1
            for sub in compat.jaxprs_in_params(eqn.params):
                counts.add(self.count_closed(sub))
        else:
            subs = list(compat.jaxprs_in_params(eqn.params))
            if subs:  # jit, custom_jvp_call, checkpoint, ...: walk the body once
                for sub in subs:
                    counts.add(self.count_closed(sub))
            else:
                rule = cost_rules.get(prim)
                if rule is not None:
                    out_avals = [v.aval for v in eqn.outvars]
                    cost = rule(out_avals, *invals, **eqn.params)
                    counts.flops[prim.name] += cost.flops
                    counts.transcendentals[prim.name] += cost.transcendentals
        return [v.aval for v in eqn.outvars]

    def count_closed(self, jaxpr: compat.Jaxpr | compat.ClosedJaxpr) -> Counts:
        """Count a (closed or open) sub-Jaxpr with a fresh tally; return it."""
        outer, self.counts = self.counts, Counts()
        try:
            inner = compat.open_jaxpr(jaxpr)
            self.eval_jaxpr(
                inner,
                [v.aval for v in inner.constvars],
                *[v.aval for v in inner.invars],
            )
            return self.counts
        finally:
            self.counts = outer


def count_staged(staged: Staged) -> Counts:
    """Count the equations and costs of a `Staged` function."""
    return OpCounter().count_closed(staged.closed_jaxpr)
