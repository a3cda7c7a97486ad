"""Error types and messages: they name the transform, the primitive, the user line."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp import (
    Interpreter,
    JaxinterpError,
    MissingRuleError,
    RuleError,
    RuleRegistry,
    StagingError,
    eval_closed_jaxpr,
    evaluate,
    stage,
)

# Default float and int types: 64-bit under `JAX_ENABLE_X64=1`.
F = "f64" if jax.config.jax_enable_x64 else "f32"
I = "i64" if jax.config.jax_enable_x64 else "i32"  # noqa: E741


def _line_of(fn, marker: str) -> int:
    """The line number of the first line of `fn`'s source containing `marker`."""
    lines, first = inspect.getsourcelines(fn)
    for offset, text in enumerate(lines):
        if marker in text:
            return first + offset
    raise AssertionError(f"{marker!r} not in the source of {fn.__name__}")


def _cites(message: str, line: int) -> bool:
    """Whether `message` cites this file at `line` (as `file.py:LINE`)."""
    return (
        re.search(re.escape(f"test_errors.py:{line}") + r"(?!\d)", message) is not None
    )


# ---------------------------------------------------------------------------
# The error hierarchy.


def test_errors_subclass_jaxinterp_error_and_the_matching_builtin():
    assert issubclass(StagingError, JaxinterpError) and issubclass(
        StagingError, TypeError
    )
    assert issubclass(RuleError, JaxinterpError) and issubclass(RuleError, RuntimeError)
    assert issubclass(MissingRuleError, JaxinterpError)
    assert issubclass(MissingRuleError, NotImplementedError)
    assert issubclass(jaxinterp.NotInvertibleError, ValueError)


# ---------------------------------------------------------------------------
# Non-callables.


class Strict(Interpreter):
    name = "strict"


@pytest.mark.parametrize(
    "call, transform",
    [
        (lambda fn: evaluate(fn), "evaluate"),
        (lambda fn: Interpreter().transform(fn), "interpret"),
        (lambda fn: Strict().transform(fn), "strict"),
        (lambda fn: stage(fn, 1.0), "stage"),
    ],
    ids=["evaluate", "transform", "subclass", "stage"],
)
@pytest.mark.parametrize("value", [3, "sin", None], ids=["int", "str", "None"])
def test_non_callable_is_a_staging_error(call, transform, value):
    with pytest.raises(StagingError) as info:
        call(value)
    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        f"`{transform}` expects a callable, got {type(value).__name__}: {value!r}."
    )


# ---------------------------------------------------------------------------
# Calls that do not match the staging.


def _pair_fn(x, tree):
    return x + tree["a"]


def test_flatten_args_names_expected_and_received_structures():
    staged = stage(_pair_fn, 1.0, {"a": jnp.ones(2)})
    expected = str(staged.in_tree)
    received = str(jax.tree_util.tree_structure(((1.0, {"b": jnp.ones(2)}), {})))
    with pytest.raises(StagingError) as info:
        staged.flatten_args(1.0, {"b": jnp.ones(2)})
    message = str(info.value)
    assert message.startswith("`_pair_fn` was staged for arguments with structure")
    assert expected in message and received in message
    assert "Stage it again" in message

    with pytest.raises(StagingError, match="was staged for arguments with structure"):
        staged.flatten_args(1.0)  # too few arguments


def test_flatten_args_names_the_leaf_and_both_types():
    staged = stage(_pair_fn, 1.0, {"a": jnp.ones(2)})
    with pytest.raises(
        StagingError,
        match=re.escape(
            f"`_pair_fn` was staged with args[1]['a'] of type {F}[2] but was "
            f"called with {F}[3]."
        ),
    ):
        staged.flatten_args(1.0, {"a": jnp.ones(3)})
    with pytest.raises(
        StagingError,
        match=re.escape(
            f"was staged with args[0] of type {F}[] but was called with "
            f"{I}[] (Python int)."
        ),
    ):
        staged.flatten_args(1, {"a": jnp.ones(2)})


def test_flatten_args_names_keyword_arguments():
    staged = stage(lambda x, *, scale: x * scale, jnp.ones(2), scale=jnp.ones(2))
    with pytest.raises(StagingError, match=re.escape("with kwargs['scale'] of type")):
        staged.flatten_args(jnp.ones(2), scale=jnp.ones(2, jnp.int32))


def test_eval_jaxpr_checks_the_argument_count_and_types():
    closed = jax.make_jaxpr(lambda x, y: x * y)(1.0, jnp.ones(3))
    with pytest.raises(
        StagingError,
        match=re.escape(
            f"`eval_closed_jaxpr` got 1 arguments ({F}[] (Python float)) for a Jaxpr "
            f"with 2 inputs ({F}[], {F}[3])."
        ),
    ):
        eval_closed_jaxpr(closed, 1.0)
    with pytest.raises(
        StagingError,
        match=re.escape(f"`eval_closed_jaxpr` input 1 expects {F}[3], got {F}[4]."),
    ):
        eval_closed_jaxpr(closed, 1.0, jnp.ones(4))
    with pytest.raises(
        StagingError,
        match=re.escape(f"`eval_closed_jaxpr` input 0 expects {F}[], got i32[]."),
    ):
        eval_closed_jaxpr(closed, jnp.int32(1), jnp.ones(3))


