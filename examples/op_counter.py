"""Count operations and estimate FLOPs by walking a Jaxpr on abstract values.

The interpreter's values are not arrays but abstract values (`ShapedArray`s):
`process_eqn` reads the shapes of an equation's operands, adds its cost to a
tally and returns the avals of its outputs, so nothing is ever computed and a
large model costs one walk over its Jaxpr. Nested Jaxprs are walked by hand:
`scan` bodies count once per iteration, `cond` counts its most expensive branch
and `while` counts one iteration (its trip count is a runtime value), which are
also the conventions of XLA's cost analysis.

`jaxinterp count MODULE:FUNCTION --args "f32[8,32], ..."` prints the same kind
of table, from a fuller version of this counter.

Run: python examples/op_counter.py
"""

from __future__ import annotations

import math
from collections import Counter

import jax
import jax.numpy as jnp
from jax import lax

import jaxinterp

ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "neg", "abs", "select_n",
               "eq", "ne", "lt", "le", "gt", "ge", "square"}  # fmt: skip
TRANSCENDENTAL = {"exp", "log", "log1p", "tanh", "logistic", "sin", "cos", "sqrt",
                  "rsqrt", "pow", "erf"}  # fmt: skip
REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"}


def flops(eqn) -> tuple[int, int]:
    """(FLOPs, transcendentals) of one equation without sub-Jaxprs."""
    name = eqn.primitive.name
    ins = [v.aval for v in eqn.invars]
    out = eqn.outvars[0].aval
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        return 2 * out.size * math.prod(ins[0].shape[d] for d in contract), 0
    if name == "conv_general_dilated":
        # Padding counted as real input: exact for "VALID" convolutions.
        lhs_spec, rhs_spec, _ = eqn.params["dimension_numbers"]
        window = math.prod(ins[1].shape[d] for d in rhs_spec[2:])
        return 2 * out.size * window * ins[1].shape[rhs_spec[1]], 0
    if name in ELEMENTWISE:
        return out.size, 0
    if name in TRANSCENDENTAL:
        return 0, out.size
    if name in REDUCTIONS:
        return ins[0].size - out.size, 0
    return 0, 0  # reshape, broadcast_in_dim, convert_element_type, ...


class OpCounter(jaxinterp.Interpreter):
    """Tallies equations, FLOPs and transcendentals per primitive."""

    name = "count"

    def __init__(self):
        super().__init__()
        self.eqns, self.flops, self.transcendentals = Counter(), Counter(), Counter()

    def process_eqn(self, eqn, invals):
        name = eqn.primitive.name
        # JAX's hijax equations (`call_hi_primitive`, under its future-default
        # flags) stand for a `scan`, `custom_jvp_call`, ...: counted as such.
        hi = jaxinterp.hijax_params(eqn) if name == "call_hi_primitive" else None
        self.eqns[name if hi is None else hi.replaces] += 1
        # Bodies, branches, rules: in params, or elsewhere for hijax equations.
        subs = jaxinterp.sub_jaxprs(eqn)
        if name == "scan":  # the body runs `length` times
            scan = jaxinterp.scan_params(eqn)
            self.absorb(self.walk(scan.jaxpr), scan.length)
        elif hi is not None and hi.kind == "scan":  # the same, under `jax_scan3`
            self.absorb(self.walk(hi.body), hi.length)
        elif name == "cond":  # only one branch runs: count the costliest
            branches = [self.walk(b) for b in jaxinterp.cond_branches(eqn)]
            self.absorb(max(branches, key=lambda c: c.total()))
        elif subs:  # jit, custom_jvp_call, while (one iteration), ...
            for sub in subs:
                self.absorb(self.walk(sub))
        else:
            f, t = flops(eqn)
            self.flops[name] += f
            self.transcendentals[name] += t
        return [v.aval for v in eqn.outvars]  # abstract values in, out

    def walk(self, jaxpr) -> OpCounter:
        """Count a sub-Jaxpr with a fresh counter."""
        child = OpCounter()
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # ClosedJaxpr -> Jaxpr
        avals = lambda vs: [v.aval for v in vs]  # noqa: E731
        child.eval_jaxpr(jaxpr, avals(jaxpr.constvars), *avals(jaxpr.invars))
        return child

    def absorb(self, child: OpCounter, times: int = 1) -> None:
        for mine, theirs in zip(
            (self.eqns, self.flops, self.transcendentals),
            (child.eqns, child.flops, child.transcendentals),
            strict=True,
        ):
            for key, n in theirs.items():
                mine[key] += n * times

    def total(self) -> tuple[int, int, int]:
        return tuple(
            sum(c.values()) for c in (self.flops, self.transcendentals, self.eqns)
        )


def count(fn, *args) -> OpCounter:
    """Count `fn` on arguments (arrays or `jax.ShapeDtypeStruct`s)."""
    staged = jaxinterp.stage(fn, *args)
    return OpCounter().walk(staged.closed_jaxpr)


def model(images, kernel, w_rnn, w_out):
    """A convolution, a tanh RNN over image rows, and a softmax classifier."""
    feats = jax.nn.relu(lax.conv_general_dilated(images, kernel, (1, 1), "VALID"))
    seq = feats.mean(axis=1).transpose(1, 0, 2)  # (rows, batch, width)

    def step(h, x):
        h = jnp.tanh(h @ w_rnn + x)
        return h, h

    h, _ = lax.scan(step, jnp.zeros_like(seq[0]), seq)
    return jax.nn.log_softmax(h @ w_out)


ARGS = [jax.ShapeDtypeStruct(s, jnp.float32) for s in
        [(16, 1, 28, 28), (8, 1, 3, 3), (26, 26), (26, 10)]]  # fmt: skip


def report(counter: OpCounter) -> str:
    lines = [f"{'primitive':<22}{'eqns':>6}{'flops':>14}{'transc.':>10}"]
    for name, n in counter.eqns.most_common():
        f, t = counter.flops[name], counter.transcendentals[name]
        lines.append(f"{name:<22}{n:>6}{f:>14,}{t:>10,}")
    fl, tr, eq = counter.total()
    lines.append(f"{'total':<22}{eq:>6}{fl:>14,}{tr:>10,}")
    return "\n".join(lines)


def main() -> OpCounter:
    counter = count(model, *ARGS)
    print(report(counter))
    xla = jax.jit(model).lower(*ARGS).cost_analysis()
    print(f"XLA's estimate (one scan iteration): {xla['flops']:,.0f} flops")
    return counter


if __name__ == "__main__":
    main()
