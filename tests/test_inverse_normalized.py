"""Normalized blocks (`jaxinterp/_inverse/_normalized.py`): a value divided by
a function of itself, pinned by elements that do not depend on the unknowns.

Each map is written the way a bijector library writes it (TFP's
`SoftmaxCentered` and `CorrelationCholesky`) and checked against a
hand-written inverse, its ildj against the area formula
`-0.5 * logdet(J^T J)` from `jax.jacfwd`, and its gradient on the image's
tangent space (`J^T grad = 1`: the gradient of a left inverse is fixed only
along the image).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxinterp

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

# Each example traces and compiles a new inverse: fewer than the profile's.
FEW = settings(max_examples=max(4, settings.default.max_examples // 3))
SOME = settings(max_examples=max(6, settings.default.max_examples // 2))


def softmax_centered(x):
    """TFP's `SoftmaxCentered` forward: a zero appended, then a stable softmax."""
    b = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, 1)])
    d = jnp.max(b, axis=-1, keepdims=True)
    d = jnp.where(jnp.isfinite(d), d, 0.0)
    e = jnp.exp(b - d)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def softmax_centered_inverse(y):
    return jnp.log(y[..., :-1]) - jnp.log(y[..., -1:])


def correlation_cholesky(x):
    """TFP's `CorrelationCholesky` forward for 3x3 factors: `x` filled into
    the strict lower triangle, ones on the diagonal, rows scaled to unit norm."""
    e = jnp.concatenate([x[2:], x[::-1]]).reshape(2, 2)
    lower = jnp.pad(jnp.tril(e), ((1, 0), (0, 1)))
    u = jnp.where(jnp.eye(3, dtype=bool), 1.0, lower)
    return u / jnp.linalg.norm(u, axis=-1, keepdims=True)


def correlation_cholesky_inverse(y):
    """Each row divided by its diagonal element, read back off the triangle."""
    u = y / jnp.diagonal(y)[:, None]
    return jnp.stack([u[2, 1], u[2, 0], u[1, 0]])


def area_ildj(f, x):
    jac = jax.jacfwd(f)(x).reshape(-1, x.size)
    return -0.5 * jnp.linalg.slogdet(jac.T @ jac)[1]


CASES = {
    "softmax_centered": (softmax_centered, softmax_centered_inverse),
    "correlation_cholesky": (correlation_cholesky, correlation_cholesky_inverse),
}

vectors = st.lists(st.floats(-3, 3, width=32), min_size=3, max_size=3).map(
    lambda v: jnp.asarray(v, jnp.float32)
)


