"""Masked couplings and diagonal rewrites: `jnp.where` with a constant mask
and unknown values in both cases (`_inverse/_masked.py`).

Each map is written as RealNVP / distrax `MaskedCoupling` / `TransformDiagonal`
write it, checked against a hand-written inverse, its ildj against
`-slogdet(jax.jacfwd(f))`, eagerly, under `jax.jit` and under `jax.vmap`
(compiled).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxinterp
from jaxinterp import NotInvertibleError, inverse, inverse_and_ildj

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

RNG = np.random.RandomState(7)
W_S = jnp.asarray(RNG.randn(4, 4).astype(np.float32) * 0.5)
W_T = jnp.asarray(RNG.randn(4, 4).astype(np.float32))
CHECKER = np.array([True, False, True, False])


def _conditioner(u, w_s=W_S, w_t=W_T):
    return jnp.tanh(u @ w_s), u @ w_t


@functools.cache
def _coupling(mask_bits: tuple[bool, ...]):
    return _make_coupling(np.array(mask_bits))


def coupling(mask):
    """RealNVP: `where(mask, x, x * exp(s(x * mask)) + t(x * mask))` and its
    hand-written inverse (the same functions for the same mask, so that the
    checks below compile once per mask)."""
    return _coupling(tuple(bool(b) for b in np.ravel(mask)))


def _make_coupling(mask):

    def f(x):
        s, t = _conditioner(x * mask)
        return jnp.where(mask, x, x * jnp.exp(s) + t)

    def f_inv(y):
        s, t = _conditioner(y * mask)
        return jnp.where(mask, y, (y - t) * jnp.exp(-s))

    return f, f_inv


def _slogdet_ildj(f, x):
    jac = jax.jacfwd(f)(x).reshape(x.size, x.size)
    return -jnp.linalg.slogdet(jac)[1]


@functools.cache
def _compiled(f):
    """`inverse_and_ildj(f)`, and it under `jax.jit` and `jax.jit(jax.vmap)`,
    compiled once per `f` for all of a test's examples."""
    inv = inverse_and_ildj(f)
    return inv, jax.jit(inv), jax.jit(jax.vmap(inv))


def _check(f, f_inv, x, rtol=2e-5, atol=2e-5):
    """`inverse_and_ildj(f)` against `f_inv` and slogdet, eager, jit, vmap."""
    y = f(x)
    want_x, want_ildj = f_inv(y), _slogdet_ildj(f, x)
    inv, jitted, batched = _compiled(f)
    for got_x, got_ildj in (inv(y), jitted(y)):
        assert bool(jnp.all(jnp.isfinite(got_x))) and bool(jnp.isfinite(got_ildj))
        np.testing.assert_allclose(got_x, want_x, rtol=rtol, atol=atol)
        np.testing.assert_allclose(got_ildj, want_ildj, rtol=rtol, atol=10 * atol)
    ys = jnp.stack([y, f(x + 0.25)])
    got_xs, got_ildjs = batched(ys)
    np.testing.assert_allclose(got_xs, jax.vmap(f_inv)(ys), rtol=rtol, atol=atol)
    want = jnp.stack([want_ildj, _slogdet_ildj(f, x + 0.25)])
    np.testing.assert_allclose(got_ildjs, want, rtol=rtol, atol=10 * atol)


_finite = st.floats(-2, 2, allow_nan=False, width=32)


@settings(max_examples=15, deadline=None)
@given(st.lists(_finite, min_size=4, max_size=4))
def test_checkerboard_coupling(xs):
    f, f_inv = coupling(CHECKER)
    _check(f, f_inv, jnp.asarray(xs, jnp.float32))


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.lists(_finite, min_size=4, max_size=4),
)
def test_random_masks(mask, xs):
    f, f_inv = coupling(np.array(mask))
    _check(f, f_inv, jnp.asarray(xs, jnp.float32))


