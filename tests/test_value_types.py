"""Interpreters whose values are their own pytrees, through every construct.

Written here as a new user would, independently of the gallery: dual numbers
with hand-written derivatives (checked against `jax.jvp`) and interval
arithmetic (bounds checked by sampling the box). Values are
`jax.tree_util.register_dataclass` dataclasses of arrays, and both
interpreters have rules for first-order primitives only: `jit`, `cond`,
`switch`, `scan` (custom carry and custom `xs`), `fori_loop`, `while_loop`,
`checkpoint`, `custom_jvp` (`jax.nn.relu`, `jax.nn.softplus`, a user's own),
`custom_vjp`, `closed_call` and their nestings go through the walker's own
handling, eagerly and under `jax.jit` of the transformed function, with
JAX's hijax future flags off and on. Loop carries that start plain and
become custom need `lift`; `cond` branches returning different types are
joined by it too.

Two more value types check what the first two do not: taint tags (a boolean
leaf; no rules at all, `default_rule` only) and units (a static field, which
both sides of a construct must agree on).
"""

from __future__ import annotations

import dataclasses
import functools as ft
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    flags_off,
    future_flags,
    future_flags_available,
    future_flags_on,
    tree_allclose,
)
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp import _jax_compat as compat

# ---------------------------------------------------------------------------
# Dual numbers with hand-written derivatives.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Dual:
    p: jax.Array  # primal
    t: jax.Array  # tangent


def _floating(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


dual_rules = jaxinterp.RuleRegistry("dual_test")


def _dual_rule(prim, derivative):
    """Register `derivative(out, primals, tangents, **params) -> tangent`;
    operands that are plain get a zero tangent, and an equation with no dual
    operand runs as it is."""

    def rule(*invals, **params):
        out = prim.bind(*[v.p if isinstance(v, Dual) else v for v in invals], **params)
        if not any(isinstance(v, Dual) for v in invals) or not _floating(out):
            return [out]
        primals = [v.p if isinstance(v, Dual) else v for v in invals]
        tangents = [
            v.t if isinstance(v, Dual) else (jnp.zeros_like(v) if _floating(v) else v)
            for v in invals
        ]
        return [Dual(out, derivative(out, primals, tangents, **params))]

    dual_rules.register(prim, rule)


def _linear(prim):
    """A primitive linear in its floating operands: its tangent is itself
    applied to the tangents (integer and boolean operands kept)."""
    _dual_rule(prim, lambda out, ps, ts, **params: prim.bind(*ts, **params))


for _prim in [
    lax.add_p, lax.sub_p, lax.neg_p, lax.reduce_sum_p, lax.broadcast_in_dim_p,
    lax.reshape_p, lax.squeeze_p, lax.transpose_p, lax.slice_p,
    lax.concatenate_p, lax.dynamic_slice_p, lax.select_n_p, lax.copy_p,
    lax.convert_element_type_p,
]:  # fmt: skip
    _linear(_prim)
for _prim in [lax.gt_p, lax.lt_p, lax.ge_p, lax.le_p, lax.eq_p, lax.ne_p,
              lax.argmax_p, lax.clamp_p, lax.sign_p]:  # fmt: skip
    _dual_rule(_prim, lambda out, ps, ts, **_: jnp.zeros_like(out))


def _unary(prim, slope):
    """`slope(out, x, **params)`: the derivative (params such as `accuracy` are
    ignored unless `slope` names them)."""
    _dual_rule(prim, lambda out, ps, ts, **params: slope(out, ps[0], **params) * ts[0])


_unary(lax.sin_p, lambda out, x, **_: jnp.cos(x))
_unary(lax.cos_p, lambda out, x, **_: -jnp.sin(x))
_unary(lax.tanh_p, lambda out, x, **_: 1 - out * out)
_unary(lax.exp_p, lambda out, x, **_: out)
_unary(lax.log_p, lambda out, x, **_: 1 / x)
_unary(lax.log1p_p, lambda out, x, **_: 1 / (1 + x))
_unary(lax.abs_p, lambda out, x, **_: jnp.sign(x))
_unary(lax.integer_pow_p, lambda out, x, y: y * x ** (y - 1))
_dual_rule(lax.mul_p, lambda out, ps, ts, **_: ts[0] * ps[1] + ps[0] * ts[1])
_dual_rule(lax.div_p, lambda out, ps, ts, **_: (ts[0] - out * ts[1]) / ps[1])


def _max_tangent(out, ps, ts, **_):  # ties share the tangent, as in JAX
    x, y = ps
    return jnp.where(x > y, ts[0], jnp.where(x < y, ts[1], (ts[0] + ts[1]) / 2))


_dual_rule(lax.max_p, _max_tangent)
_dual_rule(lax.min_p, lambda out, ps, ts, **_: _max_tangent(out, [-p for p in ps], ts))


class DualTest(jaxinterp.Interpreter):
    name = "dual_test"
    rules = dual_rules

    def lift(self, value, like):
        return Dual(value, jnp.zeros_like(value))


def dual_jvp(fn, x, t):
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(x.shape, x.dtype))
    (out,) = DualTest().run(staged, [Dual(x, t)])
    return out.p, out.t


