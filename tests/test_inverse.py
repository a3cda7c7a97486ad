"""`inverse`, `inverse_and_ildj`, `ildj`: API, classic examples, models, composition."""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import iter_eqns
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

from jaxinterp import (
    NotInvertibleError,
    explain_inverse,
    ildj,
    inverse,
    inverse_and_ildj,
)
from jaxinterp.testing import compare_with_reference, tree_allclose


def slogdet_ildj(inv, y, *known):
    """Reference ildj: slogdet of the Jacobian of the inverse, on flat arrays."""
    flat_y, unravel = jax.flatten_util.ravel_pytree(y)

    def flat_inverse(t):
        return jax.flatten_util.ravel_pytree(inv(unravel(t), *known))[0]

    return jnp.linalg.slogdet(jax.jacfwd(flat_inverse)(flat_y))[1]


# ---------------------------------------------------------------------------
# The classic examples.


def classic(x):
    return jnp.exp(jnp.tanh(x))


def test_classic_round_trip():
    np.testing.assert_allclose(inverse(classic)(classic(1.0)), 1.0, rtol=1e-5)


def test_classic_jaxpr_is_log_then_atanh():
    jaxpr = jax.make_jaxpr(inverse(classic))(classic(1.0)).jaxpr
    assert [e.primitive.name for e in jaxpr.eqns] == ["log", "atanh"]


def test_classic_jit_vmap_grad():
    y = (jnp.arange(5) + 1.0) / 5.0
    got = jax.jit(jax.vmap(jax.grad(inverse(classic))))(y)
    # d/dy atanh(log y) = 1 / (y (1 - log(y)^2)), written out by hand.
    want = 1.0 / (y * (1.0 - jnp.log(y) ** 2))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(
        got, [-3.1440797, 15.584931, 2.2551253, 1.3155028, 1.0], rtol=1e-5
    )


@pytest.mark.parametrize(
    "fn, hand",
    [(lambda x: x + 3.0, lambda y: y - 3.0), (lambda x: 2.5 * x, lambda y: y / 2.5)],
    ids=["add", "scale"],
)
def test_affine_scalars(fn, hand):
    y = fn(jnp.array([1.0, -2.0, 0.5]))
    compare_with_reference(inverse(fn), hand, (y,))


# ---------------------------------------------------------------------------
# API: argnums, example_args, pytrees, several arguments.


def affine(x, log_scale, shift):
    return x * jnp.exp(log_scale) + shift


def test_argnums_with_parameters():
    x = jnp.array([0.3, -1.2, 2.0])
    s, b = jnp.array([0.1, -0.4, 0.3]), jnp.array([1.0, 2.0, -1.0])
    y = affine(x, s, b)
    inv = inverse(affine, argnums=0)
    compare_with_reference(inv, lambda y, s, b: (y - b) * jnp.exp(-s), (y, s, b))
    got_x, got_ildj = inverse_and_ildj(affine, argnums=0)(y, s, b)
    tree_allclose(got_x, x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ildj, -jnp.sum(s), rtol=1e-5)


def test_ildj_gradient_wrt_parameters():
    # What training a flow needs: d ildj / d params through the inverse.
    y = jnp.array([0.3, -1.2, 2.0])
    s, b = jnp.array([0.1, -0.4, 0.3]), jnp.ones(3)
    grad = jax.grad(lambda s: ildj(affine, argnums=0)(y, s, b))(s)
    np.testing.assert_allclose(grad, -jnp.ones(3), rtol=1e-6)
    gx = jax.grad(lambda s: inverse(affine, argnums=0)(y, s, b).sum())(s)
    np.testing.assert_allclose(gx, -(y - b) * jnp.exp(-s), rtol=1e-5)


def test_pytree_in_and_out():
    def f(d):
        return {"a": jnp.exp(d["a"]), "b": d["b"] * 2.0 + 1.0}

    x = {"a": jnp.array([0.1, 0.2]), "b": jnp.array([[1.0, -1.0]])}
    y = f(x)
    tree_allclose(inverse(f)(y), x, rtol=1e-5, atol=1e-6)
    _, got = inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, slogdet_ildj(inverse(f), y), rtol=1e-5)


def test_several_arguments_return_a_tuple():
    def f(x, z):
        return jnp.exp(x), z - 1.0

    x, z = jnp.array([0.5, 1.0]), jnp.array(3.0)
    got = inverse(f)(f(x, z))
    assert isinstance(got, tuple) and len(got) == 2
    tree_allclose(got, (x, z), rtol=1e-6)


