"""Interval arithmetic: sound lower and upper bounds of a function over a box.

The interpreter's values are `Interval`s (a pytree of two arrays), not
arrays. Every first-order primitive has a rule in `interval_rules`; control
flow and calls need none. Under the default `recursive` policy the walker
rebuilds `jit`, `scan`, `while_loop` and `checkpoint` around intervals (JAX's
constructs take pytrees), walks the primal body of `custom_jvp` and
`custom_vjp` calls (`jax.nn.relu`), and `lift`s a loop carry that starts as a
plain array (`jnp.zeros(3)`) and becomes an interval. A `cond` whose
predicate is an interval runs every branch and joins, with the `select_n`
rule, those the predicate allows (elementwise, under `jax.jit` too). A
`while_loop` whose condition depends on an interval is refused
(`jaxinterp.CustomValueError`): its trip count would vary over the box; loops
counting with plain values work. A primitive without a rule raises
`MissingRuleError` citing the user's line. Bounds ignore floating-point
rounding (no outward rounding).

Run: python examples/interval.py
"""

from __future__ import annotations

import dataclasses
import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxinterp


@jax.tree_util.register_dataclass  # a pytree, so `jax.jit(bounds)` can return it
@dataclasses.dataclass(frozen=True)
class Interval:
    """Elementwise bounds `lo <= x <= hi` of an array."""

    lo: jax.Array
    hi: jax.Array


def hull(los, his) -> Interval:  # the smallest interval holding all of them
    return Interval(ft.reduce(jnp.minimum, los), ft.reduce(jnp.maximum, his))


interval_rules = jaxinterp.RuleRegistry("interval", qualname="interval_rules")


def interval_rule(prim):
    """Register `rule(*intervals, **params) -> Interval` for `prim`. Plain
    operands become degenerate intervals; an equation with no interval
    operand (a loop counter) runs as it is."""

    def register(rule):
        def on_values(*invals, **params):
            if not any(isinstance(v, Interval) for v in invals):
                return [prim.bind(*invals, **params)]
            ivs = [v if isinstance(v, Interval) else Interval(v, v) for v in invals]
            return [rule(*ivs, **params)]

        interval_rules.register(prim, on_values)
        return rule

    return register


def _monotone_interval(prim, *ivs, **params):
    """For primitives non-decreasing in every operand: map both ends."""
    lo = prim.bind(*[v.lo for v in ivs], **params)
    return Interval(lo, prim.bind(*[v.hi for v in ivs], **params))


for _prim in [
    lax.add_p, lax.max_p, lax.min_p, lax.exp_p, lax.log_p, lax.log1p_p, lax.tanh_p,
    lax.logistic_p, lax.sqrt_p, lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p,
    lax.broadcast_in_dim_p, lax.reshape_p, lax.transpose_p, lax.squeeze_p,
    lax.slice_p, lax.concatenate_p, lax.convert_element_type_p, lax.stop_gradient_p,
]:  # fmt: skip
    interval_rule(_prim)(ft.partial(_monotone_interval, _prim))
interval_rule(lax.neg_p)(lambda x, **_: Interval(-x.hi, -x.lo))
interval_rule(lax.sub_p)(lambda x, y, **_: Interval(x.lo - y.hi, x.hi - y.lo))
# x > y: surely true where x.lo > y.hi, possibly true where x.hi > y.lo.
interval_rule(lax.gt_p)(lambda x, y, **_: Interval(x.lo > y.hi, x.hi > y.lo))
interval_rule(lax.lt_p)(lambda x, y, **_: Interval(x.hi < y.lo, x.lo < y.hi))


@interval_rule(lax.mul_p)
def _mul_interval(x, y, **params):
    ends = [x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi]
    return hull(ends, ends)


@interval_rule(lax.div_p)
def _div_interval(x, y, **params):
    safe = (y.lo > 0) | (y.hi < 0)  # 1/y is bounded only if 0 is not in y
    lo, hi = jnp.where(safe, 1 / y.hi, -jnp.inf), jnp.where(safe, 1 / y.lo, jnp.inf)
    return _mul_interval(x, Interval(lo, hi))


@interval_rule(lax.integer_pow_p)
def _integer_pow_interval(x, *, y):
    if y < 0:  # x**-n = 1 / x**n
        one = jnp.ones_like(x.lo)
        return _div_interval(Interval(one, one), _integer_pow_interval(x, y=-y))
    if y % 2:  # odd powers are increasing
        return Interval(x.lo**y, x.hi**y)
    small, big = jnp.minimum(abs(x.lo), abs(x.hi)), jnp.maximum(abs(x.lo), abs(x.hi))
    return Interval(jnp.where((x.lo < 0) & (x.hi > 0), 0.0, small**y), big**y)


