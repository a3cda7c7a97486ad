"""Tests of `RuleRegistry`: registration, parents, user primitives, missing, lookup."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_equal, primitive_names
from jax import lax
from jax.extend.core import Primitive

import jaxinterp
from jaxinterp import Interpreter, MissingRuleError, RuleRegistry, evaluate, stage


def _exp_rule(x, **params):
    return [lax.exp(x)]


def test_register_as_decorator_returns_the_rule():
    rules = RuleRegistry("double")

    @rules.register(lax.exp_p)
    def _exp_double(x, **params):
        return [2 * lax.exp(x)]

    assert lax.exp_p in rules
    assert rules.get(lax.exp_p) is _exp_double
    assert lax.log_p not in rules
    assert rules.get(lax.log_p) is None


def test_register_direct_form_returns_the_rule():
    rules = RuleRegistry("direct")
    assert rules.register(lax.exp_p, _exp_rule) is _exp_rule
    assert rules.get(lax.exp_p) is _exp_rule
    assert list(rules) == [lax.exp_p]
    assert len(rules) == 1


def test_double_registration_is_a_value_error():
    rules = RuleRegistry("twice")
    rules.register(lax.exp_p, _exp_rule)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`twice` already has a rule for primitive `exp`. "
            "Pass `override=True` to replace it."
        ),
    ):
        rules.register(lax.exp_p, lambda x, **p: [x])
    assert rules.get(lax.exp_p) is _exp_rule


def test_override_replaces_a_rule():
    rules = RuleRegistry("twice")
    rules.register(lax.exp_p, _exp_rule)

    @rules.register(lax.exp_p, override=True)
    def _exp_twice(x, **params):
        return [x]

    assert rules.get(lax.exp_p) is _exp_twice


def test_register_refuses_non_primitives_and_non_callables():
    rules = RuleRegistry("typed")
    with pytest.raises(TypeError, match=re.escape("keyed by `jax.extend.core")):
        rules.register("exp", _exp_rule)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="must be callable"):
        rules.register(lax.exp_p, 3)  # type: ignore[call-overload]


def test_child_falls_back_to_parent_and_leaves_it_unchanged():
    parent = RuleRegistry("parent")
    parent.register(lax.exp_p, _exp_rule)
    child = RuleRegistry("child", parent=parent)

    def _log_child(x, **params):
        return [lax.log(x)]

    child.register(lax.log_p, _log_child)
    assert child.get(lax.exp_p) is _exp_rule
    assert child.get(lax.log_p) is _log_child
    assert lax.log_p not in parent
    assert child.primitives() == {lax.exp_p, lax.log_p}
    assert parent.primitives() == {lax.exp_p}

    # A child may shadow a parent's rule without `override`.
    child.register(lax.exp_p, _log_child)
    assert child.get(lax.exp_p) is _log_child
    assert parent.get(lax.exp_p) is _exp_rule
    assert len(child) == 2

    child.unregister(lax.exp_p)
    assert child.get(lax.exp_p) is _exp_rule
    with pytest.raises(KeyError, match="has no own rule for `exp`"):
        child.unregister(lax.exp_p)


def test_interpreter_rules_extend_the_evaluate_table():
    class Doubled(Interpreter):
        name = "doubled"
        rules = RuleRegistry("doubled", parent=jaxinterp.eval_rules)

    @Doubled.rules.register(lax.exp_p)
    def _exp_doubled(x, **params):
        return [2 * lax.exp(x)]

    def f(x):
        return jnp.exp(x) + jax.jit(lambda y: jnp.exp(-y))(x)

    def reference(x):
        return 2 * jnp.exp(x) + jax.jit(lambda y: 2 * jnp.exp(-y))(x)

    x = jnp.linspace(-1.0, 1.0, 5)
    np.testing.assert_allclose(Doubled().transform(f)(x), reference(x), rtol=1e-6)
    assert lax.exp_p not in jaxinterp.eval_rules


# ---------------------------------------------------------------------------
# Users' own primitives.


def _make_cube_primitive() -> Primitive:
    cube_p = Primitive("test_cube")
    cube_p.def_impl(lambda x: x * x * x)
    cube_p.def_abstract_eval(lambda aval: jax.core.ShapedArray(aval.shape, aval.dtype))
    return cube_p


def test_user_primitive_is_rebound_by_evaluate_and_takes_rules():
    cube_p = _make_cube_primitive()

    def f(x):
        return cube_p.bind(x) + 1.0

    x = jnp.arange(4.0)
    assert_tree_equal(evaluate(f)(x), f(x))
    assert [e.primitive for e in stage(f, x).jaxpr.eqns][0] is cube_p

    class Squares(Interpreter):
        rules = RuleRegistry("squares")

    @Squares.rules.register(cube_p)
    def _cube_squares(x):
        return [x * x]

    np.testing.assert_array_equal(Squares().transform(f)(x), x * x + 1.0)
    assert Squares().missing(stage(f, x).closed_jaxpr) == ["add"]


# ---------------------------------------------------------------------------
# `missing` and `lookup`.


def _nested(x):
    def body(carry, y):
        return carry + jnp.sin(y), jnp.tanh(y)

    def branch_scan(z):
        return lax.scan(body, 0.0, z)[0]

    def branch_while(z):
        return lax.fori_loop(0, x.shape[0], lambda i, c: jnp.cos(c), z).sum()

    return jax.jit(lambda z: lax.cond(z.sum() > 0, branch_scan, branch_while, z))(x)


def test_missing_lists_primitives_recursively():
    closed = stage(_nested, jnp.ones(3)).closed_jaxpr
    rules = RuleRegistry("empty")
    missing = rules.missing(closed)
    assert missing == sorted(primitive_names(closed))
    # (a `scan` is a `call_hi_primitive` under JAX's hijax flags)
    scan = {"scan"} if "scan" in missing else {"call_hi_primitive"}
    assert {"sin", "cos", "tanh", "jit", "cond"} | scan <= set(missing)

    rules.register(lax.sin_p, _exp_rule)
    rules.register(lax.cos_p, _exp_rule)
    assert rules.missing(closed) == sorted(primitive_names(closed) - {"sin", "cos"})

    handled = jaxinterp.higher_order_primitives()
    assert not {"jit", "cond", *scan} & set(rules.missing(closed, handled=handled))
    # An interpreter without rules lists everything but what the walker handles.
    handled_names = {prim.name for prim in handled}
    assert Interpreter().missing(closed) == sorted(
        primitive_names(closed) - handled_names
    )


def test_missing_accepts_an_open_jaxpr():
    staged = stage(_nested, jnp.ones(3))
    rules = RuleRegistry("empty")
    assert rules.missing(staged.jaxpr) == rules.missing(staged.closed_jaxpr)


def _uses_sin(x):
    return jnp.sin(x) * 2.0  # the line `lookup` must cite


def test_lookup_raises_missing_rule_error_citing_the_user_line():
    staged = stage(_uses_sin, 1.0)
    sin_eqn = staged.jaxpr.eqns[0]
    rules = RuleRegistry("strict", qualname="my_rules")
    line = inspect.getsourcelines(_uses_sin)[1] + 1
    with pytest.raises(MissingRuleError) as info:
        rules.lookup(sin_eqn)
    message = str(info.value)
    assert message.startswith("`strict` has no rule for primitive `sin`, used at ")
    assert re.search(re.escape(f"test_registry.py:{line}") + r"\b", message)
    assert "Register one with `@my_rules.register(lax.sin_p)`." in message
    assert isinstance(info.value, NotImplementedError)
    assert "jaxinterp" not in message.split("used at ")[1].split("\n")[0]


def test_lookup_returns_the_rule_through_parents():
    parent = RuleRegistry("parent")
    parent.register(lax.sin_p, _exp_rule)
    child = RuleRegistry("child", parent=parent)
    sin_eqn = stage(_uses_sin, 1.0).jaxpr.eqns[0]
    assert child.lookup(sin_eqn) is _exp_rule
