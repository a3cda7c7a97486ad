"""Maps through a scalar bottleneck (`jaxinterp/_inverse/_numerical/_bottleneck.py`).

Planar and radial flows (Rezende and Mohamed, 2015) and maps onto a ball
reach their result from `x` directly and through one number computed from
all of `x`. Each is checked against its hand-written inverse (the scalar
equation solved in float64 NumPy, or a closed form), the ildj against
`-slogdet(jacfwd(f))`, under `jax.jit`, `jax.vmap` and `jax.grad`; a `y`
with several preimages or none gives NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import x64
from hypothesis import given, strategies as st

import jaxinterp
from jaxinterp import NotInvertibleError

D = 4


def planar_params(seed, scale=1.0):
    """`u`, `w`, `b` with `w @ u >= -1` (the flow's usual
    reparametrization), so that the map is invertible."""
    rng = np.random.default_rng(seed)
    u, w = rng.normal(size=D) * scale, rng.normal(size=D)
    wu = w @ u
    u = u + (-1 + np.log1p(np.exp(wu)) - wu) * w / (w @ w)
    b = rng.normal()
    return (jnp.asarray(u, jnp.float32), jnp.asarray(w, jnp.float32), jnp.float32(b))


def planar(x, u, w, b):
    return x + u * jnp.tanh(jnp.dot(w, x) + b)


def planar_inverse(y, u, w, b):
    """In float64: `a = w @ x` solves `a + (w @ u) tanh(a + b) = w @ y`
    (increasing in `a`), by bisection; then `x = y - u tanh(a + b)`."""
    y, u, w = (np.asarray(v, np.float64) for v in (y, u, w))
    target, wu = w @ y, w @ u
    lo, hi = target - abs(wu) - 1, target + abs(wu) + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid + wu * np.tanh(mid + b) < target:
            lo = mid
        else:
            hi = mid
    return y - u * np.tanh((lo + hi) / 2 + b)


def radial(x, c, alpha, beta):
    r = jnp.linalg.norm(x - c)
    return x + beta / (alpha + r) * (x - c)


def radial_inverse(y, c, alpha, beta):
    """In float64: `r = |x - c|` solves `r (1 + beta / (alpha + r)) = |y - c|`
    (increasing for `beta >= -alpha`), by bisection."""
    y, c = np.asarray(y, np.float64), np.asarray(c, np.float64)
    target = np.linalg.norm(y - c)
    lo, hi = 0.0, target + abs(beta) + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * (1 + beta / (alpha + mid)) < target:
            lo = mid
        else:
            hi = mid
    r = (lo + hi) / 2
    return c + (y - c) / (1 + beta / (alpha + r))


def l2_ball(x):
    return x / (1 + jnp.linalg.norm(x))


def l2_ball_inverse(y):
    return y / (1 - jnp.linalg.norm(y))


def l1_ball(x):
    return x / (1 + jnp.sum(jnp.abs(x)))


def l1_ball_inverse(y):
    return y / (1 - jnp.sum(jnp.abs(y)))


def slogdet_ildj(f, x):
    jac = np.asarray(jax.jacfwd(f)(x), np.float64)
    return -np.linalg.slogdet(jac)[1]


def points(seed, n=3, scale=1.5):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(n, D)) * scale, jnp.float32)


@pytest.mark.slow
@given(st.integers(0, 2**31 - 1))
def test_planar_flow_against_its_hand_written_inverse(seed):
    params = planar_params(seed)
    inv = jaxinterp.inverse_and_ildj(planar, argnums=0)
    for x in points(seed):
        y = planar(x, *params)
        got, ildj = inv(y, *params)
        want = planar_inverse(y, *params)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got, x, rtol=1e-3, atol=1e-3)
        ildj_want = slogdet_ildj(lambda v: planar(v, *params), got)
        np.testing.assert_allclose(ildj, ildj_want, rtol=1e-4, atol=1e-4)


def test_radial_flow_is_refused_its_scalar_equation_has_a_moving_pole():
    """A radial flow's `G` divides by `1 + beta / (alpha + r)` with `alpha`,
    `beta` passed at run time: a pole whose place moves with them and with
    `y`, and may fall between the solver's grid points, where it would hide
    two more roots. So it is refused (its hand-written inverse below checks
    the forward map, so the refusal is not of a broken map)."""
    rng = np.random.default_rng(0)
    c = jnp.asarray(rng.normal(size=D), jnp.float32)
    alpha, beta = 1.3, -0.4
    x = points(0)[0]
    y = radial(x, c, alpha, beta)
    np.testing.assert_allclose(radial_inverse(y, c, alpha, beta), x, rtol=1e-4)
    with pytest.raises(NotInvertibleError, match="Blocked at"):
        jaxinterp.inverse(radial, argnums=0)(y, c, alpha, beta)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: x - 1e-30 / jnp.sum(x),  # a pole: every y has two preimages
        lambda x: jnp.where(jnp.sum(x) > 0, x, -x),  # a jump: x and -x
        lambda x: x + jnp.floor(4 * jnp.sum(x)) * 0.1,  # jumps (injective)
        # A `cond` on the sum inside a `jit`: a jump too.
        lambda x: (
            x
            + jax.jit(lambda s: jax.lax.cond(s > 0.3, lambda: 1.0, lambda: -1.0))(
                jnp.sum(x)
            )
        ),
    ],
    ids=["pole", "jump", "floor", "cond-in-jit"],
)
def test_a_scalar_equation_with_a_pole_or_a_jump_is_not_solved(f):
    """Where `G` may jump or have a pole between the solver's grid points
    (their places move with `y`), solving it could answer one of two
    preimages. Such a `G` is not solved (`_continuous`): refused, or NaN by
    another method, never an answer."""
    x = jnp.asarray([0.5, 0.25], jnp.float32)
    try:
        got = jaxinterp.inverse(f)(f(x))
    except NotInvertibleError:
        return
    assert np.all(np.isnan(np.asarray(got))), got


@pytest.mark.slow
@pytest.mark.parametrize(
    "f, f_inv", [(l2_ball, l2_ball_inverse), (l1_ball, l1_ball_inverse)]
)
def test_ball_maps_inverted_and_nan_outside_the_ball(f, f_inv):
    xs = points(5)
    inv = jaxinterp.inverse_and_ildj(f)
    for x in xs:
        got, ildj = inv(f(x))
        np.testing.assert_allclose(got, f_inv(f(x)), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ildj, slogdet_ildj(f, got), rtol=1e-4, atol=1e-4)
    # On the sphere and beyond it: no preimage.
    for scale in (1.0, 1.5):
        y = scale * xs[0] / (jnp.linalg.norm(xs[0], ord=1 if f is l1_ball else 2))
        assert np.all(np.isnan(jaxinterp.inverse(f)(y))), y
    report = str(jaxinterp.explain_inverse(f, xs[0]))
    assert "(scalar bottleneck solve)" in report, report


@pytest.mark.slow
def test_planar_flow_under_jit_vmap_and_grad():
    params = planar_params(11)
    inv = jaxinterp.inverse(planar, argnums=0)
    xs = points(12, n=5)
    ys = jax.vmap(planar, in_axes=(0, None, None, None))(xs, *params)
    got = jax.jit(jax.vmap(inv, in_axes=(0, None, None, None)))(ys, *params)
    np.testing.assert_allclose(got, xs, rtol=1e-4, atol=1e-4)
    # d x / d y is the inverse of the forward Jacobian at x.
    y, x = ys[0], xs[0]
    jac_inv = jax.jacrev(lambda v: inv(v, *params))(y)
    want = np.linalg.inv(np.asarray(jax.jacfwd(planar)(x, *params), np.float64))
    np.testing.assert_allclose(jac_inv, want, rtol=1e-3, atol=1e-4)
    # ... and d x / d b by the implicit function theorem: -J^-1 df/db.
    dx_db = jax.jacfwd(lambda b: inv(y, params[0], params[1], b))(params[2])
    df_db = np.asarray(jax.jacfwd(planar, argnums=3)(x, *params), np.float64)
    np.testing.assert_allclose(dx_db, -want @ df_db, rtol=1e-3, atol=1e-4)
    # The ildj's gradient in `y`, against the float64 reference's.
    ildj = jaxinterp.ildj(planar, argnums=0)
    grad = jax.grad(lambda v: ildj(v, *params))(y)
    with x64():
        p64 = [jnp.asarray(p, jnp.float64) for p in params]

        def ildj64(v):
            x64_ = v - p64[0] * jnp.tanh(_alpha64(v, p64) + p64[2])
            return -jnp.linalg.slogdet(jax.jacfwd(planar)(x64_, *p64))[1]

        want_grad = jax.grad(ildj64)(jnp.asarray(y, jnp.float64))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=1e-3)


def _alpha64(y, p):
    """`a = w @ x` of the planar flow, by Newton's method from `w @ y`
    (float64, differentiable through the iterations)."""
    u, w, b = p
    target, wu = w @ y, w @ u
    a = target
    for _ in range(60):
        g = a + wu * jnp.tanh(a + b) - target
        a = a - g / (1 + wu * (1 - jnp.tanh(a + b) ** 2))
    return a


def test_a_planar_map_that_folds_is_nan_where_several_preimages():
    # `w @ u = -3`: `a - 3 tanh(a)` turns, so some `y` have three preimages.
    w = jnp.asarray([1.0, 0.0, 0.0, 0.0], jnp.float32)
    u = jnp.asarray([-3.0, 0.5, 0.0, 0.0], jnp.float32)
    b = jnp.float32(0.0)
    x = jnp.asarray([0.2, 0.1, -0.3, 0.4], jnp.float32)  # a = 0.2: on the fold
    got = jaxinterp.inverse(planar, argnums=0)(planar(x, u, w, b), u, w, b)
    assert np.all(np.isnan(got)), got


@pytest.mark.slow
def test_a_planar_fold_between_grid_points_is_nan():
    # `w @ u = -2` with `|w|` large: `G(a) = a - 2 tanh(a - 30)` folds
    # between the grid points 16 and 32 (turns at 30 -+ 0.88), where the
    # samples of `G` never show it; the solver answered the preimage with
    # `a = 28.08` for the `y` of `a = 30` (three preimages). Enclosing
    # `G`'s slope over intervals of `a` (its operands arrays: `y`, `u`,
    # `w`) finds the turns, with the parameters constant or traced.
    w = jnp.asarray([60.0, 80.0, 0.0, 0.0], jnp.float32)
    b = jnp.float32(-30.0)
    x = jnp.asarray([0.18, 0.24, 0.1, -0.2], jnp.float32)  # w @ x = 30
    for scale, folds in [(0.004, True), (0.001, False)]:
        u = jnp.asarray([-3.0, -4.0, 1.0, 0.0], jnp.float32) * scale
        assert float(w @ u) == pytest.approx(-2.0 if folds else -0.5, rel=1e-5)
        y = planar(x, u, w, b)
        for got in (
            jaxinterp.inverse(lambda v, u=u: planar(v, u, w, b))(y),
            jax.jit(jaxinterp.inverse(planar, argnums=0))(y, u, w, b),
        ):
            if folds:
                assert np.all(np.isnan(got)), got
            else:
                np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    # Under `vmap` over `y`: the batch is searched as one box.
    ys = jax.vmap(planar, in_axes=(0, None, None, None))(
        jnp.stack([x, x * 1.01, x * 0.99]), u * 4, w, b
    )
    got = jax.jit(
        jax.vmap(jaxinterp.inverse(planar, argnums=0), (0, None, None, None))
    )(ys, u * 4, w, b)
    assert np.all(np.isnan(got)), got


@pytest.mark.slow
def test_under_vmap_every_batch_element_whose_planar_map_folds_is_nan():
    # Per batch element `u`: `w @ u = -2` (folds between grid points) for
    # every other element, `-0.5` for the rest. The batch's box is not
    # decided; the first 8 elements were then searched one by one and the
    # others left to the samplers, so elements 8 and on that fold came back
    # as one of three preimages. The batch is now halved at the median of
    # its operands, which puts the folding elements apart.
    w = jnp.asarray([60.0, 80.0, 0.0, 0.0], jnp.float32)
    b = jnp.float32(-30.0)
    x = jnp.asarray([0.18, 0.24, 0.1, -0.2], jnp.float32)
    folds = np.arange(32) % 2 == 0
    scale = jnp.where(jnp.asarray(folds), 0.004, 0.001)[:, None]
    u = jnp.asarray([-3.0, -4.0, 1.0, 0.0], jnp.float32) * scale
    ys = jax.vmap(planar, in_axes=(None, 0, None, None))(x, u, w, b)
    inv = jax.vmap(jaxinterp.inverse(planar, argnums=0), (0, 0, None, None))
    got = np.asarray(jax.jit(inv)(ys, u, w, b))
    assert np.isnan(got[folds]).all(), got[folds]
    np.testing.assert_allclose(got[~folds], np.tile(x, (16, 1)), rtol=1e-5, atol=1e-5)


def test_without_solvers_it_is_refused():
    params = planar_params(3)
    with pytest.raises(NotInvertibleError):
        jaxinterp.inverse(planar, argnums=0, solvers=False)(
            planar(points(3)[0], *params), *params
        )


@pytest.mark.slow
def test_a_continuous_scalar_equation_through_library_functions_is_solved():
    """`x + 0.5 softplus(sum(x)) + relu(sum(x)) / 4` (JAX's `softplus` is
    a `custom_jvp` guarding NaN with `where(d != d, ...)`, `relu` a `max`):
    `G` is continuous, decreasing, one root. Checked against the preimage,
    the ildj against `slogdet`, under `jit`."""

    def f(x):
        s = jnp.sum(x)
        return x + 0.5 * jax.nn.softplus(s) + jax.nn.relu(s) / 4

    for x in points(11, n=2):
        got, ildj = jax.jit(jaxinterp.inverse_and_ildj(f))(f(x))
        np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ildj, slogdet_ildj(f, got), rtol=1e-4, atol=1e-4)
    report = str(jaxinterp.explain_inverse(f, points(11)[0]))
    assert "(scalar bottleneck solve)" in report, report