def test_a_chain_of_two_with_complementary_masks():
    f1, f1_inv = coupling(CHECKER)
    f2, f2_inv = coupling(~CHECKER)
    x = jnp.array([0.3, -1.2, 0.7, 2.0])
    _check(lambda x: f2(f1(x)), lambda y: f1_inv(f2_inv(y)), x)


def _mlp(u, params):
    w1, b1, w2 = params
    h = jax.nn.relu(u.reshape(-1) @ w1 + b1)
    out = h @ w2
    half = out.size // 2
    return jnp.tanh(out[:half]).reshape(u.shape), out[half:].reshape(u.shape)


def test_a_2d_mask_with_an_mlp_conditioner_and_known_weights():
    rng = np.random.RandomState(3)
    mask = rng.rand(3, 4) < 0.5
    params = (
        jnp.asarray(rng.randn(12, 8), jnp.float32),
        jnp.asarray(rng.randn(8), jnp.float32),
        jnp.asarray(rng.randn(8, 24) * 0.3, jnp.float32),
    )

    def f(x, params):
        s, t = _mlp(x * mask, params)
        return jnp.where(mask, x, x * jnp.exp(s) + t)

    def f_inv(y, params):
        s, t = _mlp(y * mask, params)
        return jnp.where(mask, y, (y - t) * jnp.exp(-s))

    x = jnp.asarray(rng.randn(3, 4), jnp.float32)
    y = f(x, params)
    # The weights are known arguments: traced, not constants.
    inv = inverse_and_ildj(f, argnums=0)
    got_x, got_ildj = jax.jit(inv)(y, params)
    np.testing.assert_allclose(got_x, f_inv(y, params), rtol=1e-5, atol=1e-5)
    want_ildj = _slogdet_ildj(lambda x: f(x, params), x)
    np.testing.assert_allclose(got_ildj, want_ildj, rtol=1e-5, atol=1e-4)
    # Gradients of x and of the ildj with respect to y and the weights
    # (compiled: one compilation each).
    both = (0, 1)
    g_got = jax.jit(jax.grad(lambda y, p: inv(y, p)[1], argnums=both))(y, params)
    g_want = jax.grad(
        lambda y, p: _slogdet_ildj(lambda x: f(x, p), f_inv(y, p)), argnums=both
    )(y, params)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    gx_got = jax.jit(jax.grad(lambda y, p: jnp.sum(inv(y, p)[0] ** 2), argnums=both))(
        y, params
    )
    gx_want = jax.grad(lambda y, p: jnp.sum(f_inv(y, p) ** 2), argnums=both)(y, params)
    for a, b in zip(jax.tree.leaves(gx_got), jax.tree.leaves(gx_want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _exp_on_checker(x):
    return jnp.where(CHECKER, jnp.exp(x), x)


def _exp_on_checker_inverse(y):
    return jnp.where(CHECKER, jnp.log(jnp.where(CHECKER, y, 1.0)), y)


@settings(max_examples=10, deadline=None)
@given(st.lists(_finite, min_size=4, max_size=4))
def test_exp_on_a_mask(xs):
    _check(_exp_on_checker, _exp_on_checker_inverse, jnp.asarray(xs, jnp.float32))


_EYE = np.eye(3, dtype=bool)


def _softplus_on_diagonal(x):
    return jnp.where(_EYE, jax.nn.softplus(x), x)


def _softplus_on_diagonal_inverse(y):
    safe = jnp.where(_EYE, y, 1.0)
    return jnp.where(_EYE, safe + jnp.log(-jnp.expm1(-safe)), y)


@settings(max_examples=10, deadline=None)
@given(st.lists(_finite, min_size=9, max_size=9))
def test_softplus_on_the_diagonal(xs):
    x = jnp.asarray(xs, jnp.float32).reshape(3, 3)
    _check(_softplus_on_diagonal, _softplus_on_diagonal_inverse, x, rtol=1e-4)


def test_off_mask_values_outside_the_masked_map_domain_stay_out_of_it():
    # `log` of the negative elements off the mask is never computed backwards:
    # the inverse and the gradient of its ildj are finite.
    mask = jnp.array(CHECKER)

    def f(x):
        return jnp.where(mask, jnp.log(x), x)

    x = jnp.array([0.5, -3.0, 1.5, -7.0])
    got_x, got_ildj = inverse_and_ildj(f)(f(x))
    np.testing.assert_allclose(got_x, x, rtol=1e-5)
    np.testing.assert_allclose(got_ildj, _slogdet_ildj(f, x), rtol=1e-5)
    grad = jax.grad(lambda y: inverse_and_ildj(f)(y)[1])(f(x))
    assert bool(jnp.all(jnp.isfinite(grad)))


def test_where_with_a_constant_mask_and_a_constant_completes_what_it_discards():
    # The discarded elements are undetermined: they come back as the
    # constant used in their place (the preimage the projection leaves
    # unchanged), and `explain_inverse` says so.
    mask = jnp.array(CHECKER)

    def f(x):
        return jnp.where(mask, x, 0.0)

    x = jnp.array([1.5, 0.0, -2.0, 0.0])
    np.testing.assert_allclose(inverse(f)(f(jnp.array([1.5, 7.0, -2.0, 9.0]))), x)
    assert "(discarded elements completed)" in jaxinterp.explain_inverse(f, x)
    # A `y` that is not the constant there has no preimage: NaN.
    assert np.all(np.isnan(inverse(f)(f(x).at[1].set(1.0))))


def test_with_strict_discarded_elements_are_refused_not_completed():
    # The completion is a chosen preimage: under `strict=True` the elements
    # the `where` discards are undetermined, and the refusal names them.
    mask = jnp.array([True, False, False])
    c = jnp.array([5.0, 6.0, 7.0])

    def f(x0, x1):
        return jnp.where(mask, x0, c), jnp.sin(x1)

    x0, x1 = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5])
    y = f(x0, x1)
    got0, got1 = inverse(f, example_args=(x0, x1))(y)
    np.testing.assert_allclose(got0, jnp.array([1.0, 6.0, 7.0]))
    np.testing.assert_allclose(got1, x1, rtol=1e-6)
    with pytest.raises(NotInvertibleError) as err:
        inverse(f, example_args=(x0, x1), strict=True)(y)
    message = str(err.value)
    assert "but not (1,), (2,) of (3,)" in message
    assert "with `strict=True` the elements it discards are not completed" in message


