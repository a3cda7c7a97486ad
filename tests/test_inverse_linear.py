"""Linear blocks through complex values (`fft`, `real`, known complex factors),
linear blocks whose results are merged from pieces (Haar of odd length),
non-square linear blocks (zero-sum) and the `fft` inverse rule."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import jaxinterp
from jaxinterp import NotInvertibleError

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

FLOATS = st.floats(-3, 3, allow_nan=False, width=32)


def vectors(n):
    return hnp.arrays(np.float32, (n,), elements=FLOATS)


# -- the maps, written as libraries write them --------------------------------


def dct(x):
    """Orthonormal DCT-II along the last axis by one complex FFT (Makhoul)."""
    n = x.shape[-1]
    v = jnp.concatenate([x[..., ::2], x[..., 1::2][..., ::-1]], -1)
    k = jnp.arange(n)
    twiddle = jnp.exp(-1j * jnp.pi * k / (2 * n))
    scale = jnp.where(k == 0, jnp.sqrt(1.0 / (4 * n)), jnp.sqrt(1.0 / (2 * n)))
    return 2 * scale * jnp.real(jnp.fft.fft(v) * twiddle)


def dct_matrix(n):
    """The same DCT as an explicit cosine matrix (no FFT)."""
    k = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    c = np.cos(np.pi * k * (2 * j + 1) / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c


def haar(x):
    """Orthonormal Haar transform of any length: sums and differences of
    pairs, the odd element passed through at each level."""
    r = 1 / math.sqrt(2)
    lo, parts = x, []
    while lo.shape[-1] > 1:
        n = lo.shape[-1] // 2
        even, odd = lo[..., 0 : 2 * n : 2], lo[..., 1 : 2 * n : 2]
        parts.append(lo[..., 2 * n :])
        parts.append(r * (even - odd))
        lo = r * (even + odd)
    return jnp.concatenate([lo, *parts[::-1]], -1)


def haar_inverse(y, n):
    """Hand-written inverse of `haar` for length `n`."""
    r = 1 / math.sqrt(2)
    sizes = []
    m = n
    while m > 1:
        sizes.append(m)
        m //= 2
    lo, pos = y[:1], 1
    for size in reversed(sizes):
        half, extra = size // 2, size % 2
        hi, end = y[pos : pos + half], y[pos + half : pos + half + extra]
        pos += extra + half
        even, odd = r * (lo + hi), r * (lo - hi)
        lo = np.concatenate([np.stack([even, odd], -1).reshape(-1), end])
    return lo


def zero_sum(x):
    """R^{n-1} to the zero-sum vectors of R^n (an orthonormal basis)."""
    n = x.shape[-1] + 1
    total = jnp.sum(x, -1, keepdims=True)
    norm = total / (jnp.sqrt(n) + n)
    fill = norm - total / jnp.sqrt(n)
    return jnp.concatenate([x, fill], -1) - norm


def real_jacobian(f, x):
    """The Jacobian of `f` with complex results split into real and imaginary parts."""

    def flat(v):
        out = f(v)
        if jnp.iscomplexobj(out):
            return jnp.concatenate([jnp.real(out).ravel(), jnp.imag(out).ravel()])
        return out.ravel()

    return jax.jacfwd(flat)(x)


# -- DCT via fft: a square linear block through complex values ------------------


@settings(max_examples=15, deadline=None)
@given(x=vectors(6))
def test_dct_via_fft_is_inverted_exactly_with_its_log_det(x):
    y = dct(x)
    np.testing.assert_allclose(y, dct_matrix(6) @ x, atol=2e-5)
    got = jaxinterp.inverse(dct)(y)
    want = np.linalg.solve(dct_matrix(6), np.asarray(y, np.float64))
    np.testing.assert_allclose(got, want, atol=3e-5)
    ildj = jaxinterp.ildj(dct)(y)
    np.testing.assert_allclose(
        ildj, -np.linalg.slogdet(jax.jacfwd(dct)(x))[1], atol=1e-4
    )


def test_dct_inverse_composes_with_jit_vmap_and_grad():
    xs = jnp.asarray(np.random.default_rng(0).normal(size=(3, 8)), jnp.float32)
    inv = jaxinterp.inverse(dct)
    ys = jax.vmap(dct)(xs)
    np.testing.assert_allclose(jax.jit(inv)(ys[0]), xs[0], atol=3e-5)
    np.testing.assert_allclose(jax.vmap(inv)(ys), xs, atol=3e-5)
    # The inverse is linear: its gradient is a row of the inverse matrix.
    grad = jax.grad(lambda y: inv(y)[2])(ys[0])
    np.testing.assert_allclose(grad, np.linalg.inv(dct_matrix(8))[2], atol=3e-5)


# -- Haar of odd length: results merged from pieces ------------------------------


@settings(max_examples=15, deadline=None)
@given(n=st.sampled_from([3, 5, 6, 7]), data=st.data())
def test_haar_of_odd_lengths_is_inverted(n, data):
    x = data.draw(vectors(n))
    y = haar(x)
    np.testing.assert_allclose(haar_inverse(np.asarray(y, np.float64), n), x, atol=3e-5)
    got = jaxinterp.inverse(haar)(y)
    np.testing.assert_allclose(
        got, haar_inverse(np.asarray(y, np.float64), n), atol=3e-5
    )
    ildj = jaxinterp.ildj(haar)(y)
    np.testing.assert_allclose(
        ildj, -np.linalg.slogdet(jax.jacfwd(haar)(x))[1], atol=1e-4
    )


def test_haar_explains_a_linear_solve():
    text = str(jaxinterp.explain_inverse(haar, jnp.arange(6.0)))
    assert "linear solve" in text


# -- non-square linear blocks ------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(x=vectors(4))
def test_zero_sum_ildj_is_minus_half_logdet_of_the_gram_matrix(x):
    inv = jaxinterp.inverse(zero_sum, example_args=(x,))
    y = zero_sum(x)
    np.testing.assert_allclose(jnp.sum(y), 0.0, atol=1e-5)
    np.testing.assert_allclose(inv(y), x, atol=3e-5)
    jac = np.asarray(jax.jacfwd(zero_sum)(x), np.float64)
    want = -0.5 * np.linalg.slogdet(jac.T @ jac)[1]
    ildj = jaxinterp.ildj(zero_sum, example_args=(x,))(y)
    np.testing.assert_allclose(ildj, want, atol=1e-4)


def test_a_non_square_block_gives_nan_off_its_image():
    x = jnp.array([0.5, -1.0, 2.0])
    y = zero_sum(x).at[0].add(0.25)  # no longer sums to zero
    got = jaxinterp.inverse(zero_sum, example_args=(x,))(y)
    assert np.isnan(np.asarray(got)).all()


def test_a_rank_deficient_block_is_refused_not_given_a_preimage():
    # Two results per unknown, but only the symmetric part of x is seen:
    # least squares would return one preimage among many.
    def f(x):
        s = x + x[::-1]
        return jnp.concatenate([s, 2 * s])

    x = jnp.array([1.0, 2.0, 3.0])
    with pytest.raises(NotInvertibleError) as err:
        jaxinterp.inverse(f, example_args=(x,))(f(x))
    assert (
        "its unknown operand is a linear function of 3 unknowns whose matrix has "
        "rank 2: the known results it reaches do not determine them"
    ) in str(err.value)


def test_a_complex_detour_is_a_block_and_a_lost_part_is_refused():
    x = jnp.array([0.5, -1.5, 2.0])
    keep = lambda v: jnp.imag(v * (1.0 + 0.5j))  # noqa: E731
    np.testing.assert_allclose(jaxinterp.inverse(keep)(keep(x)), x, atol=1e-6)
    lose = lambda v: jnp.imag(v * (2.0 + 0j))  # noqa: E731
    # Refused as a block of rank 0 (under JAX's hijax future flags the
    # engine stops at `imag` itself, with that equation's own refusal).
    with pytest.raises(
        NotInvertibleError,
        match="whose matrix has rank 0|`imag` is not invertible: it drops the real",
    ):
        jaxinterp.inverse(lose)(lose(x))


# -- the fft rule --------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(re=vectors(4), im=vectors(4))
def test_fft_and_ifft_invert_each_other_with_closed_form_ildj(re, im):
    z = jnp.asarray(re + 1j * im, jnp.complex64)
    for f in (jnp.fft.fft, jnp.fft.ifft):
        y = f(z)
        np.testing.assert_allclose(jaxinterp.inverse(f)(y), z, atol=3e-5)

        def of_parts(v, f=f):
            return f(v[:4] + 1j * v[4:])

        jac = np.asarray(real_jacobian(of_parts, jnp.concatenate([re, im])), np.float64)
        want = -np.linalg.slogdet(jac)[1]
        np.testing.assert_allclose(jaxinterp.ildj(f)(y), want, rtol=1e-5)


@pytest.mark.parametrize("shape", [(8,), (7,), (3, 6), (2, 5)])
def test_rfft_is_inverted_with_the_area_formula_ildj(shape):
    x = jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)
    f = jnp.fft.rfftn
    y = f(x)
    inv = jaxinterp.inverse(f, example_args=(x,))
    np.testing.assert_allclose(inv(y), x, atol=3e-5)
    jac = np.asarray(real_jacobian(f, x), np.float64).reshape(-1, x.size)
    want = -0.5 * np.linalg.slogdet(jac.T @ jac)[1]
    got = jaxinterp.ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_rfft_gives_nan_off_its_image():
    x = jnp.arange(8.0)
    y = jnp.fft.rfft(x).at[0].add(0.5j)  # the zero frequency of a real signal is real
    got = jaxinterp.inverse(jnp.fft.rfft, example_args=(x,))(y)
    assert np.isnan(np.asarray(got)).all()


def test_irfft_alone_is_refused():
    with pytest.raises(NotInvertibleError) as err:
        jaxinterp.inverse(
            lambda v: jnp.fft.irfft(v, n=6),
            example_args=(jnp.zeros(4, jnp.complex64),),
        )(jnp.ones(6))
    assert (
        "`fft` of type IRFFT is not invertible: it discards the imaginary part of "
        "the self-conjugate frequencies of its operand"
    ) in str(err.value)


def test_irfft_after_rfft_is_a_linear_block():
    def smooth(x):
        return jnp.fft.irfft(jnp.fft.rfft(x) * (1.5 + 0.5j), n=x.shape[-1])

    x = jnp.array([0.3, -1.0, 2.0, 0.5, 0.1])
    jac = np.asarray(jax.jacfwd(smooth)(x), np.float64)
    want = np.linalg.solve(jac, np.asarray(smooth(x), np.float64))
    np.testing.assert_allclose(jaxinterp.inverse(smooth)(smooth(x)), want, atol=3e-5)
    np.testing.assert_allclose(
        jaxinterp.ildj(smooth)(smooth(x)), -np.linalg.slogdet(jac)[1], atol=1e-4
    )


# -- cholesky ------------------------------------------------------------------------


def spd_from(raw):
    """A symmetric positive definite matrix and its Cholesky factor, from any
    square `raw` (float64, by hand)."""
    raw = np.asarray(raw, np.float64)
    factor = np.tril(raw, -1) + np.diag(np.exp(np.diag(raw) / 2))
    return factor @ factor.T, factor


def free_coordinates_ildj(factor):
    """`log|det dx/dL|` on lower triangles, by `jax.jacfwd` + `slogdet`."""
    n = factor.shape[-1]
    rows, cols = np.tril_indices(n)

    def product(v):
        low = jnp.zeros((n, n), v.dtype).at[rows, cols].set(v)
        return (low @ low.T)[rows, cols]

    jac = jax.jacfwd(product)(jnp.asarray(factor[rows, cols], jnp.float32))
    return np.linalg.slogdet(np.asarray(jac, np.float64))[1]


@settings(max_examples=10, deadline=None)
@given(raw=hnp.arrays(np.float32, (3, 3), elements=st.floats(-1, 1, width=32)))
def test_cholesky_is_inverted_on_symmetric_matrices(raw):
    x, factor = spd_from(raw)
    lower = jnp.asarray(factor, jnp.float32)
    got, ildj = jaxinterp.inverse_and_ildj(jnp.linalg.cholesky)(lower)
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ildj, free_coordinates_ildj(factor), rtol=1e-4, atol=1e-4
    )
    # The closed form (NumPyro's `CholeskyTransform` log-det, negated).
    n = 3
    closed = n * np.log(2) + np.sum(np.arange(n, 0, -1) * np.log(np.diag(factor)))
    np.testing.assert_allclose(ildj, closed, rtol=1e-4, atol=1e-4)


def test_cholesky_inverse_composes_with_jit_vmap_and_grad():
    rng = np.random.default_rng(3)
    pairs = [spd_from(rng.uniform(-1, 1, (3, 3))) for _ in range(4)]
    xs = np.stack([p[0] for p in pairs])
    factors = jnp.asarray(np.stack([p[1] for p in pairs]), jnp.float32)
    inv = jaxinterp.inverse(jnp.linalg.cholesky)
    np.testing.assert_allclose(jax.jit(inv)(factors[0]), xs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.vmap(inv)(factors), xs, rtol=1e-5, atol=1e-5)
    # d(L L^T)_{00} / dL = 2 L_00 at (0, 0), zero elsewhere.
    grad = jax.grad(lambda f: inv(f)[0, 0])(factors[0])
    want = np.zeros((3, 3))
    want[0, 0] = 2 * factors[0][0, 0]
    np.testing.assert_allclose(grad, want, atol=1e-5)


def test_cholesky_of_a_factor_with_a_non_positive_diagonal_is_nan():
    bad = jnp.array([[1.0, 0.0], [0.5, -2.0]])
    got = jaxinterp.inverse(jnp.linalg.cholesky)(bad)
    assert np.isnan(np.asarray(got)).all()


def test_cholesky_without_symmetrization_leaves_the_upper_triangle_unknown():
    def f(x):
        return jnp.tril(jax.lax.linalg.cholesky(x, symmetrize_input=False))

    with pytest.raises(NotInvertibleError) as err:
        jaxinterp.inverse(f)(jnp.eye(3))
    assert "the outputs determine some elements but not (0, 1), (0, 2), (1, 2)" in str(
        err.value
    )


def test_the_symmetric_choice_meets_no_second_constraint():
    def f(a):
        return jnp.linalg.cholesky(a), a[0, 1]

    a = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    with pytest.raises(NotInvertibleError):
        jaxinterp.inverse(f, example_args=(a,))(f(a))


def test_an_outer_product_of_an_unknown_factor_is_refused():
    factor = jnp.array([[2.0, 0.0], [0.5, 1.0]])
    with pytest.raises(NotInvertibleError) as err:
        jaxinterp.inverse(lambda m: m @ m.T)(factor @ factor.T)
    assert "a matrix square root is not unique" in str(err.value)


# -- traced known operands: the rank is checked at run time -----------------------


def test_a_block_with_traced_known_operands_is_solved_or_nan():
    def f(x, c):
        return x + c * x[::-1]

    x = jnp.array([0.5, -1.0, 2.0, 0.25])
    inv = jax.jit(jaxinterp.inverse(f, argnums=0))
    for c in (0.3, -2.0):
        jac = np.eye(4) + c * np.eye(4)[::-1]
        want = np.linalg.solve(jac, np.asarray(f(x, c), np.float64))
        np.testing.assert_allclose(inv(f(x, c), c), want, atol=1e-5)
    # c = 1: `x + x[::-1]` does not determine x.
    assert np.isnan(np.asarray(inv(f(x, 1.0), 1.0))).all()


def test_a_literal_operand_in_a_block_with_shared_values_does_not_crash():
    """Fuzzer, seed 61 program 299: a shared-value cut met a literal operand
    (`x != 0.25`), which JAX 0.12 does not hash (`TypeError: unhashable type:
    'Literal'`)."""

    def f(x):
        v = x + jnp.where(x != 0.25, 5.0, -5.0)
        return jnp.real(v * (1.0 + 0.5j))

    x = jnp.array([[[-1.5, 0.85]], [[-1.76, -1.43]]], jnp.float32)
    got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
    np.testing.assert_allclose(got, x, atol=1e-5)
    jac = jax.jacfwd(f)(x).reshape(x.size, x.size)
    np.testing.assert_allclose(ildj, -jnp.linalg.slogdet(jac)[1], atol=1e-6)
