"""Per-element blocks (`jaxinterp/_inverse/_perelement.py`): elementwise maps
written through extra axes, as bijector libraries write splines.

A rational-quadratic spline picks each element's bin with a one-hot mask
(`x[:, None]` against knots `[n, K]`), multiplies it with known parameters
and sums over the bins (distrax's way), or looks its bin up with
`jnp.searchsorted` and indexes known tables. Each map here is checked against
a hand-written inverse (the spline's quadratic root) and a NumPy bisection of
the forward map, its ildj against `-slogdet(jax.jacfwd(f)(x))`, and under
`jax.jit`, `jax.vmap` and `jax.grad`; maps that are not per-element, or not
monotone, are refused or NaN.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jaxinterp
from jaxinterp import NotInvertibleError, inverse, inverse_and_ildj
from jaxinterp.testing import compare_with_reference

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

BOUND = 3.0


def spline_params(raw, bound=BOUND):
    """Knots `(xk, yk, dk)`, each `[n, K + 1]`, from unconstrained `raw`
    (`[n, 3K - 1]`), as distrax builds them: softmax widths and heights,
    softplus interior slopes, slope 1 at the ends (identity tails)."""
    n, m = raw.shape
    k = (m + 1) // 3

    def knots(logits):
        w = jax.nn.softmax(logits, axis=-1)
        w = 1e-3 + (1 - 1e-3 * k) * w
        edges = jnp.concatenate([jnp.zeros((n, 1)), jnp.cumsum(w, axis=-1)], axis=-1)
        return -bound + 2 * bound * edges

    slopes = 1e-3 + jax.nn.softplus(raw[:, 2 * k :])
    ones = jnp.ones((n, 1))
    return (
        knots(raw[:, :k]),
        knots(raw[:, k : 2 * k]),
        jnp.concatenate([ones, slopes, ones], axis=-1),
    )


def _rq(x, x0, x1, y0, y1, d0, d1):
    """The rational quadratic of one bin at `x` (Durkan et al., eq. 4)."""
    w, h = x1 - x0, y1 - y0
    s = h / w
    t = jnp.clip((x - x0) / w, 0.0, 1.0)
    num = h * (s * t**2 + d0 * t * (1 - t))
    den = s + (d0 + d1 - 2 * s) * t * (1 - t)
    return y0 + num / den


def rqs_onehot(x, xk, yk, dk):
    """distrax's way: a one-hot mask of the bin, multiplied with the knots
    and summed over the bin axis; the identity outside `[-BOUND, BOUND]`."""
    inside = (x[:, None] >= xk[:, :-1]) & (x[:, None] < xk[:, 1:])
    # No bin (a tail): bin 0, so that the unused formula stays finite.
    none = ~jnp.any(inside, axis=-1)
    first = jnp.arange(xk.shape[-1] - 1) == 0
    mask = jnp.where(none[:, None], first, inside).astype(x.dtype)

    def pick(p):
        return jnp.sum(mask * p, axis=-1)

    y = _rq(
        x,
        pick(xk[:, :-1]),
        pick(xk[:, 1:]),
        pick(yk[:, :-1]),
        pick(yk[:, 1:]),
        pick(dk[:, :-1]),
        pick(dk[:, 1:]),
    )
    tail = (x < xk[:, 0]) | (x >= xk[:, -1])
    return jnp.where(tail, x, y)


def rqs_searchsorted(x, xk, yk, dk):
    """One knot vector for every element, the bin by `jnp.searchsorted`
    (`compare_all`: comparisons, no loop) and indexing."""
    i = jnp.clip(jnp.searchsorted(xk, x, side="right", method="compare_all") - 1, 0)
    i = jnp.minimum(i, xk.shape[0] - 2)
    y = _rq(x, xk[i], xk[i + 1], yk[i], yk[i + 1], dk[i], dk[i + 1])
    tail = (x < xk[0]) | (x >= xk[-1])
    return jnp.where(tail, x, y)


def rqs_inverse(y, xk, yk, dk):
    """The hand-written inverse: the bin of `y` among `yk`, then the root of
    the bin's quadratic (the stable form `2c / (-b - sqrt(disc))`)."""
    inside = (y[:, None] >= yk[:, :-1]) & (y[:, None] < yk[:, 1:])
    mask = inside.astype(y.dtype)

    def pick(p):
        return jnp.sum(mask * p, axis=-1)

    x0, x1, y0, y1 = (
        pick(xk[:, :-1]),
        pick(xk[:, 1:]),
        pick(yk[:, :-1]),
        pick(yk[:, 1:]),
    )
    d0, d1 = pick(dk[:, :-1]), pick(dk[:, 1:])
    # In the tails, safe values for the unused formula (its gradient too).
    tail = ~jnp.any(inside, axis=-1)
    w = jnp.where(tail, 1.0, x1 - x0)
    h = jnp.where(tail, 1.0, y1 - y0)
    d0, d1 = jnp.where(tail, 1.0, d0), jnp.where(tail, 1.0, d1)
    s = h / w
    dy = jnp.where(tail, 0.5, y - y0)
    a = h * (s - d0) + dy * (d1 + d0 - 2 * s)
    b = h * d0 - dy * (d1 + d0 - 2 * s)
    c = -s * dy
    disc = jnp.maximum(b**2 - 4 * a * c, 0.0)
    t = 2 * c / (-b - jnp.sqrt(disc))
    return jnp.where(tail, y, x0 + t * w)


