"""Sequential blocks (`jaxinterp/_inverse/_numerical/_sequential.py`):
triangular nonlinear maps of one unknown, solved level by level.

Each map is checked against a hand-written inverse (the `d` passes of an
autoregressive flow, the stick-breaking recursion) and its ildj against
`jax.jacfwd` + `slogdet` (`-0.5 * logdet(J^T J)` for a map onto a manifold).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import flags_off
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp.testing import compare_with_reference

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

D = 4


def made_weights(seed: int, d: int = D, scale: float = 0.5) -> tuple[jax.Array, ...]:
    """Weights of a one-hidden-layer MADE network: masked dense layers whose
    output `i` sees inputs `< i` only (the masks are constants)."""
    rng = np.random.default_rng(seed)
    hidden = 2 * d
    degrees_in = np.arange(d)
    degrees_hidden = np.arange(hidden) % max(d - 1, 1)
    mask_1 = (degrees_hidden[:, None] >= degrees_in[None, :]).astype(np.float32)
    mask_2 = (degrees_in[:, None] > degrees_hidden[None, :]).astype(np.float32)
    w_1 = rng.normal(size=(hidden, d)) * scale
    w_s = rng.normal(size=(d, hidden)) * scale
    w_t = rng.normal(size=(d, hidden)) * scale
    return tuple(
        jnp.asarray(a, jnp.float32)
        for a in (mask_1 * w_1, mask_2 * w_s, mask_2 * w_t, mask_1, mask_2)
    )


def made(x, weights):
    w_1, w_s, w_t, mask_1, mask_2 = weights
    h = jnp.tanh((mask_1 * w_1) @ x)
    return jnp.tanh((mask_2 * w_s) @ h), (mask_2 * w_t) @ h


def iaf(weights):
    """Inverse autoregressive flow: one pass forward, `x` in its own scale."""

    def f(x):
        s, t = made(x, weights)
        return x * jnp.exp(s) + t

    return f


def iaf_inverse(weights):
    """`d` passes; after pass `k` coordinates `0..k` are exact."""

    def inv(y):
        x = jnp.zeros_like(y)
        for _ in range(y.shape[-1]):
            s, t = made(x, weights)
            x = (y - t) * jnp.exp(-s)
        return x

    return inv


def maf(weights):
    """Masked autoregressive flow, TFP's direction: the forward runs the `d`
    passes (a loop), the inverse is one pass."""

    def f(x):
        def one_more(_, y):
            s, t = made(y, weights)
            return x * jnp.exp(s) + t

        return jax.lax.fori_loop(0, x.shape[-1], one_more, jnp.zeros_like(x))

    return f


def maf_inverse(weights):
    def inv(y):
        s, t = made(y, weights)
        return (y - t) * jnp.exp(-s)

    return inv


def stick_breaking(x):
    """R^n onto the open simplex of R^(n+1), NumPyro's way."""
    n = x.shape[-1]
    z = jax.nn.sigmoid(x - jnp.log(n - jnp.arange(n, dtype=x.dtype)))
    rest = jnp.cumprod(1 - z)
    return jnp.pad(z, (0, 1), constant_values=1.0) * jnp.pad(
        rest, (1, 0), constant_values=1.0
    )


def stick_breaking_inverse(y):
    n = y.shape[-1] - 1
    remaining = 1 - jnp.cumsum(y[:-1]) + y[:-1]
    z = y[:-1] / remaining
    return jax.scipy.special.logit(z) + jnp.log(n - jnp.arange(n, dtype=y.dtype))


def ildj_reference(f, x, rows=None):
    """`-log|det J|`; for a map with more results than unknowns, of the
    Jacobian's `rows` (the results the inverse reads), or the area formula."""
    # (Flags off: under JAX's hijax future flags, plain `jacfwd` of a
    # `fori_loop` fails in JAX 0.12.0.1.)
    jac = flags_off(jax.jacfwd(f), x)
    if rows is not None:
        jac = jac[rows]
    if jac.shape[0] == jac.shape[1]:
        return -jnp.linalg.slogdet(jac)[1]
    return -0.5 * jnp.linalg.slogdet(jac.T @ jac)[1]


