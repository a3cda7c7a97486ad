"""Piecewise-rational blocks inverted interval by interval (`_intervals.py`).

A rational-quadratic spline written with `jnp.where` over its bins and a
clip per bin (as the gallery's flow and spline libraries write it) has more
cases than the piecewise method enumerates and a quadratic in each bin; it
is inverted exactly, against a hand-written inverse in float64 NumPy (the
bin by `searchsorted`, the root of the bin's quadratic). Maps with gaps,
folds and flat stretches are NaN exactly where `y` has no single preimage.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import x64
from hypothesis import given, settings, strategies as st

import jaxinterp
from jaxinterp._inverse import _intervals

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

BOUND = 2.5
BINS = 5
METHOD = f"({_intervals.INTERVALS})"
EPS32 = float(np.finfo(np.float32).eps)


def spline_params(raw):
    """Bin widths and heights (summing to `2 * BOUND`) and knot slopes (1
    at both ends) from unconstrained numbers."""
    raw = np.asarray(raw, np.float64)
    w = np.exp(raw[:BINS] - raw[:BINS].max())
    h = np.exp(raw[BINS : 2 * BINS] - raw[BINS : 2 * BINS].max())
    widths = 2 * BOUND * w / w.sum()
    heights = 2 * BOUND * h / h.sum()
    inner = np.log1p(np.exp(raw[2 * BINS :]))
    slopes = np.concatenate([[1.0], inner, [1.0]])
    return widths, heights, slopes


def rq_spline(x, widths, heights, slopes):
    """The spline on [-BOUND, BOUND], the identity outside: each bin's
    formula on its clipped position, the bins picked by `jnp.where`."""
    kx, ky = knots(widths, heights)
    out = x
    for k in range(BINS):
        inside = (x >= kx[k]) & (x < kx[k + 1])
        out = jnp.where(inside, bin_value(x, k, widths, heights, slopes), out)
    return out


def knots(widths, heights):
    zero = jnp.zeros(1, widths.dtype)
    kx = -BOUND + jnp.concatenate([zero, jnp.cumsum(widths)])
    ky = -BOUND + jnp.concatenate([zero, jnp.cumsum(heights)])
    return kx, ky


def bin_value(x, k, widths, heights, slopes):
    """Bin `k`'s formula at its clipped position."""
    kx, ky = knots(widths, heights)
    t = jnp.clip((x - kx[k]) / widths[k], 0.0, 1.0)
    s = heights[k] / widths[k]
    mix = t * (1 - t)
    num = heights[k] * (s * t * t + slopes[k] * mix)
    den = s + (slopes[k + 1] + slopes[k] - 2 * s) * mix
    return ky[k] + num / den


def reference_inverse(y, widths, heights, slopes):
    """The spline's inverse in float64: the bin of `y` among the knots'
    heights, then the root in [0, 1] of the bin's quadratic."""
    y = np.asarray(y, np.float64)
    kx = -BOUND + np.concatenate([[0.0], np.cumsum(widths)])
    ky = -BOUND + np.concatenate([[0.0], np.cumsum(heights)])
    k = np.clip(np.searchsorted(ky, y, side="right") - 1, 0, BINS - 1)
    w, h, d0, d1 = widths[k], heights[k], slopes[k], slopes[k + 1]
    s = h / w
    r = y - ky[k]
    a = h * (s - d0) + r * (d1 + d0 - 2 * s)
    b = h * d0 - r * (d1 + d0 - 2 * s)
    c = -s * r
    t = 2 * c / (-b - np.sqrt(b * b - 4 * a * c))
    inside = (y >= -BOUND) & (y <= BOUND)
    return np.where(inside, kx[k] + t * w, y)


def slope64(x, widths, heights, slopes):
    with x64():
        args = [jnp.asarray(v, jnp.float64) for v in (widths, heights, slopes)]
        g = jax.vmap(jax.grad(lambda u: rq_spline(u, *args)))
        return np.asarray(g(jnp.asarray(x, jnp.float64)))


