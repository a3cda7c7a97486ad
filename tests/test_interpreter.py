"""Tests of the walkers: `Interpreter`, `Env`, release of values, `BackwardWalker`."""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import weakref
from collections import Counter, namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PrimitiveLog,
    SinToCos,
    assert_tree_equal,
    check_release_plan,
    iter_eqns,
    matches_flags_off,
    tree_allclose,
)
from jax import lax

import jaxinterp
from jaxinterp import (
    BackwardWalker,
    Env,
    EvalInterpreter,
    Interpreter,
    RuleError,
    RuleRegistry,
    evaluate,
    stage,
)
from jaxinterp._env import release_plan

Point = namedtuple("Point", ["x", "y"])


def _nested(x):
    """`sin` in a `jit`, `cos` in a `cond` branch, `tanh` in a `scan` body."""

    def body(carry, y):
        return carry * jnp.tanh(y), carry

    inner = jax.jit(lambda z: jnp.sin(z) * 2.0)(x)
    branch = lax.cond(x.sum() > 0, lambda z: jnp.cos(z), lambda z: -z, inner)
    carry, ys = lax.scan(body, 1.0, branch)
    return carry + ys.sum()


# ---------------------------------------------------------------------------
# Customisation: `process_eqn`, `rules`, state.


def test_process_eqn_is_called_for_nested_equations():
    log = PrimitiveLog()
    x = jnp.linspace(0.1, 1.0, 4)
    assert_tree_equal(log.transform(_nested)(x), _nested(x))
    assert {"sin", "cos", "tanh", "jit", "cond", "scan"} <= set(log.constructs)
    # Every equation, nested ones included, went through `process_eqn` once.
    every_eqn = [e.primitive.name for e in iter_eqns(stage(_nested, x).jaxpr)]
    assert Counter(log.names) == Counter(every_eqn)


def test_process_eqn_override_changes_nested_values():
    x = jnp.linspace(0.1, 1.0, 4)

    def reference(x):
        def body(carry, y):
            return carry * jnp.tanh(y), carry

        inner = jax.jit(lambda z: jnp.cos(z) * 2.0)(x)
        branch = lax.cond(x.sum() > 0, lambda z: jnp.cos(z), lambda z: -z, inner)
        carry, ys = lax.scan(body, 1.0, branch)
        return carry + ys.sum()

    tree_allclose(SinToCos().transform(_nested)(x), reference(x))


def test_rules_class_attribute_is_consulted_first():
    class Squash(Interpreter):
        name = "squash"
        rules = RuleRegistry("squash")

    @Squash.rules.register(lax.tanh_p)
    def _tanh_squash(x, **params):
        return [lax.logistic(x)]

    def reference(x):
        def body(carry, y):
            return carry * jax.nn.sigmoid(y), carry

        inner = jax.jit(lambda z: jnp.sin(z) * 2.0)(x)
        branch = lax.cond(x.sum() > 0, lambda z: jnp.cos(z), lambda z: -z, inner)
        carry, ys = lax.scan(body, 1.0, branch)
        return carry + ys.sum()

    x = jnp.linspace(0.1, 1.0, 4)
    tree_allclose(Squash().transform(_nested)(x), reference(x))


class RoundThrough(Interpreter):
    """Rounds every floating-point result through `dtype`; counts equations."""

    name = "round_through"
    cache_subcalls = False

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
        self.count = 0

    def process_eqn(self, eqn, invals):
        self.count += 1
        outvals = super().process_eqn(eqn, invals)
        return [
            v.astype(self.dtype).astype(v.dtype)
            if jnp.issubdtype(v.dtype, jnp.floating)
            else v
            for v in outvals
        ]


def test_interpreter_instances_keep_their_own_state():
    def f(x):
        return jnp.sin(x) * 3.0 + x

    def reference(x, dtype):
        def r(v):
            return v.astype(dtype).astype(v.dtype)

        return r(r(r(jnp.sin(x)) * 3.0) + x)

    x = jnp.linspace(0.1, 2.0, 9)
    to_bf16, to_f16 = RoundThrough(jnp.bfloat16), RoundThrough(jnp.float16)
    assert_tree_equal(to_bf16.transform(f)(x), reference(x, jnp.bfloat16))
    assert_tree_equal(to_f16.transform(f)(x), reference(x, jnp.float16))
    assert to_bf16.count == to_f16.count == len(stage(f, x).jaxpr.eqns)
    to_bf16.transform(f)(x)
    assert to_bf16.count == 2 * to_f16.count
    assert not np.array_equal(to_bf16.transform(f)(x), to_f16.transform(f)(x))