# ---------------------------------------------------------------------------
# Intervals.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Box:
    lo: jax.Array
    hi: jax.Array


box_rules = jaxinterp.RuleRegistry("box_test")


def _box_rule(prim):
    """Register `rule(*boxes, **params) -> Box` for `prim`; plain operands
    become degenerate boxes, and an equation with no box operand (a loop
    counter) runs as it is."""

    def register(rule):
        def on_values(*invals, **params):
            if not any(isinstance(v, Box) for v in invals):
                return [prim.bind(*invals, **params)]
            boxes = [v if isinstance(v, Box) else Box(v, v) for v in invals]
            return [rule(*boxes, **params)]

        box_rules.register(prim, on_values)
        return rule

    return register


def _hull(*boxes):
    return Box(
        ft.reduce(jnp.minimum, [b.lo for b in boxes]),
        ft.reduce(jnp.maximum, [b.hi for b in boxes]),
    )


for _prim in [
    lax.add_p, lax.max_p, lax.min_p, lax.exp_p, lax.log1p_p, lax.log_p,
    lax.tanh_p, lax.reduce_sum_p, lax.reduce_max_p, lax.broadcast_in_dim_p,
    lax.reshape_p, lax.squeeze_p, lax.transpose_p, lax.slice_p,
    lax.concatenate_p, lax.convert_element_type_p, lax.clamp_p, lax.copy_p,
]:  # fmt: skip
    _box_rule(_prim)(
        lambda *bs, _prim=_prim, **params: Box(
            _prim.bind(*[b.lo for b in bs], **params),
            _prim.bind(*[b.hi for b in bs], **params),
        )
    )
_box_rule(lax.neg_p)(lambda x, **_: Box(-x.hi, -x.lo))
_box_rule(lax.sub_p)(lambda x, y, **_: Box(x.lo - y.hi, x.hi - y.lo))
# Comparisons: `lo` where surely true, `hi` where possibly true.
_box_rule(lax.gt_p)(lambda x, y, **_: Box(x.lo > y.hi, x.hi > y.lo))
_box_rule(lax.lt_p)(lambda x, y, **_: Box(x.hi < y.lo, x.lo < y.hi))
_box_rule(lax.ne_p)(
    lambda x, y, **_: Box(
        (x.lo > y.hi) | (x.hi < y.lo),
        ~((x.lo == x.hi) & (y.lo == y.hi) & (x.lo == y.lo)),
    )
)


@_box_rule(lax.mul_p)
def _box_mul(x, y, **_):
    return _hull(*[Box(a * b, a * b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)])


@_box_rule(lax.abs_p)
def _box_abs(x, **_):
    straddles = (x.lo < 0) & (x.hi > 0)
    small = jnp.minimum(abs(x.lo), abs(x.hi))
    return Box(jnp.where(straddles, 0, small), jnp.maximum(abs(x.lo), abs(x.hi)))


@_box_rule(lax.integer_pow_p)
def _box_pow(x, *, y):
    assert y >= 1
    if y % 2:
        return Box(x.lo**y, x.hi**y)
    a = _box_abs(x)
    return Box(a.lo**y, a.hi**y)


@_box_rule(lax.sin_p)
def _box_sin(x, **_):
    def reaches(c):  # some c + 2 pi k lies in [lo, hi]
        k = 2 * math.pi
        return jnp.ceil((x.lo - c) / k) <= jnp.floor((x.hi - c) / k)

    a, b = jnp.sin(x.lo), jnp.sin(x.hi)
    return Box(
        jnp.where(reaches(-math.pi / 2), -1.0, jnp.minimum(a, b)),
        jnp.where(reaches(math.pi / 2), 1.0, jnp.maximum(a, b)),
    )