# ---------------------------------------------------------------------------
# Rules that raise.


class Fragile(Interpreter):
    name = "fragile"
    rules = RuleRegistry("fragile")


@Fragile.rules.register(lax.sin_p)
def _sin_fragile(x, **params):
    raise ZeroDivisionError("sin is not allowed here")


def _user_top(x):
    y = x * 2.0
    return jnp.sin(y) + 1.0  # FAIL-TOP


def _user_jit(x):
    return jax.jit(lambda y: jnp.sin(y) * 3.0)(x)  # FAIL-JIT


def _user_scan(x):
    def body(carry, v):
        return carry + jnp.sin(v), carry  # FAIL-SCAN

    return lax.scan(body, 0.0, x)


def _user_cond(x):
    return lax.cond(
        x.sum() > 0,
        lambda y: jnp.sin(y) * 2.0,  # FAIL-COND
        lambda y: y,
        x,
    )


def _user_while(x):
    return lax.while_loop(
        lambda c: c.sum() < 10.0,
        lambda c: c + jnp.sin(c) + 1.0,  # FAIL-WHILE
        x,
    )


def _user_custom_jvp(x):
    return jax.nn.relu(x) + jax.checkpoint(lambda y: jnp.sin(y))(x)  # FAIL-REMAT


@pytest.mark.parametrize(
    "fn, marker",
    [
        (_user_top, "FAIL-TOP"),
        (_user_jit, "FAIL-JIT"),
        (_user_scan, "FAIL-SCAN"),
        (_user_cond, "FAIL-COND"),
        (_user_while, "FAIL-WHILE"),
        (_user_custom_jvp, "FAIL-REMAT"),
    ],
    ids=["top", "jit", "scan", "cond", "while", "checkpoint"],
)
def test_rule_error_names_transformation_primitive_and_user_line(fn, marker):
    line = _line_of(fn, marker)
    with pytest.raises(RuleError) as info:
        Fragile().transform(fn)(jnp.ones(3))
    message = str(info.value)
    assert message.startswith("`fragile` at primitive `sin`, used at ")
    assert _cites(message, line), message
    cited = message.split("used at ", 1)[1].split(",", 1)[0]
    assert "jaxinterp" not in cited
    assert "raised ZeroDivisionError: sin is not allowed here" in message
    assert re.search(rf"\n\nOperands: {F}\[3?\]\.$", message)  # a scan body: f32[]
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_rule_error_message_matches_with_re_escape():
    line = _line_of(_user_top, "FAIL-TOP")
    with pytest.raises(
        RuleError,
        match=re.escape("`fragile` at primitive `sin`, used at ")
        + r".*"
        + re.escape(f"test_errors.py:{line}"),
    ):
        Fragile().transform(_user_top)(jnp.ones(3))


def test_process_eqn_that_raises_is_a_rule_error():
    class Broken(Interpreter):
        name = "broken"

        def process_eqn(self, eqn, invals):
            if eqn.primitive is lax.mul_p:
                raise ValueError("no multiplication")
            return super().process_eqn(eqn, invals)

    line = _line_of(_user_top, "y = x * 2.0")
    with pytest.raises(
        RuleError, match=re.escape("`broken` at primitive `mul`")
    ) as info:
        Broken().transform(_user_top)(jnp.ones(3))
    assert _cites(str(info.value), line)


def test_missing_rule_error_from_a_strict_walker_passes_through_unchanged():
    class Lookup(Interpreter):
        name = "lookup"
        rules = RuleRegistry("lookup", qualname="lookup_rules")

        def process_eqn(self, eqn, invals):
            return self.rules.lookup(eqn)(*invals, **eqn.params)

    Lookup.rules.register(lax.mul_p, lambda x, y, **params: [x * y])
    Lookup.rules.register(lax.add_p, lambda x, y, **params: [x + y])
    line = _line_of(_user_top, "FAIL-TOP")
    with pytest.raises(MissingRuleError) as info:
        Lookup().transform(_user_top)(jnp.ones(3))
    message = str(info.value)
    assert message.startswith("`lookup` has no rule for primitive `sin`, used at ")
    assert _cites(message, line)
    assert "Register one with `@lookup_rules.register(lax.sin_p)`." in message


# ---------------------------------------------------------------------------
# Rules that return the wrong thing.