def test_the_hand_written_inverses_invert():
    x = jnp.array([0.3, -1.0, 0.5])
    for f, f_inv in CASES.values():
        np.testing.assert_allclose(f_inv(f(x)), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
@FEW
@given(x=vectors)
def test_normalized_inverse_matches_hand_written_and_area_formula(name, x):
    f, f_inv = CASES[name]
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, f_inv(y), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, x, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(ildj, area_ildj(f, x), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", sorted(CASES))
def test_normalized_inverse_composes_with_jit_vmap_and_grad(name):
    f, f_inv = CASES[name]
    xs = jnp.array([[0.3, -1.0, 0.5], [1.2, 0.1, -0.7]])
    ys = jax.vmap(f)(xs)
    inv = jaxinterp.inverse(f, example_args=(xs[0],))
    np.testing.assert_allclose(jax.jit(inv)(ys[0]), f_inv(ys[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.vmap(inv)(ys), jax.vmap(f_inv)(ys), atol=1e-5)
    # The gradient of sum(x) with respect to y, along the image's tangents.
    x = xs[1]
    grad = jax.grad(lambda y: jnp.sum(inv(y)))(f(x))
    jac = jax.jacfwd(f)(x).reshape(-1, x.size)
    np.testing.assert_allclose(jac.T @ grad.ravel(), jnp.ones(3), rtol=1e-4, atol=1e-4)


def test_batched_rows_are_solved_each_with_its_own_factor():
    xs = jnp.array([[0.3, -1.0, 0.5], [4.0, -2.0, 0.0], [-8.0, 1.0, 3.0]])
    ys = softmax_centered(xs)
    got = jaxinterp.inverse(softmax_centered, example_args=(xs,))(ys)
    np.testing.assert_allclose(got, softmax_centered_inverse(ys), rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(
    tuple(int(p) for p in jax.__version__.split(".")[:3]) >= (0, 12, 1),
    reason="from JAX 0.12.1 `jax.nn.softmax` is a `custom_jvp` function: the "
    "padding, outside its body, does not pin the normalization inside it",
    strict=True,
)
def test_jax_nn_softmax_of_a_padded_vector():
    def f(x):
        return jax.nn.softmax(jnp.pad(x, (1, 0)))

    x = jnp.array([0.5, -2.0, 1.5])
    y = f(x)
    np.testing.assert_allclose(
        jaxinterp.inverse(f, example_args=(x,))(y), jnp.log(y[1:] / y[0]), atol=1e-5
    )


def test_a_y_off_the_image_gives_nan():
    x = jnp.array([0.3, -1.0, 0.5])
    inv = jaxinterp.inverse(softmax_centered, example_args=(x,))
    y = softmax_centered(x)
    assert jnp.all(jnp.isnan(inv(y * 1.01)))  # sums to 1.01
    assert jnp.all(jnp.isfinite(inv(y)))
    inv_corr = jaxinterp.inverse(correlation_cholesky, example_args=(x,))
    y_corr = correlation_cholesky(x)
    assert jnp.all(jnp.isnan(inv_corr(y_corr.at[2].multiply(1.1))))  # not unit norm
    assert jnp.all(jnp.isnan(inv_corr(y_corr.at[0, 2].set(0.1))))  # not triangular


def test_two_fixed_elements_of_a_row_must_agree():
    def f(x):  # zeros at both ends: the results there must be equal
        e = jnp.exp(jnp.pad(x, (1, 1)))
        return e / jnp.sum(e)

    x = jnp.array([0.3, -1.0])
    inv = jaxinterp.inverse(f, example_args=(x,))
    y = f(x)
    np.testing.assert_allclose(inv(y), x, atol=1e-5)
    skewed = y.at[0].multiply(1.2)
    assert jnp.all(jnp.isnan(inv(skewed / jnp.sum(skewed))))


def test_a_softmax_of_unconstrained_values_is_refused_naming_the_lost_freedom():
    x = jnp.array([0.3, -1.0, 0.5])
    with pytest.raises(
        jaxinterp.NotInvertibleError,
        match=re.escape("fixes its numerator only up to one unknown factor per row"),
    ) as err:
        jaxinterp.inverse(jax.nn.softmax)(jax.nn.softmax(x))
    assert "Blocked at `div`" in str(err.value)
    assert "loses one degree of freedom per row" in str(err.value)


def test_explain_names_the_normalization():
    x = jnp.array([0.3, -1.0, 0.5])
    text = jaxinterp.explain_inverse(softmax_centered, x)
    assert "(normalization)" in text
    assert text.strip().endswith("Invertible: every unknown input is recovered.")


# -- projective blocks: ratios of affine maps ----------------------------------


def unit_vector(x):
    """TFP's `UnitVector` forward: the inverse stereographic projection."""
    d = jnp.sum(x * x, keepdims=True)
    return jnp.concatenate([2 * x, d - 1]) / (d + 1)


def unit_vector_inverse(y):
    return y[:-1] / (1 - y[-1])


A = jnp.array([[1.0, 0.2], [0.1, 0.9]])
C = jnp.array([0.1, -0.2])
B = jnp.array([0.5, -0.3])


def projective(x):
    """A projective map of the plane in homogeneous coordinates."""
    return (A @ x + B) / (C @ x + 1.0)


def projective_inverse(y):
    # (A - y c^T) x = y - b
    return jnp.linalg.solve(A - jnp.outer(y, C), y - B)


def mobius(x):
    return (2 * x + 1) / (x + 3)


def mobius_inverse(y):
    return (1 - 3 * y) / (y - 2)


def unit_vector_sums_written_thrice(x):
    """The inverse stereographic projection with `|x|^2` written out each
    time it is used: three equal reductions, one unknown; two ratios sharing
    it, solved as one system."""
    return jnp.concatenate(
        [
            2 * x / (jnp.sum(x * x) + 1),
            ((jnp.sum(x * x) - 1) / (jnp.sum(x * x) + 1))[None],
        ]
    )


def unit_vector_sums_written_twice(x):
    """TFP's form, `|x|^2` written once in the numerator, once in the divisor."""
    return jnp.concatenate([2 * x, jnp.sum(x * x, keepdims=True) - 1]) / (
        jnp.sum(x * x, keepdims=True) + 1
    )


def projective_dot_written_twice(x):
    """A projective map of the plane, the dot product with `C` written twice
    as a reduction."""
    return (A @ x + B * jnp.sum(C * x)) / (jnp.sum(C * x) + 1.0)


def projective_dot_written_twice_inverse(y):
    # (A + (b - y) c^T) x = y
    return jnp.linalg.solve(A + jnp.outer(B - y, C), y)


PROJECTIVE = {
    "unit_vector": (unit_vector, unit_vector_inverse, 3),
    "projective": (projective, projective_inverse, 2),
    "mobius": (mobius, mobius_inverse, 3),
    "unit_vector_sums_written_thrice": (
        unit_vector_sums_written_thrice,
        unit_vector_inverse,
        3,
    ),
    "unit_vector_sums_written_twice": (
        unit_vector_sums_written_twice,
        unit_vector_inverse,
        3,
    ),
    "projective_dot_written_twice": (
        projective_dot_written_twice,
        projective_dot_written_twice_inverse,
        2,
    ),
}


def exact_ildj(f, x):
    jac = jax.jacfwd(f)(x).reshape(-1, x.size)
    if jac.shape[0] == jac.shape[1]:
        return -jnp.linalg.slogdet(jac)[1]
    return -0.5 * jnp.linalg.slogdet(jac.T @ jac)[1]


def test_the_hand_written_projective_inverses_invert():
    for f, f_inv, n in PROJECTIVE.values():
        x = jnp.linspace(-0.7, 0.4, n)
        np.testing.assert_allclose(f_inv(f(x)), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PROJECTIVE))
@FEW
@given(data=st.data())
def test_projective_inverse_matches_hand_written_and_jacobian(name, data):
    f, f_inv, n = PROJECTIVE[name]
    x = jnp.asarray(
        data.draw(st.lists(st.floats(-2, 2, width=32), min_size=n, max_size=n)),
        jnp.float32,
    )
    y = f(x)
    if not jnp.all(jnp.isfinite(y)) or jnp.linalg.cond(jax.jacfwd(f)(x)) > 1e3:
        return  # near a pole or a fold of the map: not a well-posed check
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, f_inv(y), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(ildj, exact_ildj(f, x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", sorted(PROJECTIVE))
@pytest.mark.parametrize("tiny", [np.finfo(np.float32).tiny, 1e-37, -3e-38])
def test_projective_inverse_of_an_element_near_the_smallest_normal(name, tiny):
    """The linear system's residual check allows the rounding of the smallest
    normal numbers: below them, XLA's CPU code flushes products to 0, and the
    bound `8 n eps |J| |u|` itself underflows (a false NaN, hypothesis 6.170's
    draw `[0, 0.5, 1.18e-38]`)."""
    f, f_inv, n = PROJECTIVE[name]
    x = jnp.zeros(n).at[1].set(0.5).at[n - 1].set(tiny)
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(x,))(y)
    np.testing.assert_allclose(got, f_inv(y), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ildj, exact_ildj(f, x), rtol=1e-4, atol=1e-4)
    if y.size > x.size:  # onto a sphere: still a check, off it is NaN
        moved = y.at[0].add(0.1)
        assert np.all(np.isnan(jaxinterp.inverse(f, example_args=(x,))(moved)))


@pytest.mark.parametrize("name", sorted(PROJECTIVE))
def test_projective_inverse_composes_with_jit_vmap_and_grad(name):
    f, f_inv, n = PROJECTIVE[name]
    xs = jnp.stack([jnp.linspace(-0.7, 0.4, n), jnp.linspace(0.9, -0.2, n)])
    ys = jax.vmap(f)(xs)
    inv = jaxinterp.inverse(f, example_args=(xs[0],))
    np.testing.assert_allclose(jax.jit(inv)(ys[0]), f_inv(ys[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.vmap(inv)(ys), jax.vmap(f_inv)(ys), atol=1e-5)
    grad = jax.grad(lambda y: jnp.sum(inv(y)))(ys[1])
    jac = jax.jacfwd(f)(xs[1]).reshape(-1, n)
    np.testing.assert_allclose(jac.T @ grad, jnp.ones(n), rtol=1e-4, atol=1e-4)


def test_projective_off_the_image_gives_nan():
    x = jnp.array([0.3, -1.0, 0.5])
    inv = jaxinterp.inverse(unit_vector, example_args=(x,))
    y = unit_vector(x)
    assert jnp.all(jnp.isfinite(inv(y)))
    assert jnp.all(jnp.isnan(inv(y * 1.01)))  # not on the unit sphere
    # The one value a Mobius map never takes: no preimage. (Inverted by its
    # formula, element by element: the other element stands.)
    got = jaxinterp.inverse(mobius)(jnp.array([2.0, 0.5]))
    assert jnp.isnan(got[0])
    np.testing.assert_allclose(got[1], mobius_inverse(0.5), rtol=1e-6)
    np.testing.assert_allclose(
        jaxinterp.inverse(mobius)(jnp.array([1.5, 0.5])),
        mobius_inverse(jnp.array([1.5, 0.5])),
        rtol=1e-5,
    )


def test_explain_names_the_projective_solve():
    text = jaxinterp.explain_inverse(unit_vector, jnp.array([0.3, -1.0, 0.5]))
    assert "(projective solve)" in text
    assert text.strip().endswith("Invertible: every unknown input is recovered.")


def test_a_reduction_written_twice_is_one_unknown_and_checked():
    x = jnp.array([0.3, -1.0, 0.5])
    for f in (unit_vector_sums_written_thrice, unit_vector_sums_written_twice):
        text = jaxinterp.explain_inverse(f, x)
        sums = [line for line in text.splitlines() if "reduce_sum" in line]
        assert len(sums) >= 2
        assert all(line.endswith("(projective solve)") for line in sums)
        assert text.strip().endswith("Invertible: every unknown input is recovered.")
        inv = jaxinterp.inverse(f, example_args=(x,))
        np.testing.assert_allclose(inv(f(x)), x, rtol=1e-5, atol=1e-5)
        # The merged `|x|^2` must still be what the solved `x` gives it.
        assert jnp.all(jnp.isnan(inv(f(x) * 1.01)))  # not on the unit sphere


def columns_to_sphere(x, axes=(0, 0)):
    """Each column of `x` by the inverse stereographic projection, its
    squared norm written twice (over `axes[0]`, then `axes[1]`)."""
    s0 = jnp.sum(x * x, axis=axes[0])
    s1 = jnp.sum(x * x, axis=axes[1])
    return jnp.concatenate([2 * x, (s0 - 1)[None]]) / (s1 + 1)[None]


def test_equal_reductions_over_one_axis_merge():
    x = jnp.array([[0.3, -1.0], [0.5, 0.2]])
    y = columns_to_sphere(x)
    got, ildj = jaxinterp.inverse_and_ildj(columns_to_sphere, example_args=(x,))(y)
    np.testing.assert_allclose(got, y[:-1] / (1 - y[-1]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ildj, area_ildj(columns_to_sphere, x), rtol=1e-4, atol=1e-4
    )


def _refused_or_right(f, x):
    """`inverse(f)` at `f(x)`: refused (`True`), or else `x` (`False`)."""
    try:
        got = jaxinterp.inverse(f, example_args=(x,))(f(x))
    except jaxinterp.NotInvertibleError:
        return True
    np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
    return False


def test_reductions_that_differ_do_not_merge():
    # Over different axes: merged, the system would have as many unknowns
    # as results (6), and be solved wrongly; kept apart it has 8.
    x = jnp.array([[0.3, -1.0], [0.5, 0.2]])
    assert _refused_or_right(lambda x: columns_to_sphere(x, (0, 1)), x)

    # `sum(x * x)` and `sum(x * x * 2)`: two unknowns.
    def scaled(x):
        return jnp.concatenate([2 * x, jnp.sum(x * x, keepdims=True) - 1]) / (
            jnp.sum(x * x * 2, keepdims=True) + 1
        )

    assert _refused_or_right(scaled, jnp.array([0.3, -1.0, 0.5]))


def test_value_numbers_merge_only_one_computation_of_the_same_operands():
    from jaxinterp import _jax_compat as compat
    from jaxinterp._inverse._value_numbers import ValueNumbers

    def f(x, z):
        return (
            jnp.sum(x * x, axis=0),  # 0
            jnp.sum(x * x, axis=0),  # 1: the same as 0
            jnp.sum(x * x, axis=1),  # 2: another axis
            jnp.sum(x * x * 2, axis=0),  # 3: another operand
            jnp.sum(x * z, axis=0),  # 4: another input
            jnp.sum(x * 2.0, axis=0),  # 5
            jnp.sum(x * 2.0, axis=0),  # 6: equal literals, the same as 5
            jnp.sum(x * 3.0, axis=0),  # 7: another literal
            jnp.sum(x * -0.0, axis=0),  # 8
            jnp.sum(x * 0.0, axis=0),  # 9: -0.0 and 0.0 differ
            jnp.sum(x.astype(jnp.int32), axis=0),  # 10
            jnp.sum(x.astype(jnp.int32), axis=0).astype(jnp.float32),  # 11
        )

    x = jnp.ones((2, 2))
    jaxpr = jax.make_jaxpr(f)(x, x).jaxpr
    producer = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    numbers = ValueNumbers(jaxpr.eqns, producer)
    outs = jaxpr.outvars
    assert numbers.same(outs[0], outs[1])
    assert numbers.same(outs[5], outs[6])
    for a, b in [(0, 2), (0, 3), (0, 4), (5, 7), (8, 9), (10, 11)]:
        assert not numbers.same(outs[a], outs[b]), (a, b)
    # Literals are numbered by value, never hashed themselves.
    literals = [v for e in jaxpr.eqns for v in e.invars if type(v) is compat.Literal]
    assert literals
    assert numbers.number(literals[0]) == numbers.number(literals[0])


# -- random maps: a finite answer is the preimage -------------------------------


def _finite_answer_is_the_preimage(f, x, y):
    """`inverse(f)(y)` refuses, or is NaN, or is `x` (the maps drawn are
    injective where their homogeneous matrix has full rank, and a rank
    deficient one must not give a finite answer)."""
    try:
        got = jaxinterp.inverse(f, example_args=(x,))(y)
    except jaxinterp.NotInvertibleError:
        return None
    if not jnp.all(jnp.isfinite(got)):
        return got
    np.testing.assert_allclose(f(got), y, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got, x, rtol=1e-2, atol=1e-2)
    return got


@SOME
@given(data=st.data())
def test_random_projective_maps_never_answer_wrongly(data):
    n = data.draw(st.integers(1, 3), label="n")
    m = data.draw(st.integers(n, n + 1), label="m")
    rank_deficient = data.draw(st.booleans(), label="rank deficient")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, n)).astype(np.float32)
    b = rng.normal(size=m).astype(np.float32)
    c = (0.3 * rng.normal(size=n)).astype(np.float32)
    if rank_deficient:
        # The homogeneous matrix [[a, b], [c, 2]] loses rank: `a`'s columns
        # lie in a span of one direction.
        a = np.outer(rng.normal(size=m), rng.normal(size=n)).astype(np.float32)
        c = np.zeros(n, np.float32)

    def f(x):
        return (jnp.asarray(a) @ x + jnp.asarray(b)) / (jnp.asarray(c) @ x + 2.0)

    x = jnp.asarray(rng.uniform(-1, 1, size=n), jnp.float32)
    y = f(x)
    jac = np.asarray(jax.jacfwd(f)(x))
    got = _finite_answer_is_the_preimage(f, x, y)
    if not rank_deficient and np.linalg.cond(jac) < 1e2:
        assert got is not None and jnp.all(jnp.isfinite(got))
    if rank_deficient and n > 1:
        assert got is None or not jnp.all(jnp.isfinite(got))


@SOME
@given(data=st.data())
def test_random_normalizations_never_answer_wrongly(data):
    n = data.draw(st.integers(1, 4), label="n")
    lo = data.draw(st.integers(0, 2), label="pad before")
    hi = data.draw(st.integers(0 if lo else 1, 2), label="pad after")
    fill = data.draw(st.floats(-2, 2, width=32), label="pad value")
    stable = data.draw(st.booleans(), label="subtract the max")
    temperature = data.draw(st.floats(0.5, 2, width=32), label="temperature")
    seed = data.draw(st.integers(0, 2**16), label="seed")

    def f(x):
        b = jnp.pad(x, (lo, hi), constant_values=fill) / temperature
        if stable:
            b = b - jnp.max(b)
        e = jnp.exp(b)
        return e / jnp.sum(e)

    x = jnp.asarray(np.random.default_rng(seed).uniform(-2, 2, size=n), jnp.float32)
    y = f(x)
    got = _finite_answer_is_the_preimage(f, x, y)
    assert got is not None and jnp.all(jnp.isfinite(got))
    if lo + hi > 1:
        # Two padded values: they must agree, else NaN.
        skewed = y.at[0 if lo else -1].multiply(1.5)
        bad = jaxinterp.inverse(f, example_args=(x,))(skewed / jnp.sum(skewed))
        assert jnp.all(jnp.isnan(bad))


def test_a_normalization_too_large_to_check_densely_says_to_vmap():
    xs = jnp.zeros((1100, 2))  # 2200 free elements
    with pytest.raises(
        jaxinterp.NotInvertibleError, match="map the inverse over the rows"
    ):
        jaxinterp.inverse(softmax_centered, example_args=(xs,))(softmax_centered(xs))
    rows = jax.vmap(jaxinterp.inverse(softmax_centered, example_args=(xs[0],)))
    np.testing.assert_allclose(rows(softmax_centered(xs)), xs, atol=1e-5)
