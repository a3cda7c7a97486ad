"""`inverse` refuses, or returns a documented NaN, rather than a wrong `x`.

Each test carries the minimal program of one class of maps where a `y` off
the image, or with several preimages, could otherwise pass for one with a
single preimage. The first two rely on a `jit` body (`jnp.take`, `jnp.where`
are jitted functions) receiving the program's constants as concrete values,
so that the `gather` and `select_n` rules can check them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tree_allclose
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import checkify

import jaxinterp
from jaxinterp import NotInvertibleError
from jaxinterp._inverse import _gram, _rounding

X0 = jnp.array([0.5, -1.0])
X1 = jnp.array([1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    "indices, reason",
    [
        # Repeated: x1[0] is never read.
        ([2, 1, 2], "`gather` indices are not a permutation of the axis"),
        # Missing: the rows read are pieces of x1 that do not cover it.
        ([2, 0], "the outputs determine some elements but not (1,) of (3,)"),
    ],
    ids=["repeated", "missing"],
)
def test_take_with_repeated_or_missing_constant_indices_is_refused(indices, reason):
    def f(x0, x1):
        return x0, jnp.take(x1, jnp.array(indices), axis=0)

    y = f(X0, X1)
    line = f.__code__.co_firstlineno + 1
    with pytest.raises(NotInvertibleError) as info:
        jaxinterp.inverse_and_ildj(f, argnums=(0, 1), example_args=(X0, X1))(y)
    message = str(info.value)
    assert "cannot recover input 1 (float32[3])" in message
    assert f"test_inverse_soundness.py:{line}" in message
    assert reason in " ".join(message.split())


def test_take_with_a_constant_permutation_is_still_inverted():
    def f(x0, x1):
        return x0, jnp.take(x1, jnp.array([2, 0, 1]), axis=0)

    (x0, x1), ildj = jaxinterp.inverse_and_ildj(
        f, argnums=(0, 1), example_args=(X0, X1)
    )(f(X0, X1))
    tree_allclose((x0, x1), (X0, X1))
    tree_allclose(ildj, jnp.zeros(()))


def test_take_with_runtime_indices_that_are_not_a_permutation_gives_nan():
    f = lambda x, idx: jnp.take(x, idx, axis=0)  # noqa: E731
    inv = jaxinterp.inverse(f, argnums=0)
    perm = jnp.array([2, 0, 1])
    tree_allclose(inv(f(X1, perm), perm), X1)
    tree_allclose(jax.jit(inv)(f(X1, perm), perm), X1)
    repeated = jnp.array([2, 1, 2])
    assert np.all(np.isnan(inv(f(X1, repeated), repeated)))
    assert np.all(np.isnan(jax.jit(inv)(f(X1, repeated), repeated)))


def test_where_with_a_constant_mask_that_drops_elements_completes_them():
    # The dropped element comes back as the constant used in its place, not
    # as anything of the original `x`; the ildj counts the kept elements.
    mask = jnp.array([True, False, True])

    def f(x):
        return jnp.where(mask, jnp.exp(x), 3.61)

    x, ildj = jaxinterp.inverse_and_ildj(f)(f(X1))
    tree_allclose(x, jnp.where(mask, X1, jnp.log(3.61)), rtol=1e-6)
    tree_allclose(ildj, -(X1[0] + X1[2]), rtol=1e-6)


def test_where_with_a_constant_mask_that_keeps_everything_is_inverted():
    def f(x):
        return jnp.where(jnp.ones(3, bool), jnp.exp(x), 3.61)

    x, ildj = jaxinterp.inverse_and_ildj(f)(f(X1))
    tree_allclose(x, X1, rtol=1e-6)
    tree_allclose(ildj, -jnp.sum(X1), rtol=1e-6)


def test_where_with_a_runtime_mask_gives_nan_exactly_where_it_drops():
    f = lambda x, keep: jnp.where(keep, x, 3.61)  # noqa: E731
    keep = jnp.array([True, False, True])
    got = jaxinterp.inverse(f, argnums=0)(f(X1, keep), keep)
    assert np.isnan(got[1]) and np.allclose(got[jnp.array([0, 2])], X1[::2])


# ---------------------------------------------------------------------------
# `strict=True`: undetermined elements raise instead of coming back as NaN.


def _where_runtime(x, keep):
    return jnp.where(keep, x, 3.61)


@settings(max_examples=20, deadline=None)
@given(keep=st.lists(st.booleans(), min_size=3, max_size=3))
def test_strict_raises_exactly_when_elements_are_undetermined(keep):
    keep = jnp.array(keep)
    y = _where_runtime(X1, keep)
    loose = jaxinterp.inverse(_where_runtime, argnums=0)(y, keep)
    strict = jaxinterp.inverse(_where_runtime, argnums=0, strict=True)
    dropped = int(np.sum(~np.asarray(keep)))
    if dropped:
        with pytest.raises(NotInvertibleError) as info:
            strict(y, keep)
        assert f"do not determine {dropped} element(s) of operand" in str(info.value)
        assert "`inverse` (strict):" in str(info.value)
        assert "test_inverse_soundness.py" in str(info.value)  # the user's line
        assert int(np.sum(np.isnan(np.asarray(loose)))) == dropped
    else:
        tree_allclose(strict(y, keep), X1)
        tree_allclose(loose, X1)


def test_strict_under_jit_is_a_checkify_check():
    keep = jnp.array([True, False, True])
    strict = jax.jit(jaxinterp.inverse_and_ildj(_where_runtime, argnums=0, strict=True))
    err, (x, _) = checkify.checkify(strict)(_where_runtime(X1, keep), keep)
    assert "do not determine 1 element(s)" in err.get()
    assert np.isnan(x[1])
    err, (x, _) = checkify.checkify(strict)(X1, jnp.ones(3, bool))
    assert err.get() is None
    tree_allclose(x, X1)
    # Without checkify, JAX itself says the check needs functionalizing.
    with pytest.raises(ValueError, match="checkify"):
        strict(X1, keep)


def test_strict_covers_zero_factors_and_runtime_gather_indices():
    scale = jnp.array([2.0, 0.0, 1.0])
    y = X1 * scale
    with pytest.raises(NotInvertibleError, match="do not determine 1 element"):
        jaxinterp.inverse(lambda x, c: x * c, argnums=0, strict=True)(y, scale)
    idx = jnp.array([0, 0, 2])
    take = lambda x, i: jnp.take(x, i, axis=0)  # noqa: E731
    with pytest.raises(NotInvertibleError, match="do not determine 3 element"):
        jaxinterp.inverse(take, argnums=0, strict=True)(take(X1, idx), idx)


def test_strict_keeps_gradients_and_the_ildj():
    keep = jnp.ones(3, bool)

    def loss(y, strict):
        x, ildj = jaxinterp.inverse_and_ildj(_where_runtime, argnums=0, strict=strict)(
            y, keep
        )
        return jnp.sum(x**2) + ildj

    tree_allclose(jax.grad(loss)(X1, True), jax.grad(loss)(X1, False))
    tree_allclose(jax.grad(loss)(X1, True), 2 * X1)


def test_a_partly_recovered_input_names_the_missing_elements():
    f = lambda x: jnp.exp(x[::2])  # noqa: E731
    with pytest.raises(NotInvertibleError) as info:
        jaxinterp.inverse(f, example_args=(jnp.ones(5),))(jnp.ones(3))
    assert (
        "input 0: the outputs determine some elements but not (1,), (3,) of (5,)"
        in (str(info.value))
    )


def test_strict_sees_nan_from_inside_checkpoint_and_jit():
    # Found by `fuzz_inverse_main.py --seed 29` (program 861): runtime gather
    # indices inside `jax.checkpoint` (`remat2` on recent JAX).
    def f(p, x):
        body = lambda a, b: jnp.take(a, jnp.array([0, 3, 1, 1]) * jnp.int32(b < 100.0))  # noqa: E731
        return jax.checkpoint(body)(x, p)

    x = jnp.array([-1.41, -0.62, 0.88, -0.55])
    y = f(jnp.float32(0.94), x)
    loose = jaxinterp.inverse(f, argnums=1, example_args=(x,))(y, 0.94)
    assert np.all(np.isnan(loose))
    strict = jaxinterp.inverse(f, argnums=1, example_args=(x,), strict=True)
    with pytest.raises(NotInvertibleError, match="do not determine 4 element"):
        strict(y, 0.94)


def test_arctan_at_its_rounded_limit_has_no_single_preimage():
    """float32 `atan` rounds to `pi/2` for every `x` beyond about 1.7e7,
    where `tan` of the rounded value is negative: NaN, not `-2.3e7`."""
    x = jnp.array([3e7, -5e7, 100.0, -0.5])
    got = jaxinterp.inverse(jnp.arctan)(jnp.arctan(x))
    assert np.isnan(np.asarray(got[:2])).all(), got
    np.testing.assert_allclose(got[2:], x[2:], rtol=1e-4)


@pytest.mark.parametrize(
    "f, y",
    [
        (lambda x: x**2, [-1.0, 4.0]),
        (jnp.sqrt, [-1.0, 2.0]),
        (lambda x: jnp.arcsin(x) * 2.0, [4.0, 0.5]),
    ],
)
def test_an_element_without_preimage_makes_the_ildj_nan(f, y):
    """The log-det of a map at a point with no preimage is undefined: the
    element is NaN, and so is the ildj (not the sum of the other terms)."""
    x, ildj = jaxinterp.inverse_and_ildj(f)(jnp.asarray(y))
    assert np.isnan(np.asarray(x[0])) and not np.isnan(np.asarray(x[1]))
    assert np.isnan(np.asarray(ildj))
    x_ok, ildj_ok = jaxinterp.inverse_and_ildj(f)(jnp.asarray(y[1:]))
    np.testing.assert_allclose(x_ok, x[1:], rtol=1e-6)
    want = -np.log(np.abs(np.asarray(jax.vmap(jax.grad(f))(x_ok))))
    np.testing.assert_allclose(ildj_ok, want.sum(), rtol=1e-5)


def test_softplus_of_a_small_value_is_not_rounded_to_minus_infinity():
    """`logaddexp(x, c) = y` is `x = y + log(1 - exp(c - y))`: `exp` rounds
    to 1 for `y - c` below float32's eps, where `log1p(-exp(.))` gave
    `x = -inf` (softplus(x) = 1e-8) or an `x` 19% off (1e-7);
    `log(-expm1(.))` there."""
    y = jnp.array([1e-6, 1e-7, 1e-8, 1e-20, 0.5, 30.0])
    x, ildj = jaxinterp.inverse_and_ildj(jax.nn.softplus)(y)
    y64 = np.asarray(y, np.float64)
    np.testing.assert_allclose(x, np.log(np.expm1(y64)), rtol=1e-5)
    np.testing.assert_allclose(jax.nn.softplus(x), y, rtol=1e-5)
    np.testing.assert_allclose(ildj, -np.log(-np.expm1(-y64)).sum(), rtol=1e-5)
    dx = jax.grad(lambda y: jaxinterp.inverse(jax.nn.softplus)(y).sum())(y)
    np.testing.assert_allclose(dx, 1.0 / -np.expm1(-y64), rtol=1e-5)
    below = jaxinterp.inverse(lambda x: jnp.logaddexp(x, 2.0))(jnp.array([1.0]))
    assert np.isnan(np.asarray(below)).all()


def _scan_carry_before(reverse):
    def f(x):
        c, ys = jax.lax.scan(lambda c, xi: (c * 2 + xi, c), 1.0, x, reverse=reverse)
        return ys, c

    return f


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_carry_solved_back_must_equal_its_known_initial_value(reverse):
    """`ys` holding the carry before each step repeats the known initial
    carry: a `y` with another value there is off the image (the carry solved
    back from it was dropped for the known one, unchecked)."""
    f = _scan_carry_before(reverse)
    x = jnp.array([1.0, 2.0, -1.0])
    # The carry before each step, by hand (JAX 0.12's `Scan3`, under the
    # future flags, ignores `reverse`: then there is nothing to test).
    carry, want = 1.0, []
    for xi in (x[::-1] if reverse else x).tolist():
        want.append(carry)
        carry = carry * 2 + xi
    want = want[::-1] if reverse else want
    if not np.allclose(f(x)[0], want):
        pytest.skip("plain JAX's scan ignores `reverse` here (the future flags)")
    inv = jaxinterp.inverse(f, example_args=(jnp.zeros(3),))
    np.testing.assert_allclose(inv(f(x)), x, atol=1e-6)
    ys, c = f(x)
    first = 0 if not reverse else -1
    bad = (ys.at[first].add(1.0), c)
    assert np.isnan(np.asarray(inv(bad))).all()
    with pytest.raises(NotInvertibleError):
        jaxinterp.inverse(f, example_args=(jnp.zeros(3),), strict=True)(bad)


def test_loop_carries_known_throughout_are_checked_against_y():
    """A carry updated from known values only (a counter, a constant's
    doubling) is a result too: `y` must hold its final value."""

    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, c: (c[0] * 2, c[1] + 1.0), (x, 1.0))

    inv = jaxinterp.inverse(f, example_args=(jnp.float32(0.0),))
    np.testing.assert_allclose(inv(f(jnp.float32(1.5))), 1.5)
    assert np.isnan(np.asarray(inv((jnp.float32(8.0), jnp.float32(5.0)))))

    def g(x):
        (i, c), ys = jax.lax.scan(
            lambda c, xi: ((c[0] + 1, c[1] + xi), c[1]), (0, 0.0), x
        )
        return i, ys, c

    inv = jaxinterp.inverse(g, example_args=(jnp.zeros(3),))
    x = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(inv(g(x)), x)
    i, ys, c = g(x)
    assert np.isnan(np.asarray(inv((i + 1, ys, c)))).all()
    with pytest.raises(NotInvertibleError):
        jaxinterp.inverse(g, example_args=(jnp.zeros(3),), strict=True)((i + 1, ys, c))


def test_triangular_solve_with_a_zero_on_the_diagonal_has_no_finite_image():
    """`solve_triangular(L, x)` divides by `L`'s diagonal: with a zero there
    every forward value is inf or NaN, so a finite `y` is off the image (the
    rule multiplied back, `L @ y`, a plausible finite `x`)."""

    def f(x, m):
        return jax.scipy.linalg.solve_triangular(m, x, lower=True)

    inv = jaxinterp.inverse_and_ildj(f, argnums=0)
    singular = jnp.array([[1.0, 0.0], [3.0, 0.0]])
    x, ildj = inv(jnp.array([1.0, 3.0]), singular)
    assert np.isnan(np.asarray(x)).all() and np.isnan(np.asarray(ildj))
    x, _ = jax.jit(inv)(jnp.array([1.0, 3.0]), singular)
    assert np.isnan(np.asarray(x)).all()
    fine = jnp.array([[1.0, 0.0], [3.0, 2.0]])
    x0 = jnp.array([0.5, -1.0])
    x, ildj = inv(f(x0, fine), fine)
    np.testing.assert_allclose(x, x0, rtol=1e-6)
    np.testing.assert_allclose(ildj, np.log(2.0), rtol=1e-6)


@settings(deadline=None)
@given(
    x=st.lists(st.floats(-4, 4, width=32), min_size=3, max_size=3),
    moved=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_a_linear_block_with_more_results_is_nan_only_where_they_disagree(x, moved):
    # Each element's real and imaginary parts give it twice: an element whose
    # imaginary part is moved off the image is NaN, the others are answered.
    def f(v):
        return lax.complex(2.0 * v, 3.0 * v)

    x = jnp.asarray(x, jnp.float32)
    y = f(x) + 1j * jnp.where(jnp.asarray(moved), 0.5 + jnp.abs(x), 0.0)
    got = np.asarray(jaxinterp.inverse(f, example_args=(x,))(y))
    assert np.isnan(got[np.asarray(moved)]).all(), got
    keep = ~np.asarray(moved)
    np.testing.assert_allclose(got[keep], np.asarray(x)[keep], rtol=1e-6, atol=1e-6)


def test_real_to_complex_conversion_checks_the_imaginary_part():
    """A real value converted to complex has imaginary part 0: the inverse
    kept the real part of any `y` (a non-Hermitian `fft` of a real signal,
    `exp(i x)` off the unit circle gave finite `x`)."""
    x0 = jnp.array([0.3, -1.0, 2.0, 0.5])
    fft = jaxinterp.inverse(jnp.fft.fft, example_args=(x0,))
    np.testing.assert_allclose(fft(jnp.fft.fft(x0)), x0, atol=1e-6)
    assert np.isnan(np.asarray(fft(jnp.fft.fft(x0).at[1].add(0.5)))).any()

    def g(x):
        return jnp.exp(1j * x.astype(jnp.complex64))

    y = jnp.array([jnp.exp(1j * 1.0), 2 * jnp.exp(1j * 2.0)], jnp.complex64)
    x = jaxinterp.inverse(g, example_args=(jnp.zeros(2),))(y)
    np.testing.assert_allclose(x[0], 1.0, rtol=1e-6)
    assert np.isnan(np.asarray(x[1]))

    def h(x):
        return x * (1 + 1j)

    y = jnp.array([1 + 1j, 1 - 1j], jnp.complex64)
    x = jaxinterp.inverse(h, example_args=(jnp.zeros(2),))(y)
    assert x[0] == 1.0 and np.isnan(np.asarray(x[1]))
    with pytest.raises(NotInvertibleError):
        jaxinterp.inverse(h, example_args=(jnp.zeros(2),), strict=True)(y)


@pytest.mark.parametrize(
    "f, gap, on_image, x_on_image",
    [
        # Jumps by 1e-3 at 100: nothing maps into (100, 100.001].
        (lambda x: jnp.where(x > 100.0, x + 0.001, x), 100.0005, 100.002, 100.001),
        # Jumps by 1e-4 at 0.5 (a comparison turned into a number).
        (lambda x: x + 1e-4 * (x > 0.5), 0.50005, 0.7001, 0.7),
        # Jumps by 1e-3 at each integer (a `floor`).
        (lambda x: x + 1e-3 * jnp.floor(x), 1.0005, 1.501, 1.5),
    ],
    ids=["where", "comparison", "floor"],
)
def test_a_small_jump_of_a_solved_map_is_no_root(f, gap, on_image, x_on_image):
    """The numerical solve accepts a bracket a few ulps wide whose residual
    is below `sqrt(eps) * (1 + |y|)` (its allowance for maps that round
    intermediates larger than `y`) only where no discrete choice of the map
    (a comparison, a bin, a `floor`) changes across the bracket: a `y`
    inside a jump smaller than that allowance, which no `x` gives, is NaN,
    not the jump's position."""
    x = jaxinterp.inverse(f)(jnp.array([gap, on_image]))
    assert np.isnan(np.asarray(x[0])), x
    np.testing.assert_allclose(x[1], x_on_image, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "f, twice, once, x_once, crowded",
    [
        # Drops by 0.5 at 3 (between the grid points 2 and 4): the values
        # in [2.5, 3) are taken on [2.5, 3) and on [3, 3.5).
        (lambda x: x - 0.5 * jnp.floor(x / 3), 2.75, 3.75, 4.25, True),
        (lambda x: x - 0.5 * (x // 3), 2.9, 3.75, 4.25, True),
        (lambda x: x - 0.5 * jnp.sign(x - 3), 3.25, 6.0, 6.5, False),
        (lambda x: x - 0.5 * jnp.ceil(x / 3), 5.0, 3.25, 4.25, True),
    ],
    ids=["floor", "floor_divide", "sign", "ceil"],
)
def test_a_float_valued_step_between_grid_points_is_seen(
    f, twice, once, x_once, crowded
):
    """`floor`, `ceil`, `round` and `sign` are discrete choices with a float
    result: a map built from them may drop between two grid points, where
    the grid's monotonicity check does not see it. Their switches are
    located as a comparison's are, so a `y` with two preimages is NaN.
    (`floor(x / 3)` switches more often between two grid points than they
    are located, from about `2**6` on, where the map drops every 3 too: it
    is refused there; `sign` switches once.)"""
    if crowded:
        with pytest.raises(NotInvertibleError, match="not monotone"):
            jaxinterp.inverse(f)(jnp.array([twice, once]))
        return
    x = jaxinterp.inverse(f)(jnp.array([twice, once]))
    assert np.isnan(np.asarray(x[0])), x
    np.testing.assert_allclose(x[1], x_once, rtol=1e-6)


def _drops_at_zero(s):
    """`s - 0.3 * floor(s / 2.41)` once, in a loop (so no elementwise block):
    it drops by 0.3 at 0, so the values in [0, 0.3) are taken twice."""

    def body(c):
        return c[0] + 1, c[1] - 0.3 * jnp.floor(c[1] / 2.41)

    return jax.lax.while_loop(lambda c: c[0] < 1, body, (0, s))[1]


@pytest.mark.slow
def test_a_piecewise_affine_row_of_a_sequential_block_is_not_taken_as_affine():
    """A sequential block solves a level by one exact Newton step only where
    its row is affine. A row only piecewise affine (a `floor` inside) has a
    second derivative of 0 at both probe points, and one step would give one
    of its two preimages, which maps back to `y`: such a row goes to the
    elementwise solver, which sees the map turn (NaN)."""

    def f(x):
        rest, s = jax.checkpoint(
            lambda a: (a[1:], jnp.sum(a * jnp.array([-1.0, 1.0])))
        )(x)
        return rest, _drops_at_zero(s)

    x = jnp.array([0.1, 0.0])  # s = -0.1 gives 0.2, and so does s = 0.2
    inv = jaxinterp.inverse(f, example_args=(x,))
    got = np.asarray(inv(f(x)))
    assert np.isnan(got).all(), got
    # A `y` with one preimage is solved or NaN, never another `x`.
    x = jnp.array([-1.0, 0.0])
    got = np.asarray(inv(f(x)))
    assert np.isnan(got).all() or np.allclose(got, x, atol=1e-5), got


def test_a_nan_solved_off_the_image_is_rechecked_through_released_steps(monkeypatch):
    """`where(mask, x, 0)` discards `x[1]` and `x[3]`; completed with 0, the
    product `x[1] * x[3]` solved backwards for `x[1]` gives `-0.35 / 0`:
    NaN, no preimage. A NaN is excused as an element left undetermined
    (`0 / 0`) only once the step that gave it is recomputed, through any
    step in between whose value has been released (the squeeze here: its
    record outlives the value), so the answer is NaN, not `[0.3, 0, 1.1,
    0]`, which `f` does not map to `y`. (Elements another step reads are
    not completed at all; the recheck is tested with that check off.)"""
    mask = jnp.array([True, False, True, False])

    def f(x):
        return jnp.where(mask, x, 0.0), x[1] * x[3]

    x = jnp.array([0.3, -0.7, 1.1, 0.5])
    with pytest.raises(NotInvertibleError, match="Blocked at `jit`, `mul`"):
        jaxinterp.inverse(f, example_args=(x,))(f(x))
    monkeypatch.setattr(_gram, "_reads", lambda *args: False)
    inv = jaxinterp.inverse_and_ildj(f, example_args=(x,))
    got, ildj = inv(f(x))
    assert np.isnan(np.asarray(got)).all() and np.isnan(ildj), got
    # A `y` on the image of the completion: `x[1] * x[3] = 0` holds for it.
    on = x.at[1].set(0.0).at[3].set(0.0)
    got, ildj = inv(f(x.at[1].set(0.0)))
    tree_allclose(got, on)
    tree_allclose(ildj, jnp.zeros(()))


# A map that differs between elements only through an array a `jit` body in
# the block closes over (no operand of the block): `x**3 - x` for the second
# half of the elements turns. The grid check laid its points over the
# elements as if the map were the same for all (one point per element), so
# only the first ones were checked, and `-0.171` came back as `0.1765`
# rather than `0.9` (it has three preimages).
_HALF = 400  # more elements than grid points: the turning ones go unchecked


def _per_element_constant(x, a):
    c = np.where(np.arange(2 * _HALF) < _HALF, 1.0, -1.0).astype(np.float32)
    return a * x**3 + jax.jit(lambda z: z * c)(x)


@pytest.mark.slow
def test_a_constant_inside_a_jit_body_makes_the_map_per_element():
    x = jnp.full((2 * _HALF,), 0.9)
    y = _per_element_constant(x, 1.0)
    with pytest.raises(NotInvertibleError, match="not monotone"):
        jaxinterp.inverse(lambda x: _per_element_constant(x, 1.0))(y)
    # With a traced known operand: checked per element, NaN where it turns.
    got = jax.jit(jaxinterp.inverse(_per_element_constant, argnums=0))(y, 1.0)
    assert jnp.allclose(got[:_HALF], 0.9, atol=1e-5)
    assert jnp.isnan(got[_HALF:]).all()


@pytest.mark.slow
def test_a_monotone_map_with_a_constant_inside_a_jit_body_is_inverted():
    # (Each element's map rises: the grid is not laid over the elements as
    # if they were one map, which would turn.)
    c = np.linspace(0.5, 2.0, 7).astype(np.float32)
    f = lambda x: x**3 + jax.jit(lambda z: z * c)(x)  # noqa: E731
    x = jnp.linspace(-2.0, 2.0, 7)
    got, ildj = jaxinterp.inverse_and_ildj(f)(f(x))
    assert jnp.allclose(got, x, atol=1e-5)
    assert jnp.allclose(ildj, -jnp.linalg.slogdet(jax.jacfwd(f)(x))[1], atol=1e-4)


# A piecewise map whose cases overlap, with its switch a known operand
# passed at run time (or a constant that differs between elements):
# `where(x > a, x * x, 2 * x)` takes the values in `(1, 2]` twice for
# `a = 1`. At the grid points alone it rises; the run-time check also
# samples either side of where the choices change between grid points, so
# `1.5`, whose preimages are `0.75` and `sqrt(1.5)`, is NaN.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("f", "refused"),
    [
        # (Piecewise quadratic: inverted interval by interval, NaN where `y`
        # has two preimages, not refused.)
        (lambda x, a: jnp.where(x > a, x * x, 2 * x), False),
        # A small jump back.
        (lambda x, a: jnp.where(x > a, x - 1e-3, x) + x**3, True),
    ],
    ids=["square", "small_jump"],
)
def test_overlapping_cases_switching_at_a_known_operand_are_not_solved(f, refused):
    y = jnp.array([1.5, 1.9995, 2.0])
    a = jnp.float32(1.0)
    got = jax.jit(jaxinterp.inverse(f, argnums=0))(y, a)
    assert jnp.isnan(got).all()
    # Enough elements that the grid is laid out over them (a scalar `a`:
    # the same map for every element).
    got = jax.jit(jaxinterp.inverse(f, argnums=0))(jnp.resize(y, 400), a)
    assert jnp.isnan(got).all()
    per_element = jnp.array([1.0, 1.0, 1.05])  # (a constant, per element)
    if not refused:
        assert jnp.isnan(jaxinterp.inverse(lambda x: f(x, per_element))(y)).all()
        return
    with pytest.raises(NotInvertibleError, match="not monotone"):
        jaxinterp.inverse(lambda x: f(x, per_element))(y)
    # An array holding one value is the same map for every element, as the
    # scalar: inverted where `y` has one preimage (`1.5`, below the jump).
    scalar = jaxinterp.inverse(lambda x: f(x, 1.0))(y)
    same = jaxinterp.inverse(lambda x: f(x, jnp.ones(3)))(y)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(scalar))
    assert np.isnan(np.asarray(same)[1:]).all()
    np.testing.assert_allclose(f(same[0], 1.0), y[0], rtol=1e-6)


