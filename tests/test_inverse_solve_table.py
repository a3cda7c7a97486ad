"""The elementwise solver's table of starts (`jaxinterp/_inverse/_numerical/_table.py`).

A map that is the same for every element, with constant known operands, is
sampled while tracing and its inverse tabulated by the bits of `y`; the
solver's first tier then takes one Newton step from the table's start
(`_solve._from_table`). These tests hold that path to closed forms and to
the full search, off the image and under `jit`, `vmap` and `grad`, in float32
and float64, at sizes where the table is built.
"""

from __future__ import annotations

import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import abs_no_formula
from hypothesis import given, strategies as st

import jaxinterp
from jaxinterp._inverse._numerical import _lazy, _solve, _table
from jaxinterp.testing import compare_with_reference

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

N = _table.MIN_SIZE  # the smallest size with a table


# Softsign written so that no exact method inverts it (`abs_no_formula`:
# `|x|` and `x * sign(x)` are case splits of the piecewise and interval
# methods), so these tests exercise the numerical solver.
def softsign(x):
    return x / (1 + abs_no_formula(x))


def falling(x):  # decreasing: the table is read off reversed samples
    return -x / (1 + abs_no_formula(x))


def logit(x):  # defined on (0, 1) only
    # (`abs_no_formula(x)`, not `x`, in the second term: written so, logit
    # is not the logarithm of a linear-fractional map, which has a formula.)
    return jnp.log(x) - jnp.log1p(-abs_no_formula(x))


def sinh_arcsinh(x):
    return jnp.sinh(1.3 * jnp.arcsinh(x) + 0.2)


def cubic(x):
    return x**3 + x


CLOSED = {
    "softsign": (softsign, lambda y: y / (1 - jnp.abs(y)), (-300.0, 300.0)),
    "falling": (falling, lambda y: -y / (1 - jnp.abs(y)), (-50.0, 50.0)),
    "logit": (logit, jax.nn.sigmoid, (0.002, 0.998)),
    "sinh_arcsinh": (
        sinh_arcsinh,
        lambda y: jnp.sinh((jnp.arcsinh(y) - 0.2) / 1.3),
        (-30.0, 30.0),
    ),
}


def _table_for(g, dtype=jnp.float32):
    table = _table.build(g, (N,), dtype)
    assert table is not None
    return table


def test_a_table_is_built_only_where_it_pays():
    assert _table.build(softsign, (N - 1,), jnp.float32) is None
    assert _table.build(softsign, (N,), jnp.float16) is None
    assert _table.build(lambda x: jnp.full_like(x, 2.0), (N,), jnp.float32) is None
    y = softsign(jnp.linspace(-4.0, 4.0, N))
    jaxpr = str(jax.make_jaxpr(jaxinterp.inverse(softsign))(y))
    assert "gather" in jaxpr
    small = str(jax.make_jaxpr(jaxinterp.inverse(softsign))(y[:100]))
    assert "gather" not in small


# Where the inverse is smooth on the table's cells (away from the edges of
# the image, where it is steep: the later tiers finish there).
INSIDE = {
    "softsign": (-4.0, 4.0),
    "falling": (-4.0, 4.0),
    "logit": (0.05, 0.95),
    "sinh_arcsinh": (-8.0, 8.0),
}


@pytest.mark.parametrize("name", sorted(CLOSED))
def test_the_start_is_close_and_one_step_decides_inside_the_image(name):
    g, closed_form, _ = CLOSED[name]
    x = jnp.linspace(*INSIDE[name], N, dtype=jnp.float32)
    y = g(x)
    start = _table.lookup(_table_for(g), y)
    want = closed_form(y)
    rel = np.abs(np.asarray(start - want)) / np.maximum(np.abs(np.asarray(want)), 1)
    assert np.nanmax(rel) < 2e-3
    assert np.isnan(np.asarray(start)).mean() < 1e-3
    x1 = jax.jit(lambda y: _solve._from_table(g, y, _table_for(g)))(y)
    decided = ~np.isnan(np.asarray(x1))
    assert decided.mean() > 0.99
    np.testing.assert_allclose(
        np.asarray(x1)[decided], np.asarray(want)[decided], rtol=2e-5, atol=1e-6
    )


