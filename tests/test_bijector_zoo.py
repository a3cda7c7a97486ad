"""A zoo of elementwise bijectors, written the ways bijector libraries write
them: numerically stable piecewise formulas (`jnp.where` on the unknown),
saturating clamps, the unknown used several times, maps with no closed-form
inverse. Each is checked against a hand-written inverse (or, where none
exists, against `x` itself and the round trip), its ildj against
`-slogdet(jax.jacfwd(f)(x))`, and under `jax.jit`, `jax.vmap` and `jax.grad`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import abs_no_formula, flags_off
from hypothesis import given, strategies as st
from jax import lax
from jax.scipy import special

import jaxinterp
from jaxinterp import NotInvertibleError, ildj, inverse, inverse_and_ildj

SQRT2 = math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class Bijector:
    name: str
    forward: Callable[[Any], Any]
    inverse: Callable[[Any], Any] | None  # hand-written; None: no closed form
    low: float
    high: float
    # How `explain_inverse` says the hardest step is solved (None: inside a
    # `jit`, whose line reports no method).
    method: str | None

    def __str__(self) -> str:
        return self.name

    def sample(self, n: int = 9) -> Any:
        return jnp.linspace(self.low, self.high, n, dtype=jnp.float32)


def _stable_sigmoid(x):
    return jnp.where(x >= 0, 1 / (1 + jnp.exp(-x)), jnp.exp(x) / (1 + jnp.exp(x)))


def _cardano(y):  # the real root of x**3 + x = y
    d = jnp.sqrt(y**2 / 4 + 1 / 27)
    return jnp.cbrt(y / 2 + d) + jnp.cbrt(y / 2 - d)


def _yeo_johnson(x, lam=0.5):
    # The double `where` of careful libraries: each branch sees safe inputs.
    positive = x >= 0
    pos = ((jnp.where(positive, x, 0.0) + 1) ** lam - 1) / lam
    neg = -((1 - jnp.where(positive, 0.0, x)) ** (2 - lam) - 1) / (2 - lam)
    return jnp.where(positive, pos, neg)


def _yeo_johnson_inverse(y, lam=0.5):
    positive = y >= 0
    pos = (jnp.where(positive, y, 0.0) * lam + 1) ** (1 / lam) - 1
    neg = 1 - (1 - (2 - lam) * jnp.where(positive, 0.0, y)) ** (1 / (2 - lam))
    return jnp.where(positive, pos, neg)


def _normal_cdf_regimes(x):
    # Two regimes, as CDFs are written for accuracy in the lower tail.
    return jnp.where(x < -1, 0.5 * lax.erfc(-x / SQRT2), 0.5 * (1 + lax.erf(x / SQRT2)))


PIECEWISE = "piecewise"
SOLVE = "elementwise solve"
INTERVALS = "piecewise by intervals"
FORMULA = "formula"
FRACTIONAL = "linear-fractional formula"
CLAMP = "clamp"

ZOO = [
    # One formula per step: the engine's own rules.
    Bijector("exp", jnp.exp, jnp.log, -3, 3, FORMULA),
    Bijector(
        "affine", lambda x: 2.5 * x - 1.0, lambda y: (y + 1.0) / 2.5, -3, 3, FORMULA
    ),
    Bijector("tanh", jnp.tanh, jnp.arctanh, -2, 2, FORMULA),
    Bijector("sigmoid", jax.nn.sigmoid, special.logit, -5, 5, FORMULA),
    Bijector("asinh", jnp.arcsinh, jnp.sinh, -5, 5, FORMULA),
    Bijector(
        "sinh_arcsinh",
        lambda x: jnp.sinh((jnp.arcsinh(x) + 0.3) * 1.5),
        lambda y: jnp.sinh(jnp.arcsinh(y) / 1.5 - 0.3),
        -3,
        3,
        FORMULA,
    ),
    Bijector(
        "soft_clip_sigmoid",
        lambda x: -2.0 + 5.0 * jax.nn.sigmoid(x),
        lambda y: special.logit((y + 2.0) / 5.0),
        -4,
        4,
        FORMULA,
    ),
    Bijector(
        "scaled_tanh",
        lambda x: 3 * jnp.tanh(x / 3),
        lambda y: 3 * jnp.arctanh(y / 3),
        -4,
        4,
        FORMULA,
    ),
    Bijector("odd_cube", lambda x: x**3, jnp.cbrt, -2, 2, FORMULA),
    # NumPyro's AbsTransform on x > 0: `abs`'s principal branch.
    Bijector("abs_on_positives", jnp.abs, lambda y: y, 0.1, 3, FORMULA),
    # Saturating clamps added for numerical safety.
    Bijector(
        "clipped_sigmoid",
        lambda x: jnp.clip(jax.nn.sigmoid(x), 1e-6, 1 - 1e-6),
        special.logit,
        -5,
        5,
        FORMULA,
    ),
    Bijector(
        "exp_of_clip",
        lambda x: jnp.exp(jnp.clip(x, -10.0, 10.0)),
        jnp.log,
        -5,
        5,
        FORMULA,
    ),
    Bijector(
        "floor_at_tiny",
        lambda x: jnp.maximum(jnp.exp(x), 1e-20),
        jnp.log,
        -5,
        5,
        CLAMP,
    ),
    Bijector(
        "ceiling",
        lambda x: jnp.minimum(x * 2.0, 100.0),
        lambda y: y / 2.0,
        -5,
        5,
        CLAMP,
    ),
    Bijector(
        "lax_clamp",
        lambda x: lax.clamp(-50.0, x + 1.0, 50.0),
        lambda y: y - 1.0,
        -5,
        5,
        CLAMP,
    ),
    # Piecewise: a formula chosen by a predicate of the unknown.
    # Each case linear-fractional in `e^x` (or `e^-x`).
    Bijector("stable_sigmoid", _stable_sigmoid, special.logit, -6, 6, PIECEWISE),
    Bijector(
        "softplus_threshold",
        lambda x: jnp.where(x > 3.0, x, jnp.log1p(jnp.exp(x))),
        lambda y: jnp.where(y > 3.0, y, jnp.log(jnp.expm1(y))),
        -4,
        6,
        PIECEWISE,
    ),
    Bijector(
        "leaky_relu_where",
        lambda x: jnp.where(x >= 0, x, 0.1 * x),
        lambda y: jnp.where(y >= 0, y, y / 0.1),
        -3,
        3,
        PIECEWISE,
    ),
    Bijector(
        "leaky_relu_max",
        lambda x: jnp.maximum(x, 0.2 * x),
        lambda y: jnp.where(y >= 0, y, y / 0.2),
        -3,
        3,
        PIECEWISE,
    ),
    Bijector(
        "jax_nn_leaky_relu",
        lambda x: jax.nn.leaky_relu(x, 0.05),
        lambda y: jnp.where(y >= 0, y, y / 0.05),
        -3,
        3,
        None,
    ),
    Bijector(
        "elu",
        lambda x: jnp.where(x > 0, x, jnp.expm1(x)),
        lambda y: jnp.where(y > 0, y, jnp.log1p(y)),
        -3,
        3,
        PIECEWISE,
    ),
    Bijector(
        "relu_plus_linear",
        lambda x: jnp.maximum(x, 0.0) + 0.5 * x,
        lambda y: jnp.where(y >= 0, y / 1.5, y / 0.5),
        -3,
        3,
        PIECEWISE,  # each case uses `x` twice, linear-fractional
    ),
    Bijector(
        "signed_log1p",
        lambda x: jnp.where(x > 0, jnp.log1p(x), -jnp.log1p(-x)),
        lambda y: jnp.where(y > 0, jnp.expm1(y), -jnp.expm1(-y)),
        -5,
        5,
        PIECEWISE,
    ),
    Bijector("yeo_johnson", _yeo_johnson, _yeo_johnson_inverse, -3, 3, PIECEWISE),
    Bijector(
        "normal_cdf_regimes",
        _normal_cdf_regimes,
        special.ndtri,
        -3,
        3,
        PIECEWISE,
    ),
    Bijector(
        "signed_square",
        lambda x: jnp.where(x >= 0, x * x, -(x * x)),
        lambda y: jnp.sign(y) * jnp.sqrt(jnp.abs(y)),
        -3,
        3,
        INTERVALS,
    ),
    # The unknown used several times.
    Bijector(
        "softsign",
        lambda x: x / (1 + jnp.abs(x)),
        lambda y: y / (1 - jnp.abs(y)),
        -5,
        5,
        PIECEWISE,  # `|x|` a case split, each case linear-fractional
    ),
    Bijector(
        "logit",
        lambda x: jnp.log(x) - jnp.log1p(-x),
        jax.nn.sigmoid,
        0.02,
        0.98,
        FRACTIONAL,  # log(x / (1 - x)): the logarithm of a Möbius map
    ),
    Bijector(  # the pole at 1 is past the solver's first steps (NumPyro's
        "logit_ratio",  # `SigmoidTransform().inv` is `jax.scipy.special.logit`)
        lambda x: jnp.log(x / (1 - x)),
        jax.nn.sigmoid,
        0.02,
        0.98,
        FRACTIONAL,  # `x / (1 - x)`: a Möbius map, inverted exactly
    ),
    Bijector("jax_logit", special.logit, jax.nn.sigmoid, 0.02, 0.98, None),
    Bijector(
        "softplus_stable",
        lambda x: jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x))),
        lambda y: y + jnp.log(-jnp.expm1(-y)),
        -4,
        4,
        # One site (`max(x, 0)` and `|x|` both split at `x >= 0`); each case
        # linear-fractional in `e^-x` or a chain.
        PIECEWISE,
    ),
    Bijector(
        "inverse_softplus",
        lambda x: x + jnp.log(-jnp.expm1(-x)),
        jax.nn.softplus,
        0.1,
        5,
        FRACTIONAL,  # log((1 - s) / s) with s = e^-x
    ),
    Bijector(
        "symlog",
        lambda x: jnp.sign(x) * jnp.log1p(jnp.abs(x)),
        lambda y: jnp.sign(y) * jnp.expm1(jnp.abs(y)),
        -5,
        5,
        SOLVE,
    ),
    Bijector("cubic", lambda x: x**3 + x, _cardano, -3, 3, SOLVE),
    Bijector("x_plus_half_sin", lambda x: x + 0.5 * jnp.sin(x), None, -6, 6, SOLVE),
    Bijector("exp_plus_x", lambda x: jnp.exp(x) + x, None, -4, 3, SOLVE),
    Bijector("x_plus_tanh", lambda x: x + jnp.tanh(x), None, -4, 4, SOLVE),
    Bijector(
        "lambert_w_tail", lambda x: x * jnp.exp(0.3 * x**2 / 2), None, -3, 3, SOLVE
    ),
    Bijector(
        "gompertz_cdf",
        lambda x: 1 - jnp.exp(-0.5 * jnp.expm1(1.5 * x)),
        lambda y: jnp.log1p(-jnp.log1p(-y) / 0.5) / 1.5,
        0.05,
        2,
        FORMULA,
    ),
]


def _ids(b: Bijector) -> str:
    return b.name


def _reference_x(b: Bijector, x: Any, y: Any) -> Any:
    return x if b.inverse is None else b.inverse(y)


def _slogdet_ildj(f, x):
    return -jnp.linalg.slogdet(jax.jacfwd(f)(x))[1]


def _method(fn, x):
    """The one method `explain_inverse` names for `fn`'s equations."""
    report = jaxinterp.explain_inverse(fn, x)
    methods = set(re.findall(r"\[inverted\] .*\(([a-z -]+)\)$", report, re.M))
    assert len(methods) == 1, report
    return methods.pop()