_box_rule(lax.cos_p)(
    lambda x, **_: _box_sin(Box(x.lo + math.pi / 2, x.hi + math.pi / 2))
)


@_box_rule(lax.select_n_p)
def _box_select_n(which, *cases):
    lo, hi = which.lo.astype(jnp.int32), which.hi.astype(jnp.int32)
    may = [(lo <= i) & (i <= hi) for i in range(len(cases))]
    return _hull(
        *[
            Box(jnp.where(m, c.lo, jnp.inf), jnp.where(m, c.hi, -jnp.inf))
            for m, c in zip(may, cases, strict=True)
        ]
    )


@_box_rule(lax.argmax_p)
def _box_argmax(x, *, axes, index_dtype):
    assert x.lo.ndim == 1 and axes == (0,)
    may = x.hi >= x.lo.max()  # entries that may be the largest
    idx = jnp.arange(x.lo.shape[0], dtype=index_dtype)
    return Box(jnp.min(jnp.where(may, idx, idx[-1])), jnp.max(jnp.where(may, idx, 0)))


class BoxTest(jaxinterp.Interpreter):
    name = "box_test"
    rules = box_rules

    def lift(self, value, like):
        return Box(value, value)


def box_bounds(fn, lo, hi):
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(lo.shape, lo.dtype))
    (out,) = BoxTest().run(staged, [Box(lo, hi)])
    return out.lo, out.hi


# ---------------------------------------------------------------------------
# The programs: every construct and some nestings, as functions of f32[3].


@jax.custom_jvp
def _user_jvp(x):
    return jnp.sin(x) * x


_user_jvp.defjvp(
    lambda p, t: (_user_jvp(p[0]), (jnp.cos(p[0]) * p[0] + jnp.sin(p[0])) * t[0])
)


def _cv_body(x):
    return jnp.tanh(x) * 2.0


_user_vjp = jax.custom_vjp(_cv_body)
_user_vjp.defvjp(
    lambda x: (_cv_body(x), x), lambda x, g: (2 * (1 - jnp.tanh(x) ** 2) * g,)
)


def closed_call(fn, x):
    """`fn(x)` as a `closed_call` equation (no public API emits one)."""
    inner = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(x.shape, x.dtype))
    (out,) = compat.bind_eqn(compat.closed_call_p, [x], {"call_jaxpr": inner})
    return out


CONST_PRED = jnp.arange(3).sum() > 1  # a predicate independent of the input


def _scan_xs(c, a):
    return c * 0.5 + jnp.sin(a), c