raw_params = st.lists(
    st.floats(-1.5, 1.5, width=32), min_size=3 * BINS - 1, max_size=3 * BINS - 1
)
# A fixed number of points, so that every example reuses one compilation.
points = st.lists(st.floats(-3.0, 3.0, width=32), min_size=8, max_size=8)


@pytest.mark.parametrize("written", ["where", "searchsorted"])
@settings(deadline=None)
@given(raw=raw_params, xs=points)
def test_spline_against_hand_written_inverse(written, raw, xs):
    # The spline with its bins picked by `jnp.where`, or by `searchsorted`.
    spline, inverse = _SPLINES[written]
    widths, heights, slopes = spline_params(raw)
    params = [jnp.asarray(v, jnp.float32) for v in (widths, heights, slopes)]
    x = jnp.asarray(xs, jnp.float32)
    y = spline(x, *params)
    got = inverse(y, *params)
    assert_preimage(got, y, widths, heights, slopes)


_JIT_INVERSE = jax.jit(jaxinterp.inverse(rq_spline, argnums=0))


def assert_preimage(got, y, widths, heights, slopes):
    """`got` is the float64 inverse within rounding: the float32 spline and
    its parameters round, which moves the preimage by that rounding over
    the slope."""
    got = np.asarray(got, np.float64)
    want = reference_inverse(np.asarray(y), widths, heights, slopes)
    slope = np.abs(slope64(want, widths, heights, slopes))
    tol = 64 * EPS32 * (1 + np.abs(want) + np.abs(np.asarray(y)) / slope)
    assert np.all(np.abs(got - want) <= tol), (got, want, tol)


def overwriting_spline(x, widths, heights, slopes):
    """The spline as the gallery's flow writes it: each bin's formula on its
    clipped position overwrites the result from its left knot on, so
    that between a bin's clip saturating and the next knot (a few ulps
    apart: the knots are cumulative sums from `-BOUND`) the block is a
    constant sliver."""
    kx, _ = knots(widths, heights)
    inside = (x > -BOUND) & (x < BOUND)
    out = x
    for k in range(BINS):
        picked = inside & (x >= kx[k])
        out = jnp.where(picked, bin_value(x, k, widths, heights, slopes), out)
    return out


_JIT_OVERWRITING = jax.jit(jaxinterp.inverse(overwriting_spline, argnums=0))


@settings(deadline=None)
@given(raw_params, st.integers(0, 6))
def test_y_near_a_knot_has_its_preimage(raw, ulps):
    # At an interior knot the two bins' formulas meet to within rounding of
    # `BOUND` (not of the knot's height, which may be near 0), and a sliver
    # of constant value lies between them: `y` within a few ulps of the
    # knot's height has one preimage within rounding (a NaN there would
    # make a flow's log-likelihood NaN for a data point 2 ulps below a
    # knot's height).
    widths, heights, slopes = spline_params(raw)
    params = [jnp.asarray(v, jnp.float32) for v in (widths, heights, slopes)]
    kx = -BOUND + jnp.cumsum(params[0])[:-1]
    at_knots = np.asarray(overwriting_spline(kx, *params))
    bits = at_knots.view(np.int32)
    y = np.concatenate([(bits + ulps).view(np.float32), (bits - ulps).view(np.float32)])
    got = _JIT_OVERWRITING(jnp.asarray(y), *params)
    assert np.all(np.isfinite(np.asarray(got))), (y, got)
    assert_preimage(got, y, widths, heights, slopes)


