"""`|u|` as a case split of the piecewise method, each case linear-fractional.

Softsign, `x / (1 + |x|)`, uses its unknown twice; with `|x|` read as `x`
where `x >= 0` and `-x` elsewhere, each case is a Möbius map with an exact
inverse, and no numerical solve is needed. These tests
check the answers against hand-written inverses, and that maps which are not
injective give NaN where a value has several preimages, never one of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jaxinterp
from jaxinterp import inverse, inverse_and_ildj

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods


def _explained(fn, *args, argnums=None):
    return jaxinterp.explain_inverse(fn, *args, argnums=argnums)


def _slogdet_ildj(fn, x):
    return -jnp.linalg.slogdet(jax.jacfwd(fn)(x))[1]


# (No values whose products are subnormal: XLA on CPU flushes them to 0.)
_FLOAT = st.floats(-3.0, 3.0, allow_nan=False, width=32).filter(
    lambda v: v == 0 or abs(v) > 1e-30
)


def _kinked(x, a, b, s):
    return a * x + b * jnp.abs(x - s)


def _kinked_cases(y, a, b, s):
    """Both cases' solutions of `a x + b |x - s| = y`, each where it lies in
    its case's region (NaN elsewhere)."""
    upper = (y + b * s) / (a + b)  # x >= s
    lower = (y - b * s) / (a - b)  # x < s
    upper = np.where(upper >= s, upper, np.nan)
    lower = np.where(lower < s, lower, np.nan)
    return upper, lower


@given(
    a=st.floats(0.5, 2.0),
    ratio=st.floats(-0.9, 0.9),
    s=_FLOAT,
    xs=st.lists(_FLOAT, min_size=6, max_size=6),
)
def test_an_injective_kink_is_inverted_exactly(a, ratio, s, xs):
    b = ratio * a  # |b| < |a|: both slopes of one sign, injective
    x = jnp.asarray(xs, jnp.float32)
    f = lambda t: _kinked(t, a, b, s)  # noqa: E731
    y = f(x)
    got, ildj = inverse_and_ildj(f)(y)
    upper, lower = _kinked_cases(np.asarray(y, np.float64), a, b, s)
    want = np.where(np.isnan(upper), lower, upper)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # (At the kink itself the slope is one-sided, either side's.)
    if np.all(np.abs(np.asarray(x) - s) > 1e-3):
        np.testing.assert_allclose(ildj, _slogdet_ildj(f, x), rtol=1e-4, atol=1e-4)
    assert "(piecewise)" in _explained(f, x)
    np.testing.assert_allclose(jax.jit(inverse(f))(y), got, rtol=1e-6, atol=1e-6)


@given(
    a=st.floats(0.5, 2.0),
    ratio=st.floats(1.2, 3.0),
    sign=st.sampled_from([1.0, -1.0]),
    s=_FLOAT,
    xs=st.lists(_FLOAT, min_size=6, max_size=6),
)
def test_a_kink_that_folds_gives_nan_where_a_value_has_two_preimages(
    a, ratio, sign, s, xs
):
    b = sign * ratio * a  # |b| > |a|: slopes of opposite signs, a fold
    x = jnp.asarray(xs, jnp.float32)
    f = lambda t: _kinked(t, a, b, s)  # noqa: E731
    y = f(x)
    got = np.asarray(inverse(f)(y))
    upper, lower = _kinked_cases(np.asarray(y, np.float64), a, b, s)
    apart = np.abs(upper - lower) > 1e-3
    # Every `y` was taken; where it has two preimages apart the answer is
    # NaN, and any answer given is a preimage (the tip of the fold, whose
    # value has one).
    assert np.isnan(got[apart]).all(), (got, upper, lower)
    answered = ~np.isnan(got)
    np.testing.assert_allclose(
        f(jnp.asarray(got[answered])), y[answered], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(got[answered], s, rtol=1e-4, atol=1e-4)


def _scaled_softsign(x, c):
    return x / (c + jnp.abs(x))


# Compiled once for all examples (the scale is an argument).
_SCALED_SOFTSIGN_INVERSE = jax.jit(inverse(_scaled_softsign, argnums=0))


@given(
    scale=st.floats(0.1, 10.0),
    xs=st.lists(st.floats(-50.0, 50.0, width=32), min_size=8, max_size=8),
)
def test_scaled_softsign_against_its_closed_form_with_jit_and_grad(scale, xs):
    x = jnp.asarray(xs, jnp.float32)
    y = _scaled_softsign(x, scale)
    hand = lambda t, c: c * t / (1 - jnp.abs(t))  # noqa: E731
    inv = _SCALED_SOFTSIGN_INVERSE
    np.testing.assert_allclose(inv(y, scale), hand(y, scale), rtol=2e-5, atol=1e-5)
    # d x / d y and d x / d c, through the formula.
    got = jax.grad(lambda t, c: jnp.sum(inv(t, c)), argnums=(0, 1))(y, scale)
    want = jax.grad(lambda t, c: jnp.sum(hand(t, c)), argnums=(0, 1))(y, scale)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-3, atol=1e-3)


def test_softsign_is_exact_and_outside_its_image_is_nan():
    softsign = lambda x: x / (1 + jnp.abs(x))  # noqa: E731
    x = jnp.linspace(-20.0, 20.0, 9)
    report = _explained(softsign, x)
    assert "(piecewise)" in report and "elementwise solve" not in report, report
    got = inverse(softsign, solvers=False)(jnp.array([0.5, -0.75, 1.0, -2.0, 0.0]))
    np.testing.assert_allclose(got[:2], [1.0, -3.0], rtol=1e-6)
    assert np.isnan(np.asarray(got[2:4])).all(), got
    assert float(got[4]) == 0.0


