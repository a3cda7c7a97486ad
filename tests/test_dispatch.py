"""One dispatch table per interpreter class: `Interpreter.register`,
`dispatch_table`, handlers of users' own higher-order primitives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax import lax
from jax.extend.core import Primitive, jaxpr_as_fun
from jax.interpreters import mlir

import jaxinterp

# A higher-order primitive of our own: `logged_call(*args, body=ClosedJaxpr)`.
logged_call_p = Primitive("test_logged_call")
logged_call_p.multiple_results = True


def _logged_call_impl(*args, body):
    return jaxpr_as_fun(body)(*args)


logged_call_p.def_impl(_logged_call_impl)
logged_call_p.def_abstract_eval(lambda *avals, body: body.out_avals)
mlir.register_lowering(
    logged_call_p, mlir.lower_fun(_logged_call_impl, multiple_results=True)
)


def logged(fn, *args):
    return logged_call_p.bind(*args, body=jax.make_jaxpr(fn)(*args))


def h(x):
    return logged(lambda v: jnp.sin(v) * 2.0, x)[0] + 1.0


def _walk_body(interp, eqn, invals):
    if interp.policy_of(eqn) == "opaque":
        return interp.default_rule(eqn, invals)
    return interp.eval_closed(eqn.params["body"], *invals)


def _sin_to_cos_class():
    class SinToCos(jaxinterp.Interpreter):
        name = "sin_to_cos"

    @SinToCos.register(lax.sin_p)
    def _cos(interp, eqn, invals):
        return [jnp.cos(*invals)]

    return SinToCos


def test_a_handler_applies_to_its_class_and_subclasses_not_to_bases():
    SinToCos = _sin_to_cos_class()

    class Child(SinToCos):
        pass

    x = jnp.array([0.1, 0.7])
    np.testing.assert_allclose(SinToCos().transform(jnp.sin)(x), jnp.cos(x))
    np.testing.assert_allclose(Child().transform(jnp.sin)(x), jnp.cos(x))
    np.testing.assert_allclose(
        jaxinterp.Interpreter().transform(jnp.sin)(x), jnp.sin(x)
    )
    assert lax.sin_p in SinToCos.dispatch_table()
    assert lax.sin_p in Child.dispatch_table()
    assert lax.sin_p not in jaxinterp.Interpreter.dispatch_table()


def test_a_subclass_replaces_a_base_handler_without_changing_the_base():
    SinToCos = _sin_to_cos_class()

    class Tan(SinToCos):
        pass

    Tan.register(lax.sin_p, lambda interp, eqn, invals: [jnp.tan(*invals)])
    x = jnp.array([0.2, 0.4])
    np.testing.assert_allclose(Tan().transform(jnp.sin)(x), jnp.tan(x), rtol=1e-6)
    np.testing.assert_allclose(SinToCos().transform(jnp.sin)(x), jnp.cos(x))


def test_registering_twice_on_one_class_is_refused_unless_override():
    SinToCos = _sin_to_cos_class()
    with pytest.raises(ValueError) as err:
        SinToCos.register(lax.sin_p, lambda interp, eqn, invals: invals)
    assert str(err.value) == (
        "`SinToCos` already has a handler for primitive `sin`. "
        "Pass `override=True` to replace it."
    )
    SinToCos.register(lax.sin_p, lambda i, e, v: [jnp.tan(*v)], override=True)
    np.testing.assert_allclose(SinToCos().transform(jnp.sin)(0.3), jnp.tan(0.3))


def test_unregister_removes_only_the_class_own_handler():
    SinToCos = _sin_to_cos_class()
    SinToCos.unregister(lax.sin_p)
    np.testing.assert_allclose(SinToCos().transform(jnp.sin)(0.3), jnp.sin(0.3))
    with pytest.raises(KeyError, match="`SinToCos` has no own handler for `sin`"):
        SinToCos.unregister(lax.sin_p)


def test_register_checks_its_arguments():
    class Mine(jaxinterp.Interpreter):
        pass

    with pytest.raises(TypeError, match="Handlers are keyed by"):
        Mine.register("sin", lambda i, e, v: v)
    with pytest.raises(TypeError, match="A handler must be callable"):
        Mine.register(lax.sin_p, 3)


def test_rules_and_handlers_share_the_table_and_rules_win():
    class Both(jaxinterp.Interpreter):
        rules = jaxinterp.RuleRegistry("both")

    Both.rules.register(lax.exp_p, lambda x, **params: [2.0 * lax.exp(x)])
    Both.register(lax.exp_p, lambda interp, eqn, invals: [3.0 * lax.exp(*invals)])
    Both.register(lax.log_p, lambda interp, eqn, invals: [5.0 * lax.log(*invals)])
    table = Both.dispatch_table()
    assert {lax.exp_p, lax.log_p} <= set(table)
    np.testing.assert_allclose(Both().transform(jnp.exp)(0.5), 2.0 * jnp.exp(0.5))
    np.testing.assert_allclose(Both().transform(jnp.log)(2.0), 5.0 * jnp.log(2.0))
    assert jaxinterp.higher_order_primitives() <= set(table)


def test_a_handler_registered_after_an_eager_call_takes_effect():
    class Late(jaxinterp.Interpreter):
        pass

    f = jax.jit(lambda x: jnp.sin(x) + 1.0)  # also through the eager `jit` path
    interp = Late()
    x = jnp.array([0.25, 0.5])
    np.testing.assert_allclose(interp.transform(f)(x), jnp.sin(x) + 1.0)
    Late.register(lax.sin_p, lambda i, e, v: [jnp.cos(*v)])
    np.testing.assert_allclose(interp.transform(f)(x), jnp.cos(x) + 1.0)
    Late.unregister(lax.sin_p)
    np.testing.assert_allclose(interp.transform(f)(x), jnp.sin(x) + 1.0)


def test_a_replaced_builtin_handler_is_called_for_its_primitive():
    seen = []

    class Spy(jaxinterp.Interpreter):
        pass

    builtin = jaxinterp.Interpreter.dispatch_table()[lax.cond_p]

    @Spy.register(lax.cond_p)
    def _cond(interp, eqn, invals):
        seen.append(interp.policy_of(eqn))
        return builtin(interp, eqn, invals)

    def f(x):
        return lax.cond(x > 0, jnp.sin, jnp.cos, x)

    for x in (0.5, -0.5):
        np.testing.assert_allclose(Spy().transform(f)(x), f(x))
    assert seen == ["recursive", "recursive"]


def test_an_unknown_higher_order_primitive_is_refused_naming_the_fix():
    SinToCos = _sin_to_cos_class()
    with pytest.raises(jaxinterp.MissingRuleError) as err:
        SinToCos().transform(h)(0.5)
    message = str(err.value)
    assert message.startswith(
        "`sin_to_cos` cannot reach inside higher-order primitive `test_logged_call`"
    )
    assert "test_dispatch.py" in message
    assert "register a handler for it with `SinToCos.register(<the primitive>)`" in (
        message
    )
    # `opaque` re-binds it unseen, as asked: the sin inside stays a sin.
    opaque = SinToCos(policies={"test_logged_call": "opaque"})
    np.testing.assert_allclose(opaque.transform(h)(0.5), h(0.5))


@given(st.floats(-3.0, 3.0))
def test_property_a_handler_enters_a_users_higher_order_primitive(x):
    SinToCos = _sin_to_cos_class()
    SinToCos.register(logged_call_p, _walk_body)
    transformed = SinToCos().transform(h)
    want = 2.0 * np.cos(np.float32(x)) + 1.0
    np.testing.assert_allclose(transformed(x), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(transformed)(x), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        jax.grad(transformed)(x), -2.0 * np.sin(np.float32(x)), rtol=1e-5, atol=1e-6
    )
    # The handler follows the policy: `opaque` re-binds the body unseen.
    opaque = SinToCos(policies={"test_logged_call": "opaque"})
    np.testing.assert_allclose(opaque.transform(h)(x), h(x), rtol=1e-6)


def test_a_handler_on_interpreter_serves_every_interpreter():
    jaxinterp.Interpreter.register(logged_call_p, _walk_body)
    try:
        assert logged_call_p in jaxinterp.higher_order_primitives()
        np.testing.assert_allclose(jaxinterp.evaluate(h)(0.5), h(0.5))
        SinToCos = _sin_to_cos_class()
        np.testing.assert_allclose(
            SinToCos().transform(h)(0.5), 2.0 * jnp.cos(0.5) + 1.0, rtol=1e-6
        )
    finally:
        jaxinterp.Interpreter.unregister(logged_call_p)
    assert logged_call_p not in jaxinterp.higher_order_primitives()


def test_an_interpreter_that_changes_nothing_rebinds_constructs():
    inner = jax.jit(lambda v: jnp.sin(v) * 2.0)

    def f(x):
        return inner(x) + lax.cond(x.sum() > 0, jnp.cos, jnp.sin, x)

    x = jnp.array([0.3, 0.4])
    assert jaxinterp.EvalInterpreter.changes_nothing()
    assert jaxinterp.EvalInterpreter().rebinds()
    staged = jaxinterp.stage(f, x).closed_jaxpr
    walked = jax.make_jaxpr(jaxinterp.evaluate(f))(x)
    body = {e.primitive.name: e for e in staged.jaxpr.eqns}
    again = {e.primitive.name: e for e in walked.jaxpr.eqns}
    jit_name = jaxinterp._jax_compat.jit_p.name
    # The very same bodies: re-bound, not walked and traced again.
    assert again[jit_name].params["jaxpr"] is body[jit_name].params["jaxpr"]
    assert again["cond"].params["branches"] == body["cond"].params["branches"]
    np.testing.assert_allclose(jaxinterp.evaluate(f)(x), f(x))
    # An `inline` policy changes nested constructs: no longer re-bound.
    inlining = jaxinterp.EvalInterpreter(policies={"cond": "inline"})
    assert not inlining.rebinds()
    SinToCos = _sin_to_cos_class()
    assert not SinToCos.changes_nothing()
