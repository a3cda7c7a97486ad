"""The elementwise solver's tiers (`jaxinterp/_inverse/_numerical/_solve.py`).

`_find_roots` decides most elements in a fused first pass and runs its later
tiers (Newton rounds, then the full search) only for what is left. These
tests hold it to the full search (`_search`, a different algorithm:
bracketing plus safeguarded Newton from scratch) and to closed forms, over
maps whose elements need each tier.
"""

from __future__ import annotations

import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import abs_no_formula, run_python
from hypothesis import given, settings, strategies as st

import jaxinterp
from jaxinterp._inverse import _blocks
from jaxinterp._inverse._numerical import _lazy, _solve
from jaxinterp.testing import compare_with_reference

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods


# Softsign written so that no exact method inverts it (`abs_no_formula`:
# `|x|` and `x * sign(x)` are case splits of the piecewise and interval
# methods), so these tests exercise the numerical solver.
def softsign(x):
    return x / (1 + abs_no_formula(x))


def logit(x):  # defined on (0, 1) only: Newton steps leave the domain
    # (`abs_no_formula(x)`, not `x`, in the second term: written so, logit
    # is not the logarithm of a linear-fractional map, which has a formula.)
    return jnp.log(x) - jnp.log1p(-abs_no_formula(x))


def cubic(x):
    return x**3 + x


def sinh_arcsinh(x):
    return jnp.sinh(1.3 * jnp.arcsinh(x) + 0.2)


def steep(x):  # steep far out: x * g'(x) overflows float32 beyond |x| of about 39
    return x * jnp.exp(x**2 / 20)


# (map, closed-form inverse or None, sampler bounds for x)
MAPS = {
    "softsign": (softsign, lambda y: y / (1 - jnp.abs(y)), (-300.0, 300.0)),
    "logit": (logit, jax.nn.sigmoid, (0.002, 0.998)),
    "cubic": (cubic, None, (-50.0, 50.0)),
    "sinh_arcsinh": (
        sinh_arcsinh,
        lambda y: jnp.sinh((jnp.arcsinh(y) - 0.2) / 1.3),
        (-30.0, 30.0),
    ),
    "steep": (steep, None, (-8.5, 8.5)),
}


# Compiled once per map (one shape throughout: `SIZE` elements).
SIZE = 16
_TIERED = {
    name: jax.jit(ft.partial(_solve._find_roots, g)) for name, (g, *_) in MAPS.items()
}
_FULL = {name: jax.jit(ft.partial(_solve._search, g)) for name, (g, *_) in MAPS.items()}


def _xs(data, bounds, label="x"):
    low, high = (float(np.float32(b)) for b in bounds)
    values = data.draw(
        st.lists(st.floats(low, high, width=32), min_size=SIZE, max_size=SIZE),
        label=label,
    )
    return jnp.asarray(values, jnp.float32)


def _tolerance(g, x):
    """How far two preimages within rounding of `y = g(x)` may be apart:
    a few ulps of `y` through `1 / g'(x)`, plus a few ulps of `x`."""
    slope = jax.vmap(jax.grad(g))(x)
    eps = float(jnp.finfo(jnp.float32).eps)
    y = g(x)
    return 64 * eps * (jnp.abs(y) + jnp.abs(x * slope)) / jnp.abs(slope) + 8 * eps * (
        1 + jnp.abs(x)
    )


@given(st.data())
def test_tiers_agree_with_the_full_search(data):
    name = data.draw(st.sampled_from(sorted(MAPS)), label="map")
    g, _, bounds = MAPS[name]
    x = _xs(data, bounds)
    y = g(x)
    got = np.asarray(_TIERED[name](y))
    full = np.asarray(_FULL[name](y))
    # A plateau: float32 `g` is flat around a tiny nonzero `x` (`y`'s ulp is
    # much wider than `x`'s near 0; JAX 0.7's `asinh` there), so `y` has an
    # interval of preimages, which the full search may decline (NaN). The
    # tiers may answer there, with a point `g` maps to `y` exactly.
    xs = np.asarray(x)
    flat = (xs != 0) & (
        (np.asarray(g(x * (1 - 2**-4))) == np.asarray(y))
        | (np.asarray(g(x * (1 + 2**-4))) == np.asarray(y))
    )
    declined = np.isnan(full)
    assert not (declined & ~flat).any(), (x, full)
    np.testing.assert_array_equal(np.isnan(got)[~declined], declined[~declined])
    close = np.abs(got - full) <= np.asarray(_tolerance(g, x))
    assert np.all(close[~declined]), (x, got, full)
    answered = declined & ~np.isnan(got)
    assert np.all(np.asarray(g(jnp.asarray(got)))[answered] == np.asarray(y)[answered])