def _close(actual, expected, rtol=2e-4, atol=2e-5):
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol
    )


@pytest.mark.parametrize("b", ZOO, ids=_ids)
def test_inverse_and_ildj_match_the_references(b):
    x = b.sample()
    y = b.forward(x)
    got_x, got_ildj = inverse_and_ildj(b.forward)(y)
    _close(got_x, _reference_x(b, x, y))
    _close(b.forward(got_x), y)
    _close(got_ildj, _slogdet_ildj(b.forward, x), rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("b", ZOO, ids=_ids)
def test_jit_vmap_and_grad(b):
    x = b.sample(6)
    y = b.forward(x)
    inv = inverse(b.forward)
    _close(jax.jit(inv)(y), _reference_x(b, x, y))
    batch = jnp.stack([y, b.forward(x[::-1])])
    # (`vmap` and the ildj's gradient compiled: one compilation each instead
    # of dispatching every step of the inverse on its own.)
    _close(jax.jit(jax.vmap(inv))(batch), jnp.stack([inv(y), inv(batch[1])]))
    # d x / d y: the hand-written inverse's, else 1 / f'(x) elementwise.
    # (A `jnp.where` in a hand-written inverse can make its gradient NaN.)
    want = 1 / jax.vmap(jax.grad(b.forward))(x)
    if b.inverse is not None:
        hand = jax.grad(lambda t: jnp.sum(b.inverse(t)))(y)
        want = jnp.where(jnp.isnan(hand), want, hand)
    _close(jax.grad(lambda t: jnp.sum(inv(t)))(y), want, rtol=2e-3, atol=1e-4)
    # The gradient of the ildj: through x(y) and the log-slope.
    want = jax.jit(jax.grad(lambda t: _slogdet_ildj(b.forward, inv(t))))(y)
    got = jax.jit(jax.grad(ildj(b.forward)))(y)
    _close(got, want, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize(
    "b", [b for b in ZOO if b.method not in (FORMULA, None)], ids=_ids
)
def test_explain_names_the_method(b):
    report = jaxinterp.explain_inverse(b.forward, b.sample())
    assert report.endswith("Invertible: every unknown input is recovered."), report
    assert f"({b.method})" in report, report


@pytest.mark.slow
@given(st.data())
def test_random_points_round_trip(data):
    b = data.draw(st.sampled_from(ZOO), label="bijector")
    values = data.draw(
        st.lists(
            st.floats(float(np.float32(b.low)), float(np.float32(b.high)), width=32),
            min_size=1,
            max_size=6,
        ),
        label="x",
    )
    x = jnp.asarray(values, jnp.float32)
    y = b.forward(x)
    got = inverse(b.forward)(y)
    _close(b.forward(got), y, rtol=1e-4, atol=1e-5)
    _close(got, _reference_x(b, x, y), rtol=2e-3, atol=2e-4)


@given(st.data())
def test_any_y_gives_nan_or_a_preimage(data):
    """Soundness for any `y`, on the image or off it: every element of the
    inverse is NaN or a preimage of its element of `y` (the round trip),
    never another number. Elements are drawn on the image, anywhere, or at
    values where images end (0, +-1)."""
    b = data.draw(st.sampled_from(ZOO), label="bijector")
    on_image = st.floats(
        float(np.float32(b.low)), float(np.float32(b.high)), width=32
    ).map(lambda v: float(b.forward(jnp.float32(v))))
    anywhere = st.floats(-30.0, 30.0, width=32)
    ends = st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0])
    values = data.draw(
        st.lists(on_image | anywhere | ends, min_size=6, max_size=6), label="y"
    )
    y = np.asarray(values, np.float32)
    got = np.asarray(inverse(b.forward, example_args=(b.sample(6),))(jnp.asarray(y)))
    finite = np.isfinite(got)
    got = np.where(finite, got, np.float32(b.low))
    back, slope = jax.jvp(b.forward, (jnp.asarray(got),), (jnp.ones_like(got),))
    # Within rounding of `y`, and of `x` itself through the map's slope (the
    # nearest float32 to `logit`'s preimage of 15 maps to 14.84).
    ulp = np.spacing(np.abs(got))
    bound = 1e-3 * np.abs(y) + 1e-4 + 4 * np.abs(np.asarray(slope)) * ulp
    error = np.abs(np.asarray(back, np.float64) - y)
    assert np.all(error[finite] <= bound[finite]), (got, np.asarray(back), y)


