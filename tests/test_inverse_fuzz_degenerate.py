"""Open `inverse` bugs found by the fuzzer (`inverse_fuzz.py`) after the first
triage: a binary rule whose known operand makes the map constant at some
elements (a zero factor, a zero numerator, a zero exponent).

There the unknown element does not reach the output, so `inverse` should
refuse (the known operand is a constant, so the rule can check it, as the
`select_n` rule checks a constant mask). Instead the rules divide by zero
(NaN, ildj +-inf or NaN) or, for `pow`, return a plausible value. Each test
is a strict `xfail` with the minimal program; flip it when the rule is fixed.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from inverse_fuzz import check_inverse

X = jnp.array([0.5, -1.2, 0.8])
HAS_ZERO = jnp.array([0.0, 1.0, 2.0])


def _ok(f):
    outcome = check_inverse(f, (X,), (0,), variants=False)
    assert outcome.kind in ("correct", "refused"), str(outcome)


@pytest.mark.xfail(
    strict=True,
    reason="mul's rule solves x = y / c without checking the known factor: c = 0 "
    "gives x = NaN and ildj inf instead of a refusal",
)
def test_mul_by_a_constant_with_a_zero_is_refused():
    _ok(lambda x: x * HAS_ZERO)


@pytest.mark.xfail(
    strict=True,
    reason="div's rule for the divisor solves x = c / y: a zero numerator c gives "
    "x = NaN (0 / 0) and ildj NaN instead of a refusal",
)
def test_div_of_a_constant_with_a_zero_is_refused():
    _ok(lambda x: HAS_ZERO / x)


@pytest.mark.xfail(
    strict=True,
    reason="pow's rule for the base solves x = |y| ** (1 / c): a zero exponent "
    "gives 1 ** inf = 1, a plausible wrong value (x**0 == 1 for every x)",
)
def test_pow_with_a_zero_exponent_is_refused():
    _ok(lambda x: x**HAS_ZERO)