@interval_rule(lax.dot_general_p)
def _dot_general_interval(x, w, **params):
    """Midpoint-radius form: x.w lies in mx.mw +- (|mx|.rw + rx.|mw| + rx.rw)."""
    dot = lambda a, b: lax.dot_general_p.bind(a, b, **params)  # noqa: E731
    mx, rx = (x.lo + x.hi) / 2, (x.hi - x.lo) / 2
    mw, rw = (w.lo + w.hi) / 2, (w.hi - w.lo) / 2
    mid = dot(mx, mw)
    rad = dot(abs(mx), rw) + dot(rx, abs(mw)) + dot(rx, rw)
    return Interval(mid - rad, mid + rad)


@interval_rule(lax.select_n_p)
def _select_n_interval(which, *cases):
    """Join the cases that `which` may pick, element by element."""
    lo, hi = which.lo.astype(jnp.int32), which.hi.astype(jnp.int32)
    may = [(lo <= i) & (i <= hi) for i in range(len(cases))]
    los = [jnp.where(m, c.lo, jnp.inf) for m, c in zip(may, cases, strict=True)]
    his = [jnp.where(m, c.hi, -jnp.inf) for m, c in zip(may, cases, strict=True)]
    return hull(los, his)


class IntervalInterpreter(jaxinterp.Interpreter):
    name = "interval"
    rules = interval_rules

    def default_rule(self, eqn, invals):  # a first-order primitive without a rule
        if any(isinstance(v, Interval) for v in invals):
            interval_rules.lookup(eqn)  # MissingRuleError citing the user's line
        return super().default_rule(eqn, invals)

    def lift(self, value, like):  # a plain loop carry that becomes an interval
        return Interval(value, value)


def bounds(fn, *boxes: Interval):
    """Bounds of `fn` over the box of `Interval` arguments (one array each)."""
    boxes = [Interval(jnp.asarray(b.lo), jnp.asarray(b.hi)) for b in boxes]
    staged = jaxinterp.stage(
        fn, *[jax.ShapeDtypeStruct(b.lo.shape, b.lo.dtype) for b in boxes]
    )
    return staged.unflatten_out(IntervalInterpreter().run(staged, list(boxes)))


RNG = np.random.default_rng(0)
W1 = jnp.asarray(RNG.normal(size=(3, 16)), jnp.float32)
W2 = jnp.asarray(RNG.normal(size=16) / 4, jnp.float32)


def net(x):
    h = jax.nn.relu(jnp.tanh(x @ W1 + 0.1))  # relu: custom_jvp around a jit
    score = jnp.sum(h * W2) + 0.1 * jnp.max(x) ** 2
    return lax.cond(score > 0, lambda s: jnp.log1p(s**2), lambda s: s / 2, score)


def rnn(x):
    """A recurrent net: a `scan` over the inputs, then three more steps of a
    `while_loop` counting with a plain integer. Both carries start plain."""
    step = lambda h, a: (jnp.tanh(h * 0.5 + a * W2[:3]), None)  # noqa: E731
    h, _ = lax.scan(step, jnp.zeros(3), x)
    more = lambda s: (s[0] + 1, jnp.tanh(s[1] - 0.3 * x))  # noqa: E731
    _, h = lax.while_loop(lambda s: s[0] < 3, more, (0, h))
    return jnp.sum(h)


def main():
    x0 = jnp.array([0.3, -0.2, 0.5])
    for fn, radius in [(net, 0.01), (net, 0.1), (net, 1.0), (rnn, 0.1), (rnn, 1.0)]:
        box = Interval(x0 - radius, x0 + radius)
        out = bounds(fn, box)
        xs = jnp.asarray(RNG.uniform(box.lo, box.hi, (2000, 3)), jnp.float32)
        # lax.map, not vmap: JAX's hijax scan (future flags) cannot batch yet.
        ys = jax.jit(lambda xs, fn=fn: lax.map(fn, xs))(xs)
        print(f"{fn.__name__} radius {radius:<4}: bounds [{out.lo:+.4f}, "
              f"{out.hi:+.4f}]   sampled [{ys.min():+.4f}, "
              f"{ys.max():+.4f}]")  # fmt: skip


if __name__ == "__main__":
    main()
