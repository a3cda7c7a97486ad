"""Elementwise blocks linear-fractional in their unknown, and linear chains
from a value known in pieces.

* `y = (a x + b) / (c x + d)` written with `x` in several places is inverted
  by the formula `x = (b - d y) / (c y - a)` (`_inverse/_fractional.py`),
  and so is its logarithm (logit, `log(x) - log1p(-x)`) at `e^y`, and such a
  map of `s = e^x` or `e^-x` (softplus's inverse `x + log(-expm1(-x))`),
  not by the numerical solver: exact, available with `solvers=False`, and
  not a choice of preimage, so a later constraint on the same value is
  checked instead of refused. Compared with hand-written inverses and with
  `jax.jacfwd` for the ildj.
* A linear step from an unknown whose other elements are known already
  (`sum(c * x)` with `x[1:]` an output) is solved for the elements left.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxinterp

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

FEW = settings(max_examples=max(4, settings.default.max_examples // 3))

# name -> (f, its inverse by hand, where x may be drawn: an interval)
FRACTIONAL = {
    "(x - 1) / (x + 1)": (
        lambda x: (x - 1) / (x + 1),
        lambda y: (1 + y) / (1 - y),
        (-0.75, 3.0),
    ),
    "x / (1 + x)": (lambda x: x / (1 + x), lambda y: y / (1 - y), (0.0, 4.0)),
    "x * (1 / (x + 2))": (
        lambda x: x * (1 / (x + 2)),
        lambda y: 2 * y / (1 - y),
        (-1.5, 4.0),
    ),
    "scaled, jitted": (
        lambda x: jax.jit(lambda u: (3 * u + 1) / (u - 2))(x) * 2.0,
        lambda y: (2 * y / 2 + 1) / (y / 2 - 3),
        (-3.0, 1.5),
    ),
    "a known array of scales": (
        lambda x: (jnp.array([1.0, 2.0, 3.0]) * x + 1) / (x + 4),
        lambda y: (1 - 4 * y) / (y - jnp.array([1.0, 2.0, 3.0])),
        (-2.0, 3.0),
    ),
    # Logarithms of linear-fractional maps.
    "logit": (
        lambda x: jnp.log(x) - jnp.log1p(-x),
        jax.nn.sigmoid,
        (0.015625, 0.984375),
    ),
    "2 atanh as log1p(x) - log1p(-x)": (
        lambda x: jnp.log1p(x) - jnp.log1p(-x),
        lambda y: jnp.tanh(y / 2),
        (-0.875, 0.875),
    ),
    "-logit": (
        lambda x: -(jnp.log(x) - jnp.log1p(-x)),
        lambda y: jax.nn.sigmoid(-y),
        (0.015625, 0.984375),
    ),
    "a log ratio plus a known value": (
        lambda x: jnp.log(x + 2.0) - jnp.log(x + 0.5) + 1.0,
        lambda y: (2.0 - 0.5 * jnp.exp(y - 1.0)) / (jnp.exp(y - 1.0) - 1.0),
        (-0.375, 3.0),
    ),
    "exp of a log difference": (
        lambda x: jnp.exp(jnp.log(x) - jnp.log1p(x)),
        lambda y: y / (1 - y),
        (0.125, 4.0),
    ),
    # Linear-fractional in `s = e^x` or `e^-x`, `x = +-log s`.
    "softplus's inverse, x + log(-expm1(-x))": (
        lambda x: x + jnp.log(-jnp.expm1(-x)),
        jax.nn.softplus,
        (0.015625, 8.0),
    ),
    "log-sigmoid, x - log1p(exp(x))": (
        lambda x: x - jnp.log1p(jnp.exp(x)),
        lambda y: y - jnp.log1p(-jnp.exp(y)),
        (-4.0, 4.0),
    ),
    "sigmoid, exp(x) / (1 + exp(x))": (
        lambda x: jnp.exp(x) / (1 + jnp.exp(x)),
        lambda y: jnp.log(y) - jnp.log1p(-y),
        (-6.0, 6.0),
    ),
    "a Mobius map of e^-x, (2 - exp(-x)) / (exp(-x) + 3)": (
        lambda x: (2 - jnp.exp(-x)) / (jnp.exp(-x) + 3),
        lambda y: -jnp.log((2 - 3 * y) / (1 + y)),
        (-1.5, 4.0),
    ),
}


def _slogdet(f, x):
    jac = np.asarray(jax.jacfwd(f)(x), np.float64)
    if jac.shape[0] == jac.shape[1]:
        return float(-np.linalg.slogdet(jac)[1])
    return float(-0.5 * np.linalg.slogdet(jac.T @ jac)[1])


def _points(lo, hi, n=3):
    return st.lists(
        st.floats(lo, hi, allow_nan=False, width=32), min_size=n, max_size=n
    ).map(lambda v: jnp.asarray(v, jnp.float32))


@pytest.mark.parametrize("name", sorted(FRACTIONAL))
@FEW
@given(data=st.data())
def test_a_linear_fractional_block_is_inverted_by_its_formula(name, data):
    f, hand, (lo, hi) = FRACTIONAL[name]
    x = data.draw(_points(lo, hi))
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, hand(y), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ildj, _slogdet(f, x), rtol=1e-4, atol=1e-4)
    # An exact method: also with the solvers off, and compiled and batched.
    exact = jaxinterp.inverse(f, solvers=False)
    np.testing.assert_allclose(exact(y), got, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(exact)(y), got, rtol=1e-6)
    batched = jax.vmap(jaxinterp.inverse(f))(jnp.stack([y, y]))
    np.testing.assert_allclose(batched[1], got, rtol=1e-6)
    # Derivative: the inverse's Jacobian is diagonal, 1 / f'(x).
    grad = jax.grad(lambda y: jnp.sum(jaxinterp.inverse(f)(y)))(y)
    slope = jnp.diagonal(jax.jacfwd(f)(x))
    np.testing.assert_allclose(grad, 1 / slope, rtol=1e-3)


def test_logit_is_inverted_across_its_whole_float32_image():
    """`e^y` or `e^-y`, by the sign of `y`: neither overflows, and the
    answer matches `sigmoid` from `-80` (a subnormal-free tail) to the
    largest `y` float32's logit takes; past it, NaN."""

    def logit(x):
        return jnp.log(x) - jnp.log1p(-x)

    y = jnp.concatenate([jnp.linspace(-80.0, 16.0, 97), jnp.array([16.5])])
    got = jaxinterp.inverse(logit)(y)
    np.testing.assert_allclose(got, jax.nn.sigmoid(y), rtol=4e-6)
    assert "(linear-fractional formula)" in jaxinterp.explain_inverse(logit, got)
    # Larger than any logit of a float32 below 1: off the image.
    off = jaxinterp.inverse(logit)(jnp.array([20.0, 100.0]))
    assert np.isnan(np.asarray(off)).all()