# name: (program, reference for `jax.jvp` and sampling, or `None` for itself)
PROGRAMS = {
    "jit": lambda x: jax.jit(lambda y: jnp.sin(y) * y)(x),
    "cond": lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x),
    "cond-plain-predicate": lambda x: lax.cond(CONST_PRED, jnp.sin, jnp.tanh, x),
    "cond-branch-types-differ": lambda x: lax.cond(
        CONST_PRED, lambda y: jnp.ones(3), lambda y: y * 2.0, x
    ),
    "cond-branch-types-differ-custom-predicate": lambda x: lax.cond(
        x[0] > 0, lambda y: y * 2.0, lambda y: jnp.ones(3), x
    ),
    "switch": lambda x: lax.switch(jnp.argmax(x), [jnp.sin, jnp.cos, jnp.tanh], x),
    "scan-carry": lambda x: lax.scan(
        lambda c, a: (c * jnp.sin(a) + a, c), x, jnp.ones((2, 3))
    )[0],
    "scan-xs-carry-starts-plain": lambda x: (lambda c, ys: c + ys.sum())(
        *lax.scan(_scan_xs, jnp.zeros(()), x)
    ),
    "scan-reverse": lambda x: lax.scan(_scan_xs, jnp.zeros(()), x, reverse=True)[0],
    "fori_loop": lambda x: lax.fori_loop(
        0, 3, lambda i, c: c * jnp.cos(x) + 0.1, jnp.ones(3)
    ),
    "fori_loop-dynamic-bounds": lambda x: lax.fori_loop(
        0, jnp.argmax(jnp.arange(4)), lambda i, c: c * jnp.cos(x) + 0.1, jnp.ones(3)
    ),
    "while_loop": lambda x: lax.while_loop(
        lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.sin(s[1])), (0, x)
    )[1],
    "while_loop-carry-starts-plain": lambda x: lax.while_loop(
        lambda s: s[0] < 3,
        lambda s: (s[0] + 1, s[1] * 0.5 + jnp.sin(x)),
        (0, jnp.zeros(3)),
    )[1],
    "checkpoint": lambda x: jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x),
    "relu": lambda x: jax.nn.relu(x) * x,
    "softplus": jax.nn.softplus,
    "user-custom_jvp": _user_jvp,
    "custom_vjp": lambda x: _user_vjp(x) + x,
    "closed_call": lambda x: closed_call(lambda y: jnp.exp(y) - 1.0, x) * 2.0,
    # Nestings.
    "scan-in-cond-in-jit": lambda x: jax.jit(
        lambda y: lax.cond(
            y.sum() > 0,
            lambda z: lax.scan(_scan_xs, jnp.zeros(()), z)[0] * jnp.ones(3),
            lambda z: z * 2.0,
            y,
        )
    )(x),
    "while-in-scan": lambda x: lax.scan(
        lambda c, a: (
            lax.while_loop(
                lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] * 0.5 + a), (0, c)
            )[1],
            None,
        ),
        jnp.zeros(()),
        x,
    )[0],
    "custom_jvp-in-scan": lambda x: lax.scan(
        lambda c, a: (jax.nn.relu(c + a) + _user_jvp(a), None), jnp.zeros(()), x
    )[0],
    "cond-in-scan": lambda x: lax.scan(
        lambda c, a: (lax.cond(a > 0, jnp.sin, jax.nn.softplus, c) + a, None),
        jnp.zeros(()),
        x,
    )[0],
    "custom_vjp-in-while": lambda x: lax.while_loop(
        lambda s: s[0] < 2, lambda s: (s[0] + 1, _user_vjp(s[1]) + x), (0, jnp.zeros(3))
    )[1],
    "checkpoint-and-closed_call-in-fori": lambda x: lax.fori_loop(
        0,
        2,
        lambda i, c: jax.checkpoint(lambda y: closed_call(jnp.tanh, y) + jnp.sin(x))(c),
        jnp.zeros(3),
    ),
    "jit-in-while-in-checkpoint": lambda x: jax.checkpoint(
        lambda y: lax.while_loop(
            lambda s: s[0] < 2,
            lambda s: (s[0] + 1, jax.jit(lambda v: v * jnp.cos(y))(s[1])),
            (0, jnp.ones(3)),
        )[1]
    )(x),
}
# `jax.jvp` refuses `custom_vjp` functions: the reference is the same program
# on the function's body, whose derivative the custom rule gives anyway.
REFERENCES = {
    "custom_vjp": lambda x: _cv_body(x) + x,
    "custom_vjp-in-while": lambda x: lax.while_loop(
        lambda s: s[0] < 2, lambda s: (s[0] + 1, _cv_body(s[1]) + x), (0, jnp.zeros(3))
    )[1],
}
X = jnp.array([0.3, -0.8, 1.2], jnp.float32)
T = jnp.array([1.0, 0.5, -2.0], jnp.float32)


def _modes():
    """Eager and jitted; under the flags too where a run with JAX's future
    flags on (CI's second run, `JAXINTERP_TEST_FUTURE_FLAGS=1`) will not
    cover them: only the jitted walk then, to keep the suite quick."""
    modes = [("eager", False), ("jit", False)]
    if future_flags_available() and not future_flags_on():
        modes += [("jit-flags", True)]
    return modes


MODES = {name: flags for name, flags in _modes()}


def _plain_jax_differs_or_raise(mode, f, err):
    """Under the future flags, skip (printing why) a failed check of a
    program whose meaning plain JAX itself changes there (JAX 0.12.0.1's
    `Scan3` ignores `reverse`, its `jit` drops a `Scan3` whose only use is its
    carry): jaxinterp follows one of the two meanings. Else re-raise `err`."""
    if MODES[mode] or future_flags_on():
        want = flags_off(f, X)
        with future_flags(True):
            got = (jax.jit(f) if mode.startswith("jit") else f)(X)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            reason = f"plain JAX gives {got} under the future flags, {want} without"
            print(reason)
            pytest.skip(reason)
    raise err


