"""Triangular-matrix bijectors: scatters into zeros, point gathers, diagonal
transforms and non-square linear blocks (`_inverse/_scattered.py`,
`_inverse/_nonsquare.py`).

Each map is written the way NumPyro or TFP write it (our own code), checked
against a hand-written inverse, its ildj against `-slogdet` of `jax.jacfwd`
on the free coordinates (the entries the map may set: a triangle), eagerly,
under `jax.jit`, `jax.vmap` and `jax.grad`; a `y` off the image gives NaN and
maps that lose information are refused with their messages.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import jit_once
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp import NotInvertibleError, inverse, inverse_and_ildj

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

# ---------------------------------------------------------------------------
# The bijectors, written as the libraries write them.


def _n_of(size: int, diagonal: int = 0) -> int:
    return round((math.sqrt(1 + 8 * size) - 1) / 2) - diagonal


def vec_to_tril(t, diagonal=0):
    """NumPyro's `vec_to_tril_matrix`: a `lax.scatter_add` into zeros."""
    n = _n_of(t.shape[-1], diagonal)
    idx = jnp.reshape(jnp.arange(n * n), (n, n))[jnp.tril_indices(n, diagonal)]
    x = lax.scatter_add(
        jnp.zeros(t.shape[:-1] + (n * n,), t.dtype),
        jnp.expand_dims(idx, axis=-1),
        t,
        lax.ScatterDimensionNumbers(
            update_window_dims=tuple(range(t.ndim - 1)),
            inserted_window_dims=(t.ndim - 1,),
            scatter_dims_to_operand_dims=(t.ndim - 1,),
        ),
    )
    return jnp.reshape(x, x.shape[:-1] + (n, n))


def add_diag(m, d):
    """NumPyro's `add_diag`: a `scatter-add` of unknown updates into an
    unknown operand at the diagonal."""
    i = jnp.arange(m.shape[-1])
    return m.at[..., i, i].add(d)


def lower_cholesky(x):
    """NumPyro's `LowerCholeskyTransform`."""
    n = _n_of(x.shape[-1])
    return add_diag(vec_to_tril(x[..., :-n], diagonal=-1), jnp.exp(x[..., -n:]))


def lower_cholesky_inv(y):
    n = y.shape[-1]
    r, c = jnp.tril_indices(n, -1)
    return jnp.concatenate([y[..., r, c], jnp.log(jnp.diagonal(y))], -1)


def softplus_lower_cholesky(x):
    """NumPyro's `SoftplusLowerCholeskyTransform`: `z + diag * I`."""
    n = _n_of(x.shape[-1])
    z = vec_to_tril(x[..., :-n], diagonal=-1)
    diag = jax.nn.softplus(x[..., -n:])
    return z + jnp.expand_dims(diag, axis=-1) * jnp.identity(n)


def softplus_inv(y):
    return y + jnp.log(-jnp.expm1(-y))


def softplus_lower_cholesky_inv(y):
    n = y.shape[-1]
    r, c = jnp.tril_indices(n, -1)
    return jnp.concatenate([y[..., r, c], softplus_inv(jnp.diagonal(y))], -1)


def fill_triangular(x):
    """`jnp.zeros((n, n)).at[rows, cols].set(x)`: a `scatter` into zeros."""
    n = _n_of(x.shape[-1])
    r, c = jnp.tril_indices(n)
    return jnp.zeros((n, n), x.dtype).at[r, c].set(x)


def fill_triangular_inv(y):
    r, c = jnp.tril_indices(y.shape[-1])
    return y[r, c]


def transform_diagonal_exp(m):
    """TFP's `TransformDiagonal(Exp())` on JAX: `diag_part`, the bijector,
    then `set_diag` as `where(eye, d[None, :], m)`."""
    d = jnp.exp(jnp.diagonal(m))
    eye = jnp.eye(m.shape[-1], dtype=bool)
    return jnp.where(eye, d[None, :], m)


def transform_diagonal_exp_inv(y):
    eye = jnp.eye(y.shape[-1], dtype=bool)
    return jnp.where(eye, jnp.log(jnp.diagonal(y))[None, :], y)