# ---------------------------------------------------------------------------
# Known arguments, and what the blocks refuse or return as NaN.


@pytest.mark.slow
def test_known_parameters_and_their_gradients():
    def softsign_scaled(x, scale):
        return x / (scale + jnp.abs(x))

    def hand(y, scale):
        return y * scale / (1 - jnp.abs(y))

    x, scale = jnp.linspace(-4, 4, 7), jnp.float32(1.7)
    y = softsign_scaled(x, scale)
    inv = inverse(softsign_scaled, argnums=0)
    _close(inv(y, scale), hand(y, scale))
    _close(
        jax.grad(lambda s: jnp.sum(inv(y, s)))(scale),
        jax.grad(lambda s: jnp.sum(hand(y, s)))(scale),
        rtol=2e-3,
    )
    want = jax.grad(
        lambda s: _slogdet_ildj(lambda t: softsign_scaled(t, s), hand(y, s))
    )
    got = jax.grad(lambda s: ildj(softsign_scaled, argnums=0)(y, s))
    _close(got(scale), want(scale), rtol=5e-3, atol=5e-3)


def test_leaky_relu_with_a_known_slope():
    def leaky(x, alpha):
        return jnp.where(x >= 0, x, alpha * x)

    x = jnp.linspace(-3, 3, 7)
    for alpha in (0.1, 0.5):
        y = leaky(x, alpha)
        _close(inverse(leaky, argnums=0)(y, alpha), x)