@pytest.mark.parametrize("name", [k for k, v in sorted(MAPS.items()) if v[1]])
def test_inverse_matches_the_closed_form_eager_jit_vmap_and_grad(name):
    g, closed_form, (low, high) = MAPS[name]
    # Points across the range, the far ones needing the later tiers.
    x = jnp.linspace(low, high, 61, dtype=jnp.float32)
    y = g(x)
    batch = jnp.stack([y, g(x / 2)])  # both in the image
    compare_with_reference(
        jaxinterp.inverse(g),
        closed_form,
        (y,),
        rtol=2e-3,
        atol=1e-4,
        vmap_args=(batch,),
        compiled=True,
    )


def test_each_tier_is_needed_by_some_map():
    # The fixture above is only worth its name if the later tiers run (in
    # float32; float64 takes more Newton steps a round):
    # softsign far out needs more Newton rounds than the first pass takes,
    # and logit near its ends needs the full search.
    x = jnp.linspace(-300.0, 300.0, 1001, dtype=jnp.float32)
    y = softsign(x)
    first = _solve._fast(softsign, y)
    assert np.isnan(np.asarray(first)).any()
    x = jnp.linspace(0.002, 0.998, 1001, dtype=jnp.float32)
    y = logit(x)
    rounds = _solve._rounds(logit, y, lambda y, start: jnp.full_like(y, jnp.nan))
    assert np.isnan(np.asarray(rounds)).any()
    np.testing.assert_allclose(_solve._find_roots(logit, y), x, rtol=1e-4)


def test_one_far_element_among_many_reaches_the_later_tiers():
    # The test for "some element needs a later tier" reduces over every
    # element; XLA's CPU `max` over a large array can lose a NaN, a `sum`
    # cannot. One element far out (the first tier leaves it) among 2**18.
    x = jnp.linspace(-4.0, 4.0, 2**18, dtype=jnp.float32).at[12345].set(5000.0)
    y = softsign(x)
    got = jax.jit(jaxinterp.inverse(softsign))(y)
    np.testing.assert_allclose(got, y / (1 - jnp.abs(y)), rtol=1e-3)
    assert np.isnan(np.asarray(_solve._fast(softsign, y)))[12345]


