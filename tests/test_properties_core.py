"""Property tests of the interpreter core: laws over random shapes, dtypes, programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from helpers import (
    assert_program_result,
    assert_tree_equal,
    check_release_plan,
    plain_or_skip,
    tree_allclose,
)
from hypothesis import given, settings, strategies as st
from jax import lax
from strategies import batched_cases, elementwise_cases

from jaxinterp import eval_closed_jaxpr, evaluate, stage


@given(elementwise_cases())
def test_property_evaluate_is_bitwise_equal(case):
    fn, x = case
    assert_tree_equal(evaluate(fn)(x), fn(x))


@given(elementwise_cases())
def test_property_eval_jaxpr_is_bitwise_equal(case):
    fn, x = case
    closed = jax.make_jaxpr(fn)(x)
    assert_tree_equal(eval_closed_jaxpr(closed, x), jtu.tree_leaves(fn(x)))


@settings(max_examples=15)
@given(elementwise_cases())
def test_property_evaluate_is_idempotent_and_jit_compatible(case):
    fn, x = case
    assert_tree_equal(evaluate(evaluate(fn))(x), fn(x))
    assert_tree_equal(jax.jit(evaluate(fn))(x), jax.jit(fn)(x))


@settings(max_examples=15)
@given(batched_cases())
def test_property_vmap_of_evaluate_equals_a_python_loop(case):
    fn, xs = case
    loop = [fn(x) for x in xs]
    expected = jtu.tree_map(lambda *leaves: jnp.stack(leaves), *loop)
    tree_allclose(jax.vmap(evaluate(fn))(xs), expected)


# Wrappers that put a function into a higher-order construct. Each maps a
# function returning a pair of arrays shaped like its argument to another one.
WRAPPERS = {
    "jit": lambda f: jax.jit(f),
    "checkpoint": lambda f: jax.checkpoint(f),
    "cond": lambda f: lambda x: lax.cond(True, f, lambda y: f(y)[::-1], x),
    "fori": lambda f: lambda x: lax.fori_loop(0, 2, lambda i, c: f(c[0]), f(x)),
    "scan": lambda f: (
        lambda x: jtu.tree_map(
            lambda y: y[0], lax.scan(lambda c, v: (c, f(v)), 0, x[None])[1]
        )
    ),
    "while": lambda f: (
        lambda x: lax.while_loop(
            lambda c: c[0] < 2, lambda c: (c[0] + 1, *f(c[1])), (0, *f(x))
        )[1:]
    ),
}


@settings(max_examples=15)
@given(elementwise_cases(), st.lists(st.sampled_from(sorted(WRAPPERS)), max_size=3))
def test_property_nested_constructs_evaluate_bitwise(case, wrappers):
    fn, x = case
    for name in wrappers:
        fn = WRAPPERS[name](fn)
    # (Plain JAX 0.12.0.1 fails a `Scan3` over an empty array: skipped there.)
    plain_or_skip("this program", fn, x)
    assert_program_result(evaluate(fn)(x), fn, x)
    check_release_plan(stage(fn, x).jaxpr)


@given(elementwise_cases())
def test_property_staging_is_cached_and_release_plans_are_sound(case):
    fn, x = case
    staged = stage(fn, x)
    assert stage(fn, jnp.zeros_like(x)) is staged
    assert staged.in_avals == (jax.typeof(x),)
    check_release_plan(staged.jaxpr)


@given(
    st.lists(
        st.floats(-1e3, 1e3, width=32, allow_subnormal=False), min_size=1, max_size=40
    )
)
def test_property_under_jit_an_inlined_jit_evaluates_bit_for_bit(values):
    """`jnp.mean` is an inline `jit`: eagerly, JAX compiles it as one program
    while the walker runs its two equations one by one (docs/concepts.md, the
    eager fast path); under `jit` both compile the same equations."""
    x = jnp.asarray(values, jnp.float32)
    for fn in (jnp.mean, jnp.var, lambda v: jnp.linalg.norm(v) / v.size):
        assert jax.jit(evaluate(fn))(x).tobytes() == jax.jit(fn)(x).tobytes()