def pwl_onehot(x, knots, values):
    """Piecewise linear through `(knots, values)` (`[n, K + 1]` each), bins
    by a one-hot mask; slope 1 beyond the ends."""
    inside = (x[:, None] >= knots[:, :-1]) & (x[:, None] < knots[:, 1:])
    mask = inside.astype(x.dtype)
    slope = (values[:, 1:] - values[:, :-1]) / (knots[:, 1:] - knots[:, :-1])
    y = jnp.sum(mask * (values[:, :-1] + slope * (x[:, None] - knots[:, :-1])), -1)
    below = values[:, 0] + (x - knots[:, 0])
    above = values[:, -1] + (x - knots[:, -1])
    return jnp.where(x < knots[:, 0], below, jnp.where(x >= knots[:, -1], above, y))


def bisect(f, y, lo=-1e3, hi=1e3, steps=200):
    """A preimage of `y` under the increasing elementwise `f`, by bisection
    in float64 NumPy (the reference)."""
    y = np.asarray(y, np.float64)
    lo = np.full_like(y, lo)
    hi = np.full_like(y, hi)
    for _ in range(steps):
        mid = (lo + hi) / 2
        below = np.asarray(f(mid), np.float64) < y
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return (lo + hi) / 2


def _numpy_rq(x, xk, yk, dk):
    """The spline in float64 NumPy, bins by `np.searchsorted` per row: the
    forward map of the bisection reference."""
    xk, yk, dk = (np.asarray(p, np.float64) for p in (xk, yk, dk))
    x = np.asarray(x, np.float64)
    out = x.copy()
    for r in range(x.shape[0]):
        if not xk[r, 0] <= x[r] < xk[r, -1]:
            continue
        i = np.searchsorted(xk[r], x[r], side="right") - 1
        w, h = xk[r, i + 1] - xk[r, i], yk[r, i + 1] - yk[r, i]
        s, t = h / w, (x[r] - xk[r, i]) / w
        d0, d1 = dk[r, i], dk[r, i + 1]
        den = s + (d0 + d1 - 2 * s) * t * (1 - t)
        out[r] = yk[r, i] + h * (s * t**2 + d0 * t * (1 - t)) / den
    return out


def _numpy_pwl(x, knots, values):
    """`pwl_onehot` in float64 NumPy (`np.interp`, slope-1 tails)."""
    knots, values = np.asarray(knots, np.float64), np.asarray(values, np.float64)
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        k, v = knots[r], values[r]
        if x[r] < k[0]:
            out[r] = v[0] + x[r] - k[0]
        elif x[r] >= k[-1]:
            out[r] = v[-1] + x[r] - k[-1]
        else:
            out[r] = np.interp(x[r], k, v)
    return out


def _slogdet_ildj(f, x):
    return -jnp.linalg.slogdet(jax.jacfwd(f)(x))[1]