def _kinked(x, a):
    return jnp.where(x > a, 2 * x - a, x) + 0.1 * jnp.tanh(x)


_kinked_inverse = jax.jit(jaxinterp.inverse(_kinked, argnums=0))


@pytest.mark.slow
@given(a=st.floats(-3.0, 3.0), x=st.floats(-4.0, 4.0))
def test_a_continuous_piecewise_map_with_a_known_switch_is_still_inverted(a, x):
    xs = jnp.array([x, a - 1.0, a + 1.0], jnp.float32)
    got = _kinked_inverse(_kinked(xs, a), jnp.float32(a))
    assert jnp.allclose(got, xs, atol=1e-4, rtol=1e-4)


def test_overlapping_cases_are_not_solved_inside_a_shard_map_body():
    # (Inside a `shard_map` body the solver's values vary over the mesh: it
    # was built without the block's discrete choices there.)
    try:
        from jax import shard_map
    except ImportError:  # JAX < 0.8
        from jax.experimental.shard_map import shard_map
    from jax.sharding import NamedSharding, PartitionSpec as P

    f = lambda x, a: jnp.where(x > a, x * x, 2 * x)  # noqa: E731
    mesh = jax.make_mesh((1,), ("i",))
    body = shard_map(
        jaxinterp.inverse(f, argnums=0),
        mesh=mesh,
        in_specs=(P("i"), P()),
        out_specs=P("i"),
    )
    y = jax.device_put(jnp.array([1.21, 1.5, 1.9, 2.0]), NamedSharding(mesh, P("i")))
    got = jax.jit(body)(y, jnp.float32(1.0))
    assert jnp.isnan(got).all()


