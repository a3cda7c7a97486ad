"""Interval arithmetic: sound lower and upper bounds of a function over a box.

The interpreter's values are `Interval`s (a pytree of two arrays), not
arrays, so no primitive can be re-bound to them. Instead every first-order
primitive has a rule in `interval_rules`, call-like primitives (`jit`,
`custom_jvp_call`, ...) are walked in place (the `inline` policy), a `scan`
is rebuilt around intervals by the walker (JAX's `lax.scan` takes pytrees),
and `cond` has its own rule: it joins the branches the predicate's interval allows (all
of them under `jax.jit`, where the predicate's bounds are not concrete). A
primitive without a rule raises `MissingRuleError` citing the user's line.
Bounds ignore floating-point rounding (no outward rounding).

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


def _monotone_interval(prim, *ivs, **params):
    """For primitives non-decreasing in every operand: map both ends."""
    lo = prim.bind(*[v.lo for v in ivs], **params)
    return [Interval(lo, prim.bind(*[v.hi for v in ivs], **params))]


for _prim in [
    lax.add_p, lax.max_p, lax.min_p, lax.exp_p, lax.log_p, lax.log1p_p, lax.tanh_p,
    lax.logistic_p, lax.sqrt_p, lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p,
    lax.broadcast_in_dim_p, lax.reshape_p, lax.transpose_p, lax.squeeze_p,
    lax.slice_p, lax.concatenate_p, lax.convert_element_type_p, lax.stop_gradient_p,
]:  # fmt: skip
    interval_rules.register(_prim, ft.partial(_monotone_interval, _prim))
register = interval_rules.register
register(lax.neg_p, lambda x, **_: [Interval(-x.hi, -x.lo)])
register(lax.sub_p, lambda x, y, **_: [Interval(x.lo - y.hi, x.hi - y.lo)])
# x > y: surely true where x.lo > y.hi, possibly true where x.hi > y.lo.
register(lax.gt_p, lambda x, y, **_: [Interval(x.lo > y.hi, x.hi > y.lo)])


@register(lax.mul_p)
def _mul_interval(x, y, **params):
    ends = [x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi]
    return [hull(ends, ends)]


@register(lax.div_p)
def _div_interval(x, y, **params):
    safe = (y.lo > 0) | (y.hi < 0)  # 1/y is bounded only if 0 is not in y
    lo, hi = jnp.where(safe, 1 / y.hi, -jnp.inf), jnp.where(safe, 1 / y.lo, jnp.inf)
    return _mul_interval(x, Interval(lo, hi))


@register(lax.integer_pow_p)
def _integer_pow_interval(x, *, y):
    if y < 0:  # x**-n = 1 / x**n
        one = jnp.ones_like(x.lo)
        return _div_interval(Interval(one, one), *_integer_pow_interval(x, y=-y))
    if y % 2:  # odd powers are increasing
        return [Interval(x.lo**y, x.hi**y)]
    small, big = jnp.minimum(abs(x.lo), abs(x.hi)), jnp.maximum(abs(x.lo), abs(x.hi))
    return [Interval(jnp.where((x.lo < 0) & (x.hi > 0), 0.0, small**y), big**y)]


@register(lax.dot_general_p)
def _dot_general_interval(x, w, **params):
    """Midpoint-radius form: x.w lies in mx.mw +- (|mx|.rw + rx.|mw| + rx.rw)."""
    dot = lambda a, b: lax.dot_general_p.bind(a, b, **params)  # noqa: E731
    mx, rx = (x.lo + x.hi) / 2, (x.hi - x.lo) / 2
    mw, rw = (w.lo + w.hi) / 2, (w.hi - w.lo) / 2
    mid = dot(mx, mw)
    rad = dot(abs(mx), rw) + dot(rx, abs(mw)) + dot(rx, rw)
    return [Interval(mid - rad, mid + rad)]


@register(lax.select_n_p)
def _select_n_interval(which, *cases):
    """Join the cases that `which` may pick, element by element."""
    lo, hi = which.lo.astype(jnp.int32), which.hi.astype(jnp.int32)
    may = [(lo <= i) & (i <= hi) for i in range(len(cases))]
    los = [jnp.where(m, c.lo, jnp.inf) for m, c in zip(may, cases, strict=True)]
    his = [jnp.where(m, c.hi, -jnp.inf) for m, c in zip(may, cases, strict=True)]
    return [hull(los, his)]


@register(lax.cond_p)
def _cond_interval(index, *ops, branches, **params):
    """Walk every branch the index may take (all under `jit`) and join them."""
    first, last = 0, len(branches) - 1
    if not isinstance(index.lo, jax.core.Tracer):
        first, last = max(int(index.lo), first), min(int(index.hi), last)
    walk = IntervalInterpreter().eval_closed
    outs = [walk(branches[i], *ops) for i in range(first, last + 1)]
    return [hull([v.lo for v in vs], [v.hi for v in vs]) for vs in zip(*outs)]  # noqa: B905


CALLS = {"jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call", "remat2"}
WALKED = CALLS | {"scan"}  # constructs the walker handles around intervals


def is_walked(eqn) -> bool:
    """Whether the walker handles `eqn` itself: a call walked in place by the
    `inline` policy, or a `scan` rebuilt with interval carries."""
    if eqn.primitive.name == "call_hi_primitive":  # under JAX's hijax flags
        return jaxinterp.hijax_params(eqn).replaces in WALKED
    return eqn.primitive.name in WALKED


class IntervalInterpreter(jaxinterp.Interpreter):
    name = "interval"
    rules = interval_rules
    higher_order = "inline"  # walk jit bodies in place

    def process_eqn(self, eqn, invals):
        invals = [v if isinstance(v, Interval) else Interval(v, v) for v in invals]
        if not is_walked(eqn):
            interval_rules.lookup(eqn)  # MissingRuleError citing the user's line
        return super().process_eqn(eqn, invals)


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


def main():
    x0 = jnp.array([0.3, -0.2, 0.5])
    for radius in (0.01, 0.1, 1.0):
        box = Interval(x0 - radius, x0 + radius)
        out = bounds(net, box)
        xs = jnp.asarray(RNG.uniform(box.lo, box.hi, (2000, 3)), jnp.float32)
        ys = jax.vmap(net)(xs)
        print(f"radius {radius:<4}: bounds [{out.lo:+.4f}, {out.hi:+.4f}]   "
              f"sampled [{ys.min():+.4f}, {ys.max():+.4f}]")  # fmt: skip


if __name__ == "__main__":
    main()