def test_example_args_for_shape_changing_functions():
    def f(x):
        return jnp.reshape(x, (2, 3)).T * 2.0

    x = jnp.arange(6.0)
    y = f(x)
    inv = inverse(f, example_args=(jax.ShapeDtypeStruct((6,), jnp.float32),))
    tree_allclose(inv(y), x)
    _, got = inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, -6 * np.log(2.0), rtol=1e-5)


def test_structure_mismatch_suggests_example_args():
    def f(x):
        return x.T

    with pytest.raises(TypeError, match=re.escape("Pass `example_args=`")):
        inverse(f)(jnp.ones((2, 3)))


def test_a_function_that_fails_on_values_shaped_like_y_suggests_example_args():
    def f(v):
        return v, jnp.exp(v)

    y = f(jnp.array([0.5, -1.0]))
    with pytest.raises(TypeError) as info:
        inverse(f)(y)
    message = str(info.value)
    assert "assumed the unknown arguments of `f` mirror `y`" in message
    assert "Pass `example_args=`" in message
    # With them, it inverts.
    x = inverse(f, example_args=(jnp.zeros(2),))(y)
    assert jnp.allclose(x, jnp.array([0.5, -1.0]))


def test_wrong_y_with_example_args_names_shapes():
    inv = inverse(jnp.exp, example_args=(jnp.ones(3),))
    with pytest.raises(TypeError, match=re.escape("float32[3]")) as info:
        inv(jnp.ones(4))
    assert "float32[4]" in str(info.value)
    with pytest.raises(TypeError, match=re.escape("float32[3]")):
        inv(jnp.ones(3, jnp.int32))


def test_known_args_without_argnums_is_an_error():
    with pytest.raises(TypeError, match=re.escape("Pass `argnums=`")):
        inverse(jnp.exp)(jnp.ones(3), jnp.ones(3))


def test_inverse_of_inverse_is_the_function():
    x = jnp.array([0.2, -0.4])
    tree_allclose(inverse(inverse(classic))(x), classic(x), rtol=1e-5)


def test_staging_and_inverse_jaxpr_are_cached():
    traces = []

    def f(x):
        traces.append(1)
        return jnp.exp(x) * 3.0

    inv = inverse(f)
    for _ in range(3):
        inv(jnp.ones(4))
    assert len(traces) == 1


# ---------------------------------------------------------------------------
# Composition.


def test_compose_with_transformations():
    y = classic(jnp.array([0.1, -0.3, 0.6]))
    hand = lambda y: jnp.arctanh(jnp.log(y))  # noqa: E731
    compare_with_reference(inverse(classic), hand, (y,))
    t = jnp.ones(3)
    tree_allclose(
        jax.jvp(inverse(classic), (y,), (t,)), jax.jvp(hand, (y,), (t,)), rtol=1e-5
    )
    h_got = jax.hessian(lambda y: inverse(classic)(y).sum())(y)
    h_want = jax.hessian(lambda y: hand(y).sum())(y)
    tree_allclose(h_got, h_want, rtol=1e-4, atol=1e-5)


def test_ildj_per_example_under_vmap():
    ys = classic(jnp.array([[0.1, 0.2], [-0.3, 0.5], [0.0, 0.7]]))
    got = jax.vmap(ildj(classic))(ys)
    want = jnp.stack([slogdet_ildj(inverse(classic), y) for y in ys])
    np.testing.assert_allclose(got, want, rtol=1e-5)


# ---------------------------------------------------------------------------
# Higher-order primitives inside the function.


def test_jit_inside_stays_a_jit():
    inner = jax.jit(lambda t: jnp.exp(t) * 2.0)

    def f(x):
        return inner(x) + 1.0

    x = jnp.array([0.1, -0.7])
    y = f(x)
    tree_allclose(inverse(f)(y), x, rtol=1e-5)
    names = [e.primitive.name for e in jax.make_jaxpr(inverse(f))(y).jaxpr.eqns]
    assert "jit" in names
    np.testing.assert_allclose(
        inverse_and_ildj(f)(y)[1], slogdet_ildj(inverse(f), y), rtol=1e-5
    )


def test_checkpoint_inside():
    f = jax.checkpoint(lambda x: jnp.tanh(x) * 3.0 - 1.0)
    x = jnp.array([0.1, -0.7, 0.3])
    tree_allclose(inverse(f)(f(x)), x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        inverse_and_ildj(f)(f(x))[1], slogdet_ildj(inverse(f), f(x)), rtol=1e-5
    )