@pytest.mark.slow
def test_a_jump_back_among_more_switches_than_are_located_is_seen():
    """Between the grid points 0.5 and 0.75 the `floor` switches about 250
    times, more than the 16 located and sampled; such an interval is also
    sampled densely, so the jump back at 0.6 is seen: `y = 0.595`, which
    both `0.5944` and `0.6044` give, is refused or NaN."""

    def jump_back(x):
        return jnp.where(x > 0.6, x - 0.01, x) + 1e-6 * jnp.floor(1000 * x)

    try:
        x = jaxinterp.inverse(jump_back)(jnp.array([0.595]))
    except NotInvertibleError:
        pass
    else:
        assert np.isnan(np.asarray(x)).all(), x

    # The staircase alone rises: still inverted.
    def staircase(x):
        return x + 1e-6 * jnp.floor(1000 * x)

    y = jnp.array([0.2, 0.595, 0.9])
    x = jaxinterp.inverse(staircase)(y)
    np.testing.assert_allclose(staircase(x), y, rtol=1e-6)
    np.testing.assert_allclose(x, y - 1e-6 * np.floor(1000 * np.asarray(y)), atol=2e-6)


@pytest.mark.slow
@settings(deadline=None)
@given(
    start=st.floats(0.52, 0.72),
    width=st.floats(1e-6, 1e-3),
    operand=st.sampled_from(
        ["constant", "traced", "per element", "traced per element"]
    ),
)
def test_a_window_that_jumps_back_among_a_staircase_is_seen(start, width, operand):
    """A `floor` changes about 250 times between the grid points 0.5 and
    0.75, more often than its switches are located. Each choice's switches
    are located on their own, so the window `start < x < start + width`,
    where the map drops by 0.01, is not hidden among the staircase's: a `y`
    from inside the window, which the map also takes about 0.009 below it,
    is refused or NaN, with constant, traced and per-element operands."""
    start, width = np.float32(start), np.float32(width)

    def f(x, c):
        window = (x > c) & (x < c + width)
        # (Continuous but for the window: the `floor` only cuts `x` in two.)
        stairs = 0.001 * jnp.floor(1000 * x)
        drop = jnp.where(window, 0.01, 0.0)
        return 0.1 * jnp.sin(x) + stairs + (x - stairs) - drop

    inside = np.float32(start + width / 2)
    c = jnp.full((2,) if "per element" in operand else (), start, jnp.float32)
    y = f(jnp.array([inside, 0.3], jnp.float32), c)
    try:
        if operand.startswith("traced"):
            x = jax.jit(jaxinterp.inverse(f, argnums=0))(y, c)
        else:
            x = jaxinterp.inverse(lambda x: f(x, c))(y)
    except NotInvertibleError:
        assert not operand.startswith("traced")  # (refused only while tracing)
        return
    assert np.isnan(np.asarray(x)[0]), x


