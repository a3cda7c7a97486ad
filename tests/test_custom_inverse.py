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
    with pytest.raises(NotInvertibleError, match=re.escape("`add`")):
        inverse(lambda x: x**3 + x)(x**3 + x)
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
        return x + jnp.sin(x)

    report = explain_inverse(f, jnp.ones(3))
    assert "[BLOCKING]" in report
    assert re.search(r"at .*test_custom_inverse.py:\d+", report)
    assert report.splitlines()[-1].startswith("NOT invertible: input 0")