# A lower-triangular matrix: `(L @ x)[1]` reads `x[0]` and `x[1]` only.
L_TRI = jnp.asarray(np.tril(RNG.randn(4, 4).astype(np.float32)) + 2 * np.eye(4))
ONE = np.array([False, True, False, False])


def _solve_lower_transposed(x):
    return jax.scipy.linalg.solve_triangular(L_TRI, x, lower=True, trans=1)


@pytest.mark.parametrize(
    "mix",
    [
        pytest.param(lambda x: L_TRI @ x, id="lower-triangular matmul"),
        pytest.param(_solve_lower_transposed, id="triangular solve"),
        pytest.param(jnp.cumsum, id="cumsum"),
        pytest.param(lambda x: W_T @ x, id="dense matmul"),
    ],
)
def test_discarded_elements_that_mix_unknowns_are_not_completed(mix):
    """Fuzzer, seed 2222 program 5: the elements `where` discards come from
    several elements of `x` (a product, a solve, a running sum). Completing
    them made the inverse mix the completion with `y` into elements of `x`
    no output reads: `f(x_rec) == y`, but `x_rec[0]` moved with `y` (for a
    lower-triangular solve transposed, `y[1]` reads `x[1:]` only). Refused,
    naming what is lost."""

    def f(x):
        return jnp.where(jnp.array(ONE), mix(x), -0.08)

    x = jnp.array([-1.53, -1.49, -1.46, 0.68], jnp.float32)
    with pytest.raises(NotInvertibleError) as err:
        inverse(f, example_args=(x,))(f(x))
    message = str(err.value)
    assert "but not (0,), (2,), (3,) of (4,)" in message
    assert (
        "`jit` tried as a completion of discarded elements: the elements it discards "
        "each mix several elements of the unknowns"
    ) in message