def fill_scale_tril(x):
    """TFP's `FillScaleTriL`: fill the lower triangle, then the diagonal
    through `softplus(.) + 1e-5`."""
    m = fill_triangular(x)
    d = jax.nn.softplus(jnp.diagonal(m)) + 1e-5
    eye = jnp.eye(m.shape[-1], dtype=bool)
    return jnp.where(eye, d[None, :], m)


def fill_scale_tril_inv(y):
    r, c = jnp.tril_indices(y.shape[-1])
    eye = jnp.eye(y.shape[-1], dtype=bool)
    m = jnp.where(eye, softplus_inv(jnp.diagonal(y) - 1e-5)[None, :], y)
    return m[r, c]


# (map, its inverse, free coordinates of the result: "tril", "tril" or "all")
VECTOR_MAPS = {
    "lower_cholesky": (lower_cholesky, lower_cholesky_inv),
    "softplus_lower_cholesky": (softplus_lower_cholesky, softplus_lower_cholesky_inv),
    "fill_triangular": (fill_triangular, fill_triangular_inv),
    "fill_scale_tril": (fill_scale_tril, fill_scale_tril_inv),
}


def _tril_ildj(f, x):
    """`-slogdet` of the Jacobian of `x -> tril(f(x))` (square)."""
    n = f(x).shape[-1]
    r, c = np.tril_indices(n)
    jac = jax.jacfwd(lambda v: f(v)[..., r, c])(x)
    return -jnp.linalg.slogdet(jac)[1]