def test_logit_in_float64():
    from helpers import run_python

    out = run_python(
        """
import jax, jax.numpy as jnp
import jaxinterp
logit = lambda x: jnp.log(x) - jnp.log1p(-x)
y = jnp.linspace(-700.0, 36.0, 200)
assert y.dtype == jnp.float64
got, ildj = jaxinterp.inverse_and_ildj(logit)(y)
want = jax.nn.sigmoid(y)
print(float(jnp.max(jnp.abs(got - want) / want)))
x = jnp.linspace(1e-3, 1 - 1e-3, 7)
_, ildj = jaxinterp.inverse_and_ildj(logit)(logit(x))
print(float(abs(ildj + jnp.linalg.slogdet(jax.jacfwd(logit)(x))[1])))
""",
        env={"JAX_ENABLE_X64": "1"},
    )
    err_x, err_ildj = map(float, out.split())
    assert err_x < 1e-14 and err_ildj < 1e-10, out


def test_a_logarithm_scaled_or_added_to_a_fraction_goes_to_the_solver():
    # `2 log x` (a square) and `log x + x` have no linear-fractional form.
    # (A scale of the whole logarithm, `2 logit(x)`, is undone first.)
    for f in (
        lambda x: 2.0 * jnp.log(x) - jnp.log1p(-x),
        lambda x: jnp.log(x) + x,
    ):
        x = jnp.array([0.2, 0.5, 0.7])
        text = str(jaxinterp.explain_inverse(f, x))
        assert "linear-fractional" not in text, text
        np.testing.assert_allclose(jaxinterp.inverse(f)(f(x)), x, rtol=1e-5)


def test_explain_names_the_linear_fractional_formula():
    def f(x):
        return (x - 1) / (x + 1)

    text = str(jaxinterp.explain_inverse(f, jnp.ones(3)))
    assert "(linear-fractional formula)" in text, text


def test_a_value_the_map_never_takes_gives_nan():
    """`(x - 1) / (x + 1)` never equals 1 (its asymptote), and a map whose
    numerator and denominator are proportional is constant: no preimage, or
    many; NaN either way, and not a number from a solver."""

    def f(x):
        return (x - 1) / (x + 1)

    got = jaxinterp.inverse(f)(jnp.array([1.0, 0.5]))
    assert jnp.isnan(got[0])
    np.testing.assert_allclose(got[1], 3.0, rtol=1e-6)

    def constant(x):
        return (2 * x + 2) / (x + 1)

    assert jnp.all(jnp.isnan(jaxinterp.inverse(constant)(jnp.array([2.0, 2.0]))))


def test_a_map_that_is_not_linear_fractional_still_goes_to_the_solver():
    def f(x):
        return x / (1 + x * x) + x  # degree two: not a Möbius map

    x = jnp.array([0.3, -1.2, 2.0])
    text = str(jaxinterp.explain_inverse(f, x))
    assert "linear-fractional" not in text
    assert "(elementwise solve)" in text
    np.testing.assert_allclose(jaxinterp.inverse(f)(f(x)), x, rtol=1e-5)