@pytest.mark.slow
def test_where_spline_is_exact_method_and_composes():
    rng = np.random.default_rng(3)
    widths, heights, slopes = spline_params(rng.normal(size=3 * BINS - 1))
    params = [jnp.asarray(v, jnp.float32) for v in (widths, heights, slopes)]
    x = jnp.linspace(-3.0, 3.0, 301, dtype=jnp.float32)
    y = rq_spline(x, *params)
    report = str(jaxinterp.explain_inverse(rq_spline, x, *params, argnums=0))
    assert METHOD in report and "elementwise solve" not in report, report
    inv = jaxinterp.inverse(rq_spline, argnums=0)
    assert_preimage(jax.jit(inv)(y, *params), y, widths, heights, slopes)
    one = jax.vmap(inv, in_axes=(0, None, None, None))(y, *params)
    assert_preimage(one, y, widths, heights, slopes)
    # d x / d y = 1 / g'(x); d x / d params by the implicit function theorem.
    i = 137
    dx_dy = jax.grad(lambda v: inv(v, *params))(y[i])
    g_x = jax.grad(lambda u: rq_spline(u, *params))(x[i])
    np.testing.assert_allclose(dx_dy, 1 / g_x, rtol=1e-4)
    dx_dp = jax.grad(lambda h: inv(y[i], params[0], h, params[2]))(params[1])
    dg_dp = jax.grad(lambda h: rq_spline(x[i], params[0], h, params[2]))(params[1])
    np.testing.assert_allclose(dx_dp, -dg_dp / g_x, rtol=1e-3, atol=1e-6)
    # The ildj against the Jacobian of the forward map at the answer.
    xs, ildj = jaxinterp.inverse_and_ildj(rq_spline, argnums=0)(y[:7], *params)
    jac = jax.jacfwd(lambda u: rq_spline(u, *params))(xs)
    np.testing.assert_allclose(ildj, -np.linalg.slogdet(jac)[1], rtol=1e-4)


def searchsorted_spline(x, widths, heights, slopes):
    """The spline as libraries index it: each element's bin from
    `jnp.searchsorted` over the knots (comparing with every knot), its
    parameters gathered at that bin."""
    kx, ky = knots(widths, heights)
    inside = (x >= -BOUND) & (x <= BOUND)
    xc = jnp.clip(x, -BOUND, BOUND)
    k = jnp.searchsorted(kx, xc, side="right", method="compare_all") - 1
    k = jnp.clip(k, 0, BINS - 1)
    t = (xc - kx[k]) / widths[k]
    s = heights[k] / widths[k]
    mix = t * (1 - t)
    num = heights[k] * (s * t * t + slopes[k] * mix)
    den = s + (slopes[k + 1] + slopes[k] - 2 * s) * mix
    return jnp.where(inside, ky[k] + num / den, x)


_SPLINES = {
    "where": (rq_spline, _JIT_INVERSE),
    "searchsorted": (
        searchsorted_spline,
        jax.jit(jaxinterp.inverse(searchsorted_spline, argnums=0)),
    ),
}


_JAX = tuple(int(p) for p in jax.__version__.split(".")[:3])


@pytest.mark.xfail(
    _JAX >= (0, 12, 1),
    reason="JAX 0.12.1 stages `searchsorted`'s comparisons in a form the interval "
    "method does not read: the spline is solved numerically there (its answers "
    "are checked by the property test above)",
    strict=True,
)
def test_searchsorted_spline_is_inverted_by_intervals():
    rng = np.random.default_rng(4)
    widths, heights, slopes = spline_params(rng.normal(size=3 * BINS - 1))
    params = [jnp.asarray(v, jnp.float32) for v in (widths, heights, slopes)]
    x = jnp.linspace(-3.0, 3.0, 9, dtype=jnp.float32)
    report = str(jaxinterp.explain_inverse(searchsorted_spline, x, *params, argnums=0))
    assert METHOD in report and "elementwise solve" not in report, report


def test_decreasing_spline_and_float64():
    rng = np.random.default_rng(5)
    widths, heights, slopes = spline_params(rng.normal(size=3 * BINS - 1))

    def falling(x, w, h, d):
        return -rq_spline(x, w, h, d)

    with x64():
        params = [jnp.asarray(v, jnp.float64) for v in (widths, heights, slopes)]
        x = jnp.linspace(-3.0, 3.0, 257)
        y = falling(x, *params)
        got = jaxinterp.inverse(falling, argnums=0)(y, *params)
        np.testing.assert_allclose(got, x, atol=1e-12)


def far_knotted_fold(x):
    """A V at 0.5 (slopes -0.75 and 1.25, minimum 1/8) plus eight clamps
    far away (at 1000 to 1071): every `y` above 1/8 (below the clamps) has
    two preimages, `0.5 - d / 0.75` and `0.5 + d / 1.25` for `y = 1/8 + d`."""
    out = jnp.abs(x - 0.5) + 0.25 * x
    for k in range(8):
        out = out + 0.01 * jnp.clip(x - (1000.0 + 10 * k), 0.0, 1.0)
    return out