@pytest.mark.slow
@settings(deadline=None)
@given(
    centre=st.floats(0.52, 0.72),
    width=st.floats(1e-5, 1e-2),
    traced=st.booleans(),
    stairs=st.booleans(),
)
def test_a_window_written_as_one_comparison_is_seen(centre, width, traced, stairs):
    """`abs(x - c) < w` is the same (false) at both grid points 0.5 and
    0.75 around the window; the comparison is compared again at the kink of
    `abs` (at `c`), where it differs, so both edges of the window are
    located and a `y` from inside it, where the map drops back by 0.05, is
    refused or NaN (with a `floor` staircase too)."""
    centre, width = np.float32(centre), np.float32(width)

    def f(x, c):
        drop = jnp.where(jnp.abs(x - c) < width, 0.05, 0.0)
        out = x + 0.1 * jnp.sin(x) - drop
        return out + 1e-7 * jnp.floor(1000 * x) if stairs else out

    y = f(jnp.array([centre, 0.3], jnp.float32), centre)
    try:
        if traced:
            x = jax.jit(jaxinterp.inverse(f, argnums=0))(y, jnp.float32(centre))
        else:
            x = jaxinterp.inverse(lambda x: f(x, centre))(y)
    except NotInvertibleError:
        assert not traced
        return
    assert np.isnan(np.asarray(x)[0]), x


