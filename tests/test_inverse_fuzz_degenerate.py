"""Inverse rules with a known operand that leaves the unknown undetermined
(found by the fuzzer, `inverse_fuzz.py`): a zero factor in `mul`, a zero
divisor or dividend in `div`, a zero exponent in `pow`.

A constant known operand is checked when the inverse is traced: the rule
refuses, naming the elements. A runtime one cannot be checked then: exactly
those elements come back as NaN (documented in `jaxinterp.inverse`), never a
plausible value.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from inverse_fuzz import check_inverse

import jaxinterp

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

X = jnp.array([0.5, -1.2, 0.8])
HAS_ZERO = jnp.array([0.0, 1.0, 2.0])

CASES = {
    "mul": (lambda x, c: x * c, "`mul` by a known factor with zeros"),
    "div_rhs": (lambda x, c: c / x, "`div` of a known dividend with zeros"),
    "pow_lhs": (lambda x, c: x**c, "`pow` with a known exponent with zeros"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_constant_zero_is_refused_naming_the_elements(name):
    op, message = CASES[name]

    def f(x):
        return op(x, HAS_ZERO)

    x = jnp.abs(X) if name == "pow_lhs" else X
    outcome = check_inverse(f, (x,), (0,), variants=False)
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")
    with pytest.raises(jaxinterp.NotInvertibleError) as info:
        jaxinterp.inverse(f, argnums=0, example_args=(x,))(f(x))
    assert message in str(info.value)
    assert "(elements (0,) of (3,))" in str(info.value)


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    zeros=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_a_runtime_zero_gives_nan_exactly_there(name, zeros):
    # The known operand is an argument: its zeros are only known at run time.
    op, _ = CASES[name]
    c = jnp.where(jnp.array(zeros), 0.0, jnp.array([1.5, 2.0, 3.0]))
    x = jnp.abs(X) if name == "pow_lhs" else X
    y = op(x, c)
    x_rec = jaxinterp.inverse(op, argnums=0, example_args=(x,))(y, c)
    bad = np.array(zeros)
    assert np.all(np.isnan(np.asarray(x_rec)[bad]))
    np.testing.assert_allclose(np.asarray(x_rec)[~bad], np.asarray(x)[~bad], rtol=1e-5)


def test_pow_of_a_known_base_of_one_is_refused():
    def f(x):
        return jnp.array([1.0, 2.0, 3.0]) ** x

    with pytest.raises(jaxinterp.NotInvertibleError, match="not positive or is 1"):
        jaxinterp.inverse(f, argnums=0, example_args=(X,))(f(X))