_JIT_FAR_KNOTTED = jax.jit(jaxinterp.inverse(far_knotted_fold))


@settings(deadline=None)
@given(st.floats(1e-6, 100.0, allow_subnormal=False))
def test_far_breakpoints_do_not_loosen_one_preimage(d):
    # The clamps' breakpoints are computed to rounding of 1000; the V's
    # two candidates are roots of its two intervals, each to rounding of
    # itself: `d` of 1e-6 apart is two preimages, NaN (a rounding scale
    # taken from the largest breakpoint accepted 0.49987 for d = 1e-4).
    report = str(jaxinterp.explain_inverse(far_knotted_fold, jnp.zeros(2)))
    assert METHOD in report, report
    y = jnp.full(2, 0.125 + d, jnp.float32)
    two = (0.5 - d / 0.75, 0.5 + d / 1.25)
    assert two[1] - two[0] > 1e-6  # not one preimage within rounding
    assert np.all(np.isnan(np.asarray(_JIT_FAR_KNOTTED(y))))
    # Its minimum has one preimage.
    np.testing.assert_allclose(_JIT_FAR_KNOTTED(jnp.full(2, 0.125)), 0.5, rtol=1e-6)


def fold(x):
    """Rises as `x` below 0, then `x^2 - x` dips to -1/4 and rises: values
    in [-1/4, 0] are taken two or three times."""
    return jnp.where(x >= 0, x * x - x, x)


def gap(x):
    """`x` below 0, `x^2 + 1` from 0: nothing maps into [0, 1)."""
    return jnp.where(x < 0, x, x * x + 1)


def flat(x):
    """`x` below 0, then `x^2` saturating at 1 from `x = 1` on."""
    return jnp.where(x < 0, x, jnp.minimum(x**2, 1.0))


def corner(x):
    """`relu(u) + relu(u)^2 + 1/2` with `u = x - 1`: 1/2 on all of `x <= 1`."""
    u = jnp.maximum(x - 1.0, 0.0)
    return u + u * u + 0.5


@pytest.mark.parametrize(
    ("f", "ys", "want"),
    [
        # Unique preimages answered; two or three preimages are NaN.
        (fold, [-2.0, -0.3, 0.75, 2.0], [-2.0, -0.3, 1.5, 2.0]),
        (fold, [-0.25, -0.1, 0.0], [np.nan] * 3),
        # A value in the gap has none; the ends of the gap do.
        (gap, [-0.5, 0.5, 0.99, 1.0, 5.0], [-0.5, np.nan, np.nan, 0.0, 2.0]),
        # Below 1 the saturating square is invertible; 1 is taken on the
        # whole stretch from 1 on, and above 1 nothing maps there.
        (flat, [-0.5, 0.25, 0.81, 1.0, 1.5], [-0.5, 0.5, 0.9, np.nan, np.nan]),
        # The corner into the constant stretch is no answer; above it, `u`
        # solves `u^2 + u = y - 1/2`.
        (corner, [0.5, -0.5, 2.5, 0.75], [np.nan, np.nan, 2.0, 1.0 + 0.20710678]),
    ],
)
def test_nan_where_no_single_preimage(f, ys, want):
    y = jnp.asarray(ys, jnp.float32)
    report = str(jaxinterp.explain_inverse(f, y))
    assert METHOD in report, report
    got = jaxinterp.inverse(f)(y)
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-6)
    ok = ~np.isnan(np.asarray(want))
    np.testing.assert_allclose(f(got)[ok], y[ok], rtol=1e-6)


