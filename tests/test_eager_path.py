"""The walker's eager fast path: per-Jaxpr plans of compiled calls.

Outside any trace, an interpreter that keeps the default `process_eqn` runs
each equation as a cached compiled call, with broadcasts and reshapes compiled
into the elementwise equation consuming them. These tests check that the plan
gives the same bits as the function itself and as JAX's own per-primitive
`jax.core.eval_jaxpr`, releases values, notices new rules and contexts, and
still reports failures with the user's line.
"""

from __future__ import annotations

import logging
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_equal
from hypothesis import given, strategies as st
from jax import lax
from jax.extend.core import jaxpr_as_fun

import jaxinterp
from jaxinterp import EvalInterpreter, Interpreter, RuleError, RuleRegistry, stage
from jaxinterp._eager import _ABSORBED

_DropVar = jaxinterp._jax_compat.DropVar


def _plan(interp, fn, *args):
    """Call `interp.transform(fn)` eagerly twice and return the plan the
    second call walked (the first plan compiles nothing of its own)."""
    interp.transform(fn)(*args)
    interp.transform(fn)(*args)
    return interp._eager_plans.get(stage(fn, *args).jaxpr)


class _Compiles(logging.Handler):
    """Counts the executables JAX compiles while installed (`jax.log_compiles`)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith("Compiling")

    def __enter__(self):
        self._logs = jax.log_compiles()
        self._logs.__enter__()
        logging.getLogger("jax").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("jax").removeHandler(self)
        self._logs.__exit__(*exc)


def _layered(jitted_layer):
    layer = jax.jit(jnp.dot) if jitted_layer else jnp.dot

    def f(x, w):
        return jnp.sum(jnp.tanh(layer(x, w)) * 2.0 + 1.0, axis=-1)

    return f


def _fresh_inputs(n):
    """Inputs of a shape nothing else uses, so none of it is compiled yet."""
    x = jnp.linspace(-1.0, 1.0, n).reshape(1, -1)
    return x, jnp.full((n, 3), 0.5)


@pytest.mark.parametrize("jitted_layer", [False, True])
def test_a_first_eager_call_compiles_no_more_than_eval_jaxpr(jitted_layer):
    f = _layered(jitted_layer)
    x, w = _fresh_inputs(41 + jitted_layer)
    closed = jax.make_jaxpr(f)(x, w)
    with _Compiles() as reference:
        want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x, w)
    x, w = _fresh_inputs(45 + jitted_layer)  # cold again
    with _Compiles() as first:
        got = jaxinterp.evaluate(f)(x, w)
    assert 0 < first.count <= reference.count
    np.testing.assert_array_equal(got, f(x, w))
    assert want[0].shape == got.shape


def test_a_first_eager_call_reuses_what_the_programs_own_eager_call_compiled():
    # A training step: its backward pass ran eagerly inside `f`'s call, under
    # equation contexts (JAX 0.7 to 0.10 key single-primitive executables by
    # them); evaluate's first call must find those executables as
    # `jax.core.eval_jaxpr` does, not compile them again.
    def f(w, x):
        def loss(w):
            h = jax.nn.relu(lax.dot(x, w)) / 4.0
            return jnp.mean(h.reshape(-1) ** 2)

        value, grad = jax.value_and_grad(loss)(w)
        return value, w - 0.1 * grad

    def counts(n, first_call):
        w, x = jnp.full((n, 5), 0.25), jnp.linspace(-1.0, 1.0, 3 * n).reshape(3, n)
        jax.block_until_ready(f(w, x))  # `f` ran before
        with _Compiles() as compiles:
            got = first_call(w, x)
        for a, b in zip(got, f(w, x), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        return compiles.count

    def eval_jaxpr(w, x):
        closed = jax.make_jaxpr(f)(w, x)
        return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, w, x)

    reference = counts(61, eval_jaxpr)
    assert counts(63, jaxinterp.evaluate(f)) <= reference


@pytest.mark.parametrize("jitted_layer", [False, True])
def test_later_eager_calls_compile_their_fused_steps_once(jitted_layer):
    f = _layered(jitted_layer)
    x, w = _fresh_inputs(51 + jitted_layer)
    want = f(x, w)
    np.testing.assert_array_equal(jaxinterp.evaluate(f)(x, w), want)
    np.testing.assert_array_equal(jaxinterp.evaluate(f)(x, w), want)  # fuses
    with _Compiles() as later:
        np.testing.assert_array_equal(jaxinterp.evaluate(f)(x, w), want)
    assert later.count == 0


def _kinds(plan):
    """Per walked equation: 'absorbing' (it computes movers too), 'compiled' or
    'general' (through `process_eqn`), one per equation the walk runs."""
    kinds = []
    for _, step, _, _ in plan.program:
        if step is None:
            kinds.append("general")
        else:
            kinds.append("absorbing" if step.absorbed else "compiled")
    return kinds


# ---------------------------------------------------------------------------
# Bit for bit, over random broadcasting programs.

_BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "where": lambda a, b: jnp.where(a > b, a, b),
    "div": jnp.divide,
    # A broadcast made by hand, then an elementwise op: two eager dispatches
    # in `fn`, so the walker must not compile them together for `div`.
    "div_explicit": lambda a, b: (
        a / jnp.broadcast_to(b, jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b)))
    ),
    "mul_explicit": lambda a, b: (
        a * jnp.broadcast_to(b, jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b)))
    ),
    "mul_transposed": lambda a, b: (a.T * b.T).T,
}


@st.composite
def _broadcast_programs(draw):
    """A chain of binary ops on operands broadcast against one full shape."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from([np.float32, np.int32, jnp.bfloat16]))
    n_ops = draw(st.integers(1, 4))
    ops = draw(
        st.lists(st.sampled_from(sorted(_BINARY)), min_size=n_ops, max_size=n_ops)
    )
    operands = []
    for _ in range(n_ops):
        # Drop some leading axes and set some others to 1: NumPy broadcasting.
        keep = draw(st.integers(0, rank))
        sub = [d if draw(st.booleans()) else 1 for d in shape[rank - keep :]]
        operands.append(tuple(sub))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def value(s):
        if dtype is np.int32:
            return jnp.asarray(rng.integers(1, 9, size=s), np.int32)
        return jnp.asarray(rng.uniform(0.5, 3.0, size=s), dtype)

    x = value(shape)
    ys = [value(s) for s in operands]

    def fn(x, ys):
        for name, y in zip(ops, ys, strict=True):
            x = _BINARY[name](x, y)
            if np.issubdtype(x.dtype, np.integer):
                x = jnp.clip(x, -1000, 1000)
        return x

    return fn, x, ys, ops