def _under(mode, fn, *args):
    run = jax.jit(fn) if mode.startswith("jit") else fn
    if MODES[mode]:
        with future_flags(True):
            return run(*args)
    return run(*args)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_dual_numbers_through(name, mode):
    f = PROGRAMS[name]
    got = _under(mode, lambda x, t: dual_jvp(f, x, t), X, T)
    want = flags_off(jax.jvp, REFERENCES.get(name, f), (X,), (T,))
    try:
        tree_allclose(got, want, rtol=1e-5, atol=1e-6)
    except AssertionError as err:
        _plain_jax_differs_or_raise(mode, REFERENCES.get(name, f), err)


def _samples(lo, hi, n=2000, seed=0):
    xs = np.random.default_rng(seed).uniform(lo, hi, (n, *lo.shape))
    return jnp.concatenate([jnp.asarray(xs, lo.dtype), lo[None], hi[None]])


def check_bounds(reference, lo, hi, got):
    """`got` bounds every sampled value of `reference` over the box."""
    out_lo, out_hi = got
    ys = flags_off(jax.vmap(reference), _samples(lo, hi))
    tol = 1e-5 * (1 + jnp.abs(ys))
    assert bool(jnp.all(jnp.isfinite(out_lo)) and jnp.all(jnp.isfinite(out_hi)))
    assert bool(jnp.all(ys >= out_lo - tol)), (ys.min(0), out_lo)
    assert bool(jnp.all(ys <= out_hi + tol)), (ys.max(0), out_hi)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_intervals_through(name, mode):
    f = PROGRAMS[name]
    lo, hi = X - 0.05, X + 0.05
    got = _under(mode, lambda lo, hi: box_bounds(f, lo, hi), lo, hi)
    try:
        check_bounds(REFERENCES.get(name, f), lo, hi, got)
    except AssertionError as err:
        _plain_jax_differs_or_raise(mode, REFERENCES.get(name, f), err)


# ---------------------------------------------------------------------------
# What the walker refuses, and how it says so.


class DualNoLift(DualTest):
    name = "dual_no_lift"
    lift = jaxinterp.Interpreter.lift


class BoxNoLift(BoxTest):
    name = "box_no_lift"
    lift = jaxinterp.Interpreter.lift


def _line_of(fn, text):
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _scan_plain_carry(x):
    return lax.scan(lambda c, a: (c * 0.5 + jnp.sin(a), None), jnp.zeros(()), x)[0]


def _while_plain_carry(x):
    body = lambda s: (s[0] + 1, s[1] * 0.5 + jnp.sin(x))  # noqa: E731
    return lax.while_loop(lambda s: s[0] < 3, body, (0, jnp.zeros(3)))[1]


def _fori_plain_carry(x):
    body = lambda i, c: (c[0] + 1.0, c[1] * jnp.cos(x))  # noqa: E731
    return lax.fori_loop(0, jnp.argmax(jnp.arange(3)), body, (0.0, jnp.ones(3)))[1]


def _cond_plain_branch(x):
    return lax.cond(CONST_PRED, lambda y: jnp.ones(3), lambda y: y * 2.0, x)


@pytest.mark.parametrize(
    "interp, value",
    [(DualNoLift, lambda x: Dual(x, T)), (BoxNoLift, lambda x: Box(x, x + 0.1))],
    ids=["dual", "box"],
)
@pytest.mark.parametrize(
    "fn, prim, where, plain",
    [
        (_scan_plain_carry, "scan", "carry 0", "f32[]"),
        (_while_plain_carry, "while", "carry 1", "f32[3]"),
        (_fori_plain_carry, "while", "carry 3", "f32[3]"),
        (_cond_plain_branch, "cond", "output 0 of branch 1", "f32[3]"),  # true_fun
    ],
    ids=["scan", "while", "fori_loop", "cond"],
)
def test_without_lift_the_error_names_the_construct(
    interp, value, fn, prim, where, plain
):
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(X.shape, X.dtype))
    with pytest.raises(jaxinterp.CustomValueError) as info:
        interp().run(staged, [value(X)])
    assert isinstance(info.value, TypeError)
    kind = "Dual" if interp is DualNoLift else "Box"
    message = str(info.value)
    assert message.startswith(f"`{interp.name}` at primitive `{prim}`, used at ")
    assert f"test_value_types.py:{_line_of(fn, 'lax.')}" in message
    assert (
        f"{where} of `{prim}` is a plain array {plain} where the construct needs "
        f"a `{kind}`.\n\nDefine `lift(self, value, like)` on the interpreter"
    ) in message
    assert f"defines no `lift(value, like)` to turn a plain array into a `{kind}`" in (
        message
    )