def test_interpreter_name_and_policy_defaults():
    interp = Interpreter()
    assert Interpreter.name == "interpret"
    assert EvalInterpreter.name == "evaluate"
    assert interp.policy(lax.cond_p) == "recursive"
    jit_p = stage(jax.jit(jnp.sin), 1.0).jaxpr.eqns[0].primitive
    custom = Interpreter(higher_order="opaque", policies={jit_p: "inline"})
    assert custom.policy(jit_p) == "inline"
    assert custom.policy(lax.cond_p) == "opaque"
    by_name = Interpreter(policies={"cond": "opaque"})
    assert by_name.policy(lax.cond_p) == "opaque"


@pytest.mark.parametrize("bad", [{"higher_order": "lazy"}, {"policies": {"jit": "x"}}])
def test_unknown_policy_is_a_value_error(bad):
    with pytest.raises(ValueError, match="Unknown higher-order policy"):
        Interpreter(**bad)


# ---------------------------------------------------------------------------
# Composition with JAX transformations, in several orders.


def _smooth(x):
    y = lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)
    z = jax.jit(lambda a: a * jnp.tanh(a))(y)
    carry, _ = lax.scan(lambda c, v: (c + v * c, None), 1.0, z)
    return carry + jnp.sum(z**2)


_x = jnp.array([0.3, -0.2, 0.5])
_xs = jnp.stack([_x, 2 * _x, -_x])
_ev = evaluate


# Eager second derivatives dispatch hundreds of tiny ops: the costly orders run
# under an outer `jax.jit` (on both sides), which is one more order to test.
@pytest.mark.parametrize(
    "transformed, reference, args",
    [
        (lambda x: jax.grad(_ev(_smooth))(x), jax.grad(_smooth), (_x,)),
        (lambda x: _ev(jax.grad(_smooth))(x), jax.grad(_smooth), (_x,)),
        (jax.jit(_ev(jax.grad(_ev(_smooth)))), jax.grad(_smooth), (_x,)),
        (jax.vmap(_ev(jax.jit(_smooth))), jax.vmap(_smooth), (_xs,)),
        (
            jax.jit(_ev(jax.vmap(jax.grad(_ev(_smooth))))),
            jax.jit(jax.vmap(jax.grad(_smooth))),
            (_xs,),
        ),
        (
            lambda x, t: jax.jvp(_ev(_smooth), (x,), (t,)),
            lambda x, t: jax.jvp(_smooth, (x,), (t,)),
            (_x, jnp.ones(3)),
        ),
        (jax.jit(jax.hessian(_ev(_smooth))), jax.jit(jax.hessian(_smooth)), (_x,)),
        (jax.jit(_ev(jax.hessian(_smooth))), jax.jit(jax.hessian(_smooth)), (_x,)),
        (
            jax.jit(jax.jacfwd(_ev(jax.grad(_smooth)))),
            jax.jit(jax.hessian(_smooth)),
            (_x,),
        ),
        (
            jax.jit(jax.vmap(jax.hessian(_ev(_ev(_smooth))))),
            jax.jit(jax.vmap(jax.hessian(_smooth))),
            (_xs,),
        ),
    ],
    ids=[
        "grad(e)",
        "e(grad)",
        "jit(e(grad(e)))",
        "vmap(e(jit))",
        "jit(e(vmap(grad(e))))",
        "jvp(e)",
        "jit(hessian(e))",
        "jit(e(hessian))",
        "jit(jacfwd(e(grad)))",
        "jit(vmap(hessian(e(e))))",
    ],
)
def test_composes_with_jax_transformations(transformed, reference, args):
    matches_flags_off(transformed, reference, *args)


def test_a_changing_interpreter_is_differentiated_through():
    def f(x):
        return jnp.sum(jnp.sin(x) * x)

    def f_cos(x):
        return jnp.sum(jnp.cos(x) * x)

    tree_allclose(jax.grad(SinToCos().transform(f))(_x), jax.grad(f_cos)(_x))
    tree_allclose(
        jax.vmap(jax.grad(SinToCos().transform(f)))(_xs), jax.vmap(jax.grad(f_cos))(_xs)
    )