X = jnp.array([0.3, -1.0, 0.5, 2.0], jnp.float32)
MASKS = made_weights(0)[3:]


@pytest.mark.parametrize(
    "make, make_inverse", [(iaf, iaf_inverse), (maf, maf_inverse)], ids=["iaf", "maf"]
)
def test_autoregressive_flows(make, make_inverse):
    weights = made_weights(0)
    f, reference = make(weights), make_inverse(weights)
    y = f(X)
    ys = jnp.stack([y, f(0.5 * X - 0.2)])
    compare_with_reference(
        jaxinterp.inverse(f),
        reference,
        (y,),
        vmap_args=(ys,),
        atol=1e-5,
        rtol=1e-5,
        compiled=True,
    )
    x, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(x, X, atol=1e-5)
    np.testing.assert_allclose(ildj, ildj_reference(f, X), atol=1e-4, rtol=1e-5)
    # The ildj's gradient, against the hand-written inverse's log-det.
    grad = jax.grad(lambda y: jaxinterp.ildj(f)(y))(y)
    expected = jax.grad(lambda y: ildj_reference(f, reference(y)))(y)
    np.testing.assert_allclose(grad, expected, atol=1e-4, rtol=1e-4)
    report = jaxinterp.explain_inverse(f, X)
    assert "(sequential solve)" in report
    assert report.splitlines()[-1] == "Invertible: every unknown input is recovered."


def test_stick_breaking_left_inverse():
    f = lambda x: stick_breaking(x)  # noqa: E731
    inverse = jaxinterp.inverse(f, example_args=(X,))
    y = f(X)
    ys = jnp.stack([y, f(0.5 * X - 0.2)])
    # The gradient reads the first n coordinates, as the recursion does.
    compare_with_reference(
        inverse,
        stick_breaking_inverse,
        (y,),
        vmap_args=(ys,),
        atol=2e-5,
        rtol=2e-5,
        compiled=True,
    )
    # Its ildj is in the coordinates the inverse reads, the first n (NumPyro's
    # log-det).
    x, ildj = jaxinterp.inverse_and_ildj(f, example_args=(X,))(y)
    np.testing.assert_allclose(x, X, atol=2e-5)
    np.testing.assert_allclose(
        ildj, ildj_reference(f, X, rows=slice(None, -1)), atol=1e-4, rtol=1e-5
    )


def test_stick_breaking_off_the_simplex_is_nan():
    f = stick_breaking
    y = f(X)
    inverse = jaxinterp.inverse(f, example_args=(X,))
    for off in (y.at[0].add(1e-3), y.at[-1].add(1e-3), y * 1.01):
        assert bool(jnp.all(jnp.isnan(inverse(off))))
        assert bool(jnp.all(jnp.isnan(jax.jit(inverse)(off))))


def nonlinear_2d(x):
    """A 2-D autoregressive map, no splines: each step a cubic in its own
    coordinate (Newton needed), the conditioner a masked product."""
    w = jnp.array([[0.0, 0.0], [0.8, 0.0]], jnp.float32)
    return x**3 + x + jnp.sin(w @ x)


def nonlinear_2d_inverse(y):
    def cubic_root(c):  # the real root of t^3 + t - c (Cardano)
        disc = jnp.sqrt(c**2 / 4 + 1 / 27)
        return jnp.cbrt(c / 2 + disc) + jnp.cbrt(c / 2 - disc)

    x0 = cubic_root(y[0])
    x1 = cubic_root(y[1] - jnp.sin(0.8 * x0))
    return jnp.stack([x0, x1])