@given(_broadcast_programs())
def test_property_eager_plan_is_bitwise_equal_to_fn_and_to_eval_jaxpr(case):
    fn, x, ys, _ = case
    ours = jaxinterp.evaluate(fn)(x, ys)
    assert_tree_equal(ours, fn(x, ys))
    # JAX's own interpreter re-binds primitive by primitive.
    closed = stage(fn, x, ys).closed_jaxpr
    (reference,) = jaxpr_as_fun(closed)(x, *ys)
    assert_tree_equal(ours, reference)


# ---------------------------------------------------------------------------
# What the plan compiles together.


def test_a_bias_broadcast_is_compiled_into_the_add():
    def f(x, b):
        return jnp.tanh(x + b)

    x, b = jnp.ones((4, 3)), jnp.arange(3.0)
    plan = _plan(EvalInterpreter(), f, x, b)
    prims = [eqn.primitive.name for eqn, *_ in plan.program]
    assert prims == ["add", "tanh"]  # no separate broadcast_in_dim step
    assert _kinds(plan) == ["absorbing", "compiled"]
    (add_step,) = [s for _, s, _, _ in plan.program if s.absorbed]
    assert [e.primitive.name for e in add_step.absorbed] == ["broadcast_in_dim"]
    assert_tree_equal(jaxinterp.evaluate(f)(x, b), f(x, b))


def test_division_and_shared_or_returned_movers_are_not_absorbed():
    def f(x, b):
        c = jnp.broadcast_to(b, x.shape)  # used twice
        d = jnp.reshape(x, (3, 4))  # returned
        return x / b, c * x + c, d

    x, b = jnp.ones((4, 3)) * 3.0, jnp.arange(1.0, 4.0)
    plan = _plan(EvalInterpreter(), f, x, b)
    staged = stage(f, x, b)
    names = [eqn.primitive.name for eqn in staged.jaxpr.eqns]
    walked = [eqn.primitive.name for eqn, *_ in plan.program]
    # Nothing could be absorbed: the divide's broadcast feeds a division, the
    # other broadcast has two users, and the reshape is an output.
    assert walked == names
    assert "absorbing" not in _kinds(plan)
    assert_tree_equal(jaxinterp.evaluate(f)(x, b), f(x, b))