def test_softplus_inverts_through_custom_jvp():
    x = jnp.array([-2.0, 0.1, 3.0])
    y = jax.nn.softplus(x)
    tree_allclose(inverse(jax.nn.softplus)(y), x, rtol=1e-5)
    np.testing.assert_allclose(
        inverse_and_ildj(jax.nn.softplus)(y)[1],
        slogdet_ildj(inverse(jax.nn.softplus), y),
        rtol=1e-5,
    )


def test_custom_vjp_inverts_its_primal():
    @jax.custom_vjp
    def f(x):
        return jnp.exp(x) + 1.0

    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.exp(x),))
    x = jnp.array([0.3, -0.2])
    tree_allclose(inverse(f)(f(x)), x, rtol=1e-5)


def test_cond_with_known_index():
    def f(x, flag):
        return lax.cond(flag, lambda x: x * 2.0, jnp.exp, x)

    x = jnp.array([0.3, -0.2])
    for flag in (True, False):
        y = f(x, flag)
        tree_allclose(inverse(f, argnums=0)(y, flag), x, rtol=1e-5)
        inv = lambda y, flag=flag: inverse(f, argnums=0)(y, flag)  # noqa: E731
        np.testing.assert_allclose(
            inverse_and_ildj(f, argnums=0)(y, flag)[1],
            slogdet_ildj(inv, y),
            rtol=1e-5,
        )
    names = [
        e.primitive.name
        for e in jax.make_jaxpr(inverse(f, argnums=0))(f(x, True), True).jaxpr.eqns
    ]
    assert "cond" in names


def test_switch_with_known_index():
    branches = [lambda x: x + 1.0, lambda x: x * 3.0, jnp.tanh]

    def f(x, i):
        return lax.switch(i, branches, x)

    x = jnp.array([0.3, -0.2])
    for i in range(3):
        tree_allclose(inverse(f, argnums=0)(f(x, i), i), x, rtol=1e-5)


def stacked_layers(x, weights):
    def layer(c, w):
        return jnp.tanh(c) * jnp.exp(w) + w, None

    return lax.scan(layer, x, weights)[0]