# The tiers with a table against the full search, on arbitrary points (the
# table is the same for any shape; `N` elements only to sample it).
SIZE = 16
_TABLES = {name: _table_for(g) for name, (g, *_) in CLOSED.items()}
_TIERED = {
    name: jax.jit(ft.partial(_solve._find_roots, g, table=_TABLES[name]))
    for name, (g, *_) in CLOSED.items()
}
_FULL = {
    name: jax.jit(ft.partial(_solve._search, g)) for name, (g, *_) in CLOSED.items()
}


@given(st.data())
def test_tiers_with_a_table_agree_with_the_full_search(data):
    name = data.draw(st.sampled_from(sorted(CLOSED)), label="map")
    g, closed_form, (low, high) = CLOSED[name]
    low, high = float(np.float32(low)), float(np.float32(high))
    x = jnp.asarray(
        data.draw(
            st.lists(st.floats(low, high, width=32), min_size=SIZE, max_size=SIZE),
            label="x",
        ),
        jnp.float32,
    )
    y = g(x)
    got = np.asarray(_TIERED[name](y))
    full = np.asarray(_FULL[name](y))
    declined = np.isnan(full)
    np.testing.assert_array_equal(np.isnan(got)[~declined], declined[~declined])
    want = np.asarray(closed_form(y))
    slope = np.abs(np.asarray(jax.vmap(jax.grad(g))(jnp.asarray(want))))
    eps = float(jnp.finfo(jnp.float32).eps)
    # A few ulps of `y` through `1 / g'`, plus a few ulps of `x`.
    tol = 64 * eps * (np.abs(np.asarray(y)) + np.abs(want * slope)) / slope
    tol = tol + 8 * eps * (1 + np.abs(want))
    answered = ~np.isnan(got)
    assert np.all(np.abs(got - want)[answered] <= tol[answered]), (x, got, want)


@pytest.mark.parametrize("name", sorted(CLOSED))
def test_inverse_at_table_size_matches_the_closed_form_jit_vmap_grad(name):
    g, closed_form, (low, high) = CLOSED[name]
    # Across the range: the far points need the later tiers.
    x = jnp.linspace(low, high, N, dtype=jnp.float32)
    y = g(x)
    compare_with_reference(
        jaxinterp.inverse(g),
        closed_form,
        (y,),
        rtol=2e-3,
        atol=1e-4,
        vmap_args=(jnp.stack([y, g(x / 2)]),),
        compiled=True,
    )


def test_outside_the_image_and_non_finite_are_nan_with_a_table():
    x = jnp.linspace(-6.0, 6.0, N, dtype=jnp.float32)
    y = softsign(x)
    odd = {
        7: 1.0,
        100: 1.5,
        N // 8: -2.0,
        N // 4: jnp.inf,
        N // 2: -jnp.inf,
        N - 1: jnp.nan,
    }
    for i, v in odd.items():
        y = y.at[i].set(v)
    got = np.asarray(jax.jit(jaxinterp.inverse(softsign))(y))
    bad = np.zeros(N, bool)
    bad[list(odd)] = True
    assert np.isnan(got[bad]).all()
    want = np.asarray(y / (1 - jnp.abs(y)))
    np.testing.assert_allclose(got[~bad], want[~bad], rtol=1e-5, atol=1e-6)


def _x64():
    # (`jax.enable_x64` is newer than JAX 0.7; the experimental one is older.)
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def test_float64_with_a_table_reaches_the_dtypes_precision():
    with _x64():
        x = jnp.linspace(-40.0, 40.0, N, dtype=jnp.float64)
        y = softsign(x)
        got = jax.jit(jaxinterp.inverse(softsign))(y)
        assert got.dtype == jnp.float64
        want = y / (1 - jnp.abs(y))
        # Within a few ulps of `y` carried through `1 / g'(x) = (1 + |x|)^2`.
        eps = float(jnp.finfo(jnp.float64).eps)
        tol = 16 * eps * (1 + jnp.abs(want)) ** 2 * jnp.maximum(jnp.abs(y), eps)
        assert bool(jnp.all(jnp.abs(got - want) <= tol + 4 * eps * jnp.abs(want)))
        # The derivative by the implicit function theorem, d/dy = (1 + |x|)^2.
        grad = jax.grad(lambda y: jnp.sum(jaxinterp.inverse(softsign)(y)))(y)
        np.testing.assert_allclose(grad, (1 + jnp.abs(want)) ** 2, rtol=1e-9)