def test_absorbed_steps_are_never_materialised_and_values_are_released():
    def f(x, b, c):
        y = x + b  # broadcast of b absorbed
        z = jnp.sin(y) * c[:, None]  # broadcast (through a reshape) absorbed
        return jnp.sum(z * z)

    args = (jnp.ones((4, 3)), jnp.arange(3.0), jnp.arange(4.0))
    plan = _plan(EvalInterpreter(), f, *args)
    staged = stage(f, *args)
    jaxpr = staged.jaxpr
    absorbed = {
        id(e) for _, s, _, _ in plan.program if s is not None for e in s.absorbed
    }
    assert len(absorbed) >= 2
    assert not any(s is _ABSORBED for _, s, _, _ in plan.program)

    # Replay the plan: after each step, exactly the values read later (or
    # returned) are held; absorbed results are never held.
    def variables(vs):
        return {v for v in vs if type(v) is jaxinterp._jax_compat.Var}

    defined = set(jaxpr.invars) | set(jaxpr.constvars)
    held = set(defined)
    program = plan.program
    outvars = variables(jaxpr.outvars)
    for k, (eqn, _, writes, dead) in enumerate(program):
        assert id(eqn) not in absorbed
        written = {v for _, v in writes}
        assert written == {v for v in eqn.outvars if type(v) is not _DropVar}
        defined |= written
        held = (held | written) - set(dead)
        later = set()
        for e, s, _, _ in program[k + 1 :]:
            later |= variables(e.invars if s is None else s.inputs)
        needed = {v for v in defined if v in later or v in outvars}
        assert held == needed, f"after step {k}: held {held}, needed {needed}"
    assert held == outvars
    assert_tree_equal(jaxinterp.evaluate(f)(*args), f(*args))


def test_literals_keep_their_types_on_the_fast_path():
    def f(x, n):
        return x * 0.5 + 2, n * 3, n > 2

    args = (jnp.arange(3.0), jnp.arange(3))
    assert_tree_equal(jaxinterp.evaluate(f)(*args), f(*args))
    # Weakly typed operands (from Python scalars) stay weakly typed.
    weak = (jnp.asarray(2.0), jnp.asarray(3))
    assert jax.typeof(weak[0]).weak_type
    assert_tree_equal(jaxinterp.evaluate(f)(*weak), f(*weak))


def test_the_fast_path_stays_out_of_traces():
    def f(x, b):
        return jnp.exp(x + b) * 2.0

    args = (jnp.ones((2, 3)), jnp.ones(3))
    evaluated = jaxinterp.evaluate(f)
    evaluated(*args)  # build the eager plan first
    ours = jax.make_jaxpr(evaluated)(*args)
    theirs = jax.make_jaxpr(f)(*args)
    assert [e.primitive for e in ours.eqns] == [e.primitive for e in theirs.eqns]
    assert_tree_equal(jax.jit(evaluated)(*args), jax.jit(f)(*args))
    assert_tree_equal(
        jax.grad(lambda x: evaluated(x, args[1]).sum())(args[0]),
        jax.grad(lambda x: f(x, args[1]).sum())(args[0]),
    )


# ---------------------------------------------------------------------------
# Rules, contexts and interpreters the plan must respect.


def test_a_rule_registered_after_the_first_call_takes_effect():
    class Mine(Interpreter):
        name = "mine"
        rules = RuleRegistry("mine")

    f = lambda x: jnp.sin(x) + 1.0  # noqa: E731
    interp = Mine()
    x = jnp.linspace(0.0, 1.0, 4)
    transformed = interp.transform(f)
    assert_tree_equal(transformed(x), f(x))  # plan built, `sin` compiled
    Mine.rules.register(lax.sin_p, lambda x, **params: [lax.cos(x)])
    assert_tree_equal(transformed(x), jnp.cos(x) + 1.0)
    Mine.rules.unregister(lax.sin_p)
    assert_tree_equal(transformed(x), f(x))


def test_a_parent_registry_rule_added_later_takes_effect():
    parent = RuleRegistry("parent")

    class Child(Interpreter):
        rules = RuleRegistry("child", parent=parent)

    transformed = Child().transform(lambda x: jnp.exp(x) * 2.0)
    x = jnp.ones(3)
    assert_tree_equal(transformed(x), jnp.exp(x) * 2.0)
    parent.register(lax.exp_p, lambda x, **params: [x])
    assert_tree_equal(transformed(x), x * 2.0)


def test_process_eqn_overrides_see_every_equation_eagerly():
    seen = []

    class Spy(Interpreter):
        def process_eqn(self, eqn, invals):
            seen.append(eqn.primitive.name)
            return super().process_eqn(eqn, invals)

    f = lambda x, b: jnp.sin(x + b)  # noqa: E731
    args = (jnp.ones((2, 3)), jnp.ones(3))
    spy = Spy().transform(f)
    for _ in range(2):
        seen.clear()
        assert_tree_equal(spy(*args), f(*args))
        assert seen == ["broadcast_in_dim", "add", "sin"]