@settings(deadline=None)
@given(st.lists(st.floats(-3.0, 3.0, width=32), min_size=12, max_size=12))
def test_fold_only_unique_preimages(ys):
    y = np.asarray(ys, np.float64)
    got = np.asarray(jaxinterp.inverse(fold)(jnp.asarray(y, jnp.float32)))
    # Preimages: `x = y` if `y < 0`; roots of `x^2 - x = y` that are >= 0.
    disc = 1 + 4 * y
    roots = [
        (1 + np.sqrt(np.maximum(disc, 0))) / 2,
        (1 - np.sqrt(np.maximum(disc, 0))) / 2,
    ]
    count = (y < 0).astype(int)
    for r in roots:
        count += (disc >= 0) & (r >= 0)
    count -= (disc == 0).astype(int)  # (a double root counted once)
    unique = count == 1
    want = np.where(y < 0, y, roots[0])
    near = np.abs(y + 0.25) < 1e-5  # (the fold's turn: rounding decides)
    assert np.all(np.isnan(got[~unique & ~near]))
    np.testing.assert_allclose(got[unique & ~near], want[unique & ~near], rtol=1e-5)


TEETH = 16


def zigzag(x):
    """Piecewise linear: slope `0.05 + (-1)^i` on `[i, i + 1]` for
    `i < TEETH`, `0.05` outside; 32 breakpoints, not monotone."""
    out = 0.05 * x
    for i in range(TEETH):
        out = out + (-1.0) ** i * jnp.clip(x - i, 0.0, 1.0)
    return out


def zigzag_preimages(y):
    """Every preimage of each `y` (float64 NumPy), piece by piece: the value
    at each knot, then the linear piece's root where it lies on the piece."""
    knots = np.arange(TEETH + 1, dtype=np.float64)
    at_knots = 0.05 * knots + np.concatenate(
        [[0.0], np.cumsum([(-1.0) ** i for i in range(TEETH)])]
    )
    found = [[] for _ in y]
    for j, v in enumerate(y):
        if v < at_knots[0]:  # the ray below 0, slope 0.05
            found[j].append(v / 0.05)
        if v > at_knots[-1]:  # the ray above TEETH
            found[j].append(knots[-1] + (v - at_knots[-1]) / 0.05)
        for i in range(TEETH):
            lo, hi = sorted(at_knots[i : i + 2])
            if lo <= v <= hi:
                slope = 0.05 + (-1.0) ** i
                found[j].append(knots[i] + (v - at_knots[i]) / slope)
    return found


def test_many_breakpoints_by_intervals():
    report = str(jaxinterp.explain_inverse(zigzag, jnp.zeros(4)))
    assert METHOD in report, report
    # Just below 0 the only preimage is on the ray of slope 0.05; the root
    # of `[0, 1]`'s piece lies 1e-6 outside it, which is beyond rounding of
    # its end at 0 (it was judged by its end at 1: a false NaN).
    y = jnp.asarray([-1e-6, -1e-5, 1e-6], jnp.float32)
    want = [xs[0] for xs in zigzag_preimages(np.asarray(y, np.float64))]
    got = jaxinterp.inverse(zigzag)(y)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@settings(deadline=None)
@given(st.lists(st.floats(-2.0, 3.0, width=32), min_size=16, max_size=16))
def test_many_breakpoints_not_monotone(ys):
    """Not monotone: every interval's candidates per element (one interval
    at a time); the answer where `y` has one preimage, NaN where several.
    A candidate counts if it lies in its interval within `16 eps` of the
    interval's larger end (it is computed from a point inside the interval),
    so a `y` within that rounding (times the slope) of a knot's value may
    also be NaN: a documented false NaN (`docs/concepts.md`)."""
    y = np.asarray(ys, np.float32)
    got = np.asarray(jaxinterp.inverse(zigzag)(jnp.asarray(y)))
    at_knots = zigzag(jnp.arange(TEETH + 1, dtype=jnp.float32))
    near = np.min(np.abs(y[:, None] - np.asarray(at_knots)[None]), axis=1)
    rounding = 16 * EPS32 * (TEETH + 1) * 1.05
    for j, xs in enumerate(zigzag_preimages(y.astype(np.float64))):
        distinct = np.unique(np.round(np.asarray(xs), 4))
        if np.isnan(got[j]) and near[j] <= rounding:
            continue
        if len(distinct) == 1:
            np.testing.assert_allclose(got[j], distinct[0], rtol=1e-4, atol=1e-4)
        elif len(distinct) > 1 and np.ptp(distinct) > 1e-3:
            assert np.isnan(got[j]), (y[j], xs, got[j])