def test_the_table_reaches_the_edges_of_the_maps_domain():
    # logit's first samples stop at `1 - 2**-8` (`y = 5.5`) while float32
    # reaches `1 - 2**-24`; without samples toward the edge the table ended
    # there, and its starts near it were too coarse for one Newton step.
    x = jnp.linspace(1e-4, 1 - 1e-4, N, dtype=jnp.float32)
    y = logit(x)
    table = _table_for(logit)
    x1 = np.asarray(jax.jit(lambda y: _solve._from_table(logit, y, table))(y))
    assert not np.isnan(x1).any()
    np.testing.assert_allclose(x1, np.asarray(jax.nn.sigmoid(y)), rtol=1e-6, atol=1e-7)


def _scaled_softsign(x, a):
    return x / (a + abs_no_formula(x))


def _with_undecided(count, seed=0):
    """`y` of softsign at `N` points with `count` values off the image and
    `count` within a few ulps of its edge (the later tiers decide both)."""
    rng = np.random.default_rng(seed)
    y = np.asarray(softsign(jnp.linspace(-6.0, 6.0, N, dtype=jnp.float32))).copy()
    where = rng.choice(N, 2 * count, replace=False)
    y[where[:count]] = rng.choice([1.5, -3.0, 1.0], count)
    y[where[count:]] = rng.choice([0.9999999, -0.999999, 0.99999], count)
    return jnp.asarray(y, jnp.float32)


def _all_together(monkeypatch, fn, *args):
    """`fn(*args)` with the later tiers run on every element."""
    with monkeypatch.context() as m:
        m.setattr(_lazy, "_caps", lambda y, known: [])
        jaxinterp.clear_caches()
        return fn(*args)