@given(st.floats(-3, 3, width=32), st.floats(-3, 3, width=32))
def test_nonlinear_2d(a, b):
    x = jnp.array([a, b], jnp.float32)
    y = nonlinear_2d(x)
    got, ildj = jaxinterp.inverse_and_ildj(nonlinear_2d)(y)
    expected = nonlinear_2d_inverse(y)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(ildj, ildj_reference(nonlinear_2d, got), atol=2e-4)
    grad = jax.grad(lambda y: jnp.sum(jaxinterp.inverse(nonlinear_2d)(y)))(y)
    grad_ref = jax.grad(lambda y: jnp.sum(nonlinear_2d_inverse(y)))(y)
    np.testing.assert_allclose(grad, grad_ref, atol=1e-4, rtol=1e-4)


def iaf_of_weights(x, w_1, w_s, w_t):
    return iaf((w_1, w_s, w_t, *MASKS))(x)


# Weights as known arguments: traced and compiled once for all examples.
IAF_INVERSE_AND_ILDJ = jaxinterp.inverse_and_ildj(iaf_of_weights, argnums=0)


@settings(max_examples=10)
@given(st.integers(0, 2**16), st.floats(0.1, 1.5), st.data())
def test_iaf_hypothesis(seed, scale, data):
    weights = made_weights(seed, scale=scale)
    values = data.draw(
        st.lists(st.floats(-3, 3, width=32), min_size=D, max_size=D), label="x"
    )
    x = jnp.asarray(values, jnp.float32)
    f = iaf(weights)
    y = f(x)
    got, ildj = IAF_INVERSE_AND_ILDJ(y, *weights[:3])
    np.testing.assert_allclose(got, iaf_inverse(weights)(y), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got, x, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(ildj, ildj_reference(f, x), atol=1e-3, rtol=1e-4)


def test_not_injective_is_refused_or_nan():
    # y_0 = x_0^2: two preimages; the map is triangular but not injective.
    w = jnp.array([[0.0, 0.0], [1.0, 0.0]], jnp.float32)

    def f(x):
        return x * x + w @ x

    y = f(jnp.array([0.7, -0.4], jnp.float32))
    try:
        got = jaxinterp.inverse(f)(y)
    except jaxinterp.NotInvertibleError:
        return
    assert bool(jnp.all(jnp.isnan(got)))


def test_a_corner_into_a_flat_stretch_is_nan():
    # y_1 = h(x_1) + tanh(x_0) with h = relu + relu^2: every x_1 <= 0 is a
    # preimage of the same y (the solver's root would sit at the corner, 0).
    # NaN there and inside the stretch; exact elsewhere.
    w = jnp.array([[0.0, 0.0], [1.0, 0.0]], jnp.float32)

    def f(x):
        r = jax.nn.relu(x)
        return r + r**2 + w @ jnp.tanh(x)

    assert "(sequential solve)" in jaxinterp.explain_inverse(f, jnp.ones(2))
    inv = jaxinterp.inverse(f)
    for flat in ([1.0, 0.0], [1.0, -0.5], [0.5, -1e-3]):
        got = inv(f(jnp.array(flat, jnp.float32)))
        assert bool(jnp.isnan(got[1])), (flat, got)
    x = jnp.array([1.0, 0.25], jnp.float32)
    np.testing.assert_allclose(inv(f(x)), x, rtol=1e-6)


def test_not_triangular_is_refused():
    # Every result depends on every coordinate: no triangular order.
    w = jnp.array([[0.0, 0.5], [0.5, 0.0]], jnp.float32)

    def f(x):
        return x * jnp.exp(jnp.tanh(w @ x))

    with pytest.raises(jaxinterp.NotInvertibleError, match=re.escape("`mul`")):
        jaxinterp.inverse(f)(f(jnp.array([0.7, -0.4], jnp.float32)))


def test_solvers_off_refuses():
    f = iaf(made_weights(0))
    with pytest.raises(jaxinterp.NotInvertibleError, match="cannot recover input 0"):
        jaxinterp.inverse(f, solvers=False)(f(X))


def test_weights_as_known_arguments():
    # Known arguments are traced: the pattern is found with generic weights
    # in their place (the masks stay constants); eager, jit and the gradient
    # with respect to the weights agree with the hand-written inverse.
    f = iaf_of_weights

    def reference(y, w_1, w_s, w_t):
        return iaf_inverse((w_1, w_s, w_t, *MASKS))(y)

    weights = made_weights(1)[:3]
    y = f(X, *weights)
    compare_with_reference(
        jaxinterp.inverse(f, argnums=0),
        reference,
        (y, *weights),
        vmap_args=(
            jnp.stack([y, f(0.5 * X, *weights)]),
            *(jnp.stack([w, w]) for w in weights),
        ),
        atol=1e-4,
        rtol=1e-4,
    )


def test_mask_as_known_argument_is_refused():
    # A traced mask: generic values fill it, and no order is left.
    w_s, w_t = 0.5 * jnp.ones((D, D)), jnp.ones((D, D))

    def f(x, mask):
        return x * jnp.exp(jnp.tanh((mask * w_s) @ x)) + (mask * w_t) @ x

    mask = jnp.tril(jnp.ones((D, D)), -1)
    np.testing.assert_allclose(  # the map is invertible: closed over, it is solved
        jaxinterp.inverse(lambda x: f(x, mask))(f(X, mask)), X, atol=1e-5
    )
    with pytest.raises(jaxinterp.NotInvertibleError, match="cannot recover input 0"):
        jaxinterp.inverse(f, argnums=0)(f(X, mask), mask)


def test_float64():
    from helpers import run_python

    out = run_python(
        """
import jax, jax.numpy as jnp
import jaxinterp
w = jnp.tril(jnp.linspace(-1.0, 1.0, 16).reshape(4, 4), -1)
f = lambda x: x * jnp.exp(jnp.tanh(w @ x)) + jnp.sin(w @ x)


def reference(y):  # d passes
    x = jnp.zeros_like(y)
    for _ in range(4):
        x = (y - jnp.sin(w @ x)) * jnp.exp(-jnp.tanh(w @ x))
    return x


x = jnp.array([0.3, -1.0, 0.5, 2.0])
assert x.dtype == jnp.float64
got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
assert got.dtype == jnp.float64
ref = -jnp.linalg.slogdet(jax.jacfwd(f)(x))[1]
print(float(jnp.max(jnp.abs(got - reference(f(x))))), float(abs(ildj - ref)))
""",
        env={"JAX_ENABLE_X64": "1"},
    )
    err_x, err_ildj = map(float, out.split())
    assert err_x < 1e-12 and err_ildj < 1e-10, out


def test_a_value_solved_from_a_where_is_not_counted_twice_in_the_ildj():
    """Fuzzer, seed 61 program 327: `where(all_true, scan(x), x)`. The masked
    step solves the scan's result from the `where`'s; the sequential block
    then solving `x` must not take both as results (the ildj of a map that
    looks non-square, each element counted twice: -2 log 2 instead of 0)."""
    x = jnp.array([[[0.64, -1.74]], [[1.04, 1.71]]], jnp.float32)

    def f(x):
        ys = lax.scan(lambda c, r: (0.5 * c + r, c + r), jnp.zeros_like(x[0]), x)[1]
        return jnp.where(jnp.ones(x.shape, bool), ys, x)

    try:
        got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
    except jaxinterp.NotInvertibleError:
        # JAX 0.7 stages the loop's dropped carry so that no sequential block
        # is found: refused there, never answered wrongly.
        assert tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 8)
        return
    np.testing.assert_allclose(got, x, atol=1e-6)
    # (The reference with the flags off: JAX cannot `vmap` a `Scan3`.)
    jac = flags_off(jax.jacfwd(f), x).reshape(x.size, x.size)
    np.testing.assert_allclose(ildj, -jnp.linalg.slogdet(jac)[1], atol=1e-6)