@pytest.mark.parametrize("low", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
def test_a_rounded_copy_off_the_image_is_nan(low):
    """A value held twice, once rounded to a dtype of few mantissa bits: the
    agreement check allows a few of that dtype's epsilons
    (`_rounding.LOW_PRECISION_ROUNDING`), not so many that a `y` off the image
    by 10% passes as the other path's `x`."""

    def f(x):
        return x**3, x.astype(low).astype(jnp.float32)

    rng = np.random.default_rng(0)
    # (Magnitudes from 0.05: the checks also allow 16 times the dtype's
    # smallest normal number, 1e-3 for float16.)
    x = rng.uniform(0.05, 3.0, 2000) * rng.choice([-1.0, 1.0], 2000)
    x = jnp.asarray(x, jnp.float32)
    inv = jax.jit(jax.vmap(jaxinterp.inverse(f, example_args=(x[0],))))
    y0, y1 = jax.vmap(f)(x)
    # On the image, every element comes back (no false NaN at rounding
    # boundaries of the narrow dtype) ...
    np.testing.assert_allclose(inv((y0, y1)), x, rtol=1e-6, atol=1e-6)
    # ... off it by 10% in the rounded output, or by 50% in the other (`x`
    # by 15%, many ulps of the narrow dtype), NaN.
    assert np.all(np.isnan(inv((y0, y1 * 1.1))))
    assert np.all(np.isnan(inv((y0 * 1.5, y1))))
    # Closer, what comes back is within the rounding allowed (a few of the
    # narrow dtype's epsilons, `_rounding.LOW_PRECISION_ROUNDING`).
    got = np.asarray(inv((y0 * 1.1 + 0.1, y1)))
    answered = ~np.isnan(got)
    rounded = np.asarray(jnp.asarray(got[answered]).astype(low), np.float64)
    allowed = _rounding.LOW_PRECISION_ROUNDING * float(jnp.finfo(low).eps)
    want = np.asarray(y1, np.float64)[answered]
    slack = 2 * allowed * (np.abs(rounded) + np.abs(want))
    assert np.all(np.abs(rounded - want) <= slack)


@pytest.mark.slow
@pytest.mark.parametrize("traced", [False, True], ids=["constant", "traced"])
def test_a_map_monotone_on_each_side_of_a_pole_is_not_taken_as_injective(traced):
    """`x - a / x` rises on each side of 0 and takes every value on each:
    `x` and `-a / x` give the same `y`, though each stretch is monotone. A
    second stretch of finite values fails the grid check, so both preimages
    give NaN (not `[-3.33, 0.5, -0.5]` for `[0.3, 0.5, 2]`), with the
    operand a constant or passed at run time."""
    x = jnp.asarray([0.3, 0.5, 2.0, -0.7], jnp.float32)
    if traced:
        f = lambda v, a: v - a / v  # noqa: E731
        inv = jaxinterp.inverse(f, argnums=0)
        a = jnp.float32(1.0)
        got = [inv(f(x, a), a), jax.jit(inv)(f(x, a), a)]
    else:
        f = lambda v: v - 1.0 / v  # noqa: E731
        try:
            got = [jaxinterp.inverse(f)(f(x))]
        except jaxinterp.NotInvertibleError as err:
            assert "more than once" in str(err), err
            return
    for g in got:
        assert np.all(np.isnan(np.asarray(g))), g
    # A map with a pole whose two stretches take different values (`x + 1 /
    # x**3` is not: it turns) keeps an answer where `y` has one preimage.
    h = lambda v: jnp.exp(v) - 1.0 / v  # noqa: E731  (x < 0: y > 0)
    xs = jnp.asarray([-2.0, -0.5, 0.3, 1.5], jnp.float32)
    ys = h(xs)
    back = jaxinterp.inverse(h)(ys)
    # y <= 0 has its only preimage for x > 0; y > 0 has one on each side.
    single = np.asarray(ys) <= 0
    np.testing.assert_allclose(
        np.asarray(back)[single], np.asarray(xs)[single], rtol=1e-5
    )
    assert np.all(np.isnan(np.asarray(back)[~single]))


def _dense_near(p: float, dtype) -> np.ndarray:
    """Floats either side of `p`: every float within 2**10 of it in the
    floats' order, and points approaching it from 2**-12 away down to its
    neighbours (about geometrically), sorted."""
    itype = np.int32 if np.dtype(dtype).itemsize == 4 else np.int64
    ftype = np.dtype(dtype).type

    def ordered(x):
        bits = int(np.asarray(abs(x), dtype).view(itype))
        return -bits if np.signbit(x) else bits

    def unordered(k):
        x = float(np.asarray(abs(k), itype).view(dtype))
        return -x if k < 0 else x

    k = ordered(ftype(p))
    near = [k + j for j in range(-(2**10), 2**10 + 1)]
    far = [ordered(ftype(p - 2.0**-12)), ordered(ftype(p + 2.0**-12))]
    for side in far:
        gap = side - k
        near += [k + gap // 2**j for j in range(64) if gap // 2**j]
    return np.unique(np.asarray([unordered(m) for m in near], dtype))


def _with_pole(x, c, pole):
    return x + jnp.asarray(c, x.dtype) / (x - jnp.asarray(pole, x.dtype))


@functools.cache
def _grid_check(uniform, shape, dtype):
    """The grid check of `_with_pole`, compiled once (`c` and the pole are
    arguments)."""
    from jaxinterp._inverse._numerical import _grid

    def check(c, pole):
        g = lambda x: _with_pole(x, c, pole)  # noqa: E731
        return _grid.monotone_on_grid(g, shape, dtype, uniform=uniform)

    return jax.jit(check)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(
    power=st.integers(-45, 0),
    pole=st.sampled_from([0.0, 1.0, -1.0, 2.0**-12, 0.5]),
    sign=st.sampled_from([1.0, -1.0]),
    wide=st.booleans(),
)
def test_the_grid_check_never_accepts_a_map_that_turns_near_a_pole(
    power, pole, sign, wide
):
    """`x + c / (x - p)` with a pole `p` on the solver's grid: either side
    of `p` it runs to infinity, so it turns or takes values twice unless
    `c` is so small that no float comes close enough to `p` for it to
    matter. Whatever the check answers, it is never "monotone" for a map
    whose values at the floats around `p` (every float within 2**10 of it,
    and points approaching it geometrically) are not monotone: at the grid
    alone, `x - 1e-30 / x` looks like `x`."""
    from helpers import x64

    dtype = np.float64 if wide else np.float32
    # (In float64, the smallest powers reach down to its tiny coefficients.)
    c = sign * 10.0**power * (1e-280 if wide and power < -40 else 1.0)
    with x64():
        accepted = [
            bool(np.all(_grid_check(u, shape, np.dtype(dtype).name)(c, pole)))
            for u, shape in [(True, ()), (False, (3,)), (True, (300,))]
        ]
        xs = _dense_near(pole, dtype)
        vs = np.asarray(_with_pole(jnp.asarray(xs), c, pole), np.float64)
    vs = vs[np.isfinite(vs)]
    steps = np.diff(vs)
    noise = 16 * np.finfo(dtype).eps * np.maximum(np.abs(vs[1:]), 1)
    monotone = np.all(steps >= -noise) or np.all(steps <= noise)
    assert len(set(accepted)) == 1, accepted
    # (Refusing a map that is monotone near the pole is conservative, not
    # wrong: its two sides may still overlap farther out.)
    assert not accepted[0] or monotone, (c, pole, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("traced", [False, True], ids=["constant", "traced"])
def test_a_pole_between_the_grid_and_the_floats_next_to_it_is_seen(traced):
    """`x - 1e-30 / x` (float32): at the grid's points it is `x` to the
    last bit, but next to 0 it reaches +-8.5e7, so every `y` has a second
    preimage near 0 (`y = 0.3` at `x = -3.3e-30`). The grid check locates
    where the map stops being finite by bisection and samples it on the
    way, so every element is NaN (not `x`), with the coefficient a constant
    or passed at run time."""
    x = jnp.asarray([0.3, 0.5, 2.0, -0.7], jnp.float32)
    second = -1e-30 / x  # the other preimage
    f = lambda v, a: v - a * 1e-30 / v  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(f(second, 1.0)), np.asarray(f(x, 1.0)), rtol=1e-5
    )
    if traced:
        inv = jaxinterp.inverse(f, argnums=0)
        got = [inv(f(x, 1.0), 1.0), jax.jit(inv)(f(x, 1.0), 1.0)]
    else:
        h = lambda v: f(v, 1.0)  # noqa: E731
        got = [jaxinterp.inverse(h)(h(x)), jax.jit(jaxinterp.inverse(h))(h(x))]
    for back in got:
        assert np.all(np.isnan(np.asarray(back))), back


@pytest.mark.slow
def test_a_map_that_turns_just_before_it_stops_is_not_taken_as_monotone():
    """`x + 1e-30 / (x - 1)` for `x < 1` (float64; NaN beyond) rises like
    `x` at every grid point, then turns about 1e-15 below 1 and falls by
    1e-14 to its last float: `y = 1 - 5e-15` has two preimages. With the
    coefficient passed at run time every element is NaN; as a constant,
    the map is split where it turns and `y` far from 1 keeps its single
    preimage."""
    from helpers import x64

    with x64():
        f = lambda v, a: v + a * 1e-30 / (v - 1) + jnp.sqrt(1 - v) * 0  # noqa: E731
        x = jnp.asarray([-0.7, 0.3, 0.9], jnp.float64)
        band = jnp.asarray([1 - 5e-15], jnp.float64)
        inv = jaxinterp.inverse(f, argnums=0)
        assert np.all(np.isnan(np.asarray(inv(f(x, 1.0), 1.0))))
        assert np.all(np.isnan(np.asarray(inv(band, 1.0))))
        h = lambda v: f(v, 1.0)  # noqa: E731
        const = jaxinterp.inverse(h)
        np.testing.assert_allclose(np.asarray(const(h(x))), np.asarray(x), rtol=1e-12)
        assert np.all(np.isnan(np.asarray(const(band))))


@pytest.mark.slow
def test_a_removable_singularity_on_the_grid_is_bridged():
    """`expm1(a x) / x` is not finite at 0 only: the floats next to 0 give
    about `a`, and the map rises through it, so it is solved with `a`
    passed at run time: one hole the map continues across the same way
    does not fail the grid check (the map itself is NaN at 0), and its ildj
    matches `jax.jacfwd`."""
    f = lambda v, a: jnp.expm1(a * v) / v  # noqa: E731
    x = jnp.asarray([-0.7, -0.01, 0.02, 0.5, 2.0], jnp.float32)
    a = jnp.float32(1.5)
    inv = jaxinterp.inverse_and_ildj(f, argnums=0)
    for back, ildj in [inv(f(x, a), a), jax.jit(inv)(f(x, a), a)]:
        np.testing.assert_allclose(
            np.asarray(back), np.asarray(x), rtol=2e-4, atol=1e-5
        )
        slope = jax.vmap(jax.grad(lambda v: f(v, a)))(x)
        np.testing.assert_allclose(
            float(ildj), -float(jnp.sum(jnp.log(jnp.abs(slope)))), rtol=1e-4
        )


# Maps with corners (`max`, a constant case of a `where`) and terms that
# round away, of the kinds whose plateau edges `_solve.edge_of_plateau`
# finds: `_block_numeric._unproven` skips that test where the enclosures prove the
# map moves a step away either side (`_enclose.unmoving`).
def _cornered(kind, c, s, big):
    def g(x):
        if kind == "flat beyond":
            return jnp.where(x < c, x + s * x * x * x, c + s * c * c * c)
        if kind == "rounded max":
            return (big + s * jnp.maximum(x, c)) - big + 1e-12 * jnp.sin(x)
        return x + s * jnp.maximum(x - c, 0.0) ** 2  # a kink, no plateau

    return g


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["flat beyond", "rounded max", "kink"]),
    c=st.floats(-4.0, 4.0, width=32),
    s=st.floats(0.0009765625, 2.0, width=32),
    big=st.sampled_from([0.0, 32.0, 4096.0]),
)
def test_where_the_map_is_proven_to_move_no_neighbour_repeats_its_value(
    kind, c, s, big
):
    from jaxinterp._inverse._numerical import _enclose, _solve

    g = _cornered(kind, c, s, big)
    dtype = np.float32
    with jax.ensure_compile_time_eval():
        slope = _enclose.Slope.of(g, dtype)
    assert slope is not None
    step = float(np.sqrt(np.finfo(dtype).eps))
    runs = _enclose.unmoving(slope, _solve.grid(dtype), dtype, step)
    # Dense points about the corner and on a wide grid, in float32.
    near = c + np.linspace(-0.05, 0.05, 20001)
    wide = np.geomspace(1e-6, 1e6, 20000)
    wide = np.concatenate([wide, -wide])
    x = np.unique(np.concatenate([near, wide, np.linspace(-8, 8, 20001)]).astype(dtype))
    outside = np.ones(x.shape, bool)
    for lo, hi in runs:
        outside &= ~((x >= lo) & (x <= hi))
    xs = jnp.asarray(x[outside])
    d = _solve.plateau_step(xs)
    at, below, above = g(xs), g(xs - d), g(xs + d)
    finite = np.isfinite(np.asarray(at))
    assert not np.any(np.asarray(below == at) & finite)
    assert not np.any(np.asarray(above == at) & finite)
    # The plateau's edge, where there is one, lies in a run.
    if kind != "kink":
        assert any(lo <= np.float32(c) <= hi for lo, hi in runs), runs


