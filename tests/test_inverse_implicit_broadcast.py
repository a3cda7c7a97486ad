"""Operands that `lax` broadcasts implicitly (`jaxinterp/_inverse/_implicit.py`).

`jnp` stages `x * s` with `x: (B, d)` and `s: (d,)` as a `mul` of `(B, d)`
and `(1, d)`, and `x[1:] + tanh(x[:1])` as an `add` of `(2,)` and `(1,)`.
The inverse must take them as it takes operands of one shape: checked
against hand-written inverses and `jax.jacfwd` + `slogdet`.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp._inverse._implicit import explicit_broadcasts

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods


def ildj_reference(f, x):
    """`-log|det J|` of `f` at `x`, from `jax.jacfwd`."""
    jac = jax.jacfwd(f)(x).reshape(np.size(x), np.size(x))
    return -jnp.linalg.slogdet(jac)[1]


def batched_affine(x, log_scale, shift):
    return x * jnp.exp(log_scale) + shift


def batched_affine_inverse(y, log_scale, shift):
    return (y - shift) * jnp.exp(-log_scale)


def odd_coupling(x, a):
    """A coupling of 1 + 2 coordinates: the shift and scale of the last two
    are functions of the first, of shape (1,)."""
    x1, x2 = x[:1], x[1:]
    return jnp.concatenate([x1, x2 * jnp.exp(jnp.tanh(x1 * a)) + a])


def odd_coupling_inverse(y, a):
    y1, y2 = y[:1], y[1:]
    return jnp.concatenate([y1, (y2 - a) * jnp.exp(-jnp.tanh(y1 * a))])


floats = st.floats(-2.0, 2.0, allow_nan=False, width=32)


def _array(values, shape):
    return jnp.asarray(np.reshape(values, shape), jnp.float32)


@settings(deadline=None)
@given(
    st.lists(floats, min_size=12, max_size=12),
    st.lists(floats, min_size=3, max_size=3),
    st.lists(floats, min_size=3, max_size=3),
)
def test_a_batched_affine_layer_with_per_feature_parameters_is_inverted(
    xs, scales, shifts
):
    x, s, t = _array(xs, (4, 3)), _array(scales, (3,)), _array(shifts, (3,))
    y = batched_affine(x, s, t)
    got, ildj = jaxinterp.inverse_and_ildj(batched_affine, argnums=0)(y, s, t)
    np.testing.assert_allclose(
        got, batched_affine_inverse(y, s, t), rtol=1e-5, atol=1e-5
    )
    want = ildj_reference(lambda x: batched_affine(x, s, t), got)
    np.testing.assert_allclose(ildj, want, rtol=1e-5, atol=1e-4)


@settings(deadline=None)
@given(st.lists(floats, min_size=3, max_size=3), floats)
def test_a_coupling_whose_conditioner_has_one_element_is_inverted(xs, a):
    jax.config.update("jax_enable_x64", True)
    try:
        x = jnp.asarray(xs, jnp.float64)
        y = odd_coupling(x, a)
        got, ildj = jaxinterp.inverse_and_ildj(odd_coupling, argnums=0)(y, a)
        np.testing.assert_allclose(got, odd_coupling_inverse(y, a), rtol=1e-12)
        want = ildj_reference(lambda x: odd_coupling(x, a), got)
        np.testing.assert_allclose(ildj, want, rtol=1e-12, atol=1e-12)
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize(
    "f",
    [
        pytest.param(lambda x, s: x + s, id="add"),
        pytest.param(lambda x, s: s - x, id="sub"),
        pytest.param(lambda x, s: x / (1.0 + s * s), id="div"),
        pytest.param(lambda x, s: jnp.maximum(x, 0.2 * (s * s) * x), id="leaky"),
        pytest.param(lambda x, s: jnp.where(x > s, 2 * x - s, x), id="piecewise"),
        pytest.param(
            lambda x, s: x / (1 + jnp.abs(x)) + 0.1 * (s * s) * x, id="solver"
        ),
        pytest.param(lambda x, s: (x**3 + x) * (1.0 + s * s), id="cubic"),
    ],
)
def test_elementwise_maps_with_a_row_of_known_operands_are_inverted(f):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)
    s = jnp.asarray([[0.5, -0.7, 1.3]], jnp.float32)  # (1, 3): broadcast over rows
    y = f(x, s)
    got, ildj = jaxinterp.inverse_and_ildj(f, argnums=0)(y, s)
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ildj, ildj_reference(lambda x: f(x, s), x), rtol=1e-4)


def test_the_inverse_composes_with_jit_vmap_and_grad():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 3)), jnp.float32)
    s = jnp.asarray([0.1, -0.2, 0.3], jnp.float32)
    t = jnp.asarray([1.0, 2.0, -3.0], jnp.float32)
    y = batched_affine(x, s, t)
    inv = jaxinterp.inverse(batched_affine, argnums=0)
    want = batched_affine_inverse(y, s, t)
    np.testing.assert_allclose(jax.jit(inv)(y, s, t), want, rtol=1e-6)
    batched = jax.vmap(inv, in_axes=(0, None, None))(y[:, None], s, t)
    np.testing.assert_allclose(batched[:, 0], want, rtol=1e-6)

    def loss(fn, s):
        return jnp.sum(fn(y, s, t) ** 2)

    np.testing.assert_allclose(
        jax.grad(lambda s: loss(inv, s))(s),
        jax.grad(lambda s: loss(batched_affine_inverse, s))(s),
        rtol=1e-5,
    )
    _, ildj_of = jaxinterp.inverse_and_ildj(batched_affine, argnums=0)(y, s, t)
    np.testing.assert_allclose(
        jax.grad(
            lambda s: jaxinterp.inverse_and_ildj(batched_affine, argnums=0)(y, s, t)[1]
        )(s),
        -4.0 * jnp.ones(3),  # ildj = -4 * sum(s): four rows
        rtol=1e-6,
    )
    assert ildj_of.shape == ()


def test_a_broadcast_unknown_is_recovered_from_its_copies_or_nan():
    """`x: (1,)` times `k: (3,)` maps onto a line in R^3: `x` comes from the
    first copy and the other copies must agree (else NaN); the ildj is in
    the coordinate the inverse reads, `-log|k[0]|`."""
    k = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    f = lambda x, k: x * k  # noqa: E731
    x = jnp.asarray([0.7], jnp.float32)
    inv = jaxinterp.inverse_and_ildj(f, argnums=0, example_args=(x,))
    got, ildj = inv(f(x, k), k)
    np.testing.assert_allclose(got, x, rtol=1e-6)
    np.testing.assert_allclose(ildj, -np.log(0.5), rtol=1e-6)
    off, ildj_off = inv(jnp.asarray([1.0, 2.0, 3.0]), k)
    assert off.shape == (1,) and np.isnan(off).all() and np.isnan(ildj_off)


def test_a_refused_step_with_a_broadcast_operand_names_the_users_line():
    def f(x, s):
        return lax.rem(x, s) + 1.0

    line = f.__code__.co_firstlineno + 1  # the `rem`
    with pytest.raises(jaxinterp.NotInvertibleError) as info:
        jaxinterp.inverse(f, argnums=0)(jnp.ones((4, 3)), jnp.ones((1, 3)))
    message = str(info.value)
    assert "Blocked at `rem`." in message
    assert re.search(
        rf"`rem` at \S+:{line}:\d+ \(\S*f\): `rem` is not invertible", message
    ), message


def test_explain_lists_the_broadcasts_written_out():
    text = jaxinterp.explain_inverse(
        batched_affine, jnp.ones((4, 3)), jnp.ones(3), jnp.ones(3), argnums=0
    )
    # `s` and `t`, each widened to (1, 3) by `jnp`, then to (4, 3) here.
    assert len(re.findall(r"\[forward \] \w+:f32\[1,3\] = broadcast_in_dim", text)) == 2
    assert len(re.findall(r"\[forward \] \w+:f32\[4,3\] = broadcast_in_dim", text)) == 2
    assert re.search(r"\[inverted\] \w+:f32\[4,3\] = mul a \w+\n", text)
    assert text.endswith("Invertible: every unknown input is recovered.")


# -- the rewrite itself ---------------------------------------------------------

_BINARY = [lax.add, lax.sub, lax.mul, lax.max, lax.atan2, lax.pow, lax.lt]


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.data(),
)
def test_the_rewrite_computes_what_the_program_computes(shape, data):
    """On random shapes and size-1 patterns: the rewritten Jaxpr gives the
    same results, has no implicit broadcast left, and keeps its signature."""
    shape = tuple(shape)
    ones = [
        data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    ]
    ones.append(
        data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    )
    shapes = [tuple(1 if o else n for o, n in zip(m, shape, strict=True)) for m in ones]
    op = data.draw(st.sampled_from(_BINARY))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    args = [jnp.asarray(rng.uniform(0.5, 2.0, size=s), jnp.float32) for s in shapes]

    def program(a, b):
        return op(jnp.sin(a), b), a * 2.0

    closed = jax.make_jaxpr(program)(*args)
    jaxpr = closed.jaxpr
    rewritten = explicit_broadcasts(jaxpr)
    want = jax.core.eval_jaxpr(jaxpr, closed.consts, *args)
    got = jax.core.eval_jaxpr(rewritten, closed.consts, *args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert rewritten.invars == jaxpr.invars and rewritten.outvars == jaxpr.outvars
    for eqn in rewritten.eqns:
        out_shape = eqn.outvars[0].aval.shape
        if eqn.primitive.name in {"add", "sub", "mul", "max", "atan2", "pow", "lt"}:
            assert all(
                not getattr(v.aval, "shape", ()) or v.aval.shape == out_shape
                for v in eqn.invars
            )
    if all(s == shape for s in shapes):
        assert rewritten is jaxpr  # nothing to rewrite: the same Jaxpr
