"""`custom_inverse` and `explain_inverse`."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxinterp import (
    NotInvertibleError,
    custom_inverse,
    explain_inverse,
    inverse,
    inverse_and_ildj,
)
from jaxinterp.testing import tree_allclose


def make_odd_cube():
    """x**3 + x: invertible, but no rule inverts `add` of two unknowns."""

    @custom_inverse
    def f(x):
        return x**3 + x

    @f.def_inverse
    def _(y):
        # Newton's method, written independently of the primitives of `f`.
        def step(_, x):
            return x - (x**3 + x - y) / (3 * x**2 + 1)

        return lax.fori_loop(0, 30, step, jnp.cbrt(y))

    return f


def test_value_and_gradient_unchanged():
    f = make_odd_cube()
    x = jnp.array([-1.5, 0.2, 2.0])
    tree_allclose(f(x), x**3 + x)
    tree_allclose(jax.grad(lambda x: f(x).sum())(x), 3 * x**2 + 1)


def test_plain_inverse_fails_custom_inverse_succeeds():
    x = jnp.array([-1.5, 0.2, 2.0])
    # (`inverse` solves it numerically unless told to keep to formulas.)
    with pytest.raises(NotInvertibleError, match=re.escape("`add`")):
        inverse(lambda x: x**3 + x, solvers=False)(x**3 + x)
    f = make_odd_cube()
    tree_allclose(inverse(f)(f(x)), x, rtol=1e-5)


def test_default_ildj_is_slogdet_of_the_given_inverse():
    f = make_odd_cube()
    x = jnp.array([-1.5, 0.2, 2.0])
    _, got = inverse_and_ildj(f)(f(x))
    np.testing.assert_allclose(got, -jnp.sum(jnp.log(3 * x**2 + 1)), rtol=1e-4)


def test_explicit_ildj_is_used():
    @custom_inverse
    def f(x):
        return x * 4.0

    f.def_inverse(lambda y: y / 4.0, ildj=lambda y: -jnp.size(y) * jnp.log(4.0))
    _, got = inverse_and_ildj(f)(jnp.ones(5))
    np.testing.assert_allclose(got, -5 * np.log(4.0), rtol=1e-6)


def test_inside_jit_vmap_scan_and_other_inverted_functions():
    f = make_odd_cube()
    x = jnp.array([[-1.5, 0.2], [2.0, 0.7]])
    tree_allclose(jax.jit(f)(x), x**3 + x)
    tree_allclose(jax.vmap(f)(x), x**3 + x)
    tree_allclose(lax.scan(lambda c, r: (c, f(r)), 0.0, x)[1], x**3 + x)

    def g(x):
        return jnp.exp(jax.jit(f)(x * 0.5)) + 1.0

    tree_allclose(inverse(g)(g(x)), x, rtol=1e-5)
    tree_allclose(jax.vmap(inverse(g))(g(x)), x, rtol=1e-5)

    def stacked(x):
        return lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0]

    tree_allclose(inverse(stacked)(stacked(x * 0.5)), x * 0.5, rtol=1e-4)


def test_known_arguments():
    @custom_inverse
    def f(x, k):
        return x**3 + x * k

    @f.def_inverse
    def _(y, k):
        def step(_, x):
            return x - (x**3 + x * k - y) / (3 * x**2 + k)

        return lax.fori_loop(0, 30, step, jnp.cbrt(y))

    x, k = jnp.array([0.4, -1.1]), jnp.array(2.0)
    tree_allclose(inverse(f, argnums=0)(f(x, k), k), x, rtol=1e-5)


def test_explain_inverse_marks_each_equation():
    def coupling_like(x, w):
        s = jnp.tanh(w * 2.0)
        return jnp.exp(x) * jnp.exp(s) + jnp.sum(w)

    report = explain_inverse(coupling_like, jnp.ones(3), jnp.ones(3), argnums=0)
    lines = report.splitlines()
    marks = {}
    for line in lines:
        m = re.match(r"  \[(\w+) *\] .* = (\w+) ", line)
        if m:
            marks[m.group(2)] = m.group(1)
    assert marks["tanh"] == "forward" and marks["reduce_sum"] == "forward"
    assert marks["exp"] in ("inverted", "forward")
    assert lines[-1] == "Invertible: every unknown input is recovered."


def test_explain_inverse_reports_blocking_line():
    def f(x):
        return x * jnp.sum(x)

    report = explain_inverse(f, jnp.ones(3))
    assert "[BLOCKING]" in report
    assert re.search(r"at .*test_custom_inverse.py:\d+", report)
    assert report.splitlines()[-1].startswith("NOT invertible: input 0")


# ---------------------------------------------------------------------------
# `inverse(jax.vmap(f))` of a function with a custom inverse.

_L = jnp.array([[1.0, 0.0], [0.5, 1.0]])


def make_mixing(scale_known=False):
    """Per example (shape (2,)): y = h(L x) (* k), h(z) = z**3 + z. The inverse
    mixes the two coordinates, so applying it over the wrong axis is caught."""

    @custom_inverse
    def f(x, k):
        z = _L @ x
        return (z**3 + z) * k

    @f.def_inverse
    def _(y, k):
        y = y / k

        def step(_, z):
            return z - (z**3 + z - y) / (3 * z**2 + 1)

        z = lax.fori_loop(0, 40, step, jnp.cbrt(y))
        return jnp.linalg.solve(_L, z)

    return f


def _reference_inverse(y, k):
    """The same inverse, written for a whole batch of rows by hand."""
    y = y / k
    z = jnp.cbrt(y)
    for _ in range(40):
        z = z - (z**3 + z - y) / (3 * z**2 + 1)
    return jnp.linalg.solve(_L, z.T).T


def _reference_ildj(y, k):
    flat = lambda t: _reference_inverse(t.reshape(y.shape), k).ravel()  # noqa: E731
    return jnp.linalg.slogdet(jax.jacfwd(flat)(y.ravel()))[1]


@pytest.mark.parametrize("k_batched", [False, True])
def test_inverse_of_vmap_vmaps_the_custom_inverse(k_batched):
    f = make_mixing()
    x = jnp.array([[0.3, -0.2], [1.1, 0.4], [-0.7, 0.9], [0.05, -1.2], [0.6, 0.6]])
    if k_batched:
        k = jnp.linspace(0.5, 1.5, 5)
        batched = jax.vmap(f, in_axes=(0, 0))
        k_ref = k[:, None]
    else:
        k = jnp.array(2.0)
        batched = jax.vmap(f, in_axes=(0, None))
        k_ref = k
    y = batched(x, k)
    got_x, got_ildj = inverse_and_ildj(batched, argnums=0)(y, k)
    tree_allclose(got_x, x, rtol=1e-4, atol=1e-5)
    tree_allclose(got_x, _reference_inverse(y, k_ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ildj, _reference_ildj(y, k_ref), rtol=1e-4)
    # Under jit too, and the custom inverse is what runs (no `add` to block).
    tree_allclose(jax.jit(inverse(batched, argnums=0))(y, k), got_x, rtol=1e-6)


@pytest.mark.slow
def test_inverse_of_nested_vmaps():
    f = make_mixing()
    x = jax.random.uniform(jax.random.key(0), (4, 3, 2), minval=-1.0, maxval=1.0)
    k = jnp.array(1.0)
    batched = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(0, None))
    y = batched(x, k)
    got_x, got_ildj = inverse_and_ildj(batched, argnums=0)(y, k)
    tree_allclose(got_x, x, rtol=1e-4, atol=1e-5)
    expected = _reference_ildj(y.reshape(12, 2), k)
    np.testing.assert_allclose(got_ildj, expected, rtol=1e-4)


@pytest.mark.parametrize("shape, in_axes", [((2, 5), 1), ((2, 2), 0), ((2, 2), 1)])
def test_inverse_of_vmap_along_any_axis(shape, in_axes):
    # `vmap` may leave the batch axis anywhere inside the marker `jit`
    # (a square shape cannot tell where): the recorded layout says where.
    f = make_mixing()
    x = jax.random.uniform(jax.random.key(1), shape, minval=-1.0, maxval=1.0)
    batched = jax.vmap(f, in_axes=(in_axes, None), out_axes=in_axes)
    y = batched(x, 1.0)
    got_x, got_ildj = inverse_and_ildj(batched, argnums=0)(y, 1.0)
    tree_allclose(got_x, x, rtol=1e-4, atol=1e-5)
    rows = jnp.moveaxis(y, in_axes, 0)
    np.testing.assert_allclose(got_ildj, _reference_ildj(rows, 1.0), rtol=1e-4)


def test_an_unexplained_batch_layout_falls_back_to_the_body():
    # A leaf batched by the outer `vmap` only and another by the inner only:
    # the levels cannot be lined up, so the custom inverse is not guessed at.
    @custom_inverse
    def f(x, s):
        return x**3 + x * s

    f.def_inverse(lambda y, s: y)  # wrong on purpose: it must not be used
    x, s = jnp.ones((3, 2)) * 0.5, jnp.linspace(1.0, 2.0, 4)
    batched = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(None, 0))
    y = batched(x, s)
    # The body is inverted instead (each element of `x` reaches four results,
    # solved as a sequential block); the wrong custom inverse would give `y`.
    got = inverse(batched, argnums=0, example_args=(x,))(y, s)
    np.testing.assert_allclose(got, x, rtol=1e-5)