def test_a_value_outside_the_image_is_nan():
    softsign = ZOO[[b.name for b in ZOO].index("softsign")].forward
    got = inverse(softsign)(jnp.array([0.5, 1.5, -2.0]))
    _close(got[0], 1.0)
    assert np.isnan(np.asarray(got[1:])).all(), got
    elu = ZOO[[b.name for b in ZOO].index("elu")].forward
    got = inverse(elu)(jnp.array([-1.5, 0.5]))  # elu > -1
    assert np.isnan(got[0]) and np.isclose(got[1], 0.5), got


def test_a_map_that_takes_a_value_twice_gives_nan_there():
    def absolute(x):  # two injective cases that overlap: not a bijection
        return jnp.where(x > 0, x, -x)

    got = inverse(absolute)(jnp.array([2.0, -1.0]))
    assert np.isnan(np.asarray(got)).all(), got


@pytest.mark.slow
def test_a_constant_branch_gives_nan_not_a_number():
    def flat_then_rising(x):
        return jnp.where(x > 0, x + jnp.sin(x), 0.0 * x)

    got = inverse(flat_then_rising)(jnp.array([0.0, 2.0]))
    assert np.isnan(got[0]), got
    _close(flat_then_rising(got[1]), 2.0)


def test_solvers_off_refuses_with_the_line():
    def softsign_plus_tanh(x):  # no formula: a numerical solve
        return x / (1 + jnp.abs(x)) + 0.1 * jnp.tanh(x)

    line = softsign_plus_tanh.__code__.co_firstlineno + 1
    with pytest.raises(NotInvertibleError) as info:
        inverse(softsign_plus_tanh, solvers=False)(jnp.ones(3) * 0.5)
    message = str(info.value)
    assert f"test_bijector_zoo.py:{line}" in message, message
    assert "numerical solvers are off (`solvers=False`)" in message, message


