"""Interpreters whose values are their own pytrees, through every construct.

The interpreter here is the gallery's forward-mode AD with dual numbers
(`examples/dual_numbers.py`: a `jax.tree_util.register_dataclass` dataclass
of two arrays), with one rule for first-order primitives only: `jit`,
`cond`, `switch`, `scan`, `fori_loop`, `while_loop`, `checkpoint`,
`custom_jvp`, `custom_vjp`, `pmap` and their nestings go through the walker's own
handling. Results are compared with `jax.jvp` of the
function (of the same function without the `custom_vjp`, which `jax.jvp`
refuses), eagerly and under `jax.jit`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import flags_off, tree_allclose
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp


def _load_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "dual_numbers.py"
    spec = importlib.util.spec_from_file_location("example_dual_numbers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# The gallery's interpreter (`examples/dual_numbers.py`) is the one tested.
_dual = sys.modules.get("example_dual_numbers") or _load_example()
Dual, DualInterpreter, dual_jvp = _dual.Dual, _dual.DualInterpreter, _dual.dual_jvp


_cv = jax.custom_vjp(lambda x: jnp.sin(x) * 2.0)
_cv.defvjp(lambda x: (jnp.sin(x) * 2.0, x), lambda x, g: (2 * jnp.cos(x) * g,))

# name: (function, reference for `jax.jvp` or `None` for the function)
CASES = {
    "jit": (lambda x: jax.jit(lambda y: jnp.sin(y) * y)(x), None),
    "cond": (lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), None),
    "switch": (
        lambda x: lax.switch(jnp.argmax(x), [jnp.sin, jnp.cos, jnp.tanh], x),
        None,
    ),
    "cond-one-branch-plain": (
        lambda x: lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: jnp.ones(3), x),
        None,
    ),
    "scan": (
        lambda x: lax.scan(lambda c, a: (c * jnp.sin(a), c), x, jnp.ones((2, 3)))[0],
        None,
    ),
    "scan-carry-starts-plain": (
        lambda x: lax.scan(lambda c, a: (c * 0.5 + jnp.sin(a), None), jnp.zeros(()), x)[
            0
        ],
        None,
    ),
    "fori": (
        lambda x: lax.fori_loop(0, 3, lambda i, c: c * jnp.cos(x), jnp.ones(3)),
        None,
    ),
    "while": (
        lambda x: lax.while_loop(
            lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.sin(s[1])), (0, x)
        )[1],
        None,
    ),
    "while-carry-starts-plain": (
        lambda x: lax.while_loop(
            lambda s: s[0] < 3,
            lambda s: (s[0] + 1, s[1] + jnp.sin(x)),
            (0, jnp.zeros(3)),
        )[1],
        None,
    ),
    "checkpoint": (lambda x: jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x), None),
    "custom_jvp": (lambda x: jax.nn.relu(x) * x, None),
    "custom_vjp": (lambda x: _cv(x) + x, lambda x: jnp.sin(x) * 2.0 + x),
    "nested": (
        lambda x: jax.jit(
            lambda y: lax.scan(
                lambda c, a: (lax.cond(a > 0, jnp.sin, jax.nn.relu, c) + a, None),
                y,
                jnp.array([0.5, -0.5]),
            )[0]
        )(x),
        None,
    ),
}
# `jax.pmap` on one device: an `xla_pmap` before JAX 0.10, a `jit` of a
# `shard_map` from 0.10; the dual numbers go through the rebuilt map.
_pm = jax.pmap(
    lambda v: jnp.sin(v) * v + lax.psum(v, "j"),
    axis_name="j",
    devices=jax.local_devices()[:1],
)
CASES["pmap"] = (lambda x: _pm(x[None])[0], None)
X = jnp.array([0.3, -0.8, 1.2])
T = jnp.array([1.0, 0.5, -2.0])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_dual_numbers_through_every_construct(name, jit):
    f, reference = CASES[name]
    run = (
        jax.jit(lambda x, t: dual_jvp(f, x, t))
        if jit
        else (lambda x, t: dual_jvp(f, x, t))
    )
    tree_allclose(run(X, T), flags_off(jax.jvp, reference or f, (X,), (T,)))


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.floats(-2.0, 2.0, width=32), min_size=3, max_size=3),
    st.lists(st.floats(-2.0, 2.0, width=32), min_size=3, max_size=3),
)
def test_dual_numbers_loop_carry_fixpoint(x, t):
    f = CASES["scan-carry-starts-plain"][0]
    x, t = jnp.asarray(x, jnp.float32), jnp.asarray(t, jnp.float32)
    want = flags_off(jax.jvp, f, (x,), (t,))
    tree_allclose(dual_jvp(f, x, t), want, rtol=1e-5, atol=1e-5)


class NoLift(DualInterpreter):
    name = "no_lift"
    lift = jaxinterp.Interpreter.lift


def test_a_carry_changing_type_without_lift_names_the_loop():
    f = CASES["while-carry-starts-plain"][0]
    staged = jaxinterp.stage(f, jax.ShapeDtypeStruct(X.shape, X.dtype))
    with pytest.raises(jaxinterp.CustomValueError) as info:
        NoLift().run(staged, [Dual(X, T)])
    message = str(info.value)
    assert isinstance(info.value, TypeError)
    assert "`no_lift` at primitive `while`" in message
    expected = "carry 1 of `while` is a plain array f32[3] where the construct needs"
    assert f"{expected} a `Dual`" in message
    assert "Define `lift(self, value, like)`" in message
    assert "test_custom_values.py" in message  # the user's line


@jax.custom_jvp
def _doubled_slope(x):
    """The identity, with a custom JVP rule that says slope 2 (on purpose)."""
    return x


@_doubled_slope.defjvp
def _doubled_slope_jvp(primals, tangents):
    return primals[0], 2.0 * tangents[0]


class BodyWalker(DualInterpreter):
    """Dual numbers that keep the default: walk a custom call's primal body."""

    def custom_derivative(self, eqn, invals, kind):
        return jaxinterp.Interpreter.custom_derivative(self, eqn, invals, kind)


def _through_custom_jvp(x):
    return jnp.sin(_doubled_slope(x * 3.0))


@pytest.mark.parametrize("jit", [False, True])
@given(st.floats(-2.0, 2.0), st.floats(-1.0, 1.0))
@settings(max_examples=10, deadline=None)
def test_custom_derivative_chooses_the_rule_or_the_primal_body(jit, x, t):
    x, t = jnp.float32(x), jnp.float32(t)

    def run(interp):
        staged = jaxinterp.stage(_through_custom_jvp, x)
        fn = lambda x, t: interp.run(staged, [Dual(x, t)])[0]  # noqa: E731
        out = (jax.jit(fn) if jit else fn)(x, t)
        return out.primal, out.tangent

    # By default the primal body is walked: the identity's slope, 1.
    body = jax.jvp(lambda v: jnp.sin(v * 3.0), (x,), (t,))
    tree_allclose(run(BodyWalker()), body, rtol=1e-5, atol=1e-6)
    # The gallery's `custom_derivative` takes the call's rule (slope 2), as
    # `jax.jvp` does.
    want = jax.jvp(_through_custom_jvp, (x,), (t,))
    tree_allclose(run(DualInterpreter()), want, rtol=1e-5, atol=1e-6)
