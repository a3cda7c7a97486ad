"""Loops whose carry only the numerical elementwise solver recovers.

The solver answers only where its map passed a monotonicity check (NaN
elsewhere), so its answer is the only preimage; a loop's inverse passes it on
to the step before as a choice of an enclosing equation, where a second
constraint on it is still refused (`_loops._carry_branches`). Each case
checks the inverse against the true `x` and the ildj against
`-slogdet(jacfwd(f)(x))`.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import flags_off, future_flags_on, jit_once, x64
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp import NotInvertibleError

DTYPES = [jnp.float32, jnp.float64]


def _precision(dtype):
    """A context giving `dtype`, and the tolerance to compare in it."""
    if dtype == jnp.float64:
        return x64(), 1e-10
    return contextlib.nullcontext(), 2e-5


def _slogdet_ildj(f, x, *known):
    # (Plain JAX cannot batch a `Scan3` under the hijax future flags.)
    jac = flags_off(lambda: jax.jacfwd(f)(x, *known))
    return -jnp.linalg.slogdet(jac)[1]


def _check(f, x, *known, tol):
    """`inverse_and_ildj(f, argnums=0)` against `x` and the reference ildj."""
    y = f(x, *known)
    got, ildj = jaxinterp.inverse_and_ildj(f, argnums=0)(y, *known)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, x, rtol=tol, atol=tol)
    np.testing.assert_allclose(
        ildj, _slogdet_ildj(f, x, *known), rtol=10 * tol, atol=10 * tol
    )
    return y


def scan_tanh(x):
    body = lambda c, k: (c + 0.3 * jnp.tanh(c), None)  # noqa: E731
    return lax.scan(body, x, jnp.arange(3.0, dtype=x.dtype))[0]


def scan_known_xs(x, a):
    # A known argument `a` and a per-iteration `xs` inside the solved map.
    body = lambda c, k: (c + 0.3 * jnp.tanh(c * k + a), None)  # noqa: E731
    return lax.scan(body, x, jnp.arange(3.0, dtype=x.dtype))[0]


def fori_sin(x, a):
    # 0.4 < 1: `c + 0.4 sin(.)` increases in `c`. (A `scan` underneath.)
    return lax.fori_loop(0, 3, lambda i, c: c + 0.4 * jnp.sin(c + a * i), x)


def fori_traced_count(x, n):
    # A trip count known only at run time: a `while` loop underneath.
    return lax.fori_loop(0, n, lambda i, c: c + 0.4 * jnp.sin(c), x)


def while_tanh(x):
    def body(state):
        i, c = state
        return i + 1, c + 0.5 * jnp.tanh(c + 0.25)

    return lax.while_loop(lambda s: s[0] < 4, body, (0, x))[1]


def reverse_scan(x):
    body = lambda c, k: (c + 0.3 * jnp.tanh(c + k), None)  # noqa: E731
    return lax.scan(body, x, jnp.arange(3.0, dtype=x.dtype), reverse=True)[0]


def jit_body(x):
    # The step under `jax.jit`: its rule reports the solve inside as such.
    step = jax.jit(lambda c: c + 0.3 * jnp.tanh(c - 0.5))
    return lax.scan(lambda c, _: (step(c), None), x, None, length=3)[0]


def scan_with_ys(x):
    # Per-step outputs of the carry before each step, and a second carry
    # solved from them.
    def body(carry, k):
        c, s = carry
        return (c + 0.3 * jnp.tanh(c - k), s + c), jnp.exp(c)

    (c, s), ys = lax.scan(body, (x, x), jnp.arange(3.0, dtype=x.dtype))
    return c, s, ys


CASES = {
    "scan": (scan_tanh, ()),
    "scan_known_xs_and_argument": (scan_known_xs, (0.2,)),
    "fori_loop": (fori_sin, (0.7,)),
    "fori_loop_traced_count": (fori_traced_count, (3,)),
    "while_loop": (while_tanh, ()),
    "reverse_scan": (reverse_scan, ()),
    "jit_body": (jit_body, ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(CASES))
def test_inverse_and_ildj(name, dtype):
    f, known = CASES[name]
    if name == "reverse_scan" and future_flags_on():
        # (JAX 0.12.0.1's `Scan3` runs a reverse scan differently from the
        # classic one, the reference taken with the flags off.)
        pytest.skip("a reverse Scan3 differs from the classic scan")
    context, tol = _precision(dtype)
    with context:
        x = jnp.array([-2.0, -0.3, 0.1, 0.5, 3.0], dtype)
        _check(f, x, *known, tol=tol)


@pytest.mark.slow
def test_the_issue_example():
    with x64():
        x = jnp.array([-2.0, 0.1, 0.5])
        got = jaxinterp.inverse(scan_tanh)(scan_tanh(x))
        np.testing.assert_allclose(got, x, rtol=1e-12, atol=1e-12)


def test_ys_and_a_second_carry():
    with x64():
        x = jnp.array([-2.0, 0.1, 0.5])
        y = scan_with_ys(x)
        # Each step's `ys` holds its carry exactly: no solve needed, also
        # with the solved carry beside it.
        got = jaxinterp.inverse(scan_with_ys, example_args=(x,))(y)
        np.testing.assert_allclose(got, x, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_jit_and_vmap():
    x = jnp.array([[-2.0, 0.1, 0.5], [1.5, -0.7, 0.0]])
    a = jnp.array([0.3, -1.1])
    y = flags_off(jax.vmap(fori_sin), x, a)
    inv = jaxinterp.inverse_and_ildj(fori_sin, argnums=0)
    got, ildj = jax.jit(jax.vmap(inv))(y, a)
    np.testing.assert_allclose(got, x, rtol=2e-5, atol=2e-5)
    want = jnp.stack([_slogdet_ildj(fori_sin, x[i], a[i]) for i in range(2)])
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_grad_matches_implicit_differentiation(dtype):
    context, tol = _precision(dtype)
    with context:
        x = jnp.array([-2.0, 0.1, 0.5], dtype)
        a = jnp.asarray(0.2, dtype)
        y = scan_known_xs(x, a)
        w = jnp.array([1.0, -2.0, 0.5], dtype)
        inv = jaxinterp.inverse(scan_known_xs, argnums=0)

        def loss(y, a):
            return jnp.sum(w * inv(y, a))

        gy, ga = jax.jit(jax.grad(loss, argnums=(0, 1)))(y, a)
        # x(y, a) solves f(x, a) = y: dx/dy = J^-1, dx/da = -J^-1 df/da.
        jac = flags_off(jax.jacfwd(scan_known_xs), x, a)
        dfa = flags_off(jax.jacfwd(scan_known_xs, argnums=1), x, a)
        want_y = jnp.linalg.solve(jac.T, w)
        want_a = -w @ jnp.linalg.solve(jac, dfa)
        np.testing.assert_allclose(gy, want_y, rtol=100 * tol, atol=100 * tol)
        np.testing.assert_allclose(ga, want_a, rtol=100 * tol, atol=100 * tol)


@pytest.mark.slow
def test_grad_of_the_ildj_matches_finite_differences():
    with x64():
        x = jnp.array([-1.0, 0.3, 2.0])
        y = fori_sin(x, 0.7)
        ildj = lambda y: jaxinterp.inverse_and_ildj(fori_sin, argnums=0)(y, 0.7)[1]  # noqa: E731
        got = jax.grad(ildj)(y)
        eps = 1e-6
        want = [
            (ildj(y.at[i].add(eps)) - ildj(y.at[i].add(-eps))) / (2 * eps)
            for i in range(3)
        ]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@settings(max_examples=min(settings.default.max_examples, 12))
@given(
    amplitude=st.floats(-0.9, 0.9),
    shift=st.floats(-2.0, 2.0),
    length=st.integers(1, 4),
    reverse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_round_trip_over_random_coefficients(amplitude, shift, length, reverse, seed):
    # |amplitude| < 1: `c + amplitude * sin(c * k + shift)` increases in `c`
    # for the factors `k` in [-1, 1] used here.
    reverse = reverse and not future_flags_on()  # (see `test_inverse_and_ildj`)
    f = _random_coefficients_map(length, reverse)
    x = jax.random.uniform(jax.random.PRNGKey(seed), (4,), minval=-4.0, maxval=4.0)
    y = f(x, shift, amplitude)
    # (Compiled once per length and direction: the coefficients are arguments.)
    inv = jit_once(
        ("scan of random coefficients", length, reverse),
        lambda: jaxinterp.inverse_and_ildj(f, argnums=0),
    )
    got, ildj = inv(y, shift, amplitude)
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    want = _slogdet_ildj(f, x, shift, amplitude)
    np.testing.assert_allclose(ildj, want, rtol=1e-3, atol=1e-3)


def _random_coefficients_map(length: int, reverse: bool) -> Any:
    ks = jnp.linspace(-1.0, 1.0, length)

    def f(x, shift, amplitude):
        body = lambda c, k: (c + amplitude * jnp.sin(c * k + shift), None)  # noqa: E731
        return lax.scan(body, x, ks, reverse=reverse)[0]

    return f


# -- refusals -------------------------------------------------------------------


def test_a_body_that_turns_is_refused():
    # `c + 2 sin(c)` turns: its values have several preimages.
    def f(x):
        body = lambda c, _: (c + 2.0 * jnp.sin(c), None)  # noqa: E731
        return lax.scan(body, x, None, length=3)[0]

    x = jnp.linspace(-3.0, 3.0, 7)
    with pytest.raises(NotInvertibleError, match="not monotone"):
        jaxinterp.inverse(f)(f(x))


def test_a_body_that_turns_at_run_time_gives_nan():
    # With a known argument the map is checked at run time: NaN where it
    # turns, never one preimage among several.
    def f(x, a):
        body = lambda c, _: (c + 2.0 * jnp.sin(c + a), None)  # noqa: E731
        return lax.scan(body, x, None, length=3)[0]

    x = jnp.linspace(-3.0, 3.0, 7)
    for a in (0.0, 0.5):
        got = jaxinterp.inverse(f, argnums=0)(f(x, a), a)
        assert np.isnan(np.asarray(got)).all()


def test_a_carry_off_the_image_gives_nan():
    def f(x):
        body = lambda c, _: (c / (1 + jnp.abs(c)) + 0.5, None)  # noqa: E731
        return lax.scan(body, x, None, length=2)[0]

    # After two steps the values lie in (1/6, 1.1).
    got = np.asarray(jaxinterp.inverse(f)(jnp.array([1.6, 1.0, -0.7])))
    assert np.isnan(got[[0, 2]]).all()
    np.testing.assert_allclose(got[1], 1.0, rtol=1e-5)


LOOP_CHOICE = (
    "a map that is not injective (its principal branch) determines a loop carry"
)


def test_a_second_constraint_on_a_solved_carry_is_refused():
    # `ys` reads each step's new carry, which the step after solved: a second
    # constraint on a value the solver chose.
    def f(x):
        def body(c, _):
            new = c + 0.3 * jnp.tanh(c)
            return new, jnp.exp(new)

        return lax.scan(body, x, None, length=3)

    x = jnp.array([-2.0, 0.1, 0.5])
    with pytest.raises(NotInvertibleError, match=re.escape(LOOP_CHOICE)) as info:
        jaxinterp.inverse(f, example_args=(x,))(f(x))
    assert "consistently" in str(info.value)


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_a_principal_branch_for_a_carry_is_still_refused(loop):
    # Only the solver's checked choices are passed on between steps.
    def f(x, n):
        body = lambda i, c: jnp.cosh(c)  # noqa: E731
        if loop == "scan":
            return lax.fori_loop(0, 2, body, x)
        return lax.fori_loop(0, n, body, x)

    x = jnp.array([0.5, 1.0])
    with pytest.raises(NotInvertibleError, match=re.escape(LOOP_CHOICE)):
        jaxinterp.inverse(f, argnums=0)(f(x, 2), 2)


def test_a_solved_initial_carry_is_a_choice_outside_the_loop():
    # The loop solves `x` first; `exp(x)` then constrains it a second time.
    def f(x):
        return jnp.exp(x), scan_tanh(x)

    x = jnp.array([-1.0, 0.0, 1.0])
    with pytest.raises(NotInvertibleError, match="a map inside `scan`"):
        jaxinterp.inverse(f, example_args=(x,))(f(x))


@pytest.mark.slow
def test_a_loop_inside_a_loop_body_is_refused():
    # The inner loop's result is the outer carry, chosen in the step after:
    # a `scan` takes no interval for its results (`_branches.LOOPS`).
    def f(x):
        def inner(c):
            body = lambda d, _: (d + 0.3 * jnp.tanh(d), None)  # noqa: E731
            return lax.scan(body, c, None, length=2)[0]

        return lax.scan(lambda c, _: (inner(c), None), x, None, length=2)[0]

    x = jnp.array([-1.0, 0.0, 1.0])
    with pytest.raises(NotInvertibleError, match=re.escape(LOOP_CHOICE)):
        jaxinterp.inverse(f)(f(x))