def test_solvers_off_keeps_exact_piecewise_inverses():
    # Softsign's `|x|` is a case split, each case linear-fractional.
    for name in ("softplus_threshold", "softsign"):
        b = ZOO[[b.name for b in ZOO].index(name)]
        x = b.sample()
        _close(inverse(b.forward, solvers=False)(b.forward(x)), x)
        assert _method(b.forward, x) == "piecewise", name


@pytest.mark.slow
def test_a_second_output_constraining_a_solved_value_is_refused():
    def f(x):
        return x / (1 + jnp.abs(x)) + 0.1 * jnp.tanh(x), jnp.sum(x)

    x = jnp.linspace(-2, 2, 5)
    with pytest.raises(NotInvertibleError, match="numerical solver"):
        inverse(f, example_args=(x,))(f(x))


def test_a_second_output_of_an_exactly_inverted_value_is_checked():
    # Softsign's inverse is a formula, not one preimage chosen among
    # several: a second output of the same value is checked against it.
    def f(x):
        return x / (1 + jnp.abs(x)), jnp.sum(x)

    x = jnp.linspace(-2, 2, 5)
    y, total = f(x)
    _close(inverse(f, example_args=(x,))((y, total)), x)
    got = inverse(f, example_args=(x,))((y, total + 1.0))
    assert np.isnan(np.asarray(got)).all(), got


def test_blocks_inside_jit_scan_and_cond():
    def softsign(x):
        return x / (1 + jnp.abs(x))

    def leaky(x):
        return jnp.where(x >= 0, x, 0.1 * x)

    def f(x, flag):
        y = jax.jit(softsign)(x)
        y = lax.cond(flag, jnp.tanh, softsign, y)
        # A piecewise inverse is exact: it may determine a loop carry.
        y, _ = lax.scan(lambda c, _: (leaky(c) * 2.0 - 0.1, None), y, None, length=3)
        return y

    x = jnp.linspace(-2, 2, 5) + 0.13  # no element at the kink of `leaky`
    for flag in (True, False):
        y = f(x, flag)
        got_x, got_ildj = inverse_and_ildj(f, argnums=0)(y, flag)
        _close(got_x, x, rtol=1e-3, atol=1e-4)
        # (Plain JAX cannot batch a `Scan3` under the hijax future flags.)
        want = flags_off(_slogdet_ildj, lambda t, flag=flag: f(t, flag), x)
        _close(got_ildj, want, rtol=2e-3, atol=2e-3)


@pytest.mark.slow
def test_a_numerical_solve_may_determine_a_loop_carry():
    # The solver answers only where the map is monotone, so its preimage is
    # the only one: the step before takes it as given. (Softsign
    # through `abs_no_formula(c)`: with `|c|` it has an exact method.)
    def f(x):
        step = lambda c, _: (c / (1 + abs_no_formula(c)) + 0.5, None)  # noqa: E731
        return lax.scan(step, x, None, length=2)[0]

    x = jnp.linspace(-1, 1, 3)
    _close(inverse(f)(f(x)), x, rtol=1e-5, atol=1e-5)

    # A second constraint on that carry in the step before is still refused.
    def g(x):
        def step(c, _):
            new = c / (1 + abs_no_formula(c)) + 0.5
            return new, jnp.exp(new)

        return lax.scan(step, x, None, length=2)

    with pytest.raises(NotInvertibleError, match="determines a loop carry"):
        inverse(g, example_args=(x,))(g(x))


@pytest.mark.slow
def test_float64(tmp_path):
    from helpers import run_python

    out = run_python(
        """
import jax, jax.numpy as jnp, numpy as np
from jaxinterp import inverse_and_ildj
f = lambda x: x / (1 + jnp.abs(x)) + 0.1 * x
x = jnp.linspace(-30.0, 30.0, 13)
assert x.dtype == jnp.float64
got, ildj = inverse_and_ildj(f)(f(x))
ref = -jnp.linalg.slogdet(jax.jacfwd(f)(x))[1]
print(float(jnp.max(jnp.abs(got - x))), float(abs(ildj - ref)))
""",
        env={"JAX_ENABLE_X64": "1"},
    )
    err_x, err_ildj = map(float, out.split())
    assert err_x < 1e-12 and err_ildj < 1e-10, out