@pytest.mark.parametrize(
    "returned, got",
    [
        (lambda x: [x, x], "2 values"),
        (lambda x: [], "0 values"),
        (lambda x: x, f"a ArrayImpl ({F}[1])"),
    ],
    ids=["two-values", "no-value", "bare-array"],
)
def test_rule_returning_the_wrong_number_of_values_is_a_rule_error(returned, got):
    class Sloppy(Interpreter):
        name = "sloppy"
        rules = RuleRegistry("sloppy")

    Sloppy.rules.register(lax.sin_p, lambda x, **params: returned(x))
    line = _line_of(_user_top, "FAIL-TOP")
    with pytest.raises(
        RuleError,
        match=re.escape("`sloppy` at primitive `sin`, used at "),
    ) as info:
        # A bare array of length 1 would otherwise be split along its axis.
        Sloppy().transform(_user_top)(jnp.ones(1))
    message = str(info.value)
    assert f"processing the equation gave {got} for 1 outputs." in message
    assert "must return a list with one value per output" in message
    assert _cites(message, line)


def test_process_eqn_returning_a_bare_array_is_a_rule_error():
    class Bare(Interpreter):
        def process_eqn(self, eqn, invals):
            (out,) = super().process_eqn(eqn, invals)
            return out

    with pytest.raises(RuleError, match=re.escape("for 1 outputs")):
        Bare().transform(_user_top)(jnp.ones(1))


def test_rule_may_return_a_tuple():
    class Tupled(Interpreter):
        rules = RuleRegistry("tupled")

    Tupled.rules.register(lax.sin_p, lambda x, **params: (jnp.cos(x),))
    x = jnp.ones(3)
    assert jnp.array_equal(Tupled().transform(_user_top)(x), jnp.cos(x * 2.0) + 1.0)


# -- a rule's results checked where it returns them ----------------------------


def _interpreter_with_tanh_rule(rule, *, changes_dtypes=False):
    rules = RuleRegistry("checked")
    rules.register(lax.tanh_p, rule)

    class Checked(Interpreter):
        name = "checked"

    Checked.rules = rules
    Checked.changes_dtypes = changes_dtypes
    return Checked()


def _returns_seven(x, **params):
    return [jnp.zeros(7, x.dtype)]


@pytest.mark.parametrize("jit", [False, True])
def test_a_rule_result_of_the_wrong_shape_is_refused_where_it_is_returned(jit):
    interp = _interpreter_with_tanh_rule(_returns_seven)
    fn = interp.transform(lambda v: jnp.sum(jnp.tanh(v)))
    fn = jax.jit(fn) if jit else fn
    with pytest.raises(RuleError) as info:
        fn(jnp.ones(3))
    message = str(info.value)
    assert "`checked` at primitive `tanh`" in message
    assert "test_errors.py" in message  # the user's line
    assert f"its rule `_returns_seven` returned {F}[7] for result 0" in message
    assert "the equation's result is float" in message and "[3]" in message


def test_a_rule_result_of_another_dtype_is_refused_unless_the_interpreter_says_so():
    def half(x, **params):
        return [jnp.tanh(x).astype(jnp.float16)]

    def fn(v):
        return jnp.tanh(v) * 2.0

    with pytest.raises(RuleError, match=r"returned f16\[3\] for result 0"):
        _interpreter_with_tanh_rule(half).transform(fn)(jnp.ones(3))
    # Said on purpose: the result is the rule's, in its dtype.
    mixed = _interpreter_with_tanh_rule(half, changes_dtypes=True)
    got = mixed.transform(jnp.tanh)(jnp.ones(3))
    want = jnp.tanh(jnp.ones(3)).astype(jnp.float16)
    assert got.dtype == jnp.float16 and jnp.array_equal(got, want)


@given(
    st.lists(st.integers(1, 4), min_size=0, max_size=3),
    st.lists(st.integers(1, 4), min_size=0, max_size=3),
)
@settings(max_examples=min(20, settings.default.max_examples), deadline=None)
def test_only_a_result_of_the_equations_shape_is_accepted(shape, returned):
    def rule(x, **params):
        return [jnp.broadcast_to(jnp.cos(jnp.ravel(x)[:1]).reshape(()), returned)]

    x = jnp.full(shape, 0.5)
    fn = _interpreter_with_tanh_rule(rule).transform(jnp.tanh)
    if tuple(shape) == tuple(returned):
        assert jnp.array_equal(fn(x), jnp.full(shape, jnp.cos(0.5)))
    else:
        with pytest.raises(RuleError, match="for result 0, where the equation"):
            fn(x)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_run_with_the_wrong_number_of_flat_arguments_names_the_inputs(n):
    staged = stage(lambda a, b: a + b, 1.0, 2.0)
    with pytest.raises(TypeError) as info:
        Interpreter().run(staged, [1.0] * n)
    assert f"takes 2 flat arguments ({F}[], {F}[]), got {n}" in str(info.value).replace(
        "float32", "f32"
    ).replace("float64", "f64")
    assert Interpreter().run(staged, [1.0, 2.0])[0] == 3.0