# Counts on either side of each gather's size (64, then `N // 64`).
@pytest.mark.parametrize("count", [1, 64, 65, N // 64 + 1])
def test_undecided_elements_gathered_are_solved_as_all_together(monkeypatch, count):
    y = _with_undecided(count)
    solve = lambda y: jax.jit(jaxinterp.inverse(softsign))(y)  # noqa: E731
    got = np.asarray(solve(y))
    want = np.asarray(_all_together(monkeypatch, solve, y))
    _same_answers(softsign, y, got, want)
    assert np.isnan(got[np.abs(np.asarray(y)) >= 1]).all()


def _same_answers(g, y, got, want):
    """NaN at the same elements; where `g` is well conditioned (`|y| <
    0.999`) the same `x`; elsewhere (many floats `x` give the `y` at the edge
    of softsign's image, and the two may stop at different ones) an `x`
    whose `g(x)` passes the solver's loosest test, within `sqrt(eps) (1 +
    |y|)` of `y`."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    well = np.abs(np.asarray(y)) < 0.999
    np.testing.assert_allclose(got[well], want[well], rtol=1e-6)
    edge = ~well & ~np.isnan(got)
    back = np.asarray(g(jnp.asarray(got)))
    tol = np.sqrt(np.finfo(np.float32).eps) * (1 + np.abs(np.asarray(y)))
    assert np.all(np.abs(back - np.asarray(y))[edge] <= tol[edge])


def test_gathered_elements_take_their_known_operands_along(monkeypatch):
    # A known operand per element (traced: no table), under `vmap` with a
    # different number of undecided elements in each member, and `grad`.
    a = jnp.linspace(0.5, 2.0, N, dtype=jnp.float32)
    # (The second member's 600 take three chunks of `N // 64`.)
    ys = jnp.stack([_with_undecided(3, seed=1), _with_undecided(300, seed=2)])
    inv = jaxinterp.inverse(_scaled_softsign, argnums=0)
    batched = jax.jit(jax.vmap(inv, in_axes=(0, None)))
    got = np.asarray(batched(ys, a))
    want = np.asarray(_all_together(monkeypatch, batched, ys, a))
    _same_answers(lambda x: _scaled_softsign(x, a), ys, got, want)
    well = np.abs(np.asarray(ys)) < 0.999
    closed = np.asarray(a * ys / (1 - jnp.abs(ys)))
    np.testing.assert_allclose(got[well], closed[well], rtol=1e-4)
    # d x / d a through the implicit function theorem: x / a, where decided.
    y = jnp.where(jnp.abs(ys[1]) < 0.99, ys[1], 0.5)
    grad = jax.grad(lambda a: jnp.sum(inv(y, a)))(a)
    np.testing.assert_allclose(grad, y / (1 - jnp.abs(y)), rtol=1e-3)


def test_a_map_with_a_constant_per_element_inside_is_not_gathered():
    # The constant is no operand of the block, so the undecided elements
    # cannot be gathered with it: they are solved among all the elements.
    c = jnp.where(jnp.arange(N) < N // 2, 2.0, 3.0)

    def f(x):
        return x**3 + jax.jit(lambda z: z * c)(x)

    x = jnp.linspace(-2.0, 2.0, N, dtype=jnp.float32)
    y = f(x).at[5].set(jnp.nan).at[7].set(1e30)
    got = jax.jit(jaxinterp.inverse(f))(y)
    assert np.isnan(np.asarray(got)).tolist() == [i == 5 for i in range(N)]
    np.testing.assert_allclose(f(got), y, rtol=1e-5, atol=1e-5)


def _lambert_w(y):
    """The principal branch of Lambert's W (`w e^w = y`, `w >= -1`) for
    `y >= 0`, by Halley's iteration in float64: the reference for the
    inverse of `x e^x` on the values it takes once."""
    y = np.asarray(y, np.float64)
    w = np.log1p(y)
    for _ in range(40):
        e = np.exp(w)
        f = w * e - y
        w = w - f / (e * (w + 1) - (w + 2) * f / (2 * w + 2))
    return w


def test_a_map_that_turns_has_a_table_on_the_stretch_that_holds_y(monkeypatch):
    # `x e^x` turns at -1: values in (-1/e, 0) are taken twice, those >= 0
    # once (by the stretch x > -1). The table holds the inverse on that
    # stretch, and nothing where two stretches take `y`.
    def g(x):
        return x * jnp.exp(x)

    built = []
    real_build = _table.build

    def spy(*args, **kwargs):
        table = real_build(*args, **kwargs)
        built.append((args[3] if len(args) > 3 else kwargs.get("stretches"), table))
        return table

    monkeypatch.setattr(_table, "build", spy)
    y = jnp.concatenate(
        [
            jnp.geomspace(1e-3, 50.0, N - 64, dtype=jnp.float32),
            jnp.linspace(-0.3, -0.01, 64, dtype=jnp.float32),
        ]
    )
    got = np.asarray(jax.jit(jaxinterp.inverse(g))(y))
    ((stretches, table),) = built
    assert stretches is not None and table is not None
    want = _lambert_w(np.asarray(y[: N - 64]))
    np.testing.assert_allclose(got[: N - 64], want, rtol=2e-6, atol=1e-7)
    assert np.isnan(got[N - 64 :]).all()  # two preimages each
    start = np.asarray(_table.lookup(table, y))
    rel = np.abs(start[: N - 64] - want) / np.maximum(np.abs(want), 1)
    assert np.nanmax(rel) < 2e-3 and np.isnan(start[: N - 64]).mean() < 1e-3
    assert np.isnan(start[N - 64 :]).all()


def test_a_table_on_stretches_holds_nothing_where_two_take_the_value():
    # `x^2 - x`: falls to -1/4 at 1/2, then rises; every value above -1/4 is
    # taken twice, so no cell holds a start.
    def g(x):
        return x * x - x

    with jax.ensure_compile_time_eval():
        both = [(-np.inf, 0.5, -0.25, np.inf), (0.5, np.inf, -0.25, np.inf)]
        table = _table.build(g, (N,), jnp.float32, both)
    assert table is None or np.isnan(np.asarray(table.x)).all()


def stairs(x):
    # Nearly flat about each integer (slope 0.001 there): its inverse curves
    # within the table's cells, which are cut (`_table._tree`).
    return x - 0.999 * jnp.sin(2 * np.pi * x) / (2 * np.pi)


def _stairs_inverse(y):
    """The inverse of `stairs` in float64, by bisection (`stairs` is
    increasing, and within 1/(2 pi) of the identity)."""
    y = np.asarray(y, np.float64)
    lo, hi = y - 1.0, y + 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        below = mid - 0.999 * np.sin(2 * np.pi * mid) / (2 * np.pi) < y
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_cells_where_the_inverse_curves_are_cut_so_the_start_is_close(dtype):
    # Uncut, a cell about an integer holds a cube-root-shaped stretch of the
    # inverse, and its chord is off by up to 4e-2.
    with _x64():
        table = _table.build(stairs, (N,), dtype)
        assert table is not None and table.levels > 0
        assert table.x.size - 2 * (64 << 7) <= _table._MAX_REFINED
        for low, high in [(-3.0, 3.0), (3.0, 40.0), (1e-6, 1e-3)]:
            x = np.random.default_rng(0).uniform(low, high, N)
            y = stairs(jnp.asarray(x, dtype))
            want = _stairs_inverse(y)
            start = np.asarray(_table.lookup(table, y), np.float64)
            rel = np.abs(start - want) / np.maximum(np.abs(want), 1)
            assert np.max(rel) < 5e-4, (low, high, np.max(rel))


def test_with_cut_cells_one_newton_step_decides_most_roots_of_a_staircase():
    # Without cut cells a table decides about 70% of these (TFP's
    # `Softfloor(0.05)`: 28% of its benchmark's roots), leaving the rest to
    # the later tiers.
    x = jnp.asarray(np.random.default_rng(1).uniform(-3, 3, N), jnp.float32)
    y = stairs(x)
    table = _table_for(stairs)
    x1 = np.asarray(jax.jit(lambda y: _solve._from_table(stairs, y, table))(y))
    decided = ~np.isnan(x1)
    assert decided.mean() > 0.8
    want = _stairs_inverse(y)
    # Within the rounding of `y` (and of `stairs` in float32) carried
    # through the inverse's slope, up to 1000 where the steps are flat.
    eps = float(jnp.finfo(jnp.float32).eps)
    slope = 1 - 0.999 * np.cos(2 * np.pi * want)
    tol = 8 * eps * (np.abs(np.asarray(y)) + 1) / slope + 4 * eps * np.abs(want)
    assert (np.abs(x1 - want) <= tol)[decided].all()
    # The whole solve agrees with the float64 inverse. (Not within 0.06 of
    # 0, where `stairs` is a difference of two terms 1000 times its value:
    # there JAX 0.7's unoptimized XLA (`jax_disable_most_optimizations`),
    # and JAX 0.12.1's optimized XLA at -0.05, round it so coarsely that the
    # solver's tests reject some roots as plateaus, a false NaN, with or
    # without cut cells.)
    got = np.asarray(jax.jit(jaxinterp.inverse(stairs))(y))
    far = np.abs(want) > 0.06
    assert (np.abs(got - want) <= tol)[far].all()
    assert (np.isnan(got) | (np.abs(got - want) <= tol)).all()


@ft.cache
def _stairs_table():
    return _table_for(stairs)


@given(
    st.floats(-60.0, 60.0, width=32).filter(lambda x: abs(x) > 1e-6),
)
def test_a_cut_table_starts_near_the_inverse_at_any_value(x):
    # The cells' bits walked down the cut levels (`lookup`) against the
    # inverse itself, one value at a time: a sign, an exponent, a cell edge
    # or a level picked wrongly lands far from it.
    table = _stairs_table()
    y = stairs(jnp.full((1,), x, jnp.float32)) * 1.0
    want = _stairs_inverse(y)
    start = np.asarray(_table.lookup(table, y), np.float64)
    assert np.isfinite(start).all()
    # Past `|x| = 40` the samples are too sparse for the cut budget: the
    # start is within a step's width.
    bound = 5e-4 if abs(x) <= 40 else 0.05
    assert np.abs(start - want)[0] <= bound * max(abs(want[0]), 1.0)