# ---------------------------------------------------------------------------
# Linear blocks: the unknown reaches the results along several linear paths.

_V = jnp.array([0.6, 0.0, 0.8, 0.0])
_D = jnp.array([1.5, 2.0, 0.5, 1.0])
_U = jnp.array([[0.1, 0.2], [0.3, -0.1], [0.0, 0.2], [0.1, 0.1]])
_W = jnp.array([[0.2, 0.1], [-0.1, 0.3], [0.1, 0.0], [0.0, 0.2]])


def _householder(x):
    return x - 2 * _V * jnp.dot(_V, x)


def _diag_plus_low_rank(x):
    return _D * x + _U @ (_W.T @ x) + 0.25


def _haar(x):
    a, b = x[::2], x[1::2]
    return jnp.concatenate([(a + b) / jnp.sqrt(2.0), (a - b) / jnp.sqrt(2.0)])


def _two_level_haar(x):
    return _haar(jnp.concatenate([_haar(x[:4])[:4], x[4:]]))


def _mixing(x):  # a rotation written by hand, then a shear
    c, s = math.cos(0.3), math.sin(0.3)
    u = jnp.stack([c * x[0] - s * x[1], s * x[0] + c * x[1], x[2], x[3]])
    return u + 0.5 * jnp.roll(u, 1) * jnp.array([0.0, 1.0, 1.0, 1.0])


