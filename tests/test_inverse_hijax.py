"""`inverse` through hijax constructs and mutable references (JAX >= 0.11).

Under `jax_custom_jvp3`, `jax_custom_vjp3`, `jax_remat3` and `jax_scan3`,
`custom_jvp`, `custom_vjp` and `checkpoint` stage as `call_hi_primitive` and
`scan` as references around a `Scan3`. Each inverse is checked by the round
trip `inverse(f)(f(x)) == x`, and its ildj against `-log|det J|` of `f`,
with the Jacobian computed by `jax.jacfwd` with the flags off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import future_flags, future_flags_available, tree_allclose
from hypothesis import given, settings, strategies as st
from jax import lax

import jaxinterp

pytestmark = pytest.mark.skipif(
    not future_flags_available(),
    reason=f"JAX {jax.__version__} has no hijax future-default flags (JAX >= 0.11)",
)

WS = jnp.array([[1.0, 2.0], [0.5, 3.0], [2.0, 0.25]])


def scan_layers(x):
    def layer(h, w):
        return jnp.sinh(h) * w + 0.5, None

    return lax.scan(layer, x, WS)[0]


def scan_layers_reverse(x):
    def layer(h, w):
        return jnp.sinh(h) * w - 0.25, None

    return lax.scan(layer, x, WS, reverse=True)[0]


def checkpointed(x):
    return jax.checkpoint(lambda z: jnp.sinh(z) * 2.0 + 1.0)(x)


@jax.custom_vjp
def _affine(x):
    return x * 3.0 - 1.0


_affine.defvjp(lambda x: (_affine(x), None), lambda _, ct: (3.0 * ct,))


def custom_vjp_fn(x):
    return jnp.tanh(_affine(x) * 0.2)


def logaddexp_fn(x):
    return jnp.logaddexp(x, 0.5)  # a named `custom_jvp` with its own inverse


def with_refs(x):
    r = jax.new_ref(x)
    r[...] = jnp.sinh(r[...]) * 3.0
    jax.ref.addupdate(r, ..., jnp.full_like(x, 0.5))
    r[0] = r[0] * 2.0  # an indexed write
    return jax.freeze(r)


def mixed(x):
    y = jax.checkpoint(lambda z: z * 2.0 + 1.0)(x)
    return scan_layers(custom_vjp_fn(y))


PROGRAMS: dict[str, Callable[[Any], Any]] = {
    f.__name__: f
    for f in (
        scan_layers,
        scan_layers_reverse,
        checkpointed,
        custom_vjp_fn,
        logaddexp_fn,
        with_refs,
        mixed,
    )
}
X = jnp.array([0.3, -0.2])


def _reference_ildj(fn: Callable[[Any], Any], x: Any) -> Any:
    """`-log|det J|`, J column by column with `jax.jvp` under the same flags
    (`Scan3` has a JVP but no batching rule), or by `jax.jacrev` with the
    flags off where JAX has no forward mode (a `custom_vjp`)."""
    try:
        with future_flags(True):
            cols = [jax.jvp(fn, (x,), (e,))[1] for e in jnp.eye(x.shape[0])]
        jac = jnp.stack(cols, axis=1)
    except TypeError:  # "can't apply forward-mode autodiff to a custom_vjp"
        with future_flags(False):
            jac = jax.jacrev(fn)(x)
    return -jnp.linalg.slogdet(jac)[1]


def _check(fn: Callable[[Any], Any], x: Any) -> None:
    with future_flags(True):
        y = fn(x)
        x_back, ildj = jaxinterp.inverse_and_ildj(fn)(y)
    tree_allclose(x_back, x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ildj, _reference_ildj(fn, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("program", PROGRAMS)
def test_inverse_through_hijax_round_trips(program):
    fn = PROGRAMS[program]
    with future_flags(True):
        staged = jax.make_jaxpr(fn)(X).jaxpr
    names = {e.primitive.name for e in staged.eqns}
    assert names & {"call_hi_primitive", "new_ref"}, names
    _check(fn, X)


@pytest.mark.parametrize("program", PROGRAMS)
def test_explain_inverse_reads_what_inverse_solves(program):
    # `explain_inverse` analyses the same pure program as `inverse` (mutable
    # references and `Scan3` made pure first), so both agree: invertible.
    fn = PROGRAMS[program]
    with future_flags(True):
        report = jaxinterp.explain_inverse(fn, X)
    assert report.splitlines()[-1] == "Invertible: every unknown input is recovered."
    assert " new_ref " not in report


@pytest.mark.parametrize("program", ["scan_layers", "with_refs", "mixed"])
def test_inverse_through_hijax_under_jit_and_vmap(program):
    fn = PROGRAMS[program]
    with future_flags(True):
        xs = jnp.stack([X, 0.5 * X, -X])
        ys = jnp.stack([fn(x) for x in xs])  # `Scan3` has no batching rule
        inv = jaxinterp.inverse(fn)
        tree_allclose(jax.jit(inv)(ys[0]), xs[0], rtol=1e-4, atol=1e-4)
        tree_allclose(jax.vmap(inv)(ys), xs, rtol=1e-4, atol=1e-4)


def test_a_reference_argument_is_refused_with_a_clear_error():
    def writes_into(x):
        r = jax.new_ref(x)
        lax.cond(True, lambda: r.__setitem__(..., r[...] * 2.0), lambda: None)
        return jax.freeze(r)

    with future_flags(True):
        y = writes_into(X)
        with pytest.raises(
            jaxinterp.NotInvertibleError,
            match="cannot follow a mutable reference into `cond`",
        ):
            jaxinterp.inverse(writes_into)(y)


def test_identity_like_primitives_invert():
    def fn(x):
        z = lax.empty(x.shape, x.dtype) * 0.0 if hasattr(lax, "empty") else 0.0
        return jnp.copy(lax.stage(x) if hasattr(lax, "stage") else x) * 2.0 + z

    with future_flags(True):
        y = fn(X)
        tree_allclose(jaxinterp.evaluate(fn)(X), y)
    # `empty * 0` is not a constant to the engine: the result only needs `x`.
    tree_allclose(jaxinterp.inverse(lambda x: jnp.copy(x) * 2.0)(2.0 * X), X)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.floats(-0.75, 0.75, allow_nan=False, width=32), min_size=2, max_size=2),
    st.sampled_from(["scan_layers", "checkpointed", "custom_vjp_fn", "with_refs"]),
)
def test_round_trip_for_any_input(values, program):
    _check(PROGRAMS[program], jnp.asarray(values, jnp.float32))
