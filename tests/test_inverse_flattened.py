"""Elementwise blocks on arrays of several axes are solved on one axis
(`_block_solve.flattened`): XLA's CPU code vectorizes a fusion along its last
axis, and a batch of small vectors, `(n, 5)`, ran about 8 times slower than
the same elements on one axis. The answers, derivatives and batching are
those of the maps themselves, for every method."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxinterp


def _logit(x, c):  # the logarithm of a linear-fractional map: a formula
    return jnp.log(x) - jnp.log1p(-x) + c


def _softsign(x, c):  # |x| is a case split: piecewise
    return x / (1 + jnp.abs(x)) + c


def _softsign_sign(x, c):  # the sign of x^3: piecewise by intervals
    return x / (1 + x * jnp.sign(x**3)) + c


def _wavy(x, c):  # no formula: the elementwise solver
    return x + 0.5 * jnp.sin(x) + c


MAPS = {
    "linear-fractional formula": (_logit, (0.05, 0.95)),
    "piecewise": (_softsign, (-3.0, 3.0)),
    "piecewise by intervals": (_softsign_sign, (-3.0, 3.0)),
    "elementwise solve": (_wavy, (-3.0, 3.0)),
}


def _explained(f, x, c):
    return jaxinterp.explain_inverse(f, x, c, argnums=0)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(MAPS))
@settings(deadline=None, max_examples=5)
@given(shape=st.sampled_from([(7, 5), (3, 2, 4), (64, 3)]), seed=st.integers(0, 99))
def test_a_batch_of_small_vectors_is_inverted_as_the_map_is(method, shape, seed):
    f, (lo, hi) = MAPS[method]
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.uniform(lo, hi, shape), jnp.float32)
    # A known operand per element, and one that is a scalar.
    c = jnp.asarray(rng.uniform(-0.1, 0.1, shape), jnp.float32)
    assert f"({method})" in str(_explained(f, x, c))
    y = f(x, c)
    inverse = jaxinterp.inverse(f, argnums=0)
    got = jax.jit(inverse)(y, c)
    assert got.shape == shape
    np.testing.assert_allclose(got, x, rtol=2e-5, atol=2e-5)
    # The derivatives: dx/dy = 1 / g'(x), dx/dc = -1 / g'(x) (here dg/dc = 1).
    slope = jax.vmap(jax.grad(lambda u: f(u, 0.0)))(x.ravel()).reshape(shape)
    dy = jax.grad(lambda y: jnp.sum(inverse(y, c)))(y)
    dc = jax.grad(lambda c: jnp.sum(inverse(y, c)))(c)
    np.testing.assert_allclose(dy, 1 / slope, rtol=1e-3)
    np.testing.assert_allclose(dc, -1 / slope, rtol=1e-3)
    # Batched over the leading axis, and with a scalar operand.
    batched = jax.vmap(inverse)(y, c)
    np.testing.assert_allclose(batched, got, rtol=1e-6, atol=1e-6)
    scalar = jax.jit(inverse)(f(x, 0.05), jnp.float32(0.05))
    np.testing.assert_allclose(scalar, x, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("method", sorted(MAPS))
def test_the_block_runs_on_one_axis(method):
    """The compiled program holds the block's elements on one axis (35 of a
    `(7, 5)` batch), not on the batch's two: what XLA's CPU code vectorizes."""
    f, (lo, hi) = MAPS[method]
    x = jnp.linspace(lo + 0.01, hi - 0.01, 35, dtype=jnp.float32).reshape(7, 5)
    c = jnp.zeros((7, 5), jnp.float32)
    text = jax.jit(jaxinterp.inverse(f, argnums=0)).lower(f(x, c), c).as_text()
    assert "35xf32" in text


def test_a_block_over_several_devices_keeps_its_shape():
    """(With more than one device the shapes stay: a reshape could move a
    sharded axis. In this process there is one device unless the test run
    says otherwise; either way the answer is the map's.)"""
    f = _wavy
    x = jnp.linspace(-3.0, 3.0, 35, dtype=jnp.float32).reshape(7, 5)
    c = jnp.zeros((7, 5), jnp.float32)
    text = jax.jit(jaxinterp.inverse(f, argnums=0)).lower(f(x, c), c).as_text()
    assert ("35xf32" in text) == (jax.device_count() == 1)


@pytest.mark.slow
def test_a_constant_of_the_batchs_shape_is_flattened_and_stays_a_constant():
    """TFP's `Softfloor` broadcasts a constant through a `where`: a known
    operand of the batch's shape holding one value, whose compact form has
    a size-1 axis per axis of the batch. The block is solved on one axis,
    and the constant is still one there (its table of starts, built while
    tracing, is in the program: a `gather`; a traced operand would have
    none, and would look for folds by a host callback instead)."""
    n = 4096  # (`_table.MIN_SIZE`: a table is built from this size on)

    def f(x):
        zero = jnp.broadcast_to(jnp.float32(0.0), x.shape)
        return jnp.where(x > zero, x, zero) + 0.5 * jnp.tanh(x) + x * x * x / 8

    x = jnp.linspace(-3.0, 3.0, n, dtype=jnp.float32).reshape(n // 4, 4)
    y = f(x)
    assert "(elementwise solve)" in str(jaxinterp.explain_inverse(f, y))
    inverse = jax.jit(jaxinterp.inverse(f))
    text = inverse.lower(y).as_text()
    assert f"{n}xf32" in text and "gather" in text and "callback" not in text
    got = inverse(y)
    np.testing.assert_allclose(got, x, rtol=2e-5, atol=2e-5)
    flat = jax.jit(jaxinterp.inverse(f))(y.ravel()).reshape(x.shape)
    np.testing.assert_array_equal(got, flat)
