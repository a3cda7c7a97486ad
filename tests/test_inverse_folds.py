"""Maps that fold between the solver's grid points (`_enclose.py`).

`x - a tanh(b (x - c))` with `a b > 1` turns twice within about `1 / b` of
`c`; between the grid points 0.25 and 0.5 the samples saw nothing, and the
solver answered one of three preimages. The slope's enclosure over
intervals between grid points finds such turns; `y` taken three times is
NaN, and `y` outside the fold keeps its single preimage.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import x64
from hypothesis import given, settings, strategies as st

import jaxinterp
from jaxinterp._inverse._numerical import _enclose, _solve

# --- the enclosures themselves -------------------------------------------

# A small grammar of scalar maps, each written for JAX; the enclosure must
# hold every value and slope the map takes (JAX in float64 as reference).
_UNARY = {
    "tanh": jnp.tanh,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "exp": lambda u: jnp.exp(jnp.clip(u, -30.0, 30.0)),
    "log1p_sq": lambda u: jnp.log1p(u * u),
    "hypot1": lambda u: jnp.sqrt(1 + u * u),
    "atan": jnp.arctan,
    "asinh": jnp.arcsinh,
    "sigmoid": jax.nn.sigmoid,
    "erf": jax.scipy.special.erf,
    "abs": jnp.abs,
    "cube": lambda u: u**3,
    "square": jnp.square,
    "recip": lambda u: 1 / (1 + u * u),
    "softplus": jax.nn.softplus,
    "floor": jnp.floor,
}
_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "where": lambda a, b: jnp.where(a > 0.5, a, b),
}


def _trees(depth: int, known: bool = False) -> st.SearchStrategy:
    """Maps of `x` (and, with `known`, of a known operand `k` too)."""
    leaves = [st.just(("x",)), st.floats(-2.0, 2.0).map(lambda c: ("const", c))]
    leaf = st.one_of(*leaves, *([st.just(("k",))] if known else []))
    if depth == 0:
        return leaf
    sub = _trees(depth - 1, known)
    return st.one_of(
        leaf,
        st.tuples(st.sampled_from(sorted(_UNARY)), sub).map(lambda t: ("un", *t)),
        st.tuples(st.sampled_from(sorted(_BINARY)), sub, sub).map(
            lambda t: ("bin", *t)
        ),
        st.tuples(st.floats(-3.0, 3.0), sub).map(lambda t: ("scale", *t)),
    )


def _build(tree):
    """`g(x, k=0)`."""
    kind = tree[0]
    if kind == "x":
        return lambda x, k=0.0: x
    if kind == "k":
        return lambda x, k=0.0: k + 0 * x
    if kind == "const":
        return lambda x, k=0.0, c=tree[1]: jnp.full_like(x, c)
    if kind == "un":
        f, inner = _UNARY[tree[1]], _build(tree[2])
        return lambda x, k=0.0: f(inner(x, k))
    if kind == "scale":
        inner = _build(tree[2])
        return lambda x, k=0.0, c=tree[1]: c * inner(x, k)
    f, a, b = _BINARY[tree[1]], _build(tree[2]), _build(tree[3])
    return lambda x, k=0.0: f(a(x, k), b(x, k))


@settings(deadline=None)
@given(
    tree=_trees(3),
    lo=st.floats(-6.0, 6.0),
    log_width=st.floats(-12.0, 1.0),
)
def test_the_enclosures_hold_every_value_and_slope_of_the_map(tree, lo, log_width):
    g = _build(tree)
    hi = lo + 2.0**log_width * 4
    with x64():
        slope = _enclose.Slope.of(lambda x: g(x) + 0 * x, jnp.float64)
        assert slope is not None
        got = slope.enclose(np.array([lo]), np.array([hi]))
        v_lo, v_hi, d_lo, d_hi = (
            float(a[0]) for a in (got.v_lo, got.v_hi, got.d_lo, got.d_hi)
        )
        xs = jnp.linspace(lo, hi, 65, dtype=jnp.float64)
        values = np.asarray(jax.vmap(g)(xs))
        slopes = np.asarray(jax.vmap(jax.grad(lambda x: g(x) + 0 * x))(xs))
    tol = 1e-12
    if not math.isnan(v_lo):
        spread = tol * (1 + np.abs(values))
        assert np.all(values >= v_lo - spread), (tree, lo, hi, v_lo, values.min())
        assert np.all(values <= v_hi + spread), (tree, lo, hi, v_hi, values.max())
    if not math.isnan(d_lo):
        spread = tol * (1 + np.abs(slopes))
        assert np.all(slopes >= d_lo - spread), (tree, lo, hi, d_lo, slopes.min())
        assert np.all(slopes <= d_hi + spread), (tree, lo, hi, d_hi, slopes.max())


@settings(deadline=None)
@given(
    tree=_trees(3, known=True),
    lo=st.floats(-6.0, 6.0),
    log_width=st.floats(-12.0, 1.0),
    k_lo=st.floats(-3.0, 3.0),
    k_width=st.floats(0.0, 2.0),
)
def test_the_enclosures_hold_for_every_known_operand_in_the_box(
    tree, lo, log_width, k_lo, k_width
):
    # A known operand within `[k_lo, k_hi]` (the runtime search's box of
    # per-element or traced operands): the enclosures hold for each value.
    g = _build(tree)
    hi, k_hi = lo + 2.0**log_width * 4, k_lo + k_width
    with x64():
        slope = _enclose.Slope.of(lambda x, k: g(x, k) + 0 * x, jnp.float64, [1.0])
        assert slope is not None
        got = slope.enclose(np.array([lo]), np.array([hi]), [(k_lo, k_hi)])
        v_lo, v_hi, d_lo, d_hi = (
            float(a[0]) for a in (got.v_lo, got.v_hi, got.d_lo, got.d_hi)
        )
        xs, ks = np.meshgrid(np.linspace(lo, hi, 33), np.linspace(k_lo, k_hi, 9))
        xs, ks = jnp.asarray(xs.ravel()), jnp.asarray(ks.ravel())
        values = np.asarray(jax.vmap(g)(xs, ks))
        slopes = np.asarray(jax.vmap(jax.grad(lambda x, k: g(x, k) + 0 * x))(xs, ks))
    tol = 1e-12
    if not math.isnan(v_lo):
        spread = tol * (1 + np.abs(values))
        assert np.all(values >= v_lo - spread), (tree, v_lo, values.min())
        assert np.all(values <= v_hi + spread), (tree, v_hi, values.max())
    if not math.isnan(d_lo):
        spread = tol * (1 + np.abs(slopes))
        assert np.all(slopes >= d_lo - spread), (tree, d_lo, slopes.min())
        assert np.all(slopes <= d_hi + spread), (tree, d_hi, slopes.max())


# Scalar maps of `x` through arrays (the gap of a scalar bottleneck):
# broadcasts, slices, sums and products with array operands.
_THROUGH_ARRAYS = {
    "dot": lambda x, v, w: jnp.dot(w, jnp.tanh(x * v + w)),
    "sum": lambda x, v, w: jnp.sum(jnp.sin(v - x) * w) + x,
    "slices": lambda x, v, w: jnp.sum(jnp.concatenate([v[:2] * x, jnp.exp(w[2:] + x)])),
    "matrix": lambda x, v, w: jnp.sum(jnp.outer(v, w).T @ jnp.tanh(v * x)),
    "reshape": lambda x, v, w: jnp.sum(jnp.reshape(v * x, (2, 2)).T @ w[:2]) - x**3,
}


@pytest.mark.slow
@settings(deadline=None)
@given(
    name=st.sampled_from(sorted(_THROUGH_ARRAYS)),
    v=st.lists(st.floats(-2.0, 2.0), min_size=4, max_size=4),
    w=st.lists(st.floats(-2.0, 2.0), min_size=4, max_size=4),
    lo=st.floats(-6.0, 6.0),
    log_width=st.floats(-12.0, 1.0),
)
def test_the_enclosures_hold_through_array_operands(name, v, w, lo, log_width):
    g = _THROUGH_ARRAYS[name]
    hi = lo + 2.0**log_width * 4
    v, w = np.asarray(v), np.asarray(w)
    with x64():
        slope = _enclose.Slope.of(g, jnp.float64, [v, w], shaped=True)
        assert slope is not None
        got = slope.enclose(np.array([lo]), np.array([hi]), [(v, v), (w, w)])
        xs = jnp.linspace(lo, hi, 65, dtype=jnp.float64)
        values = np.asarray(jax.vmap(lambda x: g(x, v, w))(xs))
        slopes = np.asarray(jax.vmap(jax.grad(lambda x: g(x, v, w)))(xs))
    tol = 1e-12
    if not math.isnan(got.v_lo[0]):
        spread = tol * (1 + np.abs(values))
        assert np.all(values >= got.v_lo[0] - spread), (got.v_lo, values.min())
        assert np.all(values <= got.v_hi[0] + spread), (got.v_hi, values.max())
    if not math.isnan(got.d_lo[0]):
        spread = tol * (1 + np.abs(slopes))
        assert np.all(slopes >= got.d_lo[0] - spread), (got.d_lo, slopes.min())
        assert np.all(slopes <= got.d_hi[0] + spread), (got.d_hi, slopes.max())


def test_a_sum_that_cancels_is_enclosed_as_the_constant_it_is():
    # `1 + |x| - x sign(x)` is 1 on each side of 0: exact in affine forms,
    # where interval arithmetic would widen it with the interval.
    slope = _enclose.Slope.of(lambda x: 1 + jnp.abs(x) - x * jnp.sign(x), jnp.float32)
    got = slope.enclose(np.array([3.0]), np.array([1e6]))
    assert 1 - 1e-7 < got.v_lo[0] <= 1 <= got.v_hi[0] < 1 + 1e-7
    assert -1e-7 < got.d_lo[0] <= 0 <= got.d_hi[0] < 1e-7


def test_a_primitive_without_a_rule_leaves_the_map_to_the_samplers():
    assert _enclose.Slope.of(jax.scipy.special.gammaln, jnp.float32) is None


@pytest.mark.parametrize(
    "f, turns, tol",
    [
        # (turns where `sech(100 u)**2 = 1 / 2`: `u = +-acosh(sqrt(2)) / 100`)
        (
            lambda x: x - 0.02 * jnp.tanh(100 * (x - 0.3)),
            [0.3 - 0.0088137, 0.3 + 0.0088137],
            1e-3,
        ),
        (lambda x: x**3 - 0.03 * x, [-0.1, 0.1], 3e-3),
        (lambda x: x * jnp.exp(x), [-1.0], 0.05),
    ],
)
def test_turns_between_grid_points_are_bracketed(f, turns, tol):
    found = _enclose.turn_points(
        _enclose.Slope.of(f, jnp.float32), _solve.grid(jnp.float32), jnp.float32
    )
    assert found.complete
    points = found.points
    for t in turns:
        assert np.any((points <= t) & (points >= t - tol)), (t, points)
        assert np.any((points >= t) & (points <= t + tol)), (t, points)


@pytest.mark.parametrize(
    "f",
    [
        jnp.exp,
        jnp.tanh,
        jax.nn.softplus,
        jnp.arcsinh,
        lambda x: x / (1 + jnp.abs(x)),
        lambda x: x + 0.5 * jnp.sin(x),
        lambda x: x + 1e-12 * jnp.sin(x),
    ],
)
def test_a_monotone_map_has_no_turns(f):
    # (Nor a map whose turns are rounding: `x + 1e-12 sin(x)` in float32.)
    found = _enclose.turn_points(
        _enclose.Slope.of(f, jnp.float32), _solve.grid(jnp.float32), jnp.float32
    )
    assert found.points.size == 0


# --- the inverse ------------------------------------------------------------


def _fold(a, b, c):
    return lambda x: x - a * jnp.tanh(b * (x - c))


# (Each example compiles an inverse: with the tests of the numerical methods.)
@pytest.mark.methods
@settings(deadline=None)
@given(
    c=st.floats(-50.0, 50.0),
    log_b=st.floats(0.0, 5.0),
    ab=st.floats(1.1, 20.0),
    wide=st.booleans(),
)
def test_a_folded_map_has_no_answer_where_it_takes_y_three_times(c, log_b, ab, wide):
    b = 10.0**log_b
    a = ab / b
    f = _fold(a, b, c)
    dtype = jnp.float64 if wide else jnp.float32
    with x64():
        c_ = float(np.asarray(c, dtype))
        # `y = f(c)` is taken at `c` and once either side of it.
        y_mid = f(jnp.asarray(c_, dtype))
        # Far from the fold each `y` has one preimage.
        far = jnp.asarray([c_ - 2 * a - 4 / b, c_ + 2 * a + 4 / b], dtype)
        x = jaxinterp.inverse(f)(jnp.concatenate([y_mid[None], f(far)]))
        assert np.isnan(x[0]), (a, b, c, x)
        np.testing.assert_allclose(
            x[1:], far, rtol=1e-4 if not wide else 1e-9, atol=1e-5
        )


@pytest.mark.methods
@settings(deadline=None)
@given(c=st.floats(-50.0, 50.0), log_b=st.floats(0.0, 5.0), ab=st.floats(0.0, 0.9))
def test_an_unfolded_map_of_the_same_family_is_still_inverted(c, log_b, ab):
    b = 10.0**log_b
    f = _fold(ab / b, b, c)
    x = jnp.asarray([c, c + 0.5 / b, c - 3.0 / b, c + 10.0], jnp.float32)
    got = jaxinterp.inverse(f)(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5 / b)


@pytest.mark.slow
def test_the_reported_fold_is_nan_eagerly_and_under_jit():
    # The fold found by hand: `y = 0.3` is `f(0.3)` and the value of `f` at
    # a point either side of it (near 0.281 and 0.319); the solver answered
    # 0.3.
    f = _fold(0.02, 100.0, 0.3)
    y = jnp.asarray([0.3, 0.02, 1.5], jnp.float32)
    for inv in (jaxinterp.inverse(f), jax.jit(jaxinterp.inverse(f))):
        x = inv(y)
        assert np.isnan(x[0])
        np.testing.assert_allclose(f(x[1:]), y[1:], rtol=1e-6)
        np.testing.assert_allclose(x[1:], [0.0, 1.52], atol=2e-6)
    # `f - 0.3` changes sign three times (so `y = 0.3` has three preimages).
    signs = np.sign(
        np.asarray(f(jnp.asarray([0.25, 0.29, 0.31, 0.35], jnp.float64))) - 0.3
    )
    assert signs.tolist() == [-1, 1, -1, 1]
    with pytest.raises(jaxinterp.NotInvertibleError):
        jaxinterp.inverse(f, strict=True)(y)


@pytest.mark.parametrize(
    "f, x_far",
    [
        # Folds by 4e-10 around 0 (turns at +-5.8e-4), by 4e-8 (turns at
        # +-5.5e-3): far below the samples' rounding allowance (16 eps,
        # absolute below 1), far above the rounding of these float32 values.
        (lambda x: x**3 - 1e-6 * x, 0.5),
        (lambda x: x - jnp.tanh(1.00001 * x), 2.0),
    ],
)
def test_a_fold_too_shallow_for_the_samples_is_still_seen(f, x_far):
    y = f(jnp.asarray([0.0, x_far, -x_far], jnp.float32))
    x = jaxinterp.inverse(f)(y)
    assert np.isnan(x[0]), x  # `y = 0` has three preimages
    np.testing.assert_allclose(x[1:], [x_far, -x_far], rtol=1e-5)


def test_turns_below_the_rounding_of_the_map_are_none():
    # `(32 + 0.0055 x) - 32` rounds to steps of ulp(32) = 3.8e-6; the real
    # folds of `1e-12 sin(x)` on top never show in float32.
    found = _enclose.turn_points(
        _enclose.Slope.of(
            lambda x: (32.0 + 0.0055 * x) - 32.0 + 1e-12 * jnp.sin(x), jnp.float32
        ),
        _solve.grid(jnp.float32),
        jnp.float32,
    )
    assert not found.turns


# --- known operands that differ between elements or are traced ---------------


def _fold_of(x, a, c):
    """`x - a tanh(100 (x - c))`: folds for `a > 0.01` (within about 0.01 of
    `c`, between grid points), monotone below."""
    return x - a * jnp.tanh(100.0 * (x - c))


@pytest.mark.slow
def test_a_fold_with_traced_operands_is_nan_when_it_runs():
    # `a` and `c` traced under `jit`: their values, so the fold, are known
    # only when the program runs. `y = 0.3` has three preimages for `a =
    # 0.02, c = 0.3` (the solver answered 0.3); for `a = 0.005` the same
    # family is monotone and each `y` is solved.
    inv = jax.jit(jaxinterp.inverse(_fold_of, argnums=0))
    x = jnp.asarray([0.3, 0.0, 1.5], jnp.float32)
    assert np.isnan(np.asarray(inv(_fold_of(x, 0.02, 0.3), 0.02, 0.3))).all()
    got = inv(_fold_of(x, 0.005, 0.3), 0.005, 0.3)
    np.testing.assert_allclose(got, x, atol=2e-6)
    # The same map with the operands as constants: inverted where `y` has
    # one preimage, NaN in the fold.
    fixed = jaxinterp.inverse(lambda u: _fold_of(u, 0.02, 0.3))(_fold_of(x, 0.02, 0.3))
    assert np.isnan(fixed[0])
    np.testing.assert_allclose(fixed[1:], x[1:], atol=2e-6)


@pytest.mark.slow
def test_a_fold_in_some_elements_is_nan_there_only():
    inv = jax.jit(jaxinterp.inverse(_fold_of, argnums=0))
    a = jnp.asarray([0.02, 0.005, 0.005, 0.02], jnp.float32)
    c = jnp.asarray([0.3, 0.3, 1.0, -40.0], jnp.float32)
    x = jnp.asarray([0.3, 0.3, 0.2, 3.0], jnp.float32)
    got = np.asarray(inv(_fold_of(x, a, c), a, c))
    assert np.isnan(got[[0, 3]]).all()
    np.testing.assert_allclose(got[1:3], x[1:3], atol=2e-6)
    # Under `vmap` of the inverse, over the operands.
    rows = jax.vmap(inv, in_axes=(None, 0, None))(
        _fold_of(x, 0.005, 0.3), jnp.asarray([0.005, 0.02]), 0.3
    )
    np.testing.assert_allclose(rows[0], x, atol=2e-6)
    assert np.isnan(np.asarray(rows[1])).all()


@pytest.mark.slow
def test_a_batch_of_operands_is_searched_together_under_vmap():
    # 60 parameter sets under `vmap`: one search for all of them (a box
    # holds for whichever element lies in it). Those that fold are NaN,
    # the others solved; the few whose fold is shallowest (`a` just above
    # 0.01) may be left to the samplers.
    inv = jaxinterp.inverse(_fold_of, argnums=0)
    x = jnp.asarray([0.3, 0.0, 1.5], jnp.float32)
    a = jnp.linspace(0.001, 0.03, 60, dtype=jnp.float32)
    rows = np.asarray(
        jax.jit(jax.vmap(inv, in_axes=(None, 0, None)))(_fold_of(x, 0.001, 0.3), a, 0.3)
    )
    a = np.asarray(a)
    assert np.isnan(rows[a > 0.011]).all()
    want = [
        np.asarray(inv(_fold_of(x, 0.001, 0.3), float(v), 0.3)) for v in a[a <= 0.01]
    ]
    np.testing.assert_allclose(rows[a <= 0.01], want, rtol=1e-6)
    np.testing.assert_allclose(
        _fold_of(rows[a <= 0.01], a[a <= 0.01, None], 0.3),
        np.broadcast_to(_fold_of(x, 0.001, 0.3), rows[a <= 0.01].shape),
        atol=2e-6,
    )


@pytest.mark.slow
def test_a_fold_in_one_layer_of_a_scan_is_nan():
    # Per-layer parameters traced through a `scan` of layers (the inverse
    # runs the layers backwards, the search once per layer and call): the
    # second layer folds, and the solver answered 0.3 for its `y = 0.3`.
    def flow(x, a):
        return jax.lax.scan(lambda h, a_: (_fold_of(h, a_, 0.3), None), x, a)[0]

    inv = jax.jit(jaxinterp.inverse(flow, argnums=0))
    x = jnp.asarray([0.3, 1.5], jnp.float32)
    monotone = jnp.asarray([0.005, 0.005], jnp.float32)
    np.testing.assert_allclose(inv(flow(x, monotone), monotone), x, atol=2e-6)
    folded = jnp.asarray([0.005, 0.02], jnp.float32)
    assert np.isnan(np.asarray(inv(flow(x, folded), folded))).all()


@pytest.mark.slow
def test_the_gradient_with_respect_to_traced_operands_is_kept():
    # Where the map is monotone: `dx/da = tanh(100 (x - c)) / g'(x)` by the
    # implicit function theorem.
    inv = jaxinterp.inverse(_fold_of, argnums=0)
    x0, c = jnp.float32(0.302), jnp.float32(0.3)
    y = _fold_of(x0, 0.005, c)
    got = jax.grad(lambda a: inv(y, a, c))(jnp.float32(0.005))
    slope = jax.grad(_fold_of)(x0, 0.005, c)
    np.testing.assert_allclose(got, jnp.tanh(100 * (x0 - c)) / slope, rtol=1e-3)
    assert np.isnan(jax.grad(lambda a: inv(y, a, c))(jnp.float32(0.02)))


def test_constant_operands_that_fold_for_some_elements_are_refused():
    a = np.asarray([0.005, 0.02, 0.005], np.float32)
    c = np.asarray([0.3, 0.3, 1.0], np.float32)
    with pytest.raises(
        jaxinterp.NotInvertibleError, match="not monotone for 1 of 3 elements"
    ):
        jaxinterp.inverse(lambda x: _fold_of(x, a, c))(jnp.zeros(3, jnp.float32))


@settings(deadline=None)
@given(
    u=st.floats(-2.0, -0.05),
    log_w=st.lists(st.floats(-1.0, 2.5), min_size=1, max_size=40),
)
def test_turns_per_element_are_turns(u, log_w):
    # Planar flows `x + u tanh(w x + 0.3)` turn where `u w < -1`. An
    # element flagged is one that turns; those beyond `u w < -1.5` are all
    # found within the search's budget (shallower folds may be left to the
    # samplers).
    w = 10.0 ** np.asarray(log_w)
    slope = _enclose.Slope.of(
        lambda x, w_: x + u * jnp.tanh(w_ * x + 0.3), jnp.float32, [1.0]
    )
    boxes = _enclose.turning_boxes(slope, _solve.grid(jnp.float32), jnp.float32, [w])
    turned = _enclose.inside(boxes, [w])
    assert not np.any(turned & (u * w >= -1)), w[turned & (u * w >= -1)]
    assert np.all(turned[u * w < -1.5]), w[~turned & (u * w < -1.5)]


@pytest.mark.slow
def test_integer_operands_under_strict_type_promotion():
    # The run-time search's boxes are float32; an integer operand is tested
    # against them in a type both promote to, cast explicitly.
    def f(x, n):
        return x - 0.004 * n.astype(jnp.float32) * jnp.tanh(100.0 * (x - 0.3))

    inv = jax.jit(jaxinterp.inverse(f, argnums=0))
    x = jnp.asarray([0.3, 0.3, 1.5], jnp.float32)
    n = jnp.asarray([1, 5, 5], jnp.int32)  # `a = 0.004 n`: folds for n = 5
    with jax.numpy_dtype_promotion("strict"):
        got = np.asarray(inv(f(x, n), n))
    np.testing.assert_allclose(got[0], 0.3, atol=2e-6)
    assert np.isnan(got[1:]).all()
