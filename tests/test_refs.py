"""Mutable references (`jax.new_ref`, `ref[...] = v`, `jax.freeze`...) through walkers.

Their equations (`new_ref`, `get`, `swap`, `addupdate`, `freeze`,
`empty_ref`, `free_ref`) have effects: every walker must run them in order and
rebuild them faithfully, eagerly, under `jit`, `grad` and `vmap`, and inside
`scan`, `while` and `cond`. Each result is compared with plain JAX; where
plain JAX itself refuses a combination (no eager `empty_ref`, no `vmap` of a
`cond` with state effects...) the case is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import (
    PrimitiveLog,
    future_flags,
    future_flags_available,
    plain_or_skip,
    tree_allclose,
)
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp

pytestmark = pytest.mark.skipif(
    not hasattr(jax, "ref") or not hasattr(jax.ref, "addupdate"),
    reason=f"JAX {jax.__version__} has no public `jax.ref` module",
)


def straight(x):
    r = jax.new_ref(jnp.zeros_like(x))
    r[...] = jnp.sin(x)
    jax.ref.addupdate(r, ..., x * 2.0)
    old = jax.ref.swap(r, ..., r[...] + 1.0)
    jax.ref.set(r, ..., r[...] * old)
    return jax.ref.get(r, ...) - jax.freeze(r) * 0.5


def empty(x):
    r = jax.empty_ref(jax.typeof(x))
    r[...] = x * 3.0
    y = r[...]
    jax.free_ref(r)
    return y


def in_scan(x):
    r = jax.new_ref(jnp.zeros((), x.dtype))

    def body(c, a):
        r[...] += a * c
        return c + 1.0, r[...]

    c, ys = lax.scan(body, 1.0, x)
    return jax.freeze(r) + c, ys


def in_while(x):
    r = jax.new_ref(x)

    def body(i):
        r[...] = jnp.cos(r[...]) + i
        return i + 1

    lax.while_loop(lambda i: i < 3, body, 0)
    return jax.freeze(r)


def in_cond(x):
    r = jax.new_ref(x)

    def yes():
        r[...] = r[...] * 2.0

    def no():
        jax.ref.addupdate(r, ..., jnp.ones_like(x))

    lax.cond(x.sum() > 0, yes, no)
    return jax.freeze(r)


def order_matters(x):
    r = jax.new_ref(x)
    a = r[...]
    r[...] = a * 2.0
    b = r[...]
    r[...] = b + 1.0
    c = r[...]
    return a, b, c


PROGRAMS = {
    f.__name__: f for f in (straight, empty, in_scan, in_while, in_cond, order_matters)
}
X = jnp.array([0.3, -1.2, 0.7, 2.0])


def _sum_out(f: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x: sum(jnp.sum(y) for y in jax.tree.leaves(f(x)))


TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "eager": lambda f: f,
    "jit": jax.jit,
    "vmap": lambda f: lambda x: jax.vmap(f)(jnp.stack([x, -0.5 * x])),
    "jit_vmap": lambda f: jax.jit(lambda x: jax.vmap(f)(jnp.stack([x, -0.5 * x]))),
    "grad": lambda f: jax.grad(_sum_out(f)),
    "jit_grad": lambda f: jax.jit(jax.grad(_sum_out(f))),
}

INTERPRETERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "evaluate": jaxinterp.evaluate,
    "recursive": lambda f: PrimitiveLog().transform(f),
    "inline": lambda f: PrimitiveLog(higher_order="inline").transform(f),
    "eager_path": lambda f: jaxinterp.EvalInterpreter().transform(f),
}


@pytest.fixture(params=[False, True], ids=["flags_off", "flags_on"])
def flags(request):
    if request.param and not future_flags_available():
        pytest.skip(f"JAX {jax.__version__} has no hijax future-default flags")
    if not future_flags_available():
        yield
        return
    with future_flags(request.param):
        yield


@pytest.mark.parametrize("interp", INTERPRETERS)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_refs_match_plain_jax(flags, program, transform, interp):
    fn, wrap = PROGRAMS[program], TRANSFORMS[transform]
    expected = plain_or_skip(f"{transform} of {program}", wrap(fn), X)
    tree_allclose(wrap(INTERPRETERS[interp](fn))(X), expected)


def test_reference_equations_are_seen_in_order(flags):
    log = PrimitiveLog()
    tree_allclose(log.transform(order_matters)(X), order_matters(X))
    jaxpr = jax.make_jaxpr(order_matters)(X).jaxpr
    assert log.names == [e.primitive.name for e in jaxpr.eqns]
    assert [n for n in log.names if n in ("get", "swap")] == ["get", "swap"] * 2 + [
        "get"
    ]


@pytest.mark.parametrize("program", ["in_scan", "in_while", "in_cond"])
def test_reference_equations_inside_control_flow_are_seen(flags, program):
    log = PrimitiveLog()
    log.transform(PROGRAMS[program])(X)
    assert "new_ref" in log.names
    # The body's own reads and writes, not only the outer ones.
    assert sum(log.names.count(n) for n in ("get", "swap", "addupdate")) >= 2


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-3.0, 3.0, allow_nan=False, width=32), min_size=1, max_size=5),
    st.sampled_from(["straight", "in_scan", "in_while", "in_cond", "order_matters"]),
)
def test_walking_programs_with_refs_equals_plain_jax(values, program):
    x = jnp.asarray(values, jnp.float32)
    fn = PROGRAMS[program]
    tree_allclose(jaxinterp.EvalInterpreter().transform(fn)(x), fn(x))
    tree_allclose(jax.jit(PrimitiveLog().transform(fn))(x), jax.jit(fn)(x))
