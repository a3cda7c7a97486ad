"""The primitive-trait table (`_inverse/_traits.py`) checked against JAX.

A trait is a claim the inverse analyses rely on (an `INCREASING` primitive
is solved by bisection-free monotone inversion, a `COPY` passes its value
through, ...). Each test here binds the primitives that carry one trait, as
JAX stages them, and checks the claim on sampled inputs, so a wrong entry
in the table fails here rather than as a wrong inverse.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

from jaxinterp import _jax_compat as compat
from jaxinterp._inverse import _traits as t

_BITWISE = {"and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor}
_BITWISE["not"] = lax.bitwise_not
# Where a primitive is defined (the default is (-0.9, 0.9)).
_DOMAIN = {
    "log": (0.1, 3.0),
    "sqrt": (0.1, 3.0),
    "rsqrt": (0.1, 3.0),
    "lgamma": (0.1, 3.0),
    "digamma": (0.1, 3.0),
    "acosh": (1.1, 3.0),
}


# Primitives with parameters, sampled with some.
_WITH_PARAMS: dict[str, Callable] = {
    "integer_pow": lambda x: lax.integer_pow(x, 3),
    "convert_element_type": lambda x: lax.convert_element_type(x, jnp.float16),
    "reduce_precision": lambda x: lax.reduce_precision(x, 5, 7),
    "copy": jnp.copy,
    "copy_p": jnp.copy,
}


def _unary(name: str) -> Callable | None:
    """A function of one float array that stages the primitive `name`, or
    `None` (not a function of one array, or not in this JAX release)."""
    fn = _WITH_PARAMS.get(name) or getattr(lax, name, None)
    if fn is None or name in t.having(t.BROADCASTING, t.LOGIC, t.MOVE):
        return None
    try:
        staged = _staged_name(fn, np.zeros(3, np.float32))
    except (TypeError, ValueError):
        return None
    return fn if staged == name else None


_MOVES: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "broadcast_in_dim": (lambda x: lax.broadcast_in_dim(x, (4, 2, 3), (1, 2)), (2, 3)),
    "squeeze": (lambda x: lax.squeeze(x, (0,)), (1, 2, 3)),
    "slice": (lambda x: lax.slice(x, (0, 1), (2, 3)), (2, 3)),
    "transpose": (lambda x: lax.transpose(x, (1, 0)), (2, 3)),
    "rev": (lambda x: lax.rev(x, (0,)), (2, 3)),
    "reshape": (lambda x: lax.reshape(x, (3, 2)), (2, 3)),
    "dynamic_slice": (lambda x: lax.dynamic_slice(x, (0, 1), (2, 2)), (2, 3)),
    "concatenate": (lambda x: lax.concatenate([x, x[::-1]], 0), (2, 3)),
    "pad": (lambda x: lax.pad(x, 0.5, ((1, 1, 0), (0, 0, 1))), (2, 3)),
}


def _staged_name(fn: Callable, *args) -> str:
    """The primitive of the last equation `fn` stages (its own, after any
    argument preparation)."""
    return jax.make_jaxpr(fn)(*args).jaxpr.eqns[-1].primitive.name


def _unaries(trait: str) -> list[str]:
    names = sorted(n for n in t.having(trait) if _unary(n) is not None)
    assert names, f"no primitive with {trait!r} can be sampled"
    return names


def _points(name: str, n: int = 257) -> np.ndarray:
    lo, hi = _DOMAIN.get(name, (-0.9, 0.9))
    return np.linspace(lo, hi, n, dtype=np.float32)


@pytest.mark.parametrize("name", _unaries(t.ELEMENTWISE))
def test_an_elementwise_primitive_acts_on_each_element_alone(name):
    fn = _unary(name)
    x = _points(name, 12).reshape(3, 4)
    assert _staged_name(fn, x) == name
    whole = np.asarray(fn(x), np.float64)
    alone = np.array([[np.float64(fn(v)) for v in row] for row in x])
    assert whole.shape == x.shape
    np.testing.assert_allclose(whole, alone, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", _unaries(t.INCREASING))
def test_an_increasing_primitive_orders_its_results(name):
    x = _points(name)
    y = np.asarray(_unary(name)(x))
    assert np.all(np.diff(y) >= 0) and y[-1] > y[0]


@pytest.mark.parametrize("trait", [t.POSITIVE, t.NONNEGATIVE])
def test_the_sign_of_a_result_is_as_the_table_says(trait):
    for name in _unaries(trait):
        lo, hi = _DOMAIN.get(name, (-5.0, 5.0))
        y = np.asarray(_unary(name)(np.linspace(lo, hi, 101, dtype=np.float32)))
        assert np.all(y > 0) if trait == t.POSITIVE else np.all(y >= 0), name


@pytest.mark.parametrize("name", _unaries(t.CONTINUOUS))
def test_a_continuous_primitive_moves_little_for_a_small_step(name):
    x = _points(name)
    fn = _unary(name)
    # (A step of 1e-6 moves `cbrt` at 0, whose slope is infinite, by 1e-2.)
    step = np.abs(np.asarray(fn(x + 1e-6)) - np.asarray(fn(x)))
    assert np.all(step < 2e-2), (name, float(step.max()))


@pytest.mark.parametrize("name", _unaries(t.STEP))
def test_a_step_primitive_takes_whole_values(name):
    y = np.asarray(_unary(name)(_points(name) * 3))
    np.testing.assert_array_equal(y, np.round(y))


@pytest.mark.parametrize("name", _unaries(t.COPY) + _unaries(t.ROUNDING))
def test_a_copy_or_rounding_keeps_the_value_within_its_precision(name):
    fn = _unary(name)
    x = _points(name)
    y = np.asarray(fn(x), np.float32)
    assert np.all(np.sign(y) == np.sign(x))
    if t.has(name, t.COPY):
        np.testing.assert_array_equal(y, x)
    else:  # rounding: idempotent, within the narrow format's precision
        np.testing.assert_array_equal(np.asarray(fn(y), np.float32), y)
        np.testing.assert_allclose(y, x, rtol=2**-7)


@given(st.lists(st.floats(-4, 4, width=32), min_size=6, max_size=6))
@settings(max_examples=25, deadline=None)
def test_a_move_returns_elements_of_its_operands(values):
    for name in sorted(t.having(t.MOVE)):
        if name not in _MOVES:
            continue
        fn, shape = _MOVES[name]
        x = np.resize(np.asarray(values, np.float32), shape)
        assert _staged_name(fn, x) == name
        y = np.asarray(fn(x))
        allowed = set(x.ravel().tolist()) | {0.5}  # `pad`'s padding value
        assert set(y.ravel().tolist()) <= allowed, name
        if t.has(name, t.RELAYOUT):
            np.testing.assert_array_equal(y.ravel(), x.ravel())


def _binary(name: str) -> Callable | None:
    """`lax`'s function for a binary primitive (`None`: not a public one)."""
    return getattr(lax, name, None) or _BITWISE.get(name)