_MASK = jnp.tril(jnp.ones((3, 3), jnp.float32), -1)


def _folding_made(x, s, base):
    """A masked autoregressive map whose rows are `x_i - c_i tanh(100 (x_i -
    0.3))`, `c_i` from the earlier elements: row `i` folds (between grid
    points) where `c_i > 0.01`."""
    c = base + 0.004 * jnp.tanh(s * (_MASK @ x))
    return x - c * jnp.tanh(100.0 * (x - 0.3))


def test_a_row_that_folds_between_grid_points_is_nan():
    # The rows' slopes are enclosed (one-hot operands pick the element and
    # the result): with `base = 0.008` and `s = 100`, rows 1 and 2 have `c =
    # 0.012` and take `y = f(x)` three times; the solver answered `x`.
    x = jnp.asarray([0.3, 0.29, 0.35], jnp.float32)
    inv = jax.jit(jaxinterp.inverse(_folding_made, argnums=0))
    for base, s, folds in [
        (0.005, -100.0, False),
        (0.008, -100.0, False),
        (0.008, 100.0, True),
    ]:
        y = _folding_made(x, s, base)
        for got in (
            inv(y, s, base),
            jaxinterp.inverse(lambda v, s=s, base=base: _folding_made(v, s, base))(y),
        ):
            if folds:
                assert np.isnan(np.asarray(got)).all(), got
            else:
                np.testing.assert_allclose(got, x, atol=2e-6)
                assert "sequential solve" in jaxinterp.explain_inverse(
                    _folding_made, x, s, base, argnums=0
                )