# Compiled once (one shape per test): hypothesis's examples reuse them.
_ONEHOT = jax.jit(inverse_and_ildj(rqs_onehot, argnums=0))
_SEARCHSORTED = jax.jit(inverse_and_ildj(rqs_searchsorted, argnums=0))
_PWL = jax.jit(inverse_and_ildj(pwl_onehot, argnums=0))

RAW = st.lists(
    st.floats(-2.0, 2.0, allow_nan=False, width=32), min_size=4 * 11, max_size=4 * 11
)
XS = st.lists(st.floats(-5.0, 5.0, allow_nan=False, width=32), min_size=4, max_size=4)


@given(RAW, XS)
def test_onehot_spline_against_bisection_and_jacobian(raw, xs):
    xk, yk, dk = spline_params(jnp.asarray(raw, jnp.float32).reshape(4, 11))
    x = jnp.asarray(xs, jnp.float32)
    y = rqs_onehot(x, xk, yk, dk)
    x_back, ildj = _ONEHOT(y, xk, yk, dk)
    ref = bisect(lambda v: _numpy_rq(v, xk, yk, dk), y)
    np.testing.assert_allclose(x_back, ref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(x_back, rqs_inverse(y, xk, yk, dk), rtol=2e-4, atol=2e-4)
    want = _slogdet_ildj(lambda v: rqs_onehot(v, xk, yk, dk), x_back)
    np.testing.assert_allclose(ildj, want, rtol=1e-3, atol=1e-3)


def test_distrax_style_jaxpr_is_inverted_by_intervals():
    """The bins, compared along the extra axis, give the breakpoints; the
    position `(x - knot) / width` the clip bounds is fixed per bin (session
    22; was the elementwise solver)."""
    raw = jax.random.normal(jax.random.PRNGKey(2), (3, 11))
    xk, yk, dk = spline_params(raw)
    x = jnp.array([-1.0, 0.5, 2.0])
    report = jaxinterp.explain_inverse(rqs_onehot, x, xk, yk, dk, argnums=0)
    assert "(piecewise by intervals)" in report
    assert "(elementwise solve)" not in report
    assert "Invertible" in report


def rqs_shared(x, xk, yk, dk):
    """One row of knots (`[K + 1]`) for every element, broadcast inside the
    program (as a vectorized bijector's parameters are), bins by one-hot
    masks: the interval method builds its tables once, from the row."""
    n = x.shape[0]
    rows = [jnp.broadcast_to(p, (n, p.shape[-1])) for p in (xk, yk, dk)]
    return rqs_onehot(x, *rows)


def _rqs_shared_inverse(y, xk, yk, dk):
    rows = [jnp.broadcast_to(p, (y.shape[0], p.shape[-1])) for p in (xk, yk, dk)]
    return rqs_inverse(y, *rows)


_SHARED = jax.jit(inverse_and_ildj(rqs_shared, argnums=0))


# A fixed number of points, so that every example reuses one compilation.
@given(
    RAW,
    st.lists(st.floats(-5.0, 5.0, allow_nan=False, width=32), min_size=8, max_size=8),
)
def test_shared_knots_spline_against_hand_written_inverse(raw, xs):
    xk, yk, dk = (
        p[0] for p in spline_params(jnp.asarray(raw, jnp.float32).reshape(4, 11))
    )
    x = jnp.asarray(xs, jnp.float32)
    y = rqs_shared(x, xk, yk, dk)
    x_back, ildj = _SHARED(y, xk, yk, dk)
    want = _rqs_shared_inverse(y, xk, yk, dk)
    np.testing.assert_allclose(x_back, want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(rqs_shared(x_back, xk, yk, dk), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ildj,
        _slogdet_ildj(lambda v: rqs_shared(v, xk, yk, dk), x_back),
        rtol=1e-3,
        atol=1e-3,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["per_element", "shared"])
def test_onehot_spline_under_transformations(shared):
    """Knots per element (every interval tried per element) or one row for
    all (looked up): jit, vmap, and gradients in `y` and in the knots (the
    implicit function theorem) against the hand-written inverse's. (The
    ildj is checked against `jax.jacfwd` above, compiled.)"""
    rows = 1 if shared else 5
    knots = spline_params(jax.random.normal(jax.random.PRNGKey(4), (rows, 11)))
    fn, reference = (
        (rqs_shared, _rqs_shared_inverse) if shared else (rqs_onehot, rqs_inverse)
    )
    knots = tuple(p[0] for p in knots) if shared else knots
    y = jnp.linspace(-3.5, 3.5, 5)
    report = jaxinterp.explain_inverse(fn, y, *knots, argnums=0)
    assert "(piecewise by intervals)" in report
    assert "(elementwise solve)" not in report
    compare_with_reference(
        inverse(fn, argnums=0),
        reference,
        (y, *knots),
        rtol=1e-3,
        atol=1e-3,
        compiled=True,
    )


@given(RAW, XS)
def test_searchsorted_spline(raw, xs):
    raw = jnp.asarray(raw, jnp.float32).reshape(4, 11)[:1]
    xk, yk, dk = (p[0] for p in spline_params(raw))
    x = jnp.asarray(xs, jnp.float32)
    y = rqs_searchsorted(x, xk, yk, dk)
    x_back, ildj = _SEARCHSORTED(y, xk, yk, dk)
    tiled = [jnp.broadcast_to(p, (4, 5)) for p in (xk, yk, dk)]
    np.testing.assert_allclose(x_back, rqs_inverse(y, *tiled), rtol=2e-4, atol=2e-4)
    want = _slogdet_ildj(lambda v: rqs_searchsorted(v, xk, yk, dk), x_back)
    np.testing.assert_allclose(ildj, want, rtol=1e-3, atol=1e-3)


KNOT_GAPS = st.lists(st.floats(0.125, 2.0, width=32), min_size=4, max_size=4)
VALUE_GAPS = st.lists(st.floats(0.125, 3.0, width=32), min_size=4, max_size=4)


@given(KNOT_GAPS, VALUE_GAPS, XS)
def test_piecewise_linear_bins(knot_gaps, value_gaps, xs):
    knots = jnp.broadcast_to(-2.0 + jnp.cumsum(jnp.asarray([0.0, *knot_gaps])), (4, 5))
    values = jnp.broadcast_to(
        -1.0 + jnp.cumsum(jnp.asarray([0.0, *value_gaps])), (4, 5)
    )
    x = jnp.asarray(xs, jnp.float32)
    y = pwl_onehot(x, knots, values)
    x_back, ildj = _PWL(y, knots, values)

    ref = bisect(lambda v: _numpy_pwl(v, knots, values), y)
    np.testing.assert_allclose(x_back, ref, rtol=1e-4, atol=1e-4)
    want = _slogdet_ildj(lambda v: pwl_onehot(v, knots, values), x_back)
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)


def _bounded(x):
    """Piecewise linear on `[-2, 2]` (one-hot bins), `tanh` tails: the image
    is `(-3, 3)`."""
    knots = jnp.broadcast_to(jnp.array([-2.0, -0.5, 1.0, 2.0]), (x.shape[0], 4))
    values = jnp.broadcast_to(jnp.array([-2.0, -1.5, 1.0, 2.0]), (x.shape[0], 4))
    middle = pwl_onehot(x, knots, values)
    low = -2.0 + jnp.tanh(x + 2.0)
    high = 2.0 + jnp.tanh(x - 2.0)
    return jnp.where(x < -2.0, low, jnp.where(x > 2.0, high, middle))


def test_outside_the_image_is_nan():
    y = jnp.array([-3.5, -2.5, 0.3, 2.5, 3.2])
    x = inverse(_bounded)(y)
    inside = np.abs(np.asarray(y)) < 3
    np.testing.assert_array_equal(np.isnan(x), ~inside)
    np.testing.assert_allclose(_bounded(x)[inside], y[inside], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(jax.jit(inverse(_bounded))(y)), ~inside)


def _zigzag(x, slopes):
    """Piecewise linear with a falling middle bin (slopes known): per-element
    but not monotone, so it takes some values three times."""
    knots = jnp.broadcast_to(jnp.array([-1.0, 0.0, 1.0, 2.0]), (x.shape[0], 4))
    steps = jnp.concatenate([jnp.zeros((x.shape[0], 1)), slopes], axis=-1)
    values = jnp.cumsum(steps, axis=-1) - 1.0
    return pwl_onehot(x, knots, values)


def test_non_monotone_per_element_map_is_nan_where_not_unique():
    """Piecewise linear: inverted bin by bin, NaN where `y` has several
    preimages (three in the falling bin's range, two at its top)."""
    slopes = jnp.broadcast_to(jnp.array([1.0, -0.5, 1.0]), (5, 3))
    y = jnp.array([-0.4, -0.2, 0.0, 3.0, -2.0])
    report = jaxinterp.explain_inverse(lambda x: _zigzag(x, slopes), y)
    assert "(piecewise by intervals)" in report
    x = inverse(lambda x: _zigzag(x, slopes))(y)
    np.testing.assert_allclose(x, [np.nan, np.nan, np.nan, 4.5, -2.0], rtol=1e-6)


def _wavy_zigzag(x, slopes):
    """The zigzag plus a little `tanh`: no quotient of polynomials per bin,
    so the elementwise solver's."""
    return _zigzag(x, slopes) + 0.01 * jnp.tanh(x)


def test_non_monotone_per_element_map_is_refused():
    slopes = jnp.broadcast_to(jnp.array([1.0, -0.5, 1.0]), (3, 3))
    y = jnp.array([-0.4, -0.2, 0.0])
    with pytest.raises(NotInvertibleError, match=re.escape("is not monotone")):
        inverse(lambda x: _wavy_zigzag(x, slopes))(y)


def test_non_monotone_per_element_map_traced_is_nan():
    slopes = jnp.broadcast_to(jnp.array([1.0, -0.5, 1.0]), (3, 3))
    y = jnp.array([-0.4, -0.2, 3.0])
    x = jax.jit(inverse(_wavy_zigzag, argnums=0))(y, slopes)
    assert np.isnan(np.asarray(x)).all()
    monotone = jnp.abs(slopes)
    x = jax.jit(inverse(_wavy_zigzag, argnums=0))(y, monotone)
    np.testing.assert_allclose(_wavy_zigzag(x, monotone), y, rtol=1e-5, atol=1e-5)


def _couple_through_sum(x):
    return jnp.sum(x[:, None] * jnp.tanh(x[None, :]), axis=1)  # x * sum(tanh(x))


def _reversed(x):
    return x * jnp.exp(x[::-1])


def _sliced(x):
    return x + jnp.sin(x[:1])


def _transposed(x):
    return jnp.tanh(x) + x.T


def _reduced_aligned_axis(x):
    return jnp.sum(jnp.sin(x[:, None] * jnp.ones((1, 2))), axis=0) + x[:2]


@pytest.mark.parametrize(
    "fn, x",
    [
        (_couple_through_sum, jnp.array([0.5, 1.0, 2.0])),
        (_reversed, jnp.array([0.5, 1.0, 2.0])),
        (_transposed, jnp.array([[0.5, 1.0], [2.0, 3.0]])),
        (_reduced_aligned_axis, jnp.array([0.5, 1.0])),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_maps_that_are_not_per_element_are_refused(fn, x):
    with pytest.raises(NotInvertibleError, match=re.escape("cannot recover input 0")):
        inverse(fn)(fn(x))


def test_a_slice_of_the_unknown_is_not_per_element_but_triangular():
    """`x + sin(x[:1])` is not per-element (every element reads `x[0]`), but
    it is triangular: the sequential solve takes it, not an elementwise one."""
    x = jnp.array([0.5, 1.0, 2.0])
    assert "(sequential solve)" in jaxinterp.explain_inverse(_sliced, x)
    got, ildj = jaxinterp.inverse_and_ildj(_sliced)(_sliced(x))
    np.testing.assert_allclose(got, x, rtol=1e-5)
    jac = jax.jacfwd(_sliced)(x)
    np.testing.assert_allclose(ildj, -jnp.linalg.slogdet(jac)[1], rtol=1e-5)