def _vector(n, seed=0, scale=1.0):
    rng = np.random.RandomState(seed)
    return jnp.asarray(rng.randn(n * (n + 1) // 2).astype(np.float32) * scale)


# ---------------------------------------------------------------------------
# Vector -> lower-triangular matrix.


@pytest.mark.parametrize("name", sorted(VECTOR_MAPS))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_vector_to_tril(name, n):
    f, f_inv = VECTOR_MAPS[name]
    x = _vector(n, seed=n)
    y = f(x)
    x_back, ildj = inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(x_back, f_inv(y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x_back, x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ildj, _tril_ildj(f, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(VECTOR_MAPS))
def test_vector_to_tril_jit_vmap_grad(name):
    f, f_inv = VECTOR_MAPS[name]
    xs = jnp.stack([_vector(3, seed=s) for s in range(4)])
    ys = jax.vmap(f)(xs)
    inv = inverse_and_ildj(f, example_args=(xs[0],))
    x_jit, ildj_jit = jax.jit(inv)(ys[0])
    np.testing.assert_allclose(x_jit, xs[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ildj_jit, _tril_ildj(f, xs[0]), rtol=1e-4, atol=1e-4)
    # (`vmap` and the gradients compiled: one compilation each, instead of
    # dispatching each step of the inverse on its own.)
    x_vmap, ildj_vmap = jax.jit(jax.vmap(inv))(ys)
    np.testing.assert_allclose(x_vmap, xs, rtol=1e-4, atol=1e-5)
    want = jnp.stack([_tril_ildj(f, x) for x in xs])
    np.testing.assert_allclose(ildj_vmap, want, rtol=1e-4, atol=1e-4)

    # Gradients with respect to y, against the hand-written inverse.
    def loss(inverse_fn):
        return lambda y: jnp.sum(jnp.sin(inverse_fn(y)))

    g = jax.jit(jax.grad(loss(lambda y: inv(y)[0])))(ys[1])
    g_want = jax.grad(loss(f_inv))(ys[1])
    np.testing.assert_allclose(g, g_want, rtol=1e-4, atol=1e-5)
    g_ildj = jax.jit(jax.grad(lambda y: inv(y)[1]))(ys[1])
    g_ildj_want = jax.grad(lambda y: _tril_ildj(f, f_inv(y)))(ys[1])
    np.testing.assert_allclose(g_ildj, g_ildj_want, rtol=1e-3, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(0.1, 3.0),
    name=st.sampled_from(sorted(VECTOR_MAPS)),
)
def test_vector_to_tril_hypothesis(n, seed, scale, name):
    f, f_inv = VECTOR_MAPS[name]
    x = _vector(n, seed=seed % 1000, scale=scale)
    y = f(x)
    # (Compiled once per map and size.)
    x_back, ildj = jit_once(
        ("vector to tril", name, n), lambda: inverse_and_ildj(f, example_args=(x,))
    )(y)
    np.testing.assert_allclose(x_back, f_inv(y), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ildj, _tril_ildj(f, x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", sorted(VECTOR_MAPS))
@pytest.mark.parametrize("where", [(0, 1), (0, 2), (1, 2)])
def test_off_image_is_nan(name, where):
    """A non-zero above the diagonal is no image of the map: NaN."""
    f, _ = VECTOR_MAPS[name]
    x = _vector(3)
    y = f(x).at[where].set(0.5)
    for inv in (
        inverse(f, example_args=(x,)),
        jax.jit(inverse(f, example_args=(x,))),
    ):
        assert jnp.all(jnp.isnan(inv(y))), inv(y)
    # ... and the image itself is not NaN.
    assert not jnp.any(jnp.isnan(inverse(f, example_args=(x,))(f(x))))


def test_methods_named():
    x = _vector(3)
    text = jaxinterp.explain_inverse(lower_cholesky, x)
    assert "linear solve" in text
    text = jaxinterp.explain_inverse(transform_diagonal_exp, jnp.ones((3, 3)))
    assert "masked" in text


# ---------------------------------------------------------------------------
# Matrix -> matrix: a transformed diagonal.


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_transform_diagonal(n):
    rng = np.random.RandomState(n)
    m = jnp.asarray(rng.randn(n, n).astype(np.float32))
    f = transform_diagonal_exp
    y = f(m)
    m_back, ildj = inverse_and_ildj(f)(y)
    np.testing.assert_allclose(m_back, transform_diagonal_exp_inv(y), rtol=1e-5)
    np.testing.assert_allclose(m_back, m, rtol=1e-5, atol=1e-6)
    jac = jax.jacfwd(f)(m).reshape(n * n, n * n)
    np.testing.assert_allclose(ildj, -jnp.linalg.slogdet(jac)[1], rtol=1e-4, atol=1e-5)
    ms = jnp.stack([m, 2 * m, -m])
    m_vmap, _ = jax.jit(jax.vmap(inverse_and_ildj(f)))(jax.vmap(f)(ms))
    np.testing.assert_allclose(m_vmap, ms, rtol=1e-5, atol=1e-5)
    g = jax.jit(jax.grad(lambda y: jnp.sum(inverse(f)(y) ** 2)))(y)
    g_want = jax.grad(lambda y: jnp.sum(transform_diagonal_exp_inv(y) ** 2))(y)
    np.testing.assert_allclose(g, g_want, rtol=1e-4, atol=1e-5)


def test_transform_diagonal_out_of_domain_is_nan():
    y = transform_diagonal_exp(jnp.ones((3, 3))).at[1, 1].set(-1.0)
    m = inverse(transform_diagonal_exp)(y)
    assert jnp.isnan(m[1, 1])
    assert not jnp.isnan(m[0, 0])


# ---------------------------------------------------------------------------
# Non-square linear blocks: the area-formula ildj.


def symmetric(x):
    """A vector filled into a triangle, plus its transpose: each off-diagonal
    unknown lands twice, each diagonal one doubled."""
    z = fill_triangular(x)
    return z + z.T


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_non_square_ildj_is_area_formula(n):
    x = _vector(n, seed=3)
    y = symmetric(x)
    x_back, ildj = inverse_and_ildj(symmetric, example_args=(x,))(y)
    np.testing.assert_allclose(x_back, x, rtol=1e-5, atol=1e-5)
    jac = jax.jacfwd(lambda v: symmetric(v).reshape(-1))(x)
    want = -0.5 * jnp.linalg.slogdet(jac.T @ jac)[1]
    np.testing.assert_allclose(ildj, want, rtol=1e-5, atol=1e-5)
    # An asymmetric `y` is off the image: NaN in the unknowns the moved
    # element is made of, the others recovered.
    if n > 1:
        got = np.asarray(inverse(symmetric, example_args=(x,))(y.at[0, 1].add(1.0)))
        coupled = np.asarray(jac)[1] != 0  # the row of y[0, 1]
        assert np.isnan(got[coupled]).all(), got
        np.testing.assert_allclose(got[~coupled], np.asarray(x)[~coupled], rtol=1e-5)


# ---------------------------------------------------------------------------
# What loses information is refused.


def _refused(fn, args, pattern, **kwargs):
    with pytest.raises(NotInvertibleError, match=pattern):
        inverse(fn, example_args=args, **kwargs)(fn(*args))


def test_repeated_scatter_add_indices_refused():
    idx = jnp.array([0, 2, 0])

    def f(x):
        return jnp.zeros(4).at[idx].add(x)

    _refused(
        f,
        (jnp.ones(3),),
        re.escape(
            "`scatter-add` writes several updates to one position (repeated "
            "indices), so they cannot be told apart"
        ),
    )


def test_scatter_overwriting_unknown_operand_refused():
    def f(m, v):
        return m.at[jnp.arange(3), jnp.arange(3)].set(v)

    with pytest.raises(
        NotInvertibleError,
        match=re.escape(
            "`scatter` overwrites the elements of its operand at the indices, so "
            "they cannot be recovered (only the updates can)"
        ),
    ):
        inverse(f, argnums=0)(f(jnp.ones((3, 3)), jnp.zeros(3)), jnp.zeros(3))


def test_tril_vector_of_a_matrix_refused_naming_the_upper_triangle():
    """`LowerCholeskyTransform().inv` drops the upper triangle: the outputs do
    not determine it."""
    with pytest.raises(NotInvertibleError) as err:
        inverse(lower_cholesky_inv, example_args=(jnp.eye(3),))(jnp.zeros(6))
    assert "not (0, 1), (0, 2), (1, 2) of (3, 3)" in str(err.value)


def test_repeated_point_gather_refused():
    rows, cols = jnp.array([0, 1, 0]), jnp.array([0, 1, 0])

    def f(m):
        return m[rows, cols]

    with pytest.raises(
        NotInvertibleError,
        match=re.escape(
            "`gather` reads some elements more than once (repeated indices)"
        ),
    ):
        inverse(f, example_args=(jnp.ones((2, 2)),))(jnp.ones(3))


def test_point_gather_of_every_element_is_a_permutation():
    rows, cols = np.divmod(np.random.RandomState(0).permutation(9), 3)

    def f(m):
        return m[rows, cols]

    m = jnp.arange(9.0).reshape(3, 3)
    m_back, ildj = inverse_and_ildj(f, example_args=(m,))(f(m))
    np.testing.assert_array_equal(m_back, m)
    assert float(ildj) == 0.0


def test_rank_deficient_constant_block_refused():
    """`where(eye, d, m)` with both unknown loses `d` off the diagonal and
    `m` on it: refused, not NaN."""
    eye = jnp.eye(3, dtype=bool)

    def f(d, m):
        return jnp.where(eye, d, m)

    with pytest.raises(NotInvertibleError, match="select_n` discards case 0"):
        inverse(f, example_args=(jnp.ones((3, 3)), jnp.ones((3, 3))))(jnp.ones((3, 3)))


def test_broadcast_copies_must_agree():
    """A row broadcast and selected at several places: each element from a
    known copy, NaN when the copies disagree (off the image)."""
    mask = jnp.array([[True, True, False], [False, True, True], [True, False, True]])

    def f(b, m):
        return jnp.where(mask, jnp.broadcast_to(b[None, :], (3, 3)), m)

    rng = np.random.RandomState(5)
    b = jnp.asarray(rng.randn(3).astype(np.float32))
    m = jnp.asarray(rng.randn(3, 3).astype(np.float32))
    inv = inverse(f, argnums=0, example_args=(b,))
    np.testing.assert_array_equal(inv(f(b, m), m), b)
    assert jnp.all(jnp.isnan(inv(f(b, m).at[2, 0].add(1.0), m)))


def test_a_scatter_into_zeros_read_back_after_a_linear_solve():
    """Fuzzer, seed 63 program 497: the zeros the scatter leaves come back
    from a linear solve as about 1e-8, not 0: within rounding of the values
    around them, so on the image (was NaN)."""
    m = jnp.array([[0.85, 0.09, -0.17], [-0.19, 1.18, -0.33], [-0.18, -0.01, 0.98]])

    def filled(x):
        v = jnp.full((3, 3), 0.0).at[jnp.array([1])].set(x)
        return jnp.concatenate([jnp.full((3, 2), 2, jnp.float32), v], axis=1)

    def f(x):
        return jnp.einsum("ij,...j->...i", m, filled(x).T)

    x = jnp.array([[0.94, -0.57, 0.34]], jnp.float32)
    got = inverse(f, example_args=(x,))(f(x))
    np.testing.assert_allclose(got, x, atol=1e-5)
    # A non-zero where the scatter leaves 0: off the image.
    off = filled(x).at[0, 2].set(0.01).T @ m.T
    assert jnp.all(jnp.isnan(inverse(f, example_args=(x,))(off)))


# ---------------------------------------------------------------------------
# Batches of matrices: `jnp.diagonal` of a batch is a gather of windows (the
# batch axis whole), and `d[..., None, :]` broadcasts along the middle axis.


def batched_transform_diagonal(m):
    """TFP's `TransformDiagonal(Exp())` on a batch of matrices."""
    d = jnp.exp(jnp.diagonal(m, axis1=-2, axis2=-1))
    eye = jnp.eye(m.shape[-1], dtype=bool)
    return jnp.where(eye, d[..., None, :], m)


def batched_transform_diagonal_inv(y):
    eye = jnp.eye(y.shape[-1], dtype=bool)
    return jnp.where(eye, jnp.log(jnp.diagonal(y, axis1=-2, axis2=-1))[..., None, :], y)


def batched_fill_scale_tril(x):
    """TFP's `FillScaleTriL` on a batch of vectors."""
    m = vec_to_tril(x)
    d = jax.nn.softplus(jnp.diagonal(m, axis1=-2, axis2=-1)) + 1e-5
    eye = jnp.eye(m.shape[-1], dtype=bool)
    return jnp.where(eye, d[..., None, :], m)


def batched_fill_scale_tril_inv(y):
    r, c = jnp.tril_indices(y.shape[-1])
    eye = jnp.eye(y.shape[-1], dtype=bool)
    d = softplus_inv(jnp.diagonal(y, axis1=-2, axis2=-1) - 1e-5)
    return jnp.where(eye, d[..., None, :], y)[..., r, c]


def _batched_tril_ildj(f, x, rows_cols):
    """`-slogdet` of the Jacobian of `x -> f(x)[..., r, c]`, whole batch."""
    r, c = rows_cols
    jac = jax.jacfwd(lambda v: f(v)[..., r, c])(x)
    return -jnp.linalg.slogdet(jac.reshape(np.size(x), np.size(x)))[1]


@pytest.mark.parametrize(("batch", "n"), [(1, 3), (3, 2)])
def test_batched_triangular_bijectors(batch, n):
    rng = np.random.RandomState(10 * batch + n)
    x = jnp.asarray(rng.randn(batch, n * (n + 1) // 2).astype(np.float32))
    y = batched_fill_scale_tril(x)
    got, ildj = inverse_and_ildj(batched_fill_scale_tril, example_args=(x,))(y)
    np.testing.assert_allclose(
        got, batched_fill_scale_tril_inv(y), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    want = _batched_tril_ildj(batched_fill_scale_tril, x, np.tril_indices(n))
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)

    m = jnp.asarray(rng.randn(batch, n, n).astype(np.float32))
    y = batched_transform_diagonal(m)
    got, ildj = jax.jit(inverse_and_ildj(batched_transform_diagonal))(y)
    np.testing.assert_allclose(got, batched_transform_diagonal_inv(y), rtol=1e-5)
    jac = jax.jacfwd(batched_transform_diagonal)(m).reshape(m.size, m.size)
    np.testing.assert_allclose(ildj, -jnp.linalg.slogdet(jac)[1], rtol=1e-5, atol=1e-5)
    # Off the image (a diagonal entry that `exp` cannot give): NaN there.
    off = inverse(batched_transform_diagonal)(y.at[0, 1, 1].set(-1.0))
    assert np.isnan(off[0, 1, 1]) and not np.isnan(off[0, 0, 0])
