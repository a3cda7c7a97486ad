"""Realistic flow layers through `inverse`: each against a hand-written inverse and
the `slogdet` of `jax.jacfwd` of the inverse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import flags_off
from jax import lax

from jaxinterp import ildj, inverse, inverse_and_ildj
from jaxinterp.testing import compare_with_reference, tree_allclose

DIM, HIDDEN = 6, 16


def slogdet_ildj(inv, y):
    flat_y = jnp.reshape(y, (-1,))
    jac = jax.jacfwd(lambda t: jnp.reshape(inv(jnp.reshape(t, y.shape)), (-1,)))(flat_y)
    return jnp.linalg.slogdet(jac)[1]


def init_mlp(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": 0.3 * jax.random.normal(k1, (DIM // 2, HIDDEN)),
        "b1": jnp.zeros(HIDDEN),
        "w2": 0.3 * jax.random.normal(k2, (HIDDEN, DIM)),
        "b2": 0.1 * jnp.ones(DIM),
    }


def conditioner(params, h):
    h = jnp.tanh(h @ params["w1"] + params["b1"])
    out = h @ params["w2"] + params["b2"]
    return jnp.tanh(out[..., : DIM // 2]), out[..., DIM // 2 :]


def coupling(x, params):
    """RealNVP affine coupling: split, condition on one half, scale-shift the other."""
    x1, x2 = x[..., : DIM // 2], x[..., DIM // 2 :]
    log_s, t = conditioner(params, x1)
    return jnp.concatenate([x1, x2 * jnp.exp(log_s) + t], axis=-1)


def coupling_inverse(y, params):
    y1, y2 = y[..., : DIM // 2], y[..., DIM // 2 :]
    log_s, t = conditioner(params, y1)
    return jnp.concatenate([y1, (y2 - t) * jnp.exp(-log_s)], axis=-1)


def coupling_ildj(y, params):
    log_s, _ = conditioner(params, y[..., : DIM // 2])
    return -jnp.sum(log_s)


@pytest.fixture
def params():
    return init_mlp(jax.random.key(0))


@pytest.fixture
def x():
    return jax.random.normal(jax.random.key(1), (DIM,))


@pytest.mark.slow
def test_coupling_layer(params, x):
    y = coupling(x, params)
    inv = inverse(coupling, argnums=0)
    compare_with_reference(inv, coupling_inverse, (y, params))
    got_x, got_ildj = inverse_and_ildj(coupling, argnums=0)(y, params)
    tree_allclose(got_x, x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ildj, coupling_ildj(y, params), rtol=1e-5)
    np.testing.assert_allclose(
        got_ildj, slogdet_ildj(lambda y: inv(y, params), y), rtol=1e-4, atol=1e-5
    )


def test_coupling_ildj_gradient_wrt_parameters(params, x):
    y = coupling(x, params)
    got = jax.grad(lambda p: ildj(coupling, argnums=0)(y, p))(params)
    want = jax.grad(lambda p: coupling_ildj(y, p))(params)
    tree_allclose(got, want, rtol=1e-5, atol=1e-6)


def reverse_halves(x):
    return jnp.concatenate([x[..., DIM // 2 :], x[..., : DIM // 2]], axis=-1)


def stack_of_layers(x, stacked):
    """8 coupling layers (halves swapped in between) via `lax.scan`."""

    def layer(h, p):
        return reverse_halves(coupling(h, p)), None

    return lax.scan(layer, x, stacked)[0]


def stack_inverse(y, stacked):
    def layer(h, p):
        return coupling_inverse(reverse_halves(h), p), None

    return lax.scan(layer, y, stacked, reverse=True)[0]


@pytest.mark.slow
def test_stack_of_eight_layers_in_scan(x):
    stacked = jax.vmap(init_mlp)(jax.random.split(jax.random.key(2), 8))
    y = stack_of_layers(x, stacked)
    inv = inverse(stack_of_layers, argnums=0)
    # (The reference runs its reversed scan with JAX's hijax flags off: JAX
    # 0.12.0.1's `Scan3` ignores `reverse`.)
    reference = lambda y, s: flags_off(stack_inverse, y, s)  # noqa: E731
    compare_with_reference(inv, reference, (y, stacked), rtol=1e-4, atol=1e-4)
    _, got = inverse_and_ildj(stack_of_layers, argnums=0)(y, stacked)
    want = slogdet_ildj(lambda y: inv(y, stacked), y)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    names = [e.primitive.name for e in jax.make_jaxpr(inv)(y, stacked).jaxpr.eqns]
    assert names.count("scan") == 1


@pytest.mark.slow
def test_batched_coupling_under_vmap(params):
    xs = jax.random.normal(jax.random.key(3), (5, DIM))
    ys = jax.vmap(coupling, in_axes=(0, None))(xs, params)
    got_x, got_ildj = jax.vmap(inverse_and_ildj(coupling, argnums=0), (0, None))(
        ys, params
    )
    tree_allclose(got_x, xs, rtol=1e-5, atol=1e-5)
    want = jnp.stack([coupling_ildj(y, params) for y in ys])
    np.testing.assert_allclose(got_ildj, want, rtol=1e-5)


def test_permutation_layer(x):
    perm = jax.random.permutation(jax.random.key(4), DIM)

    def permute(x, perm):
        return x[perm] * 2.0

    y = permute(x, perm)
    inv = inverse(permute, argnums=0)
    compare_with_reference(
        inv, lambda y, perm: (y / 2.0)[jnp.argsort(perm)], (y, perm), check_vmap=False
    )
    np.testing.assert_allclose(
        inverse_and_ildj(permute, argnums=0)(y, perm)[1], -DIM * np.log(2.0), rtol=1e-5
    )


@pytest.mark.slow
def test_invertible_one_by_one_convolution():
    """A 1x1 convolution over channels: `dot_general` with a known matrix."""
    image = jax.random.normal(jax.random.key(5), (4, 4, 3))
    w = jnp.linalg.qr(jax.random.normal(jax.random.key(6), (3, 3)))[0] * 1.5

    def conv1x1(x, w):
        return jnp.einsum("hwc,dc->hwd", x, w)

    y = conv1x1(image, w)
    inv = inverse(conv1x1, argnums=0)
    compare_with_reference(
        inv,
        lambda y, w: jnp.einsum("hwd,cd->hwc", y, jnp.linalg.inv(w)),
        (y, w),
        rtol=1e-4,
        atol=1e-5,
    )
    _, got = inverse_and_ildj(conv1x1, argnums=0)(y, w)
    np.testing.assert_allclose(got, -16 * jnp.linalg.slogdet(w)[1], rtol=1e-4)


def test_functions_with_jit_and_checkpoint_inside(params, x):
    f = jax.jit(coupling)
    g = jax.checkpoint(coupling)
    y = coupling(x, params)
    for fn in (f, g):
        tree_allclose(inverse(fn, argnums=0)(y, params), x, rtol=1e-5, atol=1e-5)


def test_float64(params, x):
    if not jax.config.jax_enable_x64:
        pytest.skip("run with JAX_ENABLE_X64=1 (the nox `tests` x64 run)")
    x64 = x.astype(jnp.float64)
    p64 = jax.tree.map(lambda a: a.astype(jnp.float64), params)
    y = coupling(x64, p64)
    got_x, got_ildj = inverse_and_ildj(coupling, argnums=0)(y, p64)
    assert got_x.dtype == jnp.float64
    tree_allclose(got_x, x64, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_ildj, coupling_ildj(y, p64), rtol=1e-12)