# ---------------------------------------------------------------------------
# `transform` keeps the function's signature.


def test_transform_keeps_signature_name_and_wrapped():
    def model(params: dict, x: jax.Array, *, scale: float = 1.0) -> Point:
        """A documented model."""
        return Point(params["w"] * x * scale, [params["b"], None])

    transformed = PrimitiveLog().transform(model)
    assert transformed.__name__ == "model"
    assert transformed.__wrapped__ is model
    assert transformed.__doc__ == model.__doc__
    assert inspect.signature(transformed) == inspect.signature(model)
    params = {"w": jnp.ones(2), "b": jnp.zeros(())}
    out = transformed(params, jnp.arange(2.0), scale=2.0)
    assert isinstance(out, Point)
    assert_tree_equal(out, model(params, jnp.arange(2.0), scale=2.0))


def test_transform_of_a_partial_and_a_callable_object():
    class Affine:
        def __init__(self, a):
            self.a = a

        def __call__(self, x, b):
            return self.a * x + b

    affine = Affine(jnp.float32(3.0))
    assert_tree_equal(evaluate(affine)(jnp.ones(2), 1.0), affine(jnp.ones(2), 1.0))
    part = functools.partial(affine, b=2.0)
    assert_tree_equal(evaluate(part)(jnp.ones(2)), part(jnp.ones(2)))


# ---------------------------------------------------------------------------
# `Env`.


def test_env_reads_literals_and_ignores_drop_vars():
    def f(x):
        return jnp.cos(x) * 2.0

    jaxpr = stage(f, jnp.arange(3.0)).jaxpr
    cos_eqn, mul_eqn = jaxpr.eqns
    literal = mul_eqn.invars[1]
    assert isinstance(literal, jax.extend.core.Literal)
    (kept,) = cos_eqn.outvars
    # JAX 0.7 stages unused results as `DropVar`s; later releases do not.
    drop = jaxinterp._jax_compat.DropVar(kept.aval)

    env = Env()
    assert env.known(literal) and not env.known(kept)
    assert env.read(literal) == 2.0
    env.write(drop, "ignored")
    env.write_many([drop, kept], [jnp.zeros(3), jnp.ones(3)])
    assert drop not in env and len(env) == 1
    assert env.known(kept)
    assert_tree_equal(env.read_many([kept, literal])[0], jnp.ones(3))
    assert env.read_many([kept, literal])[1] == 2.0
    env.release([kept, kept])
    assert not env.known(kept)


def test_multiple_result_primitives_and_dropped_outputs():
    def f(x):
        keys, values = lax.sort((x, jnp.arange(x.shape[0])), num_keys=1)
        _, ys = lax.scan(lambda c, v: (c + v, c * v), 0.0, keys)
        return values, ys

    log = PrimitiveLog()
    x = jnp.array([3.0, 1.0, 2.0])
    assert_tree_equal(log.transform(f)(x), f(x))
    assert "sort" in log.names and "scan" in log.constructs


def test_release_plan_frees_each_value_after_its_last_use():
    def f(x):
        a = jnp.sin(x)
        b = jnp.cos(a)
        c = b * x
        return c + a, b

    jaxpr = stage(f, jnp.ones(3)).jaxpr
    plan = check_release_plan(jaxpr)
    assert jaxpr.invars[0] in plan[2]  # `x` is freed once `c` is made
    assert release_plan(jaxpr) is plan  # computed once per jaxpr


def test_release_plan_frees_unused_results_at_once():
    def f(x):
        jnp.sin(x)  # unused
        carry, ys = lax.scan(lambda c, v: (c + v, c * v), 0.0, x)  # carry unused
        return x * 2.0, ys

    jaxpr = stage(f, jnp.ones(3)).jaxpr
    check_release_plan(jaxpr)
    # Also when a result stops being returned.
    check_release_plan(jaxpr.replace(outvars=jaxpr.outvars[:1]))
    check_release_plan(stage(_nested, jnp.ones(3)).jaxpr)


class _Probe(Interpreter):
    """Counts how many earlier results are still alive at each equation."""

    cache_subcalls = False

    def __init__(self):
        super().__init__()
        self.refs = []
        self.most_alive = 0

    def process_eqn(self, eqn, invals):
        alive = sum(ref() is not None for ref in self.refs)
        self.most_alive = max(self.most_alive, alive)
        outvals = super().process_eqn(eqn, invals)
        self.refs.extend(weakref.ref(v) for v in outvals)
        return outvals