@settings(max_examples=20, deadline=None)
@given(
    mask=st.lists(st.booleans(), min_size=6, max_size=6).filter(
        lambda m: 0 < sum(m) < 6
    ),
    move=st.sampled_from(["flip", "reshape-transpose", "scale", "roll"]),
    y_shift=st.floats(-2.0, 2.0),
)
def test_discarded_elements_moved_element_by_element_come_back_as_constants(
    mask, move, y_shift
):
    # Steps that move each element on its own (a flip, a transpose, a scale,
    # a roll by slices): the completed elements are elements of `x` no
    # output reads, and come back as the same constants whatever `y` is.
    moves = {
        "flip": lambda x: x[::-1],
        "reshape-transpose": lambda x: x.reshape(2, 3).T.reshape(6),
        "scale": lambda x: 3.0 * x - 1.0,
        "roll": lambda x: jnp.roll(x, 2),
    }
    m = jnp.array(mask)

    def f(x):
        return jnp.exp(jnp.where(m, moves[move](x), 0.5))

    x = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)
    inv = inverse(f, example_args=(x,))
    first, second = inv(f(x)), inv(f(x + y_shift))
    np.testing.assert_allclose(f(first), f(x), rtol=1e-5)
    np.testing.assert_allclose(f(second), f(x + y_shift), rtol=1e-5)
    # The elements no output reads: where the step's result is discarded.
    moved = np.arange(6) if move == "scale" else np.asarray(moves[move](jnp.arange(6)))
    read = moved[np.asarray(mask)]
    free = np.setdiff1d(np.arange(6), read)
    np.testing.assert_array_equal(np.asarray(first)[free], np.asarray(second)[free])
    np.testing.assert_allclose(np.asarray(first)[read], np.asarray(x)[read], rtol=1e-5)


def test_a_coupling_whose_transformed_part_is_lost_is_refused():
    # The unmasked elements go through `x * 0`: nothing determines them.
    mask = jnp.array(CHECKER)

    def f(x):
        return jnp.where(mask, x, x * 0.0 + jnp.sum(x * mask))

    with pytest.raises(NotInvertibleError, match=re.escape("(1,), (3,) of (4,)")):
        inverse(f)(f(jnp.ones(4)))


def test_a_predicate_of_the_unknown_is_still_the_piecewise_block():
    def f(x):
        return jnp.where(x > 0, x, 0.5 * x)

    x = jnp.array([-1.0, 2.0, -0.5])
    np.testing.assert_allclose(inverse(f)(f(x)), x)
    assert "(piecewise)" in jaxinterp.explain_inverse(f, x)


def test_explain_names_the_masked_steps():
    f, _ = coupling(CHECKER)
    report = jaxinterp.explain_inverse(f, jnp.ones(4))
    assert "(masked)" in report
    assert report.splitlines()[-1] == "Invertible: every unknown input is recovered."


def test_broadcast_copies_solved_by_different_paths_agree_within_rounding():
    """Fuzzer, seed 63 program 244: two copies of `x` from a broadcast, one
    read back directly, one solved through a coupling (`(y - u) / e^tanh(u)`,
    off by an ulp): they agree within rounding, not exactly (was NaN)."""

    def f(x):
        copies = jnp.broadcast_to(x, (2, 1, 3))
        u, w = jnp.split(copies, [1])
        return jnp.concatenate([u, w * jnp.exp(jnp.tanh(u)) + u])

    x = jnp.array([[1.11, -0.41, -0.75]], jnp.float32)
    got = inverse(f, example_args=(x,))(f(x))
    np.testing.assert_allclose(got, x, atol=1e-6)
    off = f(x).at[1, 0, 0].add(0.01)  # the copies disagree: off the image
    assert jnp.all(jnp.isnan(inverse(f, example_args=(x,))(off)))