def test_equations_staged_under_another_context_keep_it():
    set_xla_metadata = pytest.importorskip(
        "jax.experimental.xla_metadata"
    ).set_xla_metadata

    def f(x):
        with set_xla_metadata(note="kept"):
            y = jnp.sin(x)
        return y * 2.0

    x = jnp.linspace(0.0, 1.0, 5)
    interp = EvalInterpreter()
    plan = _plan(interp, f, x)
    names = [e.primitive.name for e, *_ in plan.program]
    kinds = dict(zip(names, _kinds(plan), strict=True))
    assert kinds == {"sin": "general", "mul": "compiled"}
    assert_tree_equal(interp.transform(f)(x), f(x))
    # The HLO the general path compiles carries the metadata.
    hlo = jax.jit(interp.transform(f)).lower(x).as_text()
    assert "kept" in hlo


def test_higher_order_policies_are_respected_eagerly():
    inner = jax.jit(lambda x: jnp.sin(x) * 2.0)
    f = lambda x: inner(x) + 1.0  # noqa: E731
    x = jnp.ones(3)
    recursive = _plan(EvalInterpreter(), f, x)
    opaque = _plan(EvalInterpreter(higher_order="opaque"), f, x)
    assert _kinds(recursive)[0] == "compiled"  # the rebuilt `jax.jit`
    assert _kinds(opaque)[0] == "general"  # re-bound as it is
    interp = EvalInterpreter()
    transformed = interp.transform(f)
    assert_tree_equal(transformed(x), f(x))
    interp.higher_order = "opaque"  # a changed policy builds a new plan
    assert_tree_equal(transformed(x), f(x))
    assert _kinds(interp._eager_plans.get(stage(f, x).jaxpr))[0] == "general"


# ---------------------------------------------------------------------------
# Failures and threads.


def test_a_failing_compiled_step_is_reported_with_the_users_line():
    def f(x):
        return jnp.sin(x) * 2.0

    evaluated = jaxinterp.evaluate(f)
    x = jnp.ones(3)
    assert_tree_equal(evaluated(x), f(x))
    gone = jnp.ones(3)
    gone.delete()
    with pytest.raises(RuleError) as info:
        evaluated(gone)
    message = str(info.value)
    assert "`evaluate` at primitive `sin`" in message
    assert re.search(r"test_eager_path\.py:\d+", message)
    assert "Array has been deleted" in message


def test_concurrent_eager_calls_share_one_interpreter():
    def f(x, b):
        return jnp.cumsum(jnp.tanh(x * b + 1.0), axis=0)

    evaluated = jaxinterp.evaluate(f)
    inputs = [(jnp.full((5, 4), float(i)), jnp.arange(4.0) + i) for i in range(8)]
    results = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def work(i):
        barrier.wait(timeout=30)
        for _ in range(5):
            results[i] = evaluated(*inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for args, result in zip(inputs, results, strict=True):
        assert_tree_equal(result, f(*args))


def test_a_fully_compiled_plan_runs_as_one_generated_function():
    """Every step a compiled call: the plan runs as straight-line code (no
    per-equation bookkeeping), with the loop's results, bit for bit, for
    returned inputs, literals, closed-over constants and dropped results."""
    table = jnp.arange(3.0) * 0.25

    def f(x, n):
        values, _ = lax.sort_key_val(x * table, x)  # the second result dropped
        return values + 1.0, x, 2.0, n * 3

    args = (jnp.array([0.3, -1.0, 2.0]), jnp.arange(3))
    interp = EvalInterpreter()
    plan = _plan(interp, f, *args)
    assert plan.fused and plan.straight is not None
    staged = stage(f, *args)
    want = f(*args)
    assert_tree_equal(interp.transform(f)(*args), want)
    loop = jaxinterp._eager.EagerPlan.__new__(jaxinterp._eager.EagerPlan)
    for slot in jaxinterp._eager.EagerPlan.__slots__:
        setattr(loop, slot, getattr(plan, slot))
    loop.straight = None
    consts, jaxpr = staged.consts, staged.jaxpr
    leaves = jax.tree_util.tree_leaves(args)
    by_loop = jaxinterp._eager.run_plan(interp, jaxpr, loop, consts, leaves)
    by_code = plan.straight(consts, leaves)
    assert_tree_equal(by_code, by_loop)
    assert_tree_equal(by_code, jax.tree_util.tree_leaves(want))