@given(st.floats(1.5, 3.0, width=32), st.integers(0, 1))
@settings(max_examples=25, deadline=None)
def test_invertible_per_operand_means_one_to_one_in_each_operand(other, operand):
    for name in sorted(t.having(t.INVERTIBLE_PER_OPERAND)):
        if _binary(name) is None:
            continue
        grid = np.linspace(1.5, 3.0, 64, dtype=np.float32)
        if t.has(name, t.LOGIC):
            grid, other = np.arange(64, dtype=np.int32), int(other * 10)
        fixed = np.full_like(grid, other)
        args = (grid, fixed) if operand == 0 else (fixed, grid)
        y = np.asarray(_binary(name)(*args))
        assert len(np.unique(y)) == len(grid), (name, operand)


@pytest.mark.parametrize("name", sorted(t.having(t.KINK)))
def test_a_kink_picks_one_of_its_continuous_pieces(name):
    x = _points(name) * 4
    lo, hi = np.float32(-1.0), np.float32(2.0)
    pieces = {"abs": (x, -x), "max": (x, lo), "min": (x, hi), "clamp": (x, lo, hi)}
    fn = {
        "abs": lax.abs,
        "max": lambda a: lax.max(a, lo),
        "min": lambda a: lax.min(a, hi),
    }
    fn["clamp"] = lambda a: lax.clamp(lo, a, hi)
    y = np.asarray(fn[name](x))
    assert np.all(np.any([y == p for p in pieces[name]], axis=0))
    assert (name in t.having(t.CLAMP)) == (name != "abs")


@pytest.mark.parametrize("name", sorted(t.having(t.COMPARE, t.LOGIC)))
def test_a_comparison_or_logic_step_has_a_boolean_result(name):
    a, b = np.array([True, False, True]), np.array([True, True, False])
    if t.has(name, t.COMPARE):
        a, b = np.float32([1, 2, 3]), np.float32([2, 2, 2])
    y = _BITWISE["not"](a) if name == "not" else _binary(name)(a, b)
    assert y.dtype == jnp.bool_


def test_the_higher_order_primitives_are_named_as_jax_stages_them():
    x = jnp.ones(3)

    @jax.custom_vjp
    def g(v):
        return v

    g.defvjp(lambda v: (v, None), lambda _, c: (c,))

    def staged(fn, trait):
        """Whether `fn` stages a primitive with `trait`, or a hijax call
        (JAX's future-default flags stage `custom_vjp` and `scan` so)."""
        names = {e.primitive.name for e in jax.make_jaxpr(fn)(x).jaxpr.eqns}
        hijax = compat.call_hi_primitive_p
        return any(t.has(n, trait) for n in names) or (
            hijax is not None and hijax.name in names
        )

    def cond(v):
        return lax.cond(v[0] > 0, jnp.sin, jnp.cos, v)

    def scan(v):
        return lax.scan(lambda c, e: (c + e, c), 0.0, v)

    def while_loop(v):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: c + 1, v)

    assert staged(jax.jit(jnp.sin), t.CALL)
    assert staged(jax.checkpoint(jnp.sin), t.CALL)
    assert staged(jax.nn.relu, t.CALL)  # a `custom_jvp` function
    assert staged(g, t.CUSTOM_VJP)
    assert staged(cond, t.CONDITIONAL)
    assert staged(scan, t.LOOP)
    assert staged(while_loop, t.LOOP)
    assert not staged(jnp.sin, t.CALL)
    assert compat.cond_p.name in t.having(t.CONDITIONAL)
