"""JAX's hijax `call_hi_primitive` (JAX >= 0.11, opt-in future-default flags).

With `jax_custom_jvp3`, `jax_custom_vjp3`, `jax_remat3` and `jax_scan3` on,
`custom_jvp` (so `jax.nn.relu`), `custom_vjp`, `checkpoint` and `scan` stage
as `call_hi_primitive` equations. Every interpreter must see their bodies
(`recursive` rebuilds the construct with its derivative rule, `inline` walks
the body in place, `opaque` re-binds). Results are compared with plain JAX
under the same flags; where plain JAX itself refuses (it has no `grad` or
`vmap` of `Scan3` in 0.12.0.1) the case is skipped with the reason.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PrimitiveLog,
    SinToCos,
    construct_name,
    future_flags,
    future_flags_available,
    plain_or_skip,
    tree_allclose,
)
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp
from jaxinterp import _count

pytestmark = pytest.mark.skipif(
    not future_flags_available(),
    reason=f"JAX {jax.__version__} has no hijax future-default flags (JAX >= 0.11)",
)


@pytest.fixture
def flags_on():
    with future_flags(True):
        yield


def _custom_vjp(trig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A `custom_vjp` whose backward rule is deliberately not the derivative."""

    @jax.custom_vjp
    def g(x):
        return trig(x) * 2.0

    g.defvjp(lambda x: (g(x), x), lambda x, ct: (3.0 * ct,))
    return g


def _custom_jvp(trig: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    @jax.custom_jvp
    def h(x, k):
        return trig(x) * k

    h.defjvp(lambda p, t: (h(*p), 5.0 * t[0]))
    return h


# Each program is built from a trigonometric function, so that a `sin` to
# `cos` substitution has a reference: the same program built with `cos`.
PROGRAMS: dict[str, Callable[[Callable[[Any], Any]], Callable[[Any], Any]]] = {
    "relu": lambda trig: lambda x: jax.nn.relu(trig(x)) * 2.0,
    "custom_vjp": lambda trig: lambda x: _custom_vjp(trig)(x) + 1.0,
    "custom_jvp": lambda trig: lambda x: _custom_jvp(trig)(x, 3.0),
    "checkpoint": lambda trig: (
        lambda x: jax.checkpoint(lambda z: jnp.exp(z) * trig(z))(x)
    ),
    "checkpoint_policy": lambda trig: (
        lambda x: jax.checkpoint(
            lambda z: trig(z) @ trig(z).T,
            policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        )(x[None]).sum()
    ),
    "scan": lambda trig: (
        lambda x: lax.scan(lambda c, a: (c * 0.5 + trig(a), c + a), 0.0, x)
    ),
    "scan_consts": lambda trig: (
        lambda x: lax.scan(lambda c, a: (c + trig(a * x[0]), c * x[1]), x[2], x)[1]
    ),
    "nested": lambda trig: (
        lambda x: lax.scan(
            lambda c, a: (jax.checkpoint(lambda u: trig(u) * c)(a) + c, jax.nn.relu(a)),
            1.0,
            x,
        )
    ),
}
X = jnp.array([0.3, -1.2, 0.7, 2.0])


TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "eager": lambda f: f,
    "jit": jax.jit,
    "vmap": lambda f: lambda x: jax.vmap(f)(jnp.stack([x, 0.5 * x])),
    "grad": lambda f: jax.grad(
        lambda x: sum(jnp.sum(y) for y in jax.tree.leaves(f(x)))
    ),
}


def _stages_hijax(fn: Callable[..., Any]) -> None:
    names = {e.primitive.name for e in jax.make_jaxpr(fn)(X).jaxpr.eqns}
    assert "call_hi_primitive" in names, names


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_evaluate_matches_plain_jax(flags_on, program, transform):
    fn = PROGRAMS[program](jnp.sin)
    _stages_hijax(fn)
    wrap = TRANSFORMS[transform]
    expected = plain_or_skip(f"{transform} under the future flags", wrap(fn), X)
    tree_allclose(wrap(jaxinterp.evaluate(fn))(X), expected)
    tree_allclose(wrap(PrimitiveLog().transform(fn))(X), expected)