def test_scan_of_layers_is_a_reversed_scan():
    x = jnp.array([0.1, 0.5, -0.3])
    w = jnp.array([0.1, 0.2, -0.3, 0.4])
    y = stacked_layers(x, w)
    inv = inverse(stacked_layers, argnums=0)
    tree_allclose(inv(y, w), x, rtol=1e-4, atol=1e-5)
    eqns = jax.make_jaxpr(inv)(y, w).jaxpr.eqns
    scans = [e for e in eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["reverse"] is True
    np.testing.assert_allclose(
        inverse_and_ildj(stacked_layers, argnums=0)(y, w)[1],
        slogdet_ildj(lambda y: inv(y, w), y),
        rtol=1e-4,
    )


def test_scan_with_unknown_per_step_inputs():
    def f(xs):
        def step(c, x):
            return c + 1.0, jnp.exp(x) * c

        return lax.scan(step, 1.0, xs)

    xs = jnp.array([0.1, -0.2, 0.3])
    y = f(xs)
    tree_allclose(inverse(f, example_args=(xs,))(y), xs, rtol=1e-5)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_fori_loop(dynamic):
    def f(x, n):
        return lax.fori_loop(0, n, lambda i, c: c * 2.0 + 1.0, x)

    x = jnp.array([0.1, 0.5, -0.3])
    n = jnp.asarray(3) if dynamic else 3
    if dynamic:
        inv = inverse(f, argnums=0)
        y = f(x, n)
        tree_allclose(inv(y, n), x, rtol=1e-5)
        got = inverse_and_ildj(f, argnums=0)(y, n)[1]
    else:
        g = lambda x: f(x, 3)  # noqa: E731
        y = g(x)
        tree_allclose(inverse(g)(y), x, rtol=1e-5)
        got = inverse_and_ildj(g)(y)[1]
    np.testing.assert_allclose(got, -3 * 3 * np.log(2.0), rtol=1e-5)


# ---------------------------------------------------------------------------
# Not invertible: a clear error, never a wrong answer.


@pytest.mark.parametrize(
    "fn, prim",
    [
        (lambda x: jnp.maximum(x, x.sum()), "max"),
        (lambda x: jnp.minimum(x.astype(jnp.int32), 1), "min"),
        (lambda x: jnp.sum(x), "reduce_sum"),
    ],
    ids=["maximum_of_unknowns", "integer_minimum", "sum"],
)
def test_not_invertible(fn, prim):
    with pytest.raises(NotInvertibleError, match=f"`{prim}` at .*test_inverse.py:"):
        inverse(fn, example_args=(jnp.ones(3),))(fn(jnp.ones(3)))


def test_two_unknowns_added_is_not_invertible():
    def f(x1, x2):
        return x1 + x2

    with pytest.raises(NotInvertibleError, match=r"input 0 .*input 1"):
        inverse(f, example_args=(jnp.ones(2), jnp.ones(2)))(jnp.ones(2))


def test_missing_rule_names_primitive_and_line():
    def f(x):
        return lax.cumlogsumexp(jnp.sort(x))

    with pytest.raises(
        NotInvertibleError,
        match=r"`jit` at .*test_inverse.py:\d+.*inside `jit` of `sort`",
    ) as info:
        inverse(f)(jnp.ones(3))
    assert "`sort` is not invertible" in str(info.value)


def _tried(message: str) -> list[str]:
    """The methods a refusal says it tried, in the order it lists them."""
    return re.findall(r"tried as ([^:]+):", message)


@pytest.mark.parametrize("solvers", [True, False])
def test_a_refusal_says_what_each_method_tried(solvers):
    """A unit vector of unconstrained values: the normalized-block method and
    (with numerical solvers on) the triangular-map method each say why they
    did not solve it, under the `div`'s own reason; `explain_inverse`
    (numerical solvers on) lists the same."""

    def f(x):
        return x / jnp.sum(x)

    x = jnp.array([0.3, 1.0, 0.5])
    with pytest.raises(NotInvertibleError) as info:
        inverse(f, solvers=solvers)(f(x))
    message = str(info.value)
    assert re.search(r"`div` at .*test_inverse.py:[\d:]+ \(.*f\): its unknown", message)
    expected = ["a normalized block"] + (["a triangular map"] if solvers else [])
    assert _tried(message) == expected
    assert "one unknown factor per row" in message
    if solvers:
        assert _tried(explain_inverse(f, x)) == expected


@pytest.mark.slow
def test_a_method_that_solves_leaves_no_refusal_behind():
    """`x + cumsum(x)` is triangular: solved, and what the normalized and
    block methods made of it is not reported anywhere."""

    def f(x):
        return jnp.sin(x) + jnp.cumsum(x)

    x = jnp.array([0.3, -0.2, 0.5])
    np.testing.assert_allclose(inverse(f)(f(x)), x, rtol=1e-5, atol=1e-6)
    assert _tried(explain_inverse(f, x)) == []


# ---------------------------------------------------------------------------
# Dataflow: no dead code, one path per input, ildj kept through reshapes.


def _primitive_names(jaxpr):
    """Every equation's primitive name, sub-Jaxprs included (with repeats)."""
    return [eqn.primitive.name for eqn in iter_eqns(jaxpr)]


def test_unneeded_computations_are_not_emitted():
    def f(x, w):
        unused = jnp.sin(x) * 0.0 + 1.0  # computed, then never used
        return x * jnp.exp(w), unused * 0.0 + jnp.cos(w)

    x, w = jnp.array([0.5, -1.0]), jnp.array([0.2, 0.3])
    y = f(x, w)
    inv = inverse(f, argnums=0, example_args=(x,))
    tree_allclose(inv(y, w), x, rtol=1e-6)
    names = _primitive_names(jax.make_jaxpr(inv)(y, w).jaxpr)
    assert names.count("exp") == 1


def test_an_output_known_from_the_known_arguments_is_checked():
    """`cos(w) * 3` holds no unknown, but it is a constraint on `y`: a `y`
    whose second output disagrees with `w` is off the image (NaN)."""

    def f(x, w):
        return x * jnp.exp(w), jnp.cos(w) * 3.0

    x, w = jnp.array([0.5, -1.0]), jnp.array([0.2, 0.3])
    y = f(x, w)
    inv = inverse(f, argnums=0, example_args=(x,))
    tree_allclose(inv(y, w), x, rtol=1e-6)
    assert jnp.all(jnp.isnan(inv((y[0], y[1] + 0.5), w)))


def test_value_recovered_two_ways_is_solved_once_and_checked():
    def f(x):
        return jnp.exp(x), x * 2.0

    x = jnp.array([0.5, -1.0])
    inv = inverse(f, example_args=(x,))
    tree_allclose(inv(f(x)), x, rtol=1e-6)
    names = _primitive_names(jax.make_jaxpr(inv)(f(x)).jaxpr)
    # Solved once (`log` or a division), the other output recomputed forwards
    # and compared.
    assert names.count("log") + names.count("div") == 1
    assert jnp.all(jnp.isnan(inv((jnp.exp(x), 2 * x + 0.5))))


def test_reshape_keeps_the_ildj_accumulated_before_it():
    def f(x):
        return jnp.reshape(jnp.exp(x) * 3.0, (2, 3)).T

    x = jnp.linspace(-1.0, 1.0, 6)
    y = f(x)
    inv = inverse(f, example_args=(x,))
    _, got = inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, slogdet_ildj(inv, y), rtol=1e-5)
    np.testing.assert_allclose(got, -jnp.sum(x) - 6 * np.log(3.0), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "f",
    [lambda v: jnp.sinh(v) + v, lambda v: jnp.exp(v) - jnp.exp(-2.0 * v) + 3.0 * v],
    ids=["sinh_plus_x", "exp_difference"],
)
def test_no_numpy_warning_escapes_inverse(f):
    x = jnp.array([0.3, -1.2, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = inverse(f)(f(x))
        text = explain_inverse(f, x)
    assert jnp.allclose(got, x, atol=1e-4)
    assert "Invertible" in text or "inverted" in text


# A clamp that saturates chooses its bound for every preimage beyond it; a
# later step that checks the chosen value against a known one (a padding
# constant, a known operand of a concatenation or of a dynamic_update_slice)
# accepts any of those preimages, and only those.
def _padded_then_clamped(x, pad_value=0.0):
    padded = jnp.pad(x[2:], (1, 0), constant_values=pad_value)
    return jnp.maximum(jnp.concatenate([x[:2], padded]), 0.3)


def _split_then_clamped(x):
    # The padding reaches the clamp through halves of the padded value put
    # together in another order.
    left, right = jnp.split(jnp.pad(x, (1, 0)), 2)
    return jnp.maximum(jnp.concatenate([right, left]), 0.3)


@pytest.mark.parametrize("f", [_padded_then_clamped, _split_then_clamped])
@given(x=hnp.arrays(np.float32, 5, elements=st.floats(-1, 2, width=32)))
@settings(max_examples=6)
def test_a_clamps_choice_accepts_a_padding_it_stands_for(f, x):
    y = f(x)
    got = jax.jit(inverse(f, example_args=(x,)))(y)
    # A preimage of y (maximum is not injective), equal to x where x is not
    # saturated.
    np.testing.assert_array_equal(f(got), y)
    free = np.asarray(x) > 0.3
    np.testing.assert_array_equal(np.asarray(got)[free], np.asarray(x)[free])


@pytest.mark.parametrize("padding_y, pad_value", [(0.5, 0.0), (0.3, 0.5), (0.2, 0.0)])
def test_a_padding_a_clamp_cannot_have_produced_gives_nan(padding_y, pad_value):
    """y's padding element off the image: above the bound for a padding the
    clamp saturates, at the bound for a padding above it, under the bound."""

    def f(x):
        return _padded_then_clamped(x, pad_value)

    x = jnp.array([0.5, 0.7, 0.9, 1.2, 0.4])
    y = f(x).at[2].set(padding_y)
    assert not np.isin(padding_y, np.asarray(f(x))[2:3])
    got = inverse(f, example_args=(x,))(y)
    assert np.isnan(np.asarray(got)[2:]).all()


def test_a_minimum_accepts_a_known_part_above_its_bound():
    def f(x):
        return jnp.minimum(jnp.concatenate([x, jnp.full(2, 5.0)]), 1.0)

    x = jnp.array([0.25, 3.0, -2.0])
    y = f(x)
    got = inverse(f, example_args=(x,))(y)
    np.testing.assert_array_equal(f(got), y)
    # A known part under the bound has one preimage, itself.
    g = lambda x: jnp.minimum(jnp.concatenate([x, jnp.full(2, 0.5)]), 1.0)  # noqa: E731
    assert np.isnan(np.asarray(inverse(g, example_args=(x,))(y))).all()


# A power written as a product is inverted as the power is: `v * v` as
# `v ** 2` (the principal root), `v * v * v` as `v ** 3` (the real cube root).
@pytest.mark.parametrize(
    "product, power",
    [
        (lambda v: v * v, lambda v: v**2),
        (lambda v: v * v * v, lambda v: v**3),
        (lambda v: v * (v * v), lambda v: v**3),
    ],
)
@given(x=hnp.arrays(np.float32, 4, elements=st.floats(-3, 3, width=32)))
@settings(max_examples=6)
def test_a_power_written_as_a_product_is_inverted_as_the_power(product, power, x):
    y = power(x)
    got, ildj = inverse_and_ildj(product)(y)
    want, want_ildj = inverse_and_ildj(power)(y)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ildj, want_ildj)
    # The principal root for the square; the cube root keeps the sign.
    np.testing.assert_allclose(power(got), y, rtol=1e-5, atol=1e-6)