LINEAR_ZOO = [
    ("householder", _householder, jnp.array([0.3, -1.2, 2.0, 0.5])),
    ("diag_plus_low_rank", _diag_plus_low_rank, jnp.array([0.3, -1.2, 2.0, 0.5])),
    ("haar", _haar, jnp.array([0.3, -1.2, 2.0, 0.5])),
    ("two_level_haar", _two_level_haar, jnp.linspace(-1.0, 2.0, 6)),
    ("mixing", _mixing, jnp.array([0.3, -1.2, 2.0, 0.5])),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, f, x", LINEAR_ZOO, ids=[c[0] for c in LINEAR_ZOO])
def test_linear_blocks(name, f, x):
    y = f(x)
    got_x, got_ildj = inverse_and_ildj(f)(y)
    jac = jax.jacfwd(f)(x)
    _close(got_x, jnp.linalg.solve(jac, y - f(jnp.zeros_like(x))), atol=1e-5)
    _close(got_x, x, atol=1e-5)
    _close(got_ildj, -jnp.linalg.slogdet(jac)[1], atol=1e-5)
    inv = inverse(f)
    _close(jax.jit(inv)(y), x, atol=1e-5)
    _close(jax.vmap(inv)(jnp.stack([y, f(2 * x)])), jnp.stack([x, 2 * x]), atol=1e-5)
    # The inverse is linear too: its gradient is a row sum of J^-1.
    want = jnp.sum(jnp.linalg.inv(jac), axis=0)
    _close(jax.grad(lambda t: jnp.sum(inv(t)))(y), want, atol=1e-5)
    assert "(linear solve)" in jaxinterp.explain_inverse(f, x)


@pytest.mark.slow
def test_linear_block_with_known_parameters():
    def dlr(x, d, u, w):
        return d * x + u @ (w.T @ x)

    x = jnp.array([0.3, -1.2, 2.0, 0.5])
    y = dlr(x, _D, _U, _W)
    inv = inverse(dlr, argnums=0)
    _close(inv(y, _D, _U, _W), x, atol=1e-5)

    def hand(y, d, u, w):
        return jnp.linalg.solve(jnp.diag(d) + u @ w.T, y)

    args = [_D, _U, _W]
    for k in (1, 2, 3):
        got = jax.grad(lambda a, k=k: jnp.sum(inv(y, *args[: k - 1], a, *args[k:])))
        want = jax.grad(lambda a, k=k: jnp.sum(hand(y, *args[: k - 1], a, *args[k:])))
        _close(got(args[k - 1]), want(args[k - 1]), rtol=1e-3, atol=1e-4)
    got = jax.grad(lambda d: ildj(dlr, argnums=0)(y, d, _U, _W))(_D)
    want = jax.grad(lambda d: -jnp.linalg.slogdet(jnp.diag(d) + _U @ _W.T)[1])(_D)
    _close(got, want, rtol=1e-3, atol=1e-4)


def test_redundant_linear_results_use_the_ones_that_determine_x():
    def f(x):  # 3 results of 2 unknowns, none determining any alone
        return jnp.stack([x[0] + x[1], x[0] - x[1], x[0] + 2 * x[1]])

    x = jnp.array([0.3, -1.2])
    got_x, got_ildj = inverse_and_ildj(f, example_args=(x,))(f(x))
    _close(got_x, x, atol=1e-5)
    # A non-square map: minus the log of its volume factor onto the image.
    jac = np.asarray(jax.jacfwd(f)(x), np.float64)
    _close(got_ildj, -0.5 * np.linalg.slogdet(jac.T @ jac)[1], atol=1e-5)
    assert "(linear solve)" in jaxinterp.explain_inverse(f, x)
    # Results outside the image (inconsistent with each other): NaN.
    bad = f(x).at[-1].add(1.0)
    assert np.isnan(np.asarray(inverse(f, example_args=(x,))(bad))).all()


def test_a_singular_linear_block_is_refused():
    def f(x):  # x[0] + x[1] twice: J is singular
        return jnp.stack([x[0] + x[1], 2 * (x[0] + x[1])])

    with pytest.raises(NotInvertibleError, match="whose matrix has rank 1"):
        inverse(f)(jnp.array([1.0, 2.0]))


def test_linear_blocks_are_solvers():
    with pytest.raises(NotInvertibleError, match=r"solvers=False"):
        inverse(_householder, solvers=False)(jnp.ones(4))


# ---------------------------------------------------------------------------
# Embeddings: the unknown is copied into a larger array at known positions.


@pytest.mark.slow
def test_fill_triangular_by_scatter():
    rows, cols = np.tril_indices(4)

    def fill(t):  # NumPyro's `vec_to_tril_matrix` way
        return jnp.zeros((4, 4)).at[rows, cols].set(t)

    def hand(m):
        return m[rows, cols]

    t = jnp.linspace(-1.0, 2.0, 10)
    got, got_ildj = inverse_and_ildj(fill, example_args=(t,))(fill(t))
    _close(got, hand(fill(t)))
    assert float(got_ildj) == 0.0  # a copy: no volume change
    inv = inverse(fill, example_args=(t,))
    _close(jax.vmap(inv)(jnp.stack([fill(t), fill(2 * t)])), jnp.stack([t, 2 * t]))
    _close(jax.grad(lambda m: jnp.sum(inv(m) ** 2))(fill(t)), fill(2 * t))


def test_scatter_add_into_a_known_operand():
    def f(t, base):
        return base.at[1:, 0].add(t)

    base = jnp.arange(12.0).reshape(4, 3)
    t = jnp.array([0.5, -1.0, 2.0])
    _close(inverse(f, argnums=0, example_args=(t,))(f(t, base), base), t)


def test_scatter_refuses_repeated_or_dropped_indices():
    t = jnp.ones(2)
    with pytest.raises(NotInvertibleError, match="repeated indices"):
        inverse(lambda t: jnp.zeros(5).at[np.array([1, 1])].set(t), example_args=(t,))(
            jnp.ones(5)
        )
    with pytest.raises(NotInvertibleError, match="out of bounds"):
        inverse(
            lambda t: jnp.zeros(5).at[np.array([1, 7])].set(t, mode="drop"),
            example_args=(t,),
        )(jnp.ones(5))


def test_scatter_at_traced_indices_gives_nan_where_they_repeat():
    def f(t, idx):
        return jnp.zeros(5).at[idx].set(t)

    t = jnp.array([1.0, 2.0, 3.0])
    inv = inverse(f, argnums=0, example_args=(t,))
    good = jnp.array([4, 0, 2])
    _close(inv(f(t, good), good), t)
    bad = jnp.array([4, 0, 4])
    got = np.asarray(inv(f(t, bad), bad))
    assert np.isnan(got[[0, 2]]).all() and got[1] == 2.0, got


def _shifted_gompertz_cdf(x):
    return -jnp.expm1(-x) * jnp.exp(-0.7 * jnp.exp(-x))


def _shifted_gompertz_hand(y, lo=-1.0, hi=40.0):
    """Bisection in float64 on the increasing branch `x > -1` (where the
    values in (0, 1) are)."""
    y = np.asarray(y, np.float64)
    lo, hi = np.full_like(y, lo), np.full_like(y, hi)
    for _ in range(200):
        mid = (lo + hi) / 2
        f = -np.expm1(-mid) * np.exp(-0.7 * np.exp(-mid))
        lo, hi = np.where(f < y, mid, lo), np.where(f < y, hi, mid)
    return (lo + hi) / 2


@pytest.mark.slow
def test_a_formula_that_turns_outside_its_domain_is_inverted_where_single():
    # The shifted Gompertz CDF is a bijection of x > 0 onto (0, 1); its
    # formula turns for some x < 0, where it is negative: every y in (0, 1)
    # has one preimage, a negative y in its range two (NaN), and the map is
    # inverted there rather than refused (`_inverse/_numerical/_turning.py`).
    f = _shifted_gompertz_cdf
    x = jnp.linspace(0.1, 4.0, 5)
    got, ildj = inverse_and_ildj(f)(f(x))
    _close(got, _shifted_gompertz_hand(f(x)), rtol=1e-5)
    _close(ildj, _slogdet_ildj(f, x), rtol=1e-4)
    _close(jax.jit(inverse(f))(f(x)), x, rtol=1e-5)
    two = np.asarray(f(jnp.array([-0.5, -2.0])))  # negative: two preimages each
    assert np.isnan(np.asarray(inverse(f)(jnp.asarray(two)))).all()
    assert np.isnan(
        np.asarray(inverse(f)(jnp.array([-0.5, 1.5])))
    ).all()  # below, above


def _lambert_w(y):
    """The principal branch of Lambert's W (`t exp(t) = y`, `t > 0` for
    `y > 0`) by Newton's method in float64."""
    t = np.log1p(np.asarray(y, np.float64))
    for _ in range(60):
        t = t - (t * np.exp(t) - y) / (np.exp(t) * (1 + t))
    return t


@pytest.mark.slow
def test_a_map_approaching_a_value_at_the_end_of_the_grid_is_single_beyond_it():
    # `t exp(t)` of `t = 1 / asinh(x)`: for x > 0 it falls from inf towards
    # 0, which it approaches only beyond the largest float; for x < 0 it
    # turns and takes each value in [-1/e, 0) twice. Every y > 0 has one
    # preimage, sinh(1 / W(y)).
    def f(x):
        t = 1.0 / jnp.arcsinh(x)
        return t * jnp.exp(t)

    x = jnp.array([0.3, 1.0, 2.0, 5.0])
    y = f(x)
    got, ildj = inverse_and_ildj(f)(y)
    _close(got, np.sinh(1 / _lambert_w(np.asarray(y, np.float64))), rtol=2e-5)
    _close(ildj, _slogdet_ildj(f, x), rtol=1e-4)
    two = np.asarray(f(jnp.array([-0.5, -3.0])))  # in [-1/e, 0): two each
    assert np.isnan(np.asarray(inverse(f)(jnp.asarray(two)))).all()


@pytest.mark.slow
def test_a_formula_that_takes_every_value_twice_is_refused():
    def f(x):
        return jnp.exp(-x * x) + 0.5 * jnp.tanh(x) ** 2

    with pytest.raises(NotInvertibleError, match="every value it takes"):
        inverse(f)(jnp.array([0.5, 0.7]))


def test_strict_raises_where_a_block_gives_nan():
    def absolute(x):
        return jnp.where(x > 0, x, -x)

    line = absolute.__code__.co_firstlineno + 1
    with pytest.raises(NotInvertibleError) as info:
        inverse(absolute, strict=True)(jnp.array([2.0, 1.0]))
    message = str(info.value)
    assert f"test_bijector_zoo.py:{line}" in message, message
    assert "2 element(s) of float32[2] have no single preimage" in message, message
    softsign = ZOO[[b.name for b in ZOO].index("softsign")].forward
    x = jnp.array([0.5, -2.0])
    _close(inverse(softsign, strict=True)(softsign(x)), x)


@pytest.mark.slow
def test_linear_unknowns_that_depend_on_each_other_are_not_solved_apart():
    # TFP's TransformDiagonal(Softplus()) after a fill: the diagonal is
    # softplus of the fill's own diagonal, a value the linear part also
    # reaches. Solving both as free unknowns would find a singular system;
    # instead the `where` gives the fill off the diagonal, the diagonal
    # (a point gather) the rest: exact, with the ildj of the triangle.
    rows, cols = np.tril_indices(3)

    def fill_scale_tril(t):
        m = jnp.zeros((3, 3)).at[rows, cols].set(t)
        d = jax.nn.softplus(jnp.diagonal(m)) + 1e-5
        return jnp.where(jnp.eye(3, dtype=bool), d[None, :], m)

    t = jnp.linspace(-1.0, 1.0, 6)
    got, ildj = inverse_and_ildj(fill_scale_tril, example_args=(t,))(fill_scale_tril(t))
    _close(got, t, atol=1e-5)
    jac = jax.jacfwd(lambda v: fill_scale_tril(v)[rows, cols])(t)
    _close(ildj, -jnp.linalg.slogdet(jac)[1], atol=1e-5)