def test_a_block_with_a_custom_jvp_call_gathers_its_undecided_elements(monkeypatch):
    """`jnp.logaddexp` is a `custom_jvp` function, bound whole with a body
    typed at the elements' shape. Its undecided elements (`y` off the
    image) were solved with all the others (gathering them raised "select
    cases must have the same shapes"): TFP's `Softfloor` took 7 s for 10^6
    elements. Where the block is replayed on the gathered elements, the
    call's body now runs equation by equation (`_blocks._reshaped_call`),
    so they are gathered apart; the values are unchanged."""
    gathered = []
    real = _lazy._gathered
    monkeypatch.setattr(_lazy, "_gathered", lambda *a: gathered.append(1) or real(*a))

    def smooth_softsign(x):
        return x / (1.0 + jnp.logaddexp(x, -x))

    x = jnp.linspace(-3, 3, 400, dtype=jnp.float32)
    y = smooth_softsign(x).at[::50].set(1.5)
    got = jaxinterp.inverse(smooth_softsign)(y)
    assert gathered
    off = np.zeros(400, bool)
    off[::50] = True
    assert np.all(np.isnan(got[off]))
    np.testing.assert_allclose(got[~off], x[~off], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(smooth_softsign(got[~off]), y[~off], rtol=1e-6)
    # The derivative by the implicit function theorem, through the call's
    # own rule: 1 / g'(x).
    slope = jax.vmap(jax.grad(smooth_softsign))(got[~off])
    dx = jax.grad(lambda y: jnp.nansum(jaxinterp.inverse(smooth_softsign)(y)))(y)
    np.testing.assert_allclose(dx[~off], 1 / slope, rtol=1e-4)


def test_an_operand_holding_one_value_is_the_same_map_for_every_element():
    """A constant the program broadcast to the elements' shape (TFP's
    `Softfloor` compares with `tf.constant(0.)` through a `where`) is a
    known operand of that shape; the block was then taken to differ per
    element: no table of starts, no check of the map's folds, the grid
    checked element by element (`Softfloor` at 10^4 elements: 7 ms, now
    0.8 ms). It is now the same map as with the scalar, to the bit."""
    n = 5000
    x = jnp.linspace(-4.0, 4.0, n, dtype=jnp.float32)
    c = jnp.full((n,), 0.3, jnp.float32)

    def with_array(x):
        return x + c * jnp.sin(x)

    def with_scalar(x):
        return x + 0.3 * jnp.sin(x)

    y = with_scalar(x)
    got = jax.jit(jaxinterp.inverse(with_array))(y)
    want = jax.jit(jaxinterp.inverse(with_scalar))(y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(got, x, atol=2e-6)


def test_outside_the_image_is_nan_in_every_tier():
    y = jnp.array([0.5, 1.5, -2.0, 0.999, jnp.nan])
    got = jax.jit(lambda y: _solve._find_roots(softsign, y))(y)
    want = jnp.array([1.0, jnp.nan, jnp.nan, 999.0, jnp.nan])
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_vmap_runs_a_later_tier_for_one_member_only_where_needed():
    def scaled(x, a):
        return x / (a + abs_no_formula(x)) + 0.01 * x

    # The second member has a root far out (about 2900): later tiers.
    y = jnp.array([[0.5, 0.2, 0.9], [0.3, 30.0, -0.4]])
    a = jnp.array([1.0, 2.0])
    inv = jaxinterp.inverse(scaled, argnums=0)
    got = jax.vmap(inv)(y, a)
    loop = jnp.stack([inv(y[i], a[i]) for i in range(2)])
    np.testing.assert_allclose(got, loop, rtol=1e-5)
    np.testing.assert_allclose(scaled(got, a[:, None]), y, rtol=1e-5, atol=1e-6)


def scaled(x, a):
    return x / (a + abs_no_formula(x))


_scaled_inverse = jax.jit(jaxinterp.inverse(scaled, argnums=0))


@given(st.floats(0.5, 3.0, width=32), st.data())
def test_a_traced_scalar_parameter_checks_the_grid_like_a_constant(a, data):

    x = _xs(data, (-50.0, 50.0))
    y = scaled(x, a)
    traced = _scaled_inverse(y, jnp.float32(a))
    np.testing.assert_allclose(traced, a * y / (1 - jnp.abs(y)), rtol=1e-3, atol=1e-5)


def test_a_traced_scalar_parameter_that_makes_the_map_turn_gives_nan():
    def quadratic(x, a):  # x**2 + a*x turns at -a/2: not injective
        return x * x + a * x

    inv = jax.jit(jaxinterp.inverse(quadratic, argnums=0))
    got = inv(jnp.array([0.5, 2.0, 6.0]), jnp.float32(1.0))
    assert np.isnan(np.asarray(got)).all(), got


def test_the_uniform_grid_check_matches_the_loop():
    maps = [
        softsign,
        logit,
        cubic,
        lambda x: x / (1 - x),  # a pole: rises on both sides
        lambda x: x * x,
        lambda x: x + 2 * jnp.sin(x),
        lambda x: -jnp.expm1(-x) * jnp.exp(-0.7 * jnp.exp(-x)),
    ]
    for shape in [(1,), (7,), (3, 5), (200,)]:
        for g in maps:
            loop = _solve.monotone_on_grid(g, shape, jnp.float32)
            once = _solve.monotone_on_grid(g, shape, jnp.float32, uniform=True)
            np.testing.assert_array_equal(loop, once)


def _bisect64(g, y, low, high):
    """Preimages of `y` under an increasing `g` by bisection in float64
    (NumPy), a reference computed without the solver."""
    y = np.asarray(y, np.float64)
    low, high = np.full_like(y, low), np.full_like(y, high)
    for _ in range(200):
        mid = low / 2 + high / 2
        up = np.asarray(g(mid)) > y
        low, high = np.where(up, low, mid), np.where(up, mid, high)
    return low / 2 + high / 2


def test_a_steep_map_far_from_the_starts_matches_bisection():
    # From the best fixed start (2), Newton's first step for y near 69
    # lands near x = 40, where `g(x)` is about 4e36 and `x * g'(x)`
    # overflows float32: a rounding tolerance of inf once accepted it.
    x = jnp.linspace(-8.0, 8.0, 4001, dtype=jnp.float32)
    y = steep(x)
    got = np.asarray(jax.jit(jaxinterp.inverse(steep))(y))
    want = _bisect64(lambda v: v * np.exp(v**2 / 20), y, -9.0, 9.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@given(st.floats(-8.0, 8.0, width=32), st.floats(30.0, 40.75, width=32))
def test_a_far_point_where_the_tolerance_overflows_is_not_accepted(x, far):
    # `g(far)` is beyond 1e21 and `g(x)` below 200: not within rounding,
    # however large `far * g'(far)` (inf in float32 from about 39.5, while
    # `g'(far)` is finite up to about 40.8).
    y = steep(jnp.full((4,), x, jnp.float32))
    candidate = jnp.full((4,), far, jnp.float32)
    assert np.isnan(np.asarray(_solve._accepted(steep, y, candidate, False))).all()
    assert np.isnan(np.asarray(_solve._accepted(steep, y, candidate, True))).all()


def root_plus(x):  # defined for x >= 0 only
    return jnp.sqrt(x) + x


_root_plus_inverse = jax.jit(jaxinterp.inverse(root_plus))


@given(
    st.lists(
        st.floats(float(np.float32(1e-7)), float(np.float32(1e-3)), width=32),
        min_size=8,
        max_size=8,
    )
)
def test_a_neighbour_outside_the_domain_is_no_extremum(xs):
    # Near 0 the neighbour below `x` (at `x - sqrt(eps)`) is outside the
    # domain: NaN, which the extremum test counts as neither side (it
    # compares through `min` and `max`, which must keep a NaN).
    y = root_plus(jnp.asarray(xs, jnp.float32))
    got = np.asarray(_root_plus_inverse(y), np.float64)
    # The closed form: sqrt(x) is the positive root of s**2 + s - y.
    s = (np.sqrt(1 + 4 * np.asarray(y, np.float64)) - 1) / 2
    np.testing.assert_allclose(got, s * s, rtol=1e-5)


@pytest.mark.parametrize(
    "f, y",
    [
        (lambda x: x - 1e-6 * x * x, [2.0e5, 2.4e5]),  # turns at 5e5
        (lambda x: x * jnp.exp(-x / 1e5), [1.0e4, 3.0e4]),  # turns at 1e5
    ],
)
def test_a_map_that_turns_beyond_two_to_the_fourteen_is_not_solved_as_monotone(f, y):
    """The grid reaches the dtype's largest powers of two: a map that turns
    far out takes these values twice, so no preimage is picked (NaN, or a
    refusal when it takes every value twice)."""
    try:
        got = jaxinterp.inverse(f)(jnp.asarray(y))
    except jaxinterp.NotInvertibleError as err:
        assert "not monotone" in str(err)
    else:
        assert np.isnan(np.asarray(got)).all(), got


_KNOTS_X = jnp.array([-3.0, -1.0, 0.0, 2.0, 3.0])
_KNOTS_Y = jnp.array([-4.0, -1.0, 0.0, 1.0, 4.0])


def _spline_with_overlapping_tails(x):
    """A piecewise-linear spline on [-3, 3] onto [-4, 4], identity outside:
    it jumps at +-3, so values in (3, 4) are taken twice."""
    i = jnp.clip(jnp.searchsorted(_KNOTS_X, x) - 1, 0, 3)
    inside = (x >= -3) & (x <= 3)
    slope = (_KNOTS_Y[i + 1] - _KNOTS_Y[i]) / (_KNOTS_X[i + 1] - _KNOTS_X[i])
    return jnp.where(inside, _KNOTS_Y[i] + slope * (x - _KNOTS_X[i]), x)


@pytest.mark.parametrize(
    "f, twice, once",
    [
        # Drops from 2 to 1 at x = 1, between grid points: (1, 2] twice.
        (lambda x: jnp.where(x > 1, x * x, 2 * x), [1.5, 2.0], [0.5, 9.0]),
        (lambda x: jnp.where(x > 1, x + jnp.sin(x) / 2, 2 * x), [1.5], [0.5, 9.0]),
        (_spline_with_overlapping_tails, [3.5, -3.5], [0.5, 9.0]),
    ],
)
def test_a_jump_between_grid_points_is_seen(f, twice, once):
    """A piecewise map whose cases switch between two grid points may jump
    there: the switch is located (bisection on the discrete choices) and
    sampled either side, so a value taken twice gives NaN, not one preimage;
    a value taken once is still solved."""
    try:
        f(jnp.asarray(twice))
    except NotImplementedError as err:  # `searchsorted` under the future flags
        pytest.skip(f"plain JAX fails this program: {err}")
    try:
        got = jaxinterp.inverse(f)(jnp.asarray(twice))
    except jaxinterp.NotInvertibleError:
        # JAX 0.7 stages `searchsorted` so that the spline is no per-element
        # block: refused, which is no wrong answer either.
        assert f is _spline_with_overlapping_tails
        return
    assert np.isnan(np.asarray(got)).all(), got
    ys = jnp.asarray(once)
    x = jaxinterp.inverse(f)(ys)
    np.testing.assert_allclose(f(x), ys, rtol=1e-5)


_QUOTIENT_OPERAND = st.floats(-1e3, 1e3, width=32)


@given(
    a=_QUOTIENT_OPERAND,
    b=_QUOTIENT_OPERAND.filter(lambda b: abs(b) > 1e-3),
    da=_QUOTIENT_OPERAND,
    db=_QUOTIENT_OPERAND,
)
def test_the_solvers_quotient_is_div_with_the_same_derivatives(a, b, da, db):
    """`_blocks.quotient` (the division the solver's maps evaluate, with a
    derivative written with one division fewer) has `div`'s value exactly,
    and its first and second derivatives within rounding, with either
    operand's tangent zero too."""
    a, b, da, db = (jnp.float32(v) for v in (a, b, da, db))
    q, dq = jax.jvp(_blocks.quotient, (a, b), (da, db))
    r, dr = jax.jvp(jax.lax.div, (a, b), (da, db))
    assert q == r
    np.testing.assert_allclose(dq, dr, rtol=1e-5, atol=1e-5 * (abs(da) + abs(db)))
    np.testing.assert_allclose(
        jax.jvp(lambda a: _blocks.quotient(a, b), (a,), (da,))[1], da / b, rtol=1e-6
    )
    np.testing.assert_allclose(
        jax.jvp(lambda b: _blocks.quotient(a, b), (b,), (db,))[1],
        jax.jvp(lambda b: a / b, (b,), (db,))[1],
        rtol=1e-5,
        atol=1e-6,
    )
    hess = jax.hessian(_blocks.quotient, argnums=(0, 1))(a, b)
    ref = jax.hessian(jax.lax.div, argnums=(0, 1))(a, b)
    np.testing.assert_allclose(np.array(hess), np.array(ref), rtol=1e-4, atol=1e-6)


@settings(max_examples=10)
@given(
    s=st.floats(-2.0, 2.0, width=32),
    c=st.floats(-2.0, 2.0, width=32),
    xs=st.lists(st.floats(0.015625, 3.0, width=32), min_size=4, max_size=4),
)
def test_a_root_at_the_edge_of_a_constant_stretch_is_nan(s, c, xs):
    # `relu(u) + relu(u)**3 + c` is `c` for every `u <= 0`: a root found at
    # the corner (slope 1 on its right) is one of a stretch of preimages, so
    # NaN, not the corner. (With `u * u` the map is piecewise quadratic,
    # inverted interval by interval: `test_inverse_intervals.py`.)
    # (The corner and the constant are known arguments: compiled once.)
    x = s + jnp.asarray(xs, jnp.float32)
    y = jnp.concatenate([_relu_cubic(x, s, c), jnp.array([c, c - 1.0], jnp.float32)])
    got = np.asarray(_RELU_CUBIC_INVERSE(y, s, c))
    np.testing.assert_allclose(got[:-2], x, rtol=1e-4, atol=1e-4)
    assert np.isnan(got[-2:]).all(), got


def _relu_cubic(x, s, c):
    u = jnp.maximum(x - s, 0.0)
    return u + u * u * u + c


_RELU_CUBIC_INVERSE = jax.jit(jaxinterp.inverse(_relu_cubic, argnums=0))


def test_the_relu_cubic_is_an_elementwise_solve():
    y = jnp.linspace(-1.0, 3.0, 6)
    report = str(jaxinterp.explain_inverse(_relu_cubic, y, 0.5, -0.25, argnums=0))
    assert "(elementwise solve)" in report, report


def test_the_edge_of_a_plateau_through_sign_is_nan():
    # `x + |x|` (`abs_no_formula`: for the solver) is `2x` for `x > 0` and 0
    # for `x <= 0`.
    f = lambda x: x + abs_no_formula(x)  # noqa: E731
    got = np.asarray(jax.jit(jaxinterp.inverse(f))(jnp.array([0.0, 2.0, -1.0])))
    assert np.isnan(got[[0, 2]]).all(), got
    np.testing.assert_allclose(got[1], 1.0, rtol=1e-6)


def test_a_map_that_rounds_to_steps_is_not_a_plateau():
    # `(32 + k max(x, -10)) - 32` in float32 takes steps of ulp(32) = 3.8e-6,
    # one per 6.9e-4 of `x`: between one and four of the corner test's steps
    # (sqrt(eps) = 3.5e-4). A root may repeat `g(x)` one step away on one
    # side and not the other, which is rounding, not a stretch of preimages
    # (TFP's `Softfloor(0.05)` at y = -2e-5 is such a root). The corner at
    # -10, into the constant stretch `x <= -10`, is NaN.
    def f(x):  # (`x` read twice, so a block: its `sin` term rounds away)
        return (32.0 + 0.0055 * jnp.maximum(x, -10.0)) - 32.0 + 1e-12 * jnp.sin(x)

    x = jnp.linspace(0.0, 1.0, 401, dtype=jnp.float32)
    y = jnp.concatenate([f(x), f(jnp.array([-10.0, -12.0], jnp.float32))])
    got = jaxinterp.inverse(f)(y)
    assert "(elementwise solve)" in str(jaxinterp.explain_inverse(f, y))
    assert not np.isnan(np.asarray(got[:-2])).any()
    np.testing.assert_array_equal(f(got[:-2]), y[:-2])  # a preimage each
    assert np.isnan(np.asarray(got[-2:])).all(), got[-2:]


def test_an_empty_array_comes_back_empty():
    # (The rounding a solved value inherits took the largest element of
    # `y`: a reduction with no identity on an empty array raised.)
    def f(x, a):
        return x + a * jnp.tanh(3.0 * x - 0.5)

    for got in (
        jax.jit(jaxinterp.inverse(f, argnums=0))(jnp.zeros((0,), jnp.float32), 0.2),
        jaxinterp.inverse(lambda x: f(x, 0.2))(jnp.zeros((0, 3), jnp.float32)),
    ):
        assert got.size == 0 and got.dtype == jnp.float32
    x, ildj = jaxinterp.inverse_and_ildj(lambda x: f(x, 0.2))(
        jnp.zeros((0,), jnp.float32)
    )
    assert x.shape == (0,) and float(ildj) == 0.0


def test_an_operand_holding_one_value_finds_the_same_folds_as_the_scalar():
    """`x - c tanh(100 (x - 0.3))` folds between the grid points 0.25 and
    0.5: every `y` near 0.3 has three preimages. With `c` an array holding
    0.02 once per element, the map counts as the same for every element,
    and the enclosures of its slope must run on the scalar (a JAX array
    made inside the inverse's trace was a value of that trace: the search
    failed and the folds went unseen, the answer one of three preimages)."""
    n = 50
    x = jnp.linspace(0.2, 0.4, n, dtype=jnp.float32)
    c = jnp.full((n,), 0.02, jnp.float32)

    def with_array(x):
        return x - c * jnp.tanh(100 * (x - 0.3))

    def with_scalar(x):
        return x - 0.02 * jnp.tanh(100 * (x - 0.3))

    got = np.asarray(jaxinterp.inverse(with_array)(with_array(x)))
    want = np.asarray(jaxinterp.inverse(with_scalar)(with_scalar(x)))
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).sum() > 0
    # Where an answer is given, it is the one preimage.
    ok = ~np.isnan(got)
    np.testing.assert_allclose(got[ok], np.asarray(x)[ok], atol=1e-5)


def test_a_constant_holding_one_value_inside_a_jit_body():
    """A `jit` body closing over an array of the elements' shape that holds
    one value: the same map for every element. Replayed at another shape
    (the enclosures' scalars, the later tiers' gathered elements) the
    constant is its scalar: it raised "operands could not be broadcast
    together" (while tracing, and in the run-time fold search), and a fold
    with a traced operand went unseen."""
    n = 400
    k = jnp.full((n,), 0.5, jnp.float32)

    @jax.jit
    def wave(x):
        return k * jnp.sin(x)

    def f(x):
        return x + wave(x)

    x = jnp.linspace(-3, 3, n, dtype=jnp.float32)
    # Undecided elements (NaN, far out) go to the later tiers, gathered.
    y = f(x).at[::50].set(jnp.nan).at[7].set(3e4)
    got = np.asarray(jaxinterp.inverse(f)(y))
    assert np.isnan(got[::50]).all()
    np.testing.assert_allclose(f(got[7]), 3e4, rtol=1e-6)
    rest = np.ones(n, bool)
    rest[::50] = rest[7] = False
    np.testing.assert_allclose(got[rest], np.asarray(x)[rest], atol=1e-5)

    m = 50
    steep = jnp.full((m,), 100.0, jnp.float32)

    @jax.jit
    def step(x):
        return jnp.tanh(steep * (x - 0.3))

    def folds(x, c):  # folds between the grid points 0.25 and 0.5 for c = 0.02
        return x - c * step(x)

    xs = jnp.linspace(0.2, 0.4, m, dtype=jnp.float32)
    inverse = jax.jit(jaxinterp.inverse(folds, argnums=0))
    c = jnp.float32(0.02)
    assert np.isnan(np.asarray(inverse(folds(xs, c), c))).all()
    c = jnp.float32(0.001)  # monotone
    np.testing.assert_allclose(inverse(folds(xs, c), c), xs, atol=1e-6)


def _inverse_and_runs(g, y):
    """`jit(inverse(g))(y)`, and the runs where its plateau-edge test runs
    (`_block_numeric._unproven`, called once)."""
    from jaxinterp._inverse._numerical import _block_numeric

    captured = []
    real = _block_numeric._unproven

    def spy(*args):
        captured.append(real(*args))
        return captured[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_block_numeric, "_unproven", spy)
        got = np.asarray(jax.jit(jaxinterp.inverse(g))(y))
    (runs,) = captured
    return got, runs


@settings(max_examples=10, deadline=None)
@given(
    c=st.floats(-3.0, 3.0, width=32),
    s=st.floats(0.125, 2.0, width=32),
    x0=st.lists(st.floats(-6.0, 6.0, width=32), min_size=1, max_size=8),
)
def test_the_edge_of_a_plateau_is_nan_where_the_test_runs_lazily(c, s, x0):
    # Constant for `x >= c`: `y = g(c)` has every `x >= c` as a preimage.
    # The enclosures prove the map moves away from the corner, so the edge
    # test runs only if some root lies in a run about it (`_unproven`).
    def g(x):  # (`min`: at `c` the slope is not 0, half of the left side's)
        u = jnp.minimum(x, c)
        return u + s * u * u * u

    x0 = np.asarray(x0, np.float32)
    below = x0[x0 < c - 1e-3]
    y = jnp.concatenate([g(jnp.asarray(below)), g(jnp.float32(c))[None]])
    got, runs = _inverse_and_runs(g, y)
    assert runs is not None and any(lo <= c <= hi for lo, hi in runs)
    assert np.isnan(got[-1])
    np.testing.assert_allclose(got[:-1], below, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("count, size", [(40, 64), (150, 256), (600, 1024)])
def test_the_plateau_test_gathers_its_roots_in_the_smallest_size_that_holds_them(
    count, size
):
    # `count` roots in the run about the corner at 0.5 (`[0.49965, inf)`),
    # single preimages all, among 4,096: the edge test runs on them only,
    # gathered 64, 256 (`_lazy._MIDDLE`) or a chunk (1,024 here) at a time.
    def g(x):
        u = jnp.minimum(x, 0.5)
        return u + u * u * u

    inside = np.linspace(0.4997, 0.49995, count, dtype=np.float32)
    assert np.unique(inside).size == count
    x = np.concatenate(
        [np.linspace(-3.0, 0.49, 4096 - count, dtype=np.float32), inside]
    )
    y = jnp.concatenate([g(jnp.asarray(x)), g(jnp.float32(0.5))[None]])
    sizes = []
    real = _lazy._gathered

    def spy(index, *args):
        sizes.append(index.shape[0])
        return real(index, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_lazy, "_gathered", spy)
        got, runs = _inverse_and_runs(g, y)
    assert any(lo <= 0.4997 and 0.5 <= hi for lo, hi in runs)
    assert size in sizes
    np.testing.assert_allclose(got[:-1], x, rtol=2e-5, atol=2e-5)
    assert np.isnan(got[-1])


def _soft_staircase(x):
    # Continuous and increasing, written through `floor` (TFP's `Softfloor`
    # is so): the enclosures leave a run about each step, and more than
    # `_block_numeric._FEW_RUNS` of them are looked up by a sorted search.
    k = jnp.floor(x)
    lo, hi = jax.nn.sigmoid(-2.0), jax.nn.sigmoid(2.0)
    return k + (jax.nn.sigmoid(4.0 * (x - k - 0.5)) - lo) / (hi - lo)


def test_the_edge_of_a_plateau_is_nan_among_many_runs():
    from jaxinterp._inverse._numerical import _block_numeric as numeric

    def g(x):  # constant from 4.5 on (its slope there not 0: `min`)
        return _soft_staircase(jnp.minimum(x, 4.5))

    x = jnp.linspace(-3.0, 4.0, 4096, dtype=jnp.float32)
    y = jnp.concatenate([g(x), g(jnp.float32(4.5))[None], g(x[:3] + 9.0)])
    got, runs = _inverse_and_runs(g, y)
    assert runs is not None and numeric._FEW_RUNS < len(runs) <= numeric._MAX_RUNS
    assert any(lo <= 4.5 <= hi for lo, hi in runs)
    # Every root where the map moves; NaN at the plateau (its edge and the
    # values the plateau takes beyond 4.5: all the plateau's value).
    np.testing.assert_allclose(got[:4096], x, rtol=2e-5, atol=2e-5)
    assert np.isnan(got[4096:]).all(), got[4096:]


def test_a_root_beside_a_plateau_holding_every_start_is_found():
    # Constant from -2 on: the fixed starts (0, +-1/2, +-1, +-2) and `y`
    # all lie on the plateau, with slope 0 there. The search stepped right
    # from them for ever (NaN); a step that moves nothing now turns it round.
    def g(x):
        u = jnp.minimum(x, -2.0)
        return u + u * u * u

    x = jnp.asarray([-3.0, -2.5, -2.1, -5.0, -40.0], jnp.float32)
    got = jax.jit(jaxinterp.inverse(g))(g(x))
    np.testing.assert_allclose(got, x, rtol=2e-6)


@settings(max_examples=20, deadline=None)
@given(
    ends=st.lists(st.floats(-5.0, 5.0, width=32), min_size=1, max_size=300),
    x=st.lists(st.floats(-6.0, 6.0, width=32), min_size=1, max_size=50),
)
def test_the_unrolled_search_counts_the_ends_at_or_below_as_numpy_does(ends, x):
    from jaxinterp._inverse._numerical._block_numeric import _at_or_below

    ends = np.sort(np.asarray(ends, np.float32))
    x = np.concatenate([np.asarray(x, np.float32), ends])
    got = np.asarray(_at_or_below(ends, jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.searchsorted(ends, x, side="right"))


def test_the_numerical_methods_are_loaded_only_when_a_map_needs_them():
    """`import jaxinterp` and a map inverted exactly load no module of the
    numerical methods (`jaxinterp/_inverse/_numerical/`); the first map
    solved numerically loads them, and is inverted."""
    out = run_python(
        """
        import sys
        import jax.numpy as jnp
        import jaxinterp

        def loaded():
            return sorted(m for m in sys.modules if "._numerical" in m)

        print(loaded())
        print(float(jaxinterp.inverse(lambda x: jnp.exp(2.0 * x) + 1.0)(3.0)))
        print(loaded())
        g = lambda x: x + 0.5 * jnp.tanh(x)
        x = jaxinterp.inverse(g)(g(jnp.float32(0.75)))
        print(float(x), "._numerical._solve" in " ".join(loaded()))
        """
    )
    before, exact, after_exact, solved = out.splitlines()
    assert before == "[]" and after_exact == "[]"
    np.testing.assert_allclose(float(exact), np.log(2.0) / 2, rtol=1e-6)
    x, loaded = solved.split()
    np.testing.assert_allclose(float(x), 0.75, rtol=1e-6)
    assert loaded == "True"