def test_a_long_eager_chain_does_not_keep_intermediates_alive():
    def chain(x):
        for _ in range(40):
            x = jnp.sin(x) + 1.0
        return x

    probe = _Probe()
    x = jnp.ones(1000)
    out = probe.transform(chain)(x)
    assert len(probe.refs) == 80
    # Only the operand of the current equation is alive, not 80 arrays.
    assert probe.most_alive <= 2
    assert sum(ref() is not None for ref in probe.refs) == 1  # just `out`
    assert_tree_equal(out, chain(x))


# ---------------------------------------------------------------------------
# `BackwardWalker`.


class Undo(BackwardWalker):
    name = "undo"

    def process_eqn_backward(self, eqn, outvals):
        (y,) = outvals
        prim = eqn.primitive
        if prim is lax.exp_p:
            return [jnp.log(y)]
        if prim is lax.sin_p:
            return [jnp.arcsin(y)]
        if prim is lax.mul_p:
            scale = eqn.invars[1].val
            return [y / scale, None]
        if prim is lax.add_p:
            return [y - eqn.invars[1].val, None]
        raise NotImplementedError(prim.name)


def test_backward_walker_inverts_a_simple_chain():
    def f(x):
        return jnp.exp(jnp.sin(x) * 0.5) + 3.0

    x = jnp.linspace(-1.0, 1.0, 5)
    staged = stage(f, x)
    (recovered,) = Undo().eval_jaxpr_backward(staged.jaxpr, staged.consts, f(x))
    tree_allclose(recovered, x, rtol=1e-5, atol=1e-6)


def test_backward_walker_reports_unreached_inputs_and_failing_rules():
    staged = stage(lambda x, y: jnp.exp(x), 1.0, 2.0)
    with pytest.raises(RuleError, match="`undo` could not reach inputs"):
        Undo().eval_jaxpr_backward(staged.jaxpr, staged.consts, 2.0)

    staged = stage(lambda x: jnp.cos(x), 1.0)
    with pytest.raises(RuleError, match=re.escape("`undo` at primitive `cos`")) as info:
        Undo().eval_jaxpr_backward(staged.jaxpr, staged.consts, 0.5)
    assert isinstance(info.value.__cause__, NotImplementedError)


def test_backward_walker_must_be_subclassed():
    staged = stage(jnp.exp, 1.0)
    with pytest.raises(RuleError, match="must implement `process_eqn_backward`"):
        BackwardWalker().eval_jaxpr_backward(staged.jaxpr, staged.consts, 1.0)


def test_higher_order_primitives_lists_the_handled_constructs():
    handled = jaxinterp.higher_order_primitives()
    for fn, args in [
        (jax.jit(jnp.sin), (1.0,)),
        (lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x), (1.0,)),
        (lambda x: lax.scan(lambda c, v: (c, v), 0.0, x), (jnp.ones(2),)),
        (lambda x: lax.while_loop(lambda c: c < 1, lambda c: c + 1, x), (0.0,)),
        (jax.checkpoint(jnp.sin), (1.0,)),
        (jax.nn.relu, (1.0,)),
    ]:
        prims = [e.primitive for e in stage(fn, *args).jaxpr.eqns]
        assert any(p in handled for p in prims), prims
    assert all(isinstance(p, jax.extend.core.Primitive) for p in handled)


def test_recursion_limit_is_not_lowered_under_another_thread():
    # Walks raise Python's (process-wide) recursion limit. A walk that ends
    # must not restore the old limit while another thread is still walking.
    recursion_limit = jaxinterp._recursion.recursion_limit
    limit = sys.getrecursionlimit()
    target = limit + 5000
    entered, first_done = threading.Event(), threading.Event()
    seen = []

    def second_walk():
        with recursion_limit(target):
            entered.set()
            first_done.wait(timeout=10)
            seen.append(sys.getrecursionlimit())

    with recursion_limit(target):
        thread = threading.Thread(target=second_walk)
        thread.start()
        assert entered.wait(timeout=10)
    first_done.set()
    thread.join(timeout=10)
    assert seen == [target]
    assert sys.getrecursionlimit() == limit
