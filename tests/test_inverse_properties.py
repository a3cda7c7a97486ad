"""Property: random programs of invertible primitives round-trip and match slogdet.

Programs are chains of invertible steps on an unknown array, with known
parameters passed as a second argument, some steps wrapped in `jit`, `cond`
(with a known flag) or `scan` (over known per-step parameters).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

from jaxinterp import evaluate, inverse, inverse_and_ildj

# Each step: (name, fn(x, p)) where p is a known scalar-or-array parameter in
# [0.5, 1.5]; every step is a bijection of R onto an interval containing the
# next step's domain, with moderate slope so float32 round trips stay tight.
STEPS = {
    "affine": lambda x, p: x * p + (p - 1.0),
    "neg_affine": lambda x, p: 0.5 - x * p,
    "asinh": lambda x, p: jnp.arcsinh(x),
    "sinh": lambda x, p: 0.5 * jnp.sinh(x),
    "exp_log": lambda x, p: jnp.log(jnp.exp(x) * p),
    "softplus": lambda x, p: jax.nn.softplus(x) * p,
    "div": lambda x, p: x / p,
    "sub_known": lambda x, p: p - x,
}
WRAPPERS = ["plain", "jit", "cond", "scan"]


def _apply(kind, step, x, p, flag):
    fn = STEPS[step]
    if kind == "plain":
        return fn(x, p)
    if kind == "jit":
        return jax.jit(fn)(x, p)
    if kind == "cond":
        other = STEPS["affine"]
        return lax.cond(flag, fn, other, x, p)
    # scan: the step applied twice, with per-step known parameters.
    ps = jnp.stack([p, 1.0 / p])
    return lax.scan(lambda c, q: (fn(c, q), None), x, ps)[0]


def build(program):
    def f(x, p, flag):
        for kind, step, scale in program:
            x = _apply(kind, step, x, p * scale, flag)
        return x

    return f


programs = st.lists(
    st.tuples(
        st.sampled_from(WRAPPERS),
        st.sampled_from(sorted(STEPS)),
        st.floats(0.6, 1.4),
    ),
    min_size=1,
    max_size=4,
)
shapes = st.sampled_from([(), (1,), (3,), (2, 2)])


# More than the profile's examples (50 in `ci`), at most 500 (the `dev`
# profile, `nox -s hypothesis_dev`): random programs are where a rare wrong
# answer would show (the fuzzer, `tests/fuzz_inverse_main.py`, draws more).
@pytest.mark.slow
@settings(max_examples=min(500, 50 * settings.default.max_examples // 15))
@given(
    program=programs,
    shape=shapes,
    seed=st.integers(0, 2**16),
    flag=st.booleans(),
    param_is_scalar=st.booleans(),
)
def test_random_program_round_trip_and_ildj(
    program, shape, seed, flag, param_is_scalar
):
    f = build(program)
    key_x, key_p = jax.random.split(jax.random.key(seed))
    x = jax.random.uniform(key_x, shape, minval=-1.0, maxval=1.0)
    p_shape = () if param_is_scalar else shape
    p = jax.random.uniform(key_p, p_shape, minval=0.7, maxval=1.3)
    # Checked op by op under `jax.disable_jit()`, through `evaluate` (which
    # rebuilds `scan`/`cond`/`jit` with `lax.scan`/`lax.switch`/`jax.jit`, all
    # of which then run in Python): every example is a new program, and an
    # XLA compilation per example would dominate the suite's time.
    inv = evaluate(inverse(f, argnums=0))
    inv_ildj = evaluate(inverse_and_ildj(f, argnums=0))

    def flat_inverse(t):
        return jnp.reshape(inv(jnp.reshape(t, shape), p, flag), (-1,))

    with jax.disable_jit():
        y = f(x, p, flag)
        got_x, got_ildj = inv_ildj(y, p, flag)
        jac = jax.jacfwd(flat_inverse)(jnp.reshape(y, (-1,)))
        want_ildj = jnp.linalg.slogdet(jac)[1]
    np.testing.assert_allclose(got_x, x, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got_ildj, want_ildj, rtol=2e-3, atol=2e-3)
