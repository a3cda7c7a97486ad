"""`L @ L.T` of a factor lower triangular by construction, and elements a
step discards (`jaxinterp/_inverse/_gram.py`).

Each inverse is compared with a hand-written one (`jnp.linalg.cholesky`),
its ildj with `-log|det J|` of the map on lower-triangular coordinates
(`jax.jacfwd` + NumPy's `slogdet`), and a `y` off the image (asymmetric, not
positive definite) must give NaN. A factor not proven triangular is refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import lower_coordinates_ildj, lower_factors
from hypothesis import given, settings, strategies as st

import jaxinterp

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

FEW = settings(max_examples=min(6, settings.default.max_examples))


def outer_tril(x):  # TFP's CholeskyOuterProduct: `band_part`, then `x x^T`
    lower = jnp.tril(x)
    return lower @ lower.T


def outer_einsum(x):  # the product written without a transpose
    lower = jnp.where(jnp.tri(x.shape[-1], dtype=bool), x, 0.0)
    return jnp.einsum("ik,jk->ij", lower, lower)


def outer_jit(x):  # the factor built in a `jit` call, used twice
    lower = jax.jit(jnp.tril)(x)
    return jnp.matmul(lower, jnp.transpose(lower))


MAPS = {"tril": outer_tril, "einsum": outer_einsum, "jit": outer_jit}


def _factors(n):
    """Lower-triangular matrices with a positive diagonal."""
    return lower_factors(n, 1.5, 0.5)


@pytest.mark.parametrize("name", sorted(MAPS))
@FEW
@given(data=st.data())
def test_the_principal_factor_is_the_cholesky_factor(name, data):
    f = MAPS[name]
    n = data.draw(st.integers(1, 4))
    x = jnp.asarray(data.draw(_factors(n)))
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, jnp.linalg.cholesky(y), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got, x, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(ildj, lower_coordinates_ildj(f, x), rtol=1e-3, atol=1e-3)
    jitted = jax.jit(jaxinterp.inverse(f))(y)
    np.testing.assert_allclose(jitted, got, rtol=1e-5, atol=1e-5)


def outer_batched(x):  # a batch of factors (TFP's bijectors on a batch)
    lower = jnp.tril(x)
    return lower @ jnp.swapaxes(lower, -1, -2)


def outer_batched_upper(x):  # `U^T U` of a batch of upper factors, einsum
    upper = jnp.triu(x)
    return jnp.einsum("bki,bkj->bij", upper, upper)


_JITTED = {
    f: jax.jit(jaxinterp.inverse(f)) for f in (outer_batched, outer_batched_upper)
}


@pytest.mark.parametrize("f", [outer_batched, outer_batched_upper])
@FEW
@given(data=st.data())
def test_a_batch_of_factors_gives_each_its_principal_factor(f, data):
    # Each member's factor is the one drawn (a positive diagonal: the
    # principal factor), the product recomputed from it is `y`, and the ildj
    # is the sum of the members' (`jax.jacfwd` and `slogdet` of `L L^T` on
    # lower triangles; `U^T U` is that map of `L = U^T`, a permutation of
    # coordinates).
    n = data.draw(st.integers(1, 3))
    # (A batch of one: `jnp.matmul` squeezes the batch axis away and
    # broadcasts the product back.)
    b = data.draw(st.integers(1, 3))
    lower = jnp.stack([jnp.asarray(data.draw(_factors(n))) for _ in range(b)])
    x = lower if f is outer_batched else jnp.swapaxes(lower, -1, -2)
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, x, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(f(got), y, rtol=1e-4, atol=1e-4)
    members = [lower_coordinates_ildj(outer_tril, m) for m in lower]
    np.testing.assert_allclose(ildj, sum(members), rtol=1e-3, atol=1e-3)
    jitted = _JITTED[f](y)  # (one `jax.jit` per map: compiled once per shape)
    np.testing.assert_allclose(jitted, got, rtol=1e-5, atol=1e-5)
    off = y.at[0, 0, -1].add(0.5) if n > 1 else -y
    assert np.all(np.isnan(jaxinterp.inverse(f)(off)))


@pytest.mark.parametrize("f", [outer_batched, outer_batched_upper])
def test_a_batch_of_one_factor_is_its_principal_factor(f):
    # `jnp.matmul` squeezes a batch of one and broadcasts the product back.
    lower = jnp.array([[[1.2, 0.0, 0.0], [0.3, 0.8, 0.0], [-0.4, 0.1, 1.5]]])
    x = lower if f is outer_batched else jnp.swapaxes(lower, -1, -2)
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    want = lower_coordinates_ildj(outer_tril, lower[0])
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)
    assert np.all(np.isnan(jaxinterp.inverse(f)(y.at[0, 0, 2].add(0.5))))


def test_composes_with_vmap_and_grad():
    x = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.8, 0.0], [-0.4, 0.1, 1.5]])
    ys = jnp.stack([outer_tril(x), outer_tril(0.5 * x + jnp.eye(3))])
    np.testing.assert_allclose(
        jax.vmap(jaxinterp.inverse(outer_tril))(ys),
        jax.vmap(jnp.linalg.cholesky)(ys),
        rtol=1e-5,
        atol=1e-5,
    )

    def weighted(f):
        return lambda y: jnp.sum(f(y) * jnp.arange(9.0).reshape(3, 3))

    # Along symmetric tangents (the image's): the inverse reads the lower
    # triangle, `jnp.linalg.cholesky` the symmetric part.
    y = ys[0]
    got = jax.grad(weighted(jaxinterp.inverse(outer_tril)))(y)
    want = jax.grad(weighted(jnp.linalg.cholesky))(y)
    np.testing.assert_allclose(got + got.T, want + want.T, rtol=1e-4, atol=1e-4)


def test_a_y_off_the_image_gives_nan():
    x = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.8, 0.0], [-0.4, 0.1, 1.5]])
    y = outer_tril(x)
    inverse = jaxinterp.inverse_and_ildj(outer_tril)
    for off in (
        y.at[0, 2].add(0.1),  # not symmetric
        y.at[1, 1].set(-1.0),  # not positive definite
        -y,
    ):
        got, ildj = inverse(off)
        assert np.all(np.isnan(got)) and np.isnan(ildj)


def test_a_factor_not_triangular_by_construction_is_refused():
    with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
        jaxinterp.inverse(lambda x: x @ x.T)(jnp.eye(3))
    # Lower triangular only for some values of its unknowns (the upper
    # triangle scaled by a known zero would be NaN times zero): refused.
    with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
        jaxinterp.inverse(lambda x: (x * jnp.tri(3)) @ (x * jnp.tri(3)).T)(jnp.eye(3))


def test_a_factor_filled_in_by_a_scatter_is_the_cholesky_factor():
    # TFP's `FillTriangular` then `CholeskyOuterProduct`: the product was
    # taken by the block solver first, which gave NaN for every `y`.
    n = 3
    rows, cols = np.tril_indices(n)

    def f(v):
        lower = jnp.zeros((n, n)).at[rows, cols].set(v)
        return lower @ lower.T

    x = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.8, 0.0], [-0.4, 0.1, 1.5]])
    v = x[rows, cols]
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(v,))(f(v))
    np.testing.assert_allclose(got, jnp.linalg.cholesky(f(v))[rows, cols], atol=1e-5)
    jac = jax.jacfwd(lambda u: f(u)[rows, cols])(v)
    want = -np.linalg.slogdet(np.asarray(jac, np.float64))[1]
    np.testing.assert_allclose(ildj, want, rtol=1e-4)


def test_a_factor_whose_zeros_come_from_nan_is_refused():
    # `nan_to_num` maps the NaN probe to 0 everywhere: the factor looked
    # lower triangular by construction, `L @ L.T` of a full 3 x 3 `z` (6
    # coordinates of `y` for 9 unknowns, a singular Jacobian) was inverted
    # by Cholesky with a finite ildj. Numbers as probes tell it apart.
    def f(z):
        lower = jnp.nan_to_num(z)
        return lower @ lower.T

    def g(z):
        lower = jax.jit(lambda u: jnp.where(u > 0, u, 0.0))(jnp.tril(z))
        return lower @ lower.T

    def big(z):  # zeros above the diagonal for small numbers only
        lower = jax.jit(lambda u: jnp.where(u > 100.0, u, jnp.tril(u)))(z)
        return lower @ lower.T

    z = jnp.array([[1.2, 0.5, 0.6], [0.3, 0.8, 0.7], [-0.4, 0.1, 1.5]])
    for h in (f, g, big):
        with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
            jaxinterp.inverse_and_ildj(h)(h(z))


@pytest.mark.parametrize("columns", [2, 4])
def test_a_factor_that_is_not_square_is_refused(columns):
    # `n x k`: the Cholesky factor (`n x n`) was put in its place, and a
    # later step crashed on the shape (a `RuleError`).
    def f(z):
        lower = jnp.tril(z)
        return lower @ lower.T

    z = jnp.tril(jnp.ones((3, columns))) + jnp.eye(3, columns)
    with pytest.raises(jaxinterp.NotInvertibleError, match="matrix square root"):
        jaxinterp.inverse(f, example_args=(z,))(f(z))


MASK = jnp.array([True, False, True, False])


def exp_of_masked(x):
    return jnp.exp(jnp.where(MASK, x, 2.0))


def test_discarded_elements_come_back_as_the_value_used_in_their_place():
    # `where(mask, x, c)` reads `x` only where `mask`: the elements it
    # discards are taken as `c`, the preimage the step leaves unchanged.
    f = exp_of_masked
    x = jnp.array([0.3, 2.0, -1.0, 2.0])
    y = exp_of_masked(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, x, rtol=1e-6)
    # The ildj in the coordinates the inverse reads: the kept elements only.
    np.testing.assert_allclose(ildj, -(0.3 - 1.0), rtol=1e-6)
    ys = jnp.stack([y, exp_of_masked(0.5 * x)])
    np.testing.assert_allclose(
        jax.vmap(jaxinterp.inverse(f))(ys),
        jnp.stack([x, x.at[0].mul(0.5).at[2].mul(0.5)]),
        rtol=1e-6,
    )
    # A result that is not the constant where it is used: NaN.
    assert np.all(np.isnan(jaxinterp.inverse(f)(y.at[1].set(1.0))))


def test_a_call_that_is_not_a_projection_is_not_completed():
    # As one call, `exp(where(mask, x, 2.0))` gives `exp(2)` where it
    # discards `x`: not what it uses in their place, so nothing is completed
    # (and the completion inside a body solved in parts is not made).
    with pytest.raises(jaxinterp.NotInvertibleError, match=r"\(1,\), \(3,\)"):
        jaxinterp.inverse(jax.jit(exp_of_masked))(exp_of_masked(jnp.ones(4)))


def test_a_completion_off_the_image_of_earlier_steps_is_nan_and_strict_raises():
    # `v` completed with 0.96 where the `where` discards it, but `v = cosh(x)`
    # never takes 0.96: that element of `x` is undetermined, NaN; with
    # `strict=True` the discarded element is refused, not completed.
    mask = jnp.array([False, True, True])

    def f(x):
        v = jnp.cosh(x)
        return jnp.where(mask, jax.jit(lambda u: u)(v), 0.96)

    x = jnp.array([-1.3, 0.3, 0.6])
    got = jaxinterp.inverse(f)(f(x))
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], jnp.arccosh(jnp.cosh(x[1:])), rtol=1e-5)
    with pytest.raises(jaxinterp.NotInvertibleError, match=r"not \(0,\) of \(3,\)"):
        jaxinterp.inverse(f, strict=True)(f(x))


def test_a_completion_off_the_image_solved_in_parts_also_raises_strict():
    # The same through a step solved element by element (`x` known in parts
    # from the element kept): `log(-3.65)`; with `strict=True` refused.
    def f(x):
        return jnp.where(jnp.array([False, True, True]), -3.65, jnp.exp(x))

    x = jnp.array([-1.3, -1.5, 1.2])
    got = jaxinterp.inverse(f)(f(x))
    assert np.isnan(got[1:]).all()
    np.testing.assert_allclose(got[0], x[0], rtol=1e-6)
    message = r"not \(1,\), \(2,\) of \(3,\)"
    with pytest.raises(jaxinterp.NotInvertibleError, match=message):
        jaxinterp.inverse(f, strict=True)(f(x))


@pytest.mark.parametrize(
    "other",
    [jnp.sum, lambda x: x[1] * x[3], jnp.max, jnp.floor],
    ids=["sum", "product", "max", "floor"],
)
def test_elements_another_step_reads_are_not_completed(other):
    # Not free: the value `where` uses in their place would have to agree
    # with the other output by chance (NaN, or with a product solved
    # backwards, once a plausible wrong `x`). Refused, naming both steps.
    def f(x):
        return jnp.where(MASK, x, 0.0), other(x)

    x = jnp.array([0.3, -0.7, 1.1, 0.5])
    with pytest.raises(jaxinterp.NotInvertibleError, match="Blocked at `jit`, `"):
        jaxinterp.inverse(f, example_args=(x,))(f(x))


def _factor_read_twice(z):  # the factor copied, and one of its elements read
    lower = jnp.tril(z)
    return jnp.copy(lower) @ jnp.copy(lower).T, lower[0, 0]


def test_a_factor_also_read_elsewhere_must_agree_with_that_output():
    z = jnp.array([[1.5, 0.0, 0.0], [0.4, 1.1, 0.0], [-0.3, 0.2, 0.9]])
    y = _factor_read_twice(z)
    inverse = jaxinterp.inverse(_factor_read_twice, example_args=(z,))
    x = inverse(y)
    np.testing.assert_allclose(x, z, atol=1e-5)
    # The second output moved off the image: no `x` maps to this `y`.
    off = inverse((y[0], y[1] + 0.5))
    assert np.isnan(np.asarray(off)).all(), off