@pytest.mark.parametrize("policy", ["recursive", "inline"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_a_substitution_reaches_inside_hijax_bodies(flags_on, program, policy):
    expected = PROGRAMS[program](jnp.cos)(X)
    swapped = SinToCos(higher_order=policy).transform(PROGRAMS[program](jnp.sin))
    tree_allclose(swapped(X), expected)
    tree_allclose(jax.jit(swapped)(X), expected)


def test_opaque_re_binds_hijax_calls_unchanged(flags_on):
    fn = PROGRAMS["custom_vjp"](jnp.sin)
    log = PrimitiveLog(higher_order="opaque")
    tree_allclose(log.transform(fn)(X), fn(X))
    assert "sin" not in log.names and "call_hi_primitive" in log.names
    # The opaque policy can be keyed by the construct, as with the flags off.
    log = PrimitiveLog(policies={"custom_vjp_call": "opaque"})
    swapped = SinToCos(policies={"CustomVJPTraced": "opaque"}).transform(fn)
    log.transform(fn)(X)
    assert "sin" not in log.names
    tree_allclose(swapped(X), fn(X))


def test_recursive_keeps_the_custom_vjp_rule_and_inline_drops_it(flags_on):
    fn = PROGRAMS["custom_vjp"](jnp.sin)
    # The rule says 3 * ct; the body's derivative is 2 cos(x).
    rule = jax.grad(fn)(0.5)
    np.testing.assert_allclose(rule, 3.0)
    tree_allclose(jax.grad(jaxinterp.evaluate(fn))(0.5), rule)
    tree_allclose(jax.grad(PrimitiveLog().transform(fn))(0.5), rule)
    inline = PrimitiveLog(higher_order="inline").transform(fn)
    tree_allclose(jax.grad(inline)(0.5), 2.0 * jnp.cos(0.5))


def test_recursive_keeps_the_custom_jvp_rule(flags_on):
    fn = PROGRAMS["custom_jvp"](jnp.sin)
    tree_allclose(jax.grad(PrimitiveLog().transform(fn))(0.5), 5.0)
    inline = PrimitiveLog(higher_order="inline").transform(fn)
    tree_allclose(jax.grad(inline)(0.5), 3.0 * jnp.cos(0.5))


def test_recursive_rebuilds_each_construct(flags_on):
    fn = PROGRAMS["nested"](jnp.sin)
    staged = jax.make_jaxpr(PrimitiveLog().transform(fn))(X)
    # `Scan3`, which plain JAX 0.12.0.1 can neither differentiate nor batch,
    # comes back as the classic `scan` it replaces (`hi_transformable`); the
    # hijax constructs inside it stay hijax.
    (scan,) = [e for e in staged.jaxpr.eqns if construct_name(e) == "scan"]
    if jaxinterp._jax_compat.hi_transformable(_scan3_prim(fn)):
        body = jaxinterp.hijax_params(scan).body
    else:
        assert scan.primitive.name == "scan"
        body = jaxinterp._jax_compat.open_jaxpr(jaxinterp.scan_params(scan).jaxpr)
    inner = [
        jaxinterp.hijax_params(e).name
        for e in body.eqns
        if e.primitive.name == "call_hi_primitive"
    ]
    assert sorted(inner) == ["CustomJVPTraced", "RematTraced"]


def _scan3_prim(fn):
    (eqn,) = [
        e
        for e in jax.make_jaxpr(fn)(X).jaxpr.eqns
        if e.primitive.name == "call_hi_primitive"
    ]
    return jaxinterp.hijax_params(eqn).prim


def test_hijax_params_reads_each_construct(flags_on):
    fns = {
        "custom_jvp": PROGRAMS["relu"](jnp.sin),
        "custom_vjp": PROGRAMS["custom_vjp"](jnp.sin),
        "checkpoint": PROGRAMS["checkpoint"](jnp.sin),
        "scan": PROGRAMS["scan"](jnp.sin),
    }
    for kind, fn in fns.items():
        (eqn,) = [
            e
            for e in jax.make_jaxpr(fn)(X).jaxpr.eqns
            if e.primitive.name == "call_hi_primitive"
        ]
        h = jaxinterp.hijax_params(eqn)
        assert h.kind == kind
        n_body = len(jaxinterp._jax_compat.open_jaxpr(h.body).invars)
        n_kept = len(eqn.invars) if h.keep is None else sum(h.keep)
        assert n_body == n_kept, (kind, n_body, n_kept)
    (eqn,) = [
        e
        for e in jax.make_jaxpr(fns["scan"])(X).jaxpr.eqns
        if e.primitive.name == "call_hi_primitive"
    ]
    h = jaxinterp.hijax_params(eqn)
    assert h.length == X.shape[0] and h.extensives == (False, True)


# ---------------------------------------------------------------------------
# A user-defined hijax primitive.


def _hiprim_class() -> type:
    from jax.experimental.hijax import HiPrim

    class Cube(HiPrim):
        def __init__(self, aval: Any) -> None:
            self.in_avals = (aval,)
            self.out_aval = aval
            self.params = {}
            super().__init__()

        def expand(self, x: Any) -> Any:
            return jnp.sin(x) * x * x

    return Cube


def test_a_user_hijax_primitive_is_walked_through_its_expand(flags_on):
    cube_cls = _hiprim_class()

    def fn(x):
        return cube_cls(jax.typeof(x))(x) + 1.0

    expected = jnp.sin(X) * X * X + 1.0
    log = PrimitiveLog()
    tree_allclose(log.transform(fn)(X), expected)
    assert "sin" in log.names and "call_hi_primitive" in log.names
    swapped = SinToCos(higher_order="inline").transform(fn)
    tree_allclose(swapped(X), jnp.cos(X) * X * X + 1.0)
    opaque = PrimitiveLog(policies={"Cube": "opaque"})
    tree_allclose(opaque.transform(fn)(X), expected)
    assert "sin" not in opaque.names


def test_a_user_hijax_primitive_without_expand_raises_missing_rule_error(flags_on):
    from jax.experimental.hijax import HiPrim

    class NoExpand(HiPrim):
        def __init__(self, aval: Any) -> None:
            self.in_avals = (aval,)
            self.out_aval = aval
            self.params = {}
            super().__init__()

        def batch(self, axis_data, args, dims):  # pragma: no cover - unused
            raise NotImplementedError

    def fn(x):
        return NoExpand(jax.typeof(x))(x)

    line = fn.__code__.co_firstlineno + 1
    with pytest.raises(jaxinterp.MissingRuleError) as info:
        PrimitiveLog().transform(fn)(X)
    message = str(info.value)
    assert "cannot reach inside hijax primitive `NoExpand`" in message
    assert f"test_hijax.py:{line}" in message
    assert re.search(r"policies=\{'NoExpand': 'opaque'\}", message)


# ---------------------------------------------------------------------------
# Counting: the same equations with the flags on as with them off.

# Bookkeeping that differs between the two stagings without computing
# anything: the hijax call, the constructs it replaces, and the reference
# operations `scan` uses for its carry under `jax_scan3`.
_STRUCTURE = {
    "call_hi_primitive",
    "custom_jvp_call",
    "custom_vjp_call",
    "checkpoint",
    "remat2",
    "scan",
    "new_ref",
    "get",
    "swap",
    "freeze",
    # The classic `scan` converts a weakly typed carry to its strong type
    # (outside the body); `Scan3` keeps it as it is in the reference.
    "convert_element_type",
}


def _counted(fn: Callable[..., Any], on: bool) -> Counter[str]:
    with future_flags(on):
        log = PrimitiveLog()
        log.transform(fn)(X)
    # The same function staged both ways (not one cached staging).
    assert ("call_hi_primitive" in log.names) == on, log.names
    return Counter(n for n in log.names if n not in _STRUCTURE)


@pytest.mark.parametrize("program", ["relu", "custom_vjp", "checkpoint", "scan"])
def test_a_counter_sees_the_same_equations_with_the_flags_on(program):
    fn = PROGRAMS[program](jnp.sin)
    off, on = _counted(fn, False), _counted(fn, True)
    assert off == on
    assert on["sin"] == 1  # the body itself was seen


@pytest.mark.parametrize("program", ["relu", "custom_vjp", "checkpoint", "scan"])
def test_op_counter_counts_hijax_bodies(program):
    fn = PROGRAMS[program](jnp.sin)
    with future_flags(False):
        off = _count.count_staged(jaxinterp.stage(fn, X))
    with future_flags(True):
        on = _count.count_staged(jaxinterp.stage(fn, X))
    assert on.total_flops == off.total_flops
    assert on.total_transcendentals == off.total_transcendentals > 0


# ---------------------------------------------------------------------------
# A law over inputs.


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-3.0, 3.0, allow_nan=False, width=32), min_size=1, max_size=6),
    st.sampled_from(sorted(PROGRAMS)),
)
def test_walking_equals_plain_jax_for_any_input(values, program):
    x = jnp.asarray(values, jnp.float32)
    if program in ("scan_consts",) and x.shape[0] < 3:
        x = jnp.concatenate([x, x, x])
    with future_flags(True):
        fn = PROGRAMS[program](jnp.sin)
        tree_allclose(PrimitiveLog().transform(fn)(x), fn(x))