def test_a_while_condition_on_intervals_is_refused():
    def f(x):
        return lax.while_loop(lambda s: s.sum() < 3.0, lambda s: s + 1.0, x)

    with pytest.raises(jaxinterp.CustomValueError) as info:
        box_bounds(f, X, X + 0.1)
    message = str(info.value)
    assert message.startswith("`box_test` at primitive `while`, used at ")
    assert f"test_value_types.py:{_line_of(f, 'lax.while_loop')}" in message
    assert "the condition of `while` is a `Box`, not a plain boolean" in message


def test_a_cond_on_an_interval_index_joins_the_reachable_branches():
    def f(x):
        return lax.cond(x > 0, lambda v: v + 10.0, lambda v: v - 10.0, x)

    one = jnp.float32(1.0)
    assert box_bounds(f, one, 2 * one) == (11.0, 12.0)  # only the true branch
    assert box_bounds(f, -one, 2 * one) == (-11.0, 12.0)  # the hull of both


_floats3 = st.lists(st.floats(-2.0, 2.0, width=32), min_size=3, max_size=3)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(sorted(PROGRAMS)), _floats3, _floats3)
def test_dual_numbers_match_jax_jvp_anywhere(name, x, t):
    f = PROGRAMS[name]
    x, t = jnp.asarray(x, jnp.float32), jnp.asarray(t, jnp.float32)
    want = flags_off(jax.jvp, REFERENCES.get(name, f), (x,), (t,))
    tree_allclose(flags_off(dual_jvp, f, x, t), want, rtol=1e-4, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(sorted(PROGRAMS)), _floats3, st.floats(0.0, 0.5, width=32))
def test_interval_bounds_hold_over_any_box(name, x, radius):
    f = PROGRAMS[name]
    x = jnp.asarray(x, jnp.float32)
    lo, hi = x - radius, x + radius
    check_bounds(REFERENCES.get(name, f), lo, hi, flags_off(box_bounds, f, lo, hi))


# ---------------------------------------------------------------------------
# Two more value types: one with a boolean leaf and no rules at all (taint
# tracking through `default_rule` alone), one with a static field (units).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tainted:
    v: jax.Array
    tag: jax.Array  # bool, one per element: derived from the tainted input


class TaintTest(jaxinterp.Interpreter):
    """No rules: every first-order primitive goes through `default_rule`,
    which marks every result of an equation that reads a tainted value."""

    name = "taint_test"

    def default_rule(self, eqn, invals):
        plain = [v.v if isinstance(v, Tainted) else v for v in invals]
        outs = eqn.primitive.bind(*plain, **eqn.params)
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        tags = [jnp.any(v.tag) for v in invals if isinstance(v, Tainted)]
        if not tags:
            return outs
        tag = ft.reduce(jnp.logical_or, tags)
        return [Tainted(o, jnp.broadcast_to(tag, jnp.shape(o))) for o in outs]

    def lift(self, value, like):
        return Tainted(value, jnp.zeros(jnp.shape(value), bool))


def taint(fn, x):
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(x.shape, x.dtype))
    (out,) = TaintTest().run(staged, [Tainted(x, jnp.ones(x.shape, bool))])
    return out


@pytest.mark.parametrize("mode", sorted(m for m, flags in MODES.items() if not flags))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_taint_tags_through(name, mode):
    f = PROGRAMS[name]
    got = _under(mode, lambda x: taint(f, x), X)
    want = flags_off(REFERENCES.get(name, f), X)
    # The output is tainted exactly when it depends on `x`: when its Jacobian
    # is not zero (none of these programs depends on `x` only through a
    # piecewise-constant step); a plain branch output is lifted untainted.
    depends = bool(np.any(flags_off(jax.jacfwd(REFERENCES.get(name, f)), X) != 0))
    assert isinstance(got, Tainted) and got.tag.dtype == jnp.bool_
    np.testing.assert_array_equal(got.tag, jnp.full(got.tag.shape, depends))
    try:
        np.testing.assert_allclose(got.v, want, rtol=1e-5, atol=1e-6)
    except AssertionError as err:
        _plain_jax_differs_or_raise(mode, REFERENCES.get(name, f), err)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantity:
    v: jax.Array
    unit: str = dataclasses.field(metadata=dict(static=True))


