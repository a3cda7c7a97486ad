"""The Cholesky factor of the inverse, `chol(x^-T x^-1)` (TFP's
`CholeskyToInvCholesky`, written by hand here): `U = x^-1` as a
`triangular_solve` with the identity, lower triangular by construction, the
Gram step's upper factor of `U^T U`, and `triangular_solve` solved for its
matrix (`jaxinterp/_inverse/_gram.py`, `_trisolve.py`, `_linalg.py`).

Each inverse is compared with a hand-written one (the map is an involution:
`x = chol(inv(y y^T))`), its ildj with `-log|det J|` of the map on
lower-triangular coordinates (`jax.jacfwd` + NumPy's `slogdet`); a `y` off
the image must give NaN, and a factor not proven triangular is refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import lower_coordinates_ildj, lower_factors
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.extend.core import primitives as jex_prims

import jaxinterp
from jaxinterp._inverse._rules import InverseContext, PieceResult, inverse_rules

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

FEW = settings(max_examples=min(4, settings.default.max_examples))


def _eye(x):
    return jnp.eye(x.shape[-1], dtype=x.dtype)


def inv_chol_scipy(x):  # as TFP: `solve_triangular` (a `jit`), `U^T @ U`
    u = jax.scipy.linalg.solve_triangular(x, _eye(x), lower=True)
    return jnp.linalg.cholesky(jnp.matmul(jnp.transpose(u), u))


def inv_chol_lax(x):  # the solve as a bare `triangular_solve`
    u = lax.linalg.triangular_solve(x, _eye(x), left_side=True, lower=True)
    return jnp.linalg.cholesky(u.T @ u)


def inv_chol_right(x):  # `U = I x^-1`, the product as an einsum
    u = lax.linalg.triangular_solve(x, _eye(x), left_side=False, lower=True)
    return jnp.linalg.cholesky(jnp.einsum("ki,kj->ij", u, u))


def inv_chol_transposed(x):  # `V = x^-T`, upper triangular: `V V^T`
    v = lax.linalg.triangular_solve(
        x, _eye(x), left_side=True, lower=True, transpose_a=True
    )
    return jnp.linalg.cholesky(v @ v.T)


MAPS = {
    "scipy": inv_chol_scipy,
    "lax": inv_chol_lax,
    "right": inv_chol_right,
    "transposed": inv_chol_transposed,
}


def hand_inverse(y):
    return jnp.linalg.cholesky(jnp.linalg.inv(y @ y.T))


def _factors(n):
    """Lower-triangular matrices with a positive diagonal."""
    return lower_factors(n, 1.0, 0.7)


X = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.8, 0.0], [-0.4, 0.1, 1.5]])


@FEW
@given(data=st.data())
def test_the_inverse_is_the_cholesky_factor_of_the_inverse(data):
    f = inv_chol_scipy
    n = data.draw(st.integers(1, 3))
    x = jnp.asarray(data.draw(_factors(n)))
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, hand_inverse(y), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got, x, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(ildj, lower_coordinates_ildj(f, x), rtol=1e-3, atol=1e-3)


def inv_chol_batched(x):  # as TFP on a batch: the identity broadcast by a product
    eye = _eye(x)[None] * jnp.ones(x.shape[:-2] + (1, 1), x.dtype)
    u = jax.scipy.linalg.solve_triangular(x, eye, lower=True)
    return jnp.linalg.cholesky(jnp.matmul(jnp.swapaxes(u, -1, -2), u))


@FEW
@given(data=st.data())
def test_a_batch_gives_each_member_its_factor(data):
    n = data.draw(st.integers(1, 3))
    b = data.draw(st.integers(1, 3))
    x = jnp.stack([jnp.asarray(data.draw(_factors(n))) for _ in range(b)])
    y = inv_chol_batched(x)
    got, ildj = jaxinterp.inverse_and_ildj(inv_chol_batched)(y)
    np.testing.assert_allclose(got, jax.vmap(hand_inverse)(y), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got, x, rtol=2e-3, atol=2e-3)
    members = [lower_coordinates_ildj(inv_chol_scipy, m) for m in x]
    np.testing.assert_allclose(ildj, sum(members), rtol=1e-3, atol=1e-3)
    off = y.at[0, 0, 0].set(-1.0)
    assert np.all(np.isnan(jaxinterp.inverse(inv_chol_batched)(off)[0]))


@pytest.mark.parametrize("name", sorted(MAPS))
def test_each_spelling_is_inverted(name):
    f = MAPS[name]
    x = X.at[2, 0].set(0.9)
    got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ildj, lower_coordinates_ildj(f, x), rtol=1e-4)


def test_composes_with_jit_vmap_and_grad():
    f = inv_chol_scipy
    y = f(X)
    np.testing.assert_allclose(jax.jit(jaxinterp.inverse(f))(y), X, atol=1e-5)
    ys = jnp.stack([y, f(0.5 * X + jnp.eye(3))])
    np.testing.assert_allclose(
        jax.vmap(jaxinterp.inverse(f))(ys), jax.vmap(hand_inverse)(ys), atol=1e-5
    )
    # Along lower-triangular tangents (the coordinates the inverse reads;
    # the hand-written inverse reads the whole of `y`).
    rows, cols = np.tril_indices(3)
    weights = jnp.arange(9.0).reshape(3, 3)

    def weighted(inverse):
        def of(v):
            return jnp.sum(inverse(jnp.zeros((3, 3)).at[rows, cols].set(v)) * weights)

        return of

    v = y[rows, cols]
    got = jax.grad(weighted(jaxinterp.inverse(f)))(v)
    want = jax.grad(weighted(hand_inverse))(v)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_y_off_the_image_gives_nan(name):
    f = MAPS[name]
    y = f(X)
    inverse = jaxinterp.inverse_and_ildj(f)
    for off in (
        y.at[1, 1].set(-0.5),  # a diagonal that is not positive
        y.at[0, 0].set(0.0),
        y.at[0, 2].set(0.3),  # not lower triangular
        -y,
    ):
        got, ildj = inverse(off)
        assert np.all(np.isnan(got)) and np.isnan(ildj)
    assert not np.any(np.isnan(jaxinterp.inverse(f, strict=True)(y)))


def test_a_factor_not_triangular_by_construction_is_refused():
    full = jnp.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.2], [0.3, 0.0, 1.0]])

    def not_triangular_rhs(x):  # `x^-1 B`: full for a full `B`
        u = jax.scipy.linalg.solve_triangular(x, full, lower=True)
        return jnp.linalg.cholesky(u.T @ u)

    def upper_rhs(x):  # lower `x`, upper `B`: neither triangle
        u = lax.linalg.triangular_solve(
            x, jnp.triu(full) + 1.0, left_side=True, lower=True
        )
        return jnp.linalg.cholesky(u.T @ u)

    def general_inverse(x):  # `inv` of a full matrix (an LU solve)
        u = jnp.linalg.inv(x)
        return jnp.linalg.cholesky(u.T @ u)

    def traced_rhs(x, b):  # a right-hand side only known when run
        u = lax.linalg.triangular_solve(x, b, left_side=True, lower=True)
        return jnp.linalg.cholesky(u.T @ u)

    for f in (not_triangular_rhs, upper_rhs, general_inverse):
        with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
            jaxinterp.inverse(f)(f(X))
    with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
        jaxinterp.inverse(traced_rhs, argnums=0)(traced_rhs(X, jnp.eye(3)), jnp.eye(3))


def test_an_upper_factor_by_construction_is_the_reversed_cholesky_factor():
    def f(z):
        upper = jnp.triu(z)
        return upper @ upper.T

    z = jnp.array([[1.2, 0.3, -0.4], [0.5, 0.8, 0.1], [0.7, -0.2, 1.5]])
    y = f(z)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, jnp.triu(z), rtol=1e-4, atol=1e-5)
    rows, cols = np.triu_indices(3)
    lower = np.tril_indices(3)

    def g(v):
        return f(jnp.zeros((3, 3)).at[rows, cols].set(v))[lower]

    jac = np.asarray(jax.jacfwd(g)(z[rows, cols]), np.float64)
    np.testing.assert_allclose(ildj, -np.linalg.slogdet(jac)[1], rtol=1e-4)
    assert np.all(np.isnan(jaxinterp.inverse(f)(y.at[1, 1].set(-1.0))))


# -- `triangular_solve` solved for its matrix ---------------------------------


def solve_lower(x):
    return lax.linalg.triangular_solve(x, _eye(x), left_side=True, lower=True)


B = jnp.array([[2.0, 0.0, 0.0], [0.5, -1.0, 0.0], [0.3, 0.2, 0.5]])


@pytest.mark.parametrize(
    "f",
    [
        solve_lower,
        lambda x: lax.linalg.triangular_solve(x, B, left_side=True, lower=True),
        lambda x: lax.linalg.triangular_solve(x, B, left_side=False, lower=True),
        lambda x: lax.linalg.triangular_solve(
            x, B.T, left_side=True, lower=True, transpose_a=True
        ),
        lambda x: jax.scipy.linalg.solve_triangular(x.T, B.T, lower=False),
    ],
    ids=["inverse", "left", "right", "transposed", "scipy-upper"],
)
def test_a_solve_is_inverted_for_its_matrix(f):
    x = X.at[1, 1].set(-0.8)  # (any sign: the solve is injective)
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-5)
    # The triangle the solve never reads comes back as zeros; the ildj on
    # the triangles it reads and gives.
    triangle = np.tril_indices(3) if np.all(np.triu(y, 1) == 0) else np.triu_indices(3)
    rows, cols = np.tril_indices(3)

    def g(v):
        return f(jnp.zeros((3, 3)).at[rows, cols].set(v))[triangle]

    jac = np.asarray(jax.jacfwd(g)(x[rows, cols]), np.float64)
    np.testing.assert_allclose(ildj, -np.linalg.slogdet(jac)[1], rtol=1e-4)
    # Off the image: a non-zero in the other triangle, a zero pivot.
    other = (0, 2) if triangle[0][1] == 1 else (2, 0)
    # (The triangle never read stays zeros, a constant of the inverse.)
    for off in (y.at[other].set(0.5), y.at[1, 1].set(0.0)):
        got, ildj = jaxinterp.inverse_and_ildj(f)(off)
        assert np.all(np.isnan(got[rows, cols])) and np.isnan(ildj)


def test_the_solve_rule_ildj_is_on_the_triangles():
    # The rule's own ildj (the steps' sum, where no completion replaces it).
    rule = inverse_rules.get(jex_prims.triangular_solve_p)
    x = X.at[2, 2].set(-1.3)
    rows, cols = np.tril_indices(3)
    for left_side in (True, False):
        params = dict(
            left_side=left_side,
            lower=True,
            transpose_a=False,
            conjugate_a=False,
            unit_diagonal=False,
        )
        y = lax.linalg.triangular_solve(x, B, **params)
        res = rule(InverseContext(), [y], None, B, **params)
        assert isinstance(res, PieceResult)
        np.testing.assert_allclose(res.pieces[0].value, x[rows, cols], rtol=1e-5)

        def solve(v, params=params):
            a = jnp.zeros((3, 3)).at[rows, cols].set(v)
            return lax.linalg.triangular_solve(a, B, **params)[rows, cols]

        jac = np.asarray(jax.jacfwd(solve)(x[rows, cols]), np.float64)
        np.testing.assert_allclose(res.ildj, -np.linalg.slogdet(jac)[1], rtol=1e-4)


def test_solves_not_determining_their_matrix_are_refused():
    singular = B.at[1, 1].set(0.0)
    for f, match in (
        (
            lambda x: lax.linalg.triangular_solve(
                x, singular, left_side=True, lower=True
            ),
            "non-singular",
        ),
        (
            lambda x: lax.linalg.triangular_solve(x, B.T, left_side=True, lower=True),
            "triangular",
        ),
        (
            lambda x: lax.linalg.triangular_solve(
                x, B[:, :2], left_side=True, lower=True
            ),
            "square",
        ),
        (
            lambda x: lax.linalg.triangular_solve(
                x, B, left_side=True, lower=True, unit_diagonal=True
            ),
            "unit_diagonal",
        ),
    ):
        with pytest.raises(jaxinterp.NotInvertibleError, match=match):
            jaxinterp.inverse(f, example_args=(X,))(f(X))


@pytest.mark.parametrize(
    "other", [jnp.sum, lambda x: x[0, 1] * x[1, 2]], ids=["sum", "product"]
)
def test_elements_another_step_reads_are_not_completed(other):
    def f(x):
        return solve_lower(x), other(x)

    with pytest.raises(jaxinterp.NotInvertibleError):
        jaxinterp.inverse(f, example_args=(X,))(f(X))