def test_under_vmap_every_batch_element_whose_row_folds_is_nan():
    # Under `vmap` over `(y, s, base)`, the rows of the first 8 batch
    # elements were searched one by one and the others left to the samplers,
    # which do not see a fold between grid points: batch elements 8 and on
    # that fold came back as one of three preimages. The batch is now
    # halved at the median of its operands (folding and not apart here).
    n = 24
    folds = np.arange(n) % 3 == 0
    s = jnp.where(jnp.asarray(folds), 100.0, -100.0)
    base = jnp.full((n,), 0.008, jnp.float32)
    x = jnp.tile(jnp.asarray([0.3, 0.29, 0.35], jnp.float32), (n, 1))
    y = jax.vmap(_folding_made)(x, s, base)
    got = np.asarray(
        jax.jit(jax.vmap(jaxinterp.inverse(_folding_made, argnums=0)))(y, s, base)
    )
    assert np.isnan(got[folds][:, 1:]).all(), got[folds]
    np.testing.assert_allclose(got[~folds], np.asarray(x)[~folds], atol=2e-6)


def test_a_value_known_in_parts_inside_the_block_is_checked():
    """Found by the fuzzer (seed 3333): five results of three unknowns. The
    sequential solve recovers `x` from `softplus(x)[:, :2]` and the sum;
    `(x @ M)[:, 1:]` is a slice of a value inside the block, which the
    engine inverts into pieces of it, and the solve did not check them: a
    `y` moved off the image in any result came back as an `x` that does
    not reproduce it. It is NaN now; on the image, `x`."""
    m = jnp.array([[-1.17, 0.06, 0.39], [0.05, 1.02, 0.3], [0.01, 0.0, 0.86]])

    def f(x):
        v0 = x @ m
        v2 = jnp.take(jax.nn.softplus(x), jnp.array([0, 1]), axis=1)
        return v2, v0[..., 1:], jnp.sum(v0 * jnp.array([1.0, 0.63, 0.78]), axis=-1)

    x = jnp.array([[0.32, 0.71, -0.94]], jnp.float32)
    inverse = jaxinterp.inverse(f, example_args=(x,))
    y = f(x)
    np.testing.assert_allclose(inverse(y), x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(inverse)(y), x, rtol=1e-5, atol=1e-6)
    for k, index in [(0, (0, 0)), (1, (0, 0)), (1, (0, 1)), (2, (0,))]:
        moved = list(y)
        moved[k] = moved[k].at[index].add(0.05)
        assert np.isnan(np.asarray(inverse(tuple(moved)))).all(), (k, index)