def test_per_element_knots_try_every_interval():
    """Knots that differ between elements: no lookup, every interval's
    candidates per element."""
    rng = np.random.default_rng(11)
    table = [spline_params(rng.normal(size=3 * BINS - 1)) for _ in range(6)]

    def batched(x, widths, heights, slopes):
        return jax.vmap(rq_spline)(x, widths, heights, slopes)

    params = [jnp.asarray(np.stack(p), jnp.float32) for p in zip(*table, strict=True)]
    x = jnp.asarray(rng.uniform(-3, 3, 6), jnp.float32)
    y = batched(x, *params)
    got = jaxinterp.inverse(batched, argnums=0)(y, *params)
    for i in range(6):
        assert_preimage(got[i : i + 1], y[i : i + 1], *table[i])


def test_not_taken_where_a_predicate_is_not_monotone():
    """`sin(x) > 0` changes at many points no chain of monotone steps gives:
    the block is left to the other methods."""

    def wavy(x):
        return jnp.where(jnp.sin(x) > 0, x * x * x + x, x * x * x + 2 * x)

    report = str(jaxinterp.explain_inverse(wavy, jnp.linspace(-1, 1, 5)))
    assert METHOD not in report, report


def tfp_softsign(x):
    """Softsign as TFP writes it: `sign(x)` where `1 + |x|` would round
    to `|x|`."""
    a = jnp.abs(x)
    return jnp.where(a >= 1e20, jnp.sign(x), x / (1.0 + a))


def softsign_by_sign(x):
    return x / (1.0 + x * jnp.sign(x))


# Compiled once for all examples.
_JIT_SIGN_INVERSES = {
    f: jax.jit(jaxinterp.inverse(f)) for f in (tfp_softsign, softsign_by_sign)
}


@pytest.mark.parametrize("f", [tfp_softsign, softsign_by_sign])
@settings(deadline=None, max_examples=25)
@given(ys=st.lists(st.floats(-1.0, 1.0, width=32), min_size=12, max_size=12))
def test_sign_is_a_breakpoint(f, ys):
    """`sign(u)` is -1, 0 or 1 by a comparison of `u` with 0: piecewise
    constant, a breakpoint at `x = 0` (TFP's `Softsign` was a numerical
    solve for its `sign` case). Against `y / (1 - |y|)` in float64; NaN
    where `y = +-1`, which the float32 map takes on a whole ray."""
    y = np.asarray(ys, np.float32)
    report = str(jaxinterp.explain_inverse(f, jnp.asarray(y)))
    assert METHOD in report, report
    got = np.asarray(_JIT_SIGN_INVERSES[f](jnp.asarray(y)))
    y64 = y.astype(np.float64)
    edge = np.abs(y64) == 1.0
    assert np.all(np.isnan(got[edge])), got
    want = y64[~edge] / (1 - np.abs(y64[~edge]))
    # (`y` near 1 carries its rounding, `eps / (1 - |y|)^2`, into `x`; XLA's
    # CPU code flushes subnormal `y` to 0.)
    slack = 4 * EPS32 / (1 - np.abs(y64[~edge])) ** 2 + np.finfo(np.float32).tiny
    err = np.abs(got[~edge] - want)
    assert np.all(err <= 1e-5 * np.abs(want) + slack), (y[~edge], got[~edge], want)


def test_a_jump_through_sign_has_two_preimages_where_it_overlaps():
    """`x - 0.5 sign(x)` jumps down by 1 at 0: `y` in `(-0.5, 0.5)` is taken
    twice (NaN), `0` is the value at the jump itself and once more on
    either side (NaN); outside, one preimage."""

    def f(x):
        return x - 0.5 * jnp.sign(x)

    y = jnp.array([-2.0, -0.25, 0.0, 0.25, 0.75, 3.0], jnp.float32)
    got = np.asarray(jaxinterp.inverse(f)(y))
    want = np.array([-2.5, np.nan, np.nan, np.nan, 1.25, 3.5], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