unit_rules = jaxinterp.RuleRegistry("units_test")


def _same_unit(prim):
    def rule(*invals, **params):
        units = {v.unit for v in invals if isinstance(v, Quantity)}
        if len(units) > 1:
            raise TypeError(f"`{prim.name}` of mixed units {sorted(units)}")
        plain = [v.v if isinstance(v, Quantity) else v for v in invals]
        out = prim.bind(*plain, **params)
        return [Quantity(out, units.pop()) if units else out]

    unit_rules.register(prim, rule)


for _prim in [lax.add_p, lax.sub_p, lax.neg_p, lax.max_p, lax.select_n_p,
              lax.broadcast_in_dim_p, lax.reduce_sum_p, lax.copy_p,
              lax.convert_element_type_p]:  # fmt: skip
    _same_unit(_prim)


def _mul_units(*invals, **params):
    units = [v.unit for v in invals if isinstance(v, Quantity)]
    out = lax.mul_p.bind(*[v.v if isinstance(v, Quantity) else v for v in invals])
    return [Quantity(out, "*".join(units)) if units else out]


unit_rules.register(lax.mul_p, _mul_units)
for _prim in [lax.lt_p, lax.gt_p]:
    unit_rules.register(
        _prim,
        lambda *invals, _p=_prim, **params: [
            _p.bind(*[v.v if isinstance(v, Quantity) else v for v in invals])
        ],
    )


class UnitsTest(jaxinterp.Interpreter):
    name = "units_test"
    rules = unit_rules


def with_units(fn, x):
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(x.v.shape, x.v.dtype))
    (out,) = UnitsTest().run(staged, [x])
    return out


UNIT_PROGRAMS = {
    "while": lambda x: lax.while_loop(
        lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + x), (0, x)
    )[1],
    "cond": lambda x: lax.cond(X[0] > 0, lambda: x + x, lambda: x * 2.0),
    "scan": lambda x: lax.scan(lambda c, a: (c + a * 2.0, None), x, x[None])[0],
    "relu-in-checkpoint": lambda x: jax.checkpoint(jax.nn.relu)(x - x * 0.5),
    "jit": lambda x: jax.jit(lambda y: (y * 3.0) * y)(x),
}
UNITS_OUT = {"jit": "m*m"}


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(UNIT_PROGRAMS))
def test_a_static_field_goes_through(name, jitted):
    f = UNIT_PROGRAMS[name]
    run = jax.jit(with_units, static_argnums=0) if jitted else with_units
    got = run(f, Quantity(X, "m"))
    assert isinstance(got, Quantity) and got.unit == UNITS_OUT.get(name, "m")
    np.testing.assert_allclose(got.v, flags_off(f, X), rtol=1e-6)


def test_branches_disagreeing_on_a_static_field_are_refused():
    def f(x):
        return lax.cond(X[0] > 0, lambda: x * x, lambda: x)

    with pytest.raises(jaxinterp.CustomValueError) as info:
        with_units(f, Quantity(X, "m"))
    message = str(info.value)
    assert message.startswith("`units_test` at primitive `cond`, used at ")
    assert f"test_value_types.py:{_line_of(f, 'lax.cond')}" in message
    assert (
        "output 0 of branch 1 of `cond` has the pytree structure "
        "PyTreeDef(CustomNode(Quantity[('m*m',)], [*])) where the construct needs "
        "PyTreeDef(CustomNode(Quantity[('m',)], [*])): both sides of a construct "
        "must agree on the static fields of a value."
    ) in message


def test_a_custom_value_reaching_a_primitive_without_rule_is_named():
    def f(x):
        return jnp.sin(x)

    with pytest.raises(jaxinterp.CustomValueError) as info:
        with_units(f, Quantity(X, "m"))
    message = str(info.value)
    assert message.startswith("`units_test` at primitive `sin`, used at ")
    assert f"test_value_types.py:{_line_of(f, 'jnp.sin')}" in message
    assert message.endswith(
        ": no rule, so the primitive is re-bound, but operand 0 is a `Quantity`, "
        "which JAX cannot take. Register a rule for `sin` in the interpreter's "
        "`rules` (or handle it in `default_rule`)."
    )