@pytest.mark.slow
def test_a_fold_beside_a_max_is_seen_whatever_jax_writes_its_derivative():
    # `max(x, 0) + x - 0.05 tanh(100 (x - 0.3))` folds between the grid
    # points 0.25 and 0.5: the values in (0.582, 0.618) have three
    # preimages. JAX 0.10 and older write the derivative of `max` with a
    # comparison `max(x, 0) == x`, which the enclosures did not decide at
    # a point; the intervals about the fold were then taken for NaN all
    # over, the fold went unseen, and one of the three preimages came back.
    def g(x):
        return jnp.maximum(x, 0.0) + x - 0.05 * jnp.tanh(100.0 * (x - 0.3))

    inside = jnp.linspace(0.28, 0.32, 9, dtype=jnp.float32)
    away = jnp.asarray([1.0, -1.0, 3.0], jnp.float32)
    y = jnp.concatenate([g(inside), g(away)])
    try:
        got = np.asarray(jax.jit(jaxinterp.inverse(g))(y))
    except NotInvertibleError as err:  # (refused outright: also no wrong answer)
        assert "not monotone" in str(err)
        return
    assert np.isnan(got[:9]).all(), got[:9]
    np.testing.assert_allclose(got[9:], away, rtol=1e-5)


def _algebraic_sigmoid(x):
    return x / jnp.sqrt(1 + x**2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_map_that_jumps_where_it_overflows_is_split_there_not_refused(dtype):
    # `x / sqrt(1 + x**2)` as computed is 1 up to where `x**2` overflows
    # (1.8e19 in float32), and 0 past it: the samples show a turn, and the
    # stretch after it, taken to fall through every value from 1 to 0,
    # would give every `y` two preimages. The map takes no value between
    # the neighbouring floats where it jumps; the stretches part there, and
    # only `y = 0` (taken at 0 and past the overflow) has two.
    from helpers import x64

    with x64():
        x = jnp.asarray([-40.0, -3.0, -0.5, -1e-3, 2e-3, 0.7, 3.0, 60.0], dtype)
        y = _algebraic_sigmoid(x)
        inv = jaxinterp.inverse(_algebraic_sigmoid)
        want = y / jnp.sqrt((1 - y) * (1 + y))
        for got in (inv(y), jax.jit(inv)(y)):
            # Within the rounding of `y` through the slope `(1 + x**2)**1.5`.
            eps = float(jnp.finfo(dtype).eps)
            tol = 8 * eps * (1 + np.asarray(want) ** 2) ** 1.5 * (np.abs(y) + eps)
            assert np.all(
                np.abs(np.asarray(got - want)) <= tol + 4 * eps * np.abs(want)
            )
        assert np.isnan(np.asarray(inv(jnp.zeros(2, dtype)))).all()
        # Off the image: NaN.
        assert np.isnan(np.asarray(inv(jnp.asarray([1.5, -2.0], dtype)))).all()
        # The implicit function theorem's derivative, `(1 + x**2)**1.5`
        # (where `|x| <= 3`: beyond, `g'` cancels in float32, off by 5e-4
        # at `x = 60`).
        grad = np.asarray(jax.vmap(jax.grad(inv))(y), np.float64)
        near = np.abs(np.asarray(x)) <= 3
        want64 = np.asarray(want, np.float64)
        np.testing.assert_allclose(
            grad[near], (1 + want64[near] ** 2) ** 1.5, rtol=1e-4
        )


@pytest.mark.slow
@given(st.floats(-(1 - 2**-11), 1 - 2**-11, width=32))
def test_past_an_overflow_jump_no_value_but_zero_has_a_second_preimage(v):
    # Any `y` of `x / sqrt(1 + x**2)` but 0 has its one preimage below the
    # overflow (`|x| < 1.8e19`); the answer is that preimage, never NaN but
    # within the stretches' rounding allowance of 0 (`_turning._margin`:
    # 16 times the smallest normal float).
    y = jnp.full((3,), v, jnp.float32)
    got = np.asarray(jaxinterp.inverse(_algebraic_sigmoid)(y), np.float64)
    tiny = float(jnp.finfo(jnp.float32).tiny)
    if v == 0:
        assert np.isnan(got).all()
        return
    want = v / np.sqrt((1 - v) * (1 + v))
    eps = float(jnp.finfo(jnp.float32).eps)
    tol = 8 * eps * (1 + want**2) ** 1.5 * abs(v) + 4 * eps * abs(want)
    close = np.abs(got - want) <= tol
    assert np.all(close | (np.isnan(got) & (abs(v) <= 32 * tiny))), (got, want)


def _dropped_window(x):
    # Drops by 0.05 where a bump about 0.3 exceeds a half (`|x - 0.3| <
    # 0.0416`): between two grid points, where the choice is the same at
    # both.
    base = x + 0.1 * jnp.sin(x)
    bump = jnp.exp(-400.0 * (x - 0.3) ** 2)
    return jnp.where(bump > 0.5, base - 0.05, base)


@pytest.mark.slow
def test_a_window_of_a_smoothly_turning_comparison_between_grid_points_is_seen():
    # The comparison `bump > 0.5` turns on and off between two grid points,
    # so the samples never saw the drop: a `y` the window drops back to,
    # which has a second preimage before the window, came back as one of
    # them (91 of these 4,001). Enclosing the map locates where the choice
    # may switch, down to neighbouring floats; sampled there, the drop is
    # seen and those `y` are NaN.
    x = jnp.linspace(-2.0, 2.0, 4001, dtype=jnp.float32)
    y32 = _dropped_window(x)
    got = np.asarray(jax.jit(jaxinterp.inverse(_dropped_window))(y32))
    y = np.asarray(y32, np.float64)
    start = 0.3 - np.sqrt(np.log(2.0) / 400.0)
    top = start + 0.1 * np.sin(start)  # the value just before the window
    # Taken before the window and inside it: `[top - 0.05, top)`; either
    # answer within rounding of its ends.
    margin = 1e-5
    inside = (y >= top - 0.05 + margin) & (y < top - margin)
    outside = (y < top - 0.05 - margin) | (y >= top + margin)
    assert inside.sum() > 50 and np.isnan(got[inside]).all()
    np.testing.assert_allclose(got[outside], np.asarray(x)[outside], atol=2e-6)


# A window's sharpness `k` and its shift `d` (`_window_of`).
_SHARPNESS = st.floats(50.0, 5000.0)
_SHIFT = st.floats(-0.2, 0.2).filter(lambda d: abs(d) > 0.01)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(st.floats(-3.0, 3.0), _SHARPNESS, _SHIFT)
def test_a_window_between_grid_points_never_answers_one_of_two_preimages(c, k, d):
    # `base + d` where `exp(-k (x - c)**2) > 1/2`, `base` elsewhere: a
    # window of half-width `sqrt(ln 2 / k)` about `c` shifted by `d`. A `y`
    # with a preimage outside the window and one inside is NaN; one with a
    # single preimage comes back as it.
    def g(x):
        return _window_of(x, c, k, d)

    x = jnp.linspace(-4.0, 4.0, 2001, dtype=jnp.float32)
    y32 = g(x)
    got = np.asarray(jaxinterp.inverse(g)(y32), np.float64)
    y = np.asarray(y32, np.float64)
    # `base` is increasing (its slope is at least 0.9): its inverse by
    # interpolation on a dense grid, good to 1e-7 here.
    xs = np.linspace(-6.0, 6.0, 2_000_001)
    bs = xs + 0.1 * np.sin(xs)
    half = np.sqrt(np.log(2.0) / k)
    out = np.interp(y, bs, xs)  # the preimage off the window, if any
    win = np.interp(y - d, bs, xs)  # the one in it, if any
    margin = 1e-4
    off_ok = np.abs(out - c) > half + margin
    in_ok = np.abs(win - c) < half - margin
    unclear = (np.abs(np.abs(out - c) - half) <= margin) | (
        np.abs(np.abs(win - c) - half) <= margin
    )
    two = off_ok & in_ok & ~unclear
    assert np.isnan(got[two]).all()
    one = (off_ok ^ in_ok) & ~unclear
    single = np.where(off_ok, out, win)[one]
    answered = ~np.isnan(got[one])
    np.testing.assert_allclose(got[one][answered], single[answered], atol=1e-5)
    assert answered.mean() > 0.95  # (NaN only about the window's edges)


def _window_of(x, c, k, d):
    # `base + d` where a bump of width about `1 / sqrt(k)` about `c` exceeds
    # a half: a window between grid points, the same choice at both.
    base = x + 0.1 * jnp.sin(x)
    return jnp.where(jnp.exp(-k * (x - c) ** 2) > 0.5, base + d, base)


@pytest.mark.slow
@pytest.mark.parametrize("operands", ["traced", "vmap", "per element"])
def test_a_window_of_a_smoothly_turning_comparison_with_traced_operands_is_nan(
    operands,
):
    # With traced operands the samplers locate one switch of each choice
    # between grid points, so they never saw the window; a `y` it drops back
    # to came back as one of its two preimages (12 of these 2,001 with a
    # traced scalar `c`). The search for turns, run on the operands' values
    # when the program runs, now encloses the map either side of where the
    # choice switches: proven to jump back there, it is not injective, NaN
    # (as where the samples show a turn when the program runs).
    x = jnp.linspace(-2.0, 2.0, 2001, dtype=jnp.float32)
    inv = jaxinterp.inverse(_window_of, argnums=0)
    if operands == "traced":
        c = jnp.float32(0.3)
        got = jax.jit(inv)(_window_of(x, c, 400.0, -0.05), c, 400.0, -0.05)
    elif operands == "vmap":
        c = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
        y = jax.vmap(lambda c: _window_of(x, c, 400.0, -0.05))(c)
        got = jax.jit(jax.vmap(inv, (0, 0, None, None)))(y, c, 400.0, -0.05)
    else:
        # (One `c` per element, spread over a thousandth.)
        c = 0.3 + jnp.linspace(0.0, 1e-3, x.size, dtype=jnp.float32)
        got = jax.jit(inv)(_window_of(x, c, 400.0, -0.05), c, 400.0, -0.05)
    assert np.isnan(np.asarray(got)).all()


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(st.floats(-1.5, 1.5), _SHARPNESS, _SHIFT)
def test_with_traced_operands_a_window_never_answers_one_of_two_preimages(c, k, d):
    # Every answer is the one preimage of its `y`: here none is, every
    # `y` near the window has two, and with traced operands the map's turn
    # is found only as a whole (NaN for every element).
    x = jnp.linspace(-2.0, 2.0, 1001, dtype=jnp.float32)
    c, k, d = np.float32(c), np.float32(k), np.float32(d)
    got = jax.jit(jaxinterp.inverse(_window_of, argnums=0))(
        _window_of(x, c, k, d), c, k, d
    )
    assert np.isnan(np.asarray(got)).all()


@pytest.mark.slow
def test_with_traced_operands_a_continuous_window_is_still_inverted():
    # A comparison of a smoothly turning value that switches between cases
    # that meet there (`bump - 0.5` is 0 at the edges): no jump, a monotone
    # map, answered everywhere.
    def f(x, c):
        base = x + 0.1 * jnp.sin(x)
        bump = jnp.exp(-400.0 * (x - c) ** 2)
        return jnp.where(bump > 0.5, base + 0.01 * (bump - 0.5), base)

    x = jnp.linspace(-2.0, 2.0, 2001, dtype=jnp.float32)
    c = jnp.float32(0.3)
    got = jax.jit(jaxinterp.inverse(f, argnums=0))(f(x, c), c)
    np.testing.assert_allclose(got, x, atol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("step", [27, 30, 36])
def test_with_a_traced_operand_one_step_of_a_staircase_that_drops_back_is_nan(step):
    # `floor(50 x)` switches about 37 times between the grid points about
    # 0.6, and the samplers locate one switch of it there: step `c` falls
    # back by about 0.02, and a `y` it drops back to came back as the
    # preimage on the step before (`y(0.61) = y(0.591)` for `c = 30`).
    # The search for turns, on the traced `c` when the program runs, now
    # compares the map at both ends of each interval it cuts: it falls
    # across that step, so the map is not monotone, NaN.
    def f(x, c):
        s = jnp.floor(50 * x)
        return x + 1e-3 * s - 0.02 * jnp.exp(-100 * (s - c) ** 2)

    c = jnp.float32(step)
    inside = np.float32(step / 50 + 0.01)
    x = jnp.asarray([inside, 0.3, 0.7], jnp.float32)
    got = jax.jit(jaxinterp.inverse(f, argnums=0))(f(x, c), c)
    assert np.isnan(np.asarray(got)).all()


_PAD_SCALES = jnp.array([[0.35, -0.42, -0.42], [0.36, -1.6, 0.89]])


def _cropped_copy_and_block(kind):
    # `d = x * C` is solved with `x` by a block from the second result; the
    # first holds a cropped copy of `d` (`pad` with negative low padding)
    # and a padding element.
    def f(x):
        d = x * _PAD_SCALES
        copy = lax.pad(d, jnp.float32(0.5), [(-1, 0, 0), (-1, 1, 0)])
        if kind == "linear":
            return copy, x - d
        return copy, x + 0.5 * jnp.sin(d)

    return f


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(
    kind=st.sampled_from(["linear", "solved"]),
    at=st.sampled_from([(0, 0), (0, 1), (0, 2)]),
    by=st.floats(0.01, 1.0).map(np.float32) | st.floats(-1.0, -0.01).map(np.float32),
)
def test_a_cropped_copy_of_a_value_a_block_solves_is_checked(kind, at, by):
    # Found by the fuzzer (seed 356): the block's values replaced the pieces
    # the `pad` had solved of `d` without comparing them, so a `y` whose
    # copy (or padding) was moved off the image came back as the `x` of
    # the other result. Now NaN; on the image, `x`.
    f = _cropped_copy_and_block(kind)
    x = jnp.array([[-0.3, 0.9, 1.56], [-0.6, -0.31, 0.75]], jnp.float32)
    inv = jaxinterp.inverse_and_ildj(f, example_args=(x,))
    copy, rest = f(x)
    back, ildj = inv((copy, rest))
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
    assert np.isfinite(ildj)
    back, ildj = inv((copy.at[at].add(by), rest))
    assert np.isnan(np.asarray(back)).all() and np.isnan(ildj)