def _stereographic(x):
    """The inverse stereographic projection, `|x|^2` computed once."""
    s = jnp.sum(x**2)
    return jnp.concatenate([2 * x / (s + 1), ((s - 1) / (s + 1))[None]])


@FEW
@given(x=_points(-1.25, 1.25))
def test_the_stereographic_form_with_one_squared_norm_is_inverted(x):
    """The last coordinate gives `s` (a Möbius map of it), the others `x`;
    the `|x|^2` the program computes is then a second constraint, checked."""
    inv = jaxinterp.inverse_and_ildj(_stereographic, example_args=(x,))
    got, ildj = inv(_stereographic(x))
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ildj, _slogdet(_stereographic, x), rtol=1e-3, atol=1e-4)
    # A point off the sphere has no preimage.
    off = _stereographic(x) * 1.1
    got_off, ildj_off = inv(off)
    assert jnp.all(jnp.isnan(got_off)) and jnp.isnan(ildj_off)


C = jnp.array([0.5, -0.3, 0.2])


def _tail_and_ratio(x):
    s = jnp.sum(C * x)
    return jnp.concatenate([x[1:], ((2 * s + 1) / (s + 3))[None]])


def _tail_and_affine(x):
    s = jnp.sum(C * x)
    return jnp.concatenate([x[1:], (2 * s + 1)[None]])


@pytest.mark.parametrize("f", [_tail_and_ratio, _tail_and_affine])
@FEW
@given(x=_points(-1.25, 1.25))
def test_a_reduction_of_a_partly_known_value_is_solved_for_the_rest(f, x):
    """`x[1:]` is an output; `sum(C * x)` then determines `x[0]`."""
    got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ildj, _slogdet(f, x), rtol=1e-3, atol=1e-4)
    jitted = jax.jit(jaxinterp.inverse_and_ildj(f))(f(x))
    np.testing.assert_allclose(jitted[0], x, rtol=1e-4, atol=1e-4)


def _softplus_inverse_with_thresholds(x):
    # The regimes careful libraries write for float32: `log x` below a small
    # threshold, `x` above a large one, the stable form between, its operand
    # replaced by 1 outside (a predicate that is the `|` of the other two).
    small = x < np.exp(np.log(np.finfo(np.float32).eps) + 2.0)
    large = x > -(np.log(np.finfo(np.float32).eps) + 2.0)
    safe = jnp.where(small | large, jnp.ones([], x.dtype), x)
    middle = safe + jnp.log(-jnp.expm1(-safe))
    return jnp.where(small, jnp.log(x), jnp.where(large, x, middle))


def test_softplus_inverse_in_e_to_the_x_is_exact_over_float32():
    """From `y = -80` (`x` about 1e-35) to `80`: within a few ulps of
    `softplus`, no NaN; the form with thresholds is piecewise, each case a
    formula, with no NaN at the thresholds themselves (where rounding hides
    the jump between the regimes)."""
    plain = FRACTIONAL["softplus's inverse, x + log(-expm1(-x))"][0]
    y = jnp.linspace(-80.0, 80.0, 641)
    got = jaxinterp.inverse(plain)(y)
    np.testing.assert_allclose(got, jax.nn.softplus(y), rtol=2e-6)

    f = _softplus_inverse_with_thresholds
    edges = np.exp(np.log(np.finfo(np.float32).eps) + 2.0), 13.942384719848633
    x = jnp.concatenate(
        [
            jnp.logspace(-30, 1.5, 2001, dtype=jnp.float32),
            jnp.array([e * k for e in edges for k in (1 - 1e-7, 1.0, 1 + 1e-7)]),
        ]
    ).astype(jnp.float32)
    for inv in (jaxinterp.inverse(f), jaxinterp.inverse(f, solvers=False)):
        got = jax.jit(inv)(f(x))
        assert not np.isnan(np.asarray(got)).any()
        np.testing.assert_allclose(got, x, rtol=2e-5)
    text = jaxinterp.explain_inverse(f, x[:3])
    assert "(piecewise)" in text and "elementwise solve" not in text, text


@FEW
@given(data=st.data())
def test_a_jump_between_cases_is_nan_in_its_gap(data):
    """A candidate kept at a threshold must map back: `y` in the gap of a
    jump has no preimage (NaN), on either side of it the exact one."""

    def f(x):
        return jnp.where(x < 1.0, x, x + 5.0)

    lo = data.draw(st.floats(-4.0, 0.9990234375, width=32))
    hi = data.draw(st.floats(1.0, 4.0, width=32))
    gap = data.draw(st.floats(1.0009765625, 5.9990234375, width=32))
    got = jaxinterp.inverse(f)(jnp.array([lo, hi + 5.0, gap], jnp.float32))
    np.testing.assert_allclose(got[:2], [lo, hi], rtol=1e-6, atol=1e-6)
    assert np.isnan(got[2]), got