def test_a_constant_case_gives_nan_on_its_value_not_one_preimage():
    # `x + |x|` is 0 for every x <= 0: y = 0 has no single preimage.
    f = lambda x: x + jnp.abs(x)  # noqa: E731
    got = np.asarray(inverse(f)(jnp.array([0.0, 3.0, -1.0])))
    assert np.isnan(got[0]) and np.isnan(got[2]), got
    np.testing.assert_allclose(got[1], 1.5)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_a_case_constant_only_for_some_known_value_is_checked_when_traced(c):
    # With `c == 1`, the case `x < 0` of `x + c |x|` is constant (0): the
    # check runs on the traced coefficients, under `jax.jit`.
    f = lambda x, c: x + c * jnp.abs(x)  # noqa: E731
    inv = jax.jit(inverse(f, argnums=0))
    got = np.asarray(inv(jnp.array([0.0, 3.0, -1.0]), c))
    np.testing.assert_allclose(got[1], 3.0 / (1 + c), rtol=1e-6)
    if c == 1.0:
        assert np.isnan(got[[0, 2]]).all(), got
    else:  # slopes 1.5 and 0.5: injective
        np.testing.assert_allclose(got[[0, 2]], [0.0, -2.0], rtol=1e-6)


def test_softsign_near_its_kink_has_no_false_nan():
    # Near 0 the other case's candidate (`y / (1 - y)` for a negative `y`)
    # maps back within rounding too: only the case read at (or within a few
    # ulps of) the candidate may answer, else the two look like two
    # preimages. A sweep over 35 decades each side, and 10^6 points on
    # [-4, 4], none NaN.
    softsign = lambda x: x / (1 + jnp.abs(x))  # noqa: E731
    tiny = jnp.logspace(-36.0, -0.5, 2001, dtype=jnp.float32)
    y = jnp.concatenate([tiny, -tiny, softsign(jnp.linspace(-4.0, 4.0, 10**6))])
    got = np.asarray(jax.jit(inverse(softsign))(y))
    want = np.asarray(y / (1 - jnp.abs(y)))
    assert not np.isnan(got).any(), y[np.isnan(got)]
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=0)


def test_erfc_is_inverted_in_its_tail():
    # `erfc(x)` for x up to 9 is as small as 4e-37: `erf_inv(1 - y)` would
    # see `1 - y == 1` (infinite); `ndtri(y / 2)` keeps the digits.
    x = jnp.linspace(-2.0, 9.0, 45)
    got = inverse(jax.lax.erfc)(jax.lax.erfc(x))
    np.testing.assert_allclose(got, x, rtol=2e-5, atol=2e-6)


def _ndtr_by_regimes(x):
    # The normal CDF as careful libraries write it: `erf` near 0, `erfc` of
    # `|w|` in each tail (for its digits), one `abs` and two `where`s.
    w = x * (0.5 * np.sqrt(2.0))
    z = jnp.abs(w)
    y = jnp.where(
        z < 0.5 * np.sqrt(2.0),
        1.0 + jax.lax.erf(w),
        jnp.where(w > 0.0, 2.0 - jax.lax.erfc(z), jax.lax.erfc(z)),
    )
    return 0.5 * y


@given(st.lists(st.floats(-9.0, 3.0, width=32), min_size=8, max_size=8))
def test_a_normal_cdf_by_regimes_is_inverted_piecewise(xs):
    x = jnp.asarray(xs, jnp.float32)
    y = _ndtr_by_regimes(x)
    got, ildj = inverse_and_ildj(_ndtr_by_regimes)(y)
    np.testing.assert_allclose(got, jax.scipy.special.ndtri(y), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, x, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(
        ildj, _slogdet_ildj(_ndtr_by_regimes, got), rtol=1e-3, atol=1e-3
    )
    assert "(piecewise)" in _explained(_ndtr_by_regimes, x)
    # Off its image, (0, 1): NaN.
    off = inverse(_ndtr_by_regimes)(jnp.array([-0.5, 1.5]))
    assert np.isnan(np.asarray(off)).all()


@given(
    st.floats(-2.0, -0.25, width=32),
    st.floats(0.25, 2.0, width=32),
    st.sampled_from([-0.5, 0.0, 0.5]),
    st.lists(st.floats(-4.0, 4.0, width=32), min_size=6, max_size=6),
)
def test_regimes_with_a_derived_predicate_answer_only_unique_preimages(a, b, d, ys):
    """Three regimes as libraries write them (the middle one's operand made
    safe with `where(small | large, ...)`), the low one shifted by `d`: a
    jump up (`d > 0`, values taken twice) or down (`d < 0`, a gap). Every
    `y` with one preimage gets it; every other `y` is NaN."""

    def f(x):
        small, large = x < a, x > b
        safe = jnp.where(small | large, 0.5 * (a + b), x)
        return jnp.where(small, x + 1.0 + d, jnp.where(large, x + 1.0, safe + 1.0))

    y = np.asarray(ys, np.float32)
    got = np.asarray(inverse(f)(jnp.asarray(y)))
    for yk, gk in zip(y.astype(np.float64), got, strict=True):
        pre = [x for x in (yk - 1.0 - d,) if x < a] + [x for x in (yk - 1.0,) if x >= a]
        if min(abs(yk - 1.0 - a), abs(yk - 1.0 - d - a)) < 1e-4:
            continue  # within rounding of a threshold's image
        if len(pre) == 1:
            np.testing.assert_allclose(gk, pre[0], rtol=1e-5, atol=1e-5)
        else:
            assert np.isnan(gk), (a, b, d, yk, gk, pre)
    assert "(piecewise)" in _explained(f, jnp.asarray(y))
