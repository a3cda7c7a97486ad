"""Maps whose outputs hold the unknowns more than once.

Two properties, each checked against a reference computed another way:

* **A second constraint is checked.** When the outputs determine a value
  twice (an output that repeats an input, a result the program computes
  again from values solved through another path), a `y` on the image gives
  the input back, and a `y` off it gives NaN (input and ildj), never the
  answer of whichever path the engine took first. `strict=True` raises.
* **The ildj of a map with more results than unknowns** is taken in the
  coordinates `S` of `y` that the inverse reads when they are as many as
  the unknowns, `-log|det J[S, :]|` (`J` from `jax.jacfwd`), and otherwise
  is the area formula of the whole map, `-0.5 logdet(J^T J)`, also when a
  linear step or a transformed copy follows the non-square step (the
  backward steps' ildjs do not add up to it there).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jaxinterp
from jaxinterp import _jax_compat as compat

# One of the inverse's methods on many maps: left out of the default run
# (conftest.py); `--full`, CI's newest-JAX run and nox run them.
pytestmark = pytest.mark.methods

# Each example traces and compiles a new inverse: fewer than the profile's.
FEW = settings(max_examples=max(4, settings.default.max_examples // 3))

SCALES = jnp.array([1, 2, 3, 4.0])
M = jnp.array([[0.85, 0.09, -0.17], [-0.19, 1.18, -0.33], [-0.18, -0.01, 0.98]])


def _padded(x):
    return jnp.full((5,), 0.0).at[jnp.array([1, 2, 3])].set(x)


def _fraction(v):
    return v / (3.08 - v)


def _filled(x):
    v = jnp.zeros((3, 3)).at[jnp.array([1])].set(x)
    return jnp.concatenate([jnp.full((3, 2), 2.0), v], axis=1)


# name -> (f, the shape of x). Each f maps R^n to more than n results.
REDUNDANT = {
    "copy and exp": (lambda x: (x, jnp.exp(x)), (2,)),
    "exp and copy": (lambda x: (jnp.exp(x), x), (2,)),
    "two affine maps": (lambda x: (2 * x, x + 1), (2,)),
    "concatenated copy and exp": (lambda x: jnp.concatenate([x, jnp.exp(x)]), (2,)),
    "copy and sin": (lambda x: (x, jnp.sin(x)), (3,)),
    "twice the same": (lambda x: (x, x), (2,)),
    "scaled copies": (
        lambda x: jnp.concatenate([x, x]) * jnp.array([1, 2, 3, 4.0]),
        (2,),
    ),
    "one call reading x twice": (
        lambda x: jax.jit(lambda a, b: (2 * a, jnp.exp(b)))(x, x),
        (2,),
    ),
    # A quotient of a value with constant zeros solved again for its
    # denominator: `0 / 0` there, an element left undetermined (its ildj
    # term was NaN, and made the whole ildj NaN).
    "copies and a fraction of a scatter": (
        lambda x: (jnp.broadcast_to(x, (2, 3)), _fraction(_padded(x))),
        (3,),
    ),
}

NONSQUARE = {
    **REDUNDANT,
    "exp of a padding": (
        lambda x: jnp.exp(jnp.pad(x, (0, 1), constant_values=1.0)),
        (2,),
    ),
    "matrix after a padding": (lambda x: M @ jnp.pad(x, (0, 1)), (2,)),
    "padding after a matrix": (lambda x: jnp.pad(M[:2, :2] @ x, (0, 1)), (2,)),
    "scatter, concatenation, product": (
        lambda x: jnp.einsum("ij,...j->...i", M, _filled(x).T),
        (1, 3),
    ),
}


# name -> the flat indices of the results its inverse reads, where they are
# as many as the unknowns (`None`: it reads more). An exact copy is read
# before a transformed one; `(2 x, x + 1)` is solved from its last result.
READS = {
    "copy and exp": [0, 1],
    "exp and copy": [2, 3],
    "two affine maps": [2, 3],
    "concatenated copy and exp": [0, 1],
    "copy and sin": [0, 1, 2],
    "twice the same": [0, 1],
    "scaled copies": [0, 1],
    "one call reading x twice": [0, 1],
    "copies and a fraction of a scatter": [0, 1, 2],
    "exp of a padding": [0, 1],
    "matrix after a padding": None,
    "padding after a matrix": [0, 1],
    "scatter, concatenation, product": None,
}


def _flat(f, shape):
    def flat(u):
        out = f(u.reshape(shape))
        return jnp.concatenate([jnp.ravel(o) for o in jax.tree_util.tree_leaves(out)])

    return flat


def _manifold_ildj(f, x, reads):
    """`-log|det J[reads, :]|`, or `-0.5 logdet(J^T J)` if `reads` is
    `None`, from the whole map's Jacobian (`jax.jacfwd`), the determinant
    taken in float64 by NumPy."""
    jac = np.asarray(jax.jacfwd(_flat(f, x.shape))(jnp.ravel(x)), np.float64)
    if reads is None:
        return float(-0.5 * np.linalg.slogdet(jac.T @ jac)[1])
    return float(-np.linalg.slogdet(jac[reads])[1])


def _read(f, x):
    """The flat indices of the results that `inverse(f)` depends on at `f(x)`."""
    y = f(x)
    leaves, tree = jax.tree_util.tree_flatten(y)
    inv = jaxinterp.inverse(f, example_args=(x,))

    def x_of(u):
        parts = jnp.split(u, np.cumsum([v.size for v in leaves])[:-1])
        ys = [p.reshape(v.shape) for p, v in zip(parts, leaves, strict=True)]
        return jnp.ravel(inv(jax.tree_util.tree_unflatten(tree, ys)))

    jac = jax.jacfwd(x_of)(jnp.concatenate([jnp.ravel(v) for v in leaves]))
    return np.nonzero(np.any(np.asarray(jac) != 0, axis=0))[0].tolist()


def _xs(shape):
    # (Values below 1e-30 in magnitude are drawn as 0: `x / (3.08 - x)` of
    # the smallest normal float32 is subnormal, which XLA's CPU code flushes
    # to 0, and the denominator solved back from that 0 is `inf`, which no
    # check can tell from a `y` off the image: a false NaN, not a wrong
    # number. The coordinates of the ildj are what this file tests.)
    n = int(np.prod(shape))
    value = st.floats(-1.25, 1.25, allow_nan=False, width=32)
    return st.lists(
        value.map(lambda v: v if abs(v) > 1e-30 else 0.0), min_size=n, max_size=n
    ).map(lambda v: jnp.asarray(np.reshape(np.asarray(v, np.float32), shape)))


@pytest.mark.parametrize("name", sorted(NONSQUARE))
@FEW
@given(data=st.data())
def test_the_ildj_of_a_nonsquare_map_is_in_the_coordinates_its_inverse_reads(
    name, data
):
    f, shape = NONSQUARE[name]
    x = data.draw(_xs(shape))
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(x,))(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    want = _manifold_ildj(f, x, READS[name])
    np.testing.assert_allclose(ildj, want, rtol=1e-4, atol=1e-4)
    # Compiled alike (once per map: every example has the same shape).
    if name not in _COMPILED:
        _COMPILED[name] = jax.jit(jaxinterp.inverse_and_ildj(f, example_args=(x,)))
    jitted = _COMPILED[name](f(x))
    np.testing.assert_allclose(jitted[1], want, rtol=1e-4, atol=1e-4)


_COMPILED: dict[str, Any] = {}


@pytest.mark.parametrize("name", sorted(NONSQUARE))
def test_the_inverse_of_a_nonsquare_map_reads_the_stated_results(name):
    f, shape = NONSQUARE[name]
    x = jnp.linspace(-0.7, 0.9, int(np.prod(shape)), dtype=jnp.float32).reshape(shape)
    read = _read(f, x)
    if READS[name] is None:
        assert len(read) > x.size  # (so the ildj is the area formula)
    else:
        assert read == READS[name]


@pytest.mark.parametrize("name", sorted(REDUNDANT))
@FEW
@given(data=st.data())
def test_a_y_off_the_image_of_a_redundant_map_gives_nan(name, data):
    f, shape = REDUNDANT[name]
    x = data.draw(_xs(shape))
    y = f(x)
    leaves, tree = jax.tree_util.tree_flatten(y)
    # One element of the last output moved well beyond rounding: no preimage.
    last = leaves[-1]
    moved = last.at[(0,) * last.ndim].add(0.25 + 0.5 * jnp.abs(last[(0,) * last.ndim]))
    off = jax.tree_util.tree_unflatten(tree, [*leaves[:-1], moved])
    inv = jaxinterp.inverse_and_ildj(f, example_args=(x,))
    got, ildj = inv(off)
    assert jnp.all(jnp.isnan(got)), got
    assert jnp.isnan(ildj)
    got_on, _ = inv(y)
    np.testing.assert_allclose(got_on, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exp_first", [False, True])
def test_a_second_path_off_its_domain_is_not_excused(exp_first):
    """`x` read twice by one call: the `exp` path's `log` of a negative
    result is NaN. That NaN is not an element left undetermined (the
    engine excuses those, `0 / 0`): recomputing the call from the other
    path's `x` shows the contradiction, so every element is NaN."""

    def call(a, b):
        return (jnp.exp(a), 2 * b) if exp_first else (2 * a, jnp.exp(b))

    def f(x):
        return jax.jit(call)(x, x)

    x = jnp.array([0.3, -0.5])
    inv = jaxinterp.inverse(f, example_args=(x,))
    np.testing.assert_allclose(inv(f(x)), x, rtol=1e-6)
    y = list(f(x))
    k = 0 if exp_first else 1
    y[k] = y[k].at[0].set(-3.0)
    assert jnp.all(jnp.isnan(inv(tuple(y)))), inv(tuple(y))
    assert jnp.all(jnp.isnan(jax.jit(inv)(tuple(y))))


def test_an_element_one_path_leaves_undetermined_is_not_a_contradiction():
    """The second path divides `0 / 0` where the known factor is zero: that
    element is determined by the first path alone, and the answer stands."""
    z = jnp.array([0.0, 2.0, 0.0])

    def f(x):
        return jax.jit(lambda a, b: (a + 1.0, b * z))(x, x)

    x = jnp.array([0.25, -1.5, 3.0])
    inv = jaxinterp.inverse(f, example_args=(x,))
    np.testing.assert_allclose(inv(f(x)), x, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(inv)(f(x)), x, rtol=1e-6)
    # Off the image where the factor is not zero: NaN.
    a, b = f(x)
    assert jnp.all(jnp.isnan(inv((a, b.at[1].add(1.0)))))


def test_a_constant_output_that_disagrees_gives_nan():
    def f(x):
        return x * 2.0, jnp.ones(3)

    x = jnp.array([0.5, -1.0, 2.0])
    inv = jaxinterp.inverse(f, example_args=(x,))
    np.testing.assert_allclose(inv(f(x)), x)
    assert jnp.all(jnp.isnan(inv((f(x)[0], jnp.array([1.0, 1.0, 3.0])))))


def test_strict_inversion_raises_naming_the_second_constraint():
    def f(x):
        return x, jnp.exp(x)

    x = jnp.array([0.5, -1.0])
    inv = jaxinterp.inverse(f, example_args=(x,), strict=True)
    np.testing.assert_allclose(inv(f(x)), x)
    with pytest.raises(
        jaxinterp.NotInvertibleError, match="constrain some values twice"
    ):
        inv((x, jnp.array([5.0, jnp.exp(-1.0)])))


def test_a_steep_recomputation_on_the_image_is_not_refused():
    """`x` solved from `log`, then `sin(x)` recomputed near its root and
    `exp(5x)` where it is steep: within rounding, not NaN."""

    def f(x):
        return jnp.exp(x), jnp.sin(x), jnp.exp(5 * x)

    x = jnp.array([3.1415925, 2.0, -0.7, 0.0])
    got = jaxinterp.inverse(f, example_args=(x,))(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-6)


def test_a_large_nonsquare_ildj_is_refused_and_its_inverse_is_not():
    def f(x):
        return jnp.pad(x, (0, 1)) * 2.0

    x = jnp.linspace(-1.0, 1.0, 3000)
    np.testing.assert_allclose(jaxinterp.inverse(f, example_args=(x,))(f(x)), x)
    with pytest.raises(
        jaxinterp.NotInvertibleError,
        match="dense Jacobians of the map and of its inverse",
    ) as info:
        jaxinterp.inverse_and_ildj(f, example_args=(x,))(f(x))
    assert "3000 unknown real coordinates (float32[3000])" in str(info.value)
    assert "3001 results" in str(info.value)


# Off-image results that must not come back as a finite, plausible x.
_X3 = jnp.array([0.3, -0.5, 1.2])
OFF_IMAGE = {
    # A value solved backwards off a rule's domain (log of a negative), then
    # recomputed from x solved along another path: the NaN was excused.
    "exp(2x), x": (
        lambda x: (jnp.exp(2 * x), x),
        lambda y: (y[0].at[0].set(-1.0), y[1]),
    ),
    "x, exp(exp(x))": (
        lambda x: (x, jnp.exp(jnp.exp(x))),
        lambda y: (y[0], y[1].at[0].set(-1.0)),
    ),
    "concat exp(2x), x": (
        lambda x: jnp.concatenate([jnp.exp(2 * x), x]),
        lambda y: y.at[0].set(-1.0),
    ),
    # An infinite known value agreed with any finite recomputation.
    "x, 2x with inf": (lambda x: (x, 2 * x), lambda y: (y[0], y[1].at[0].set(jnp.inf))),
    "tanh(2x), x at -1": (
        lambda x: (jnp.tanh(2 * x), x),
        lambda y: (y[0].at[0].set(-1.0), y[1]),
    ),
    # Constant parts of the result were never compared with y.
    "pad constant": (
        lambda x: jnp.pad(x, (1, 2), constant_values=3.0),
        lambda y: y.at[0].set(0.5),
    ),
    "pad interior": (
        lambda x: jax.lax.pad(x, 0.0, [(0, 0, 1)]),
        lambda y: y.at[1].set(0.5),
    ),
    "exp of a padding": (
        lambda x: jnp.exp(jnp.pad(x, (1, 1))),
        lambda y: y.at[0].set(0.5),
    ),
    "dynamic_update_slice into zeros": (
        lambda x: jax.lax.dynamic_update_slice(jnp.zeros(5), x, (1,)),
        lambda y: y.at[0].set(0.5),
    ),
    "concat with a closed-over constant": (
        lambda x: jnp.concatenate([x, jnp.array([1.0, 2.0])]),
        lambda y: y.at[-1].add(0.5),
    ),
}


@pytest.mark.parametrize("name", sorted(OFF_IMAGE))
def test_an_off_image_y_gives_nan_not_a_plausible_x(name):
    f, move = OFF_IMAGE[name]
    inv = jaxinterp.inverse_and_ildj(f, example_args=(_X3,))
    got, _ = inv(f(_X3))
    np.testing.assert_allclose(got, _X3, rtol=1e-5, atol=1e-5)
    got, ildj = inv(move(f(_X3)))
    assert jnp.all(jnp.isnan(got)), got
    assert jnp.isnan(ildj)


ELEMENTWISE_RANGES = [
    (jnp.sqrt, -1.0),
    (jax.lax.rsqrt, -1.0),
    (lambda x: x**4, -1.0),
    (lambda x: x**-4, -1.0),
    (jnp.arcsin, 2.0),
    (jnp.arccos, -0.5),
    (jnp.arctan, 2.0),
    (lambda x: jnp.arctan2(x, 1.0), 2.0),
    (lambda x: jnp.arctan2(1.0, x), -1.0),
]


@pytest.mark.parametrize("k", range(len(ELEMENTWISE_RANGES)))
def test_a_result_outside_an_elementwise_maps_image_gives_nan(k):
    f, value = ELEMENTWISE_RANGES[k]
    x = jnp.array([0.3, 0.5, 0.8])
    inv = jaxinterp.inverse(f, example_args=(x,))
    np.testing.assert_allclose(inv(f(x)), x, rtol=1e-5, atol=1e-5)
    got = inv(f(x).at[0].set(value))
    assert jnp.isnan(got[0]), got


def test_arccosh_of_a_negative_result_gives_nan():
    x = jnp.array([1.3, 2.0])
    got = jaxinterp.inverse(jnp.arccosh)(jnp.arccosh(x).at[0].set(-1.0))
    assert jnp.isnan(got[0]) and jnp.allclose(got[1], 2.0)


def test_a_scan_step_off_the_image_is_not_undone_by_an_earlier_copy():
    """The ys copy each carry: the last step's failed check made its carry
    NaN, and the step before solved that carry again from its copy in `ys`
    (a NaN on the known side is excused), so x came back finite."""

    def f(x):
        return jax.lax.scan(lambda c, _: (c * 2.0 + 1.0, c), x, None, length=3)

    c, ys = f(_X3)
    inv = jaxinterp.inverse_and_ildj(f, example_args=(_X3,))
    np.testing.assert_allclose(inv((c, ys))[0], _X3, rtol=1e-6)
    for off in ((c + 0.1, ys), (c, ys.at[1, 0].add(0.1))):
        got, ildj = inv(off)
        assert jnp.all(jnp.isnan(got)) and jnp.isnan(ildj), got


def _primitives(jaxpr):
    """Every primitive name in `jaxpr` and its sub-Jaxprs."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for sub in compat.sub_jaxprs(eqn):
            names.extend(_primitives(sub))
    return names


def test_nothing_determined_twice_means_no_checks_in_the_inverse():
    """A known operand that a rule hands back unchanged (the weights of a
    `scan` of layers, a coupling's parameters) is not a second constraint:
    the compiled inverse holds no comparison of it with itself (which once
    made it 15 times the hand-written inverse's size)."""

    def layers(x, w):
        def layer(c, wk):
            return jnp.tanh(c) * jnp.exp(wk[0]) + wk[1], None

        return jax.lax.scan(layer, x, w)[0]

    x = jnp.linspace(-0.3, 0.3, 4)
    w = 0.1 * jnp.ones((2, 5, 4))
    w = (w[0], w[1])
    inv = jaxinterp.inverse(layers, argnums=0)
    names = _primitives(jax.make_jaxpr(inv)(layers(x, w), w).jaxpr)
    assert "reduce_and" not in names and "is_finite" not in names, names
    np.testing.assert_allclose(inv(layers(x, w), w), x, rtol=1e-5, atol=1e-6)


@FEW
@given(
    x=st.lists(
        st.floats(-0.0009765625, 0.0009765625, width=32), min_size=3, max_size=3
    ).map(lambda v: jnp.asarray(v, jnp.float32))
)
def test_a_value_solved_from_a_larger_one_is_checked_at_that_ones_rounding(x):
    """`(2 x, x + 1)`: `x = y1 - 1` is off by about `eps` (not `eps |x|`), and
    the check of `2 x` allows for it; a first result off by far more than
    that still gives NaN."""

    def f(x):
        return 2 * x, x + 1

    inverse = jaxinterp.inverse(f, example_args=(x,))
    y0, y1 = f(x)
    got = inverse((y0, y1))
    np.testing.assert_allclose(got, (y1 - 1) * np.ones(3), rtol=0, atol=0)
    np.testing.assert_allclose(got, x, rtol=0, atol=2e-7)
    assert np.all(np.isnan(inverse((y0 + 1e-2, y1))))


def _lower(values):
    """A lower-triangular matrix with a diagonal away from zero."""
    t = jnp.tril(jnp.asarray(values, jnp.float32).reshape(3, 3))
    return t + jnp.diag(jnp.sign(jnp.diag(t)) + (jnp.diag(t) == 0))


@FEW
@given(
    x=st.lists(st.floats(-3, 3, width=32), min_size=9, max_size=9).map(
        lambda v: jnp.asarray(v, jnp.float32).reshape(3, 3)
    ),
    t=st.lists(st.floats(-1, 1, width=32), min_size=9, max_size=9).map(_lower),
)
def test_a_zero_solved_back_through_a_solve_is_checked_at_its_values_rounding(x, t):
    """A linear map computed twice, the second copy masked and then solved by
    a triangular matrix: the masked zeros come back from the triangular
    solve as rounding of the whole value (`1e-8`, not `0`), and the linear
    block's residual check allows that (it gave NaN on every `y`). A `y`
    off the image, a masked row moved by `1e-3`, still gives NaN."""
    mask = jnp.array([[1, 0, 1], [0, 0, 0], [1, 0, 1]], jnp.float32)

    def mixed(x):
        return jnp.fft.irfft(jnp.fft.rfft(x) * (1.5 + 0.5j), n=3)

    def f(x):
        solved = jax.lax.linalg.triangular_solve(
            t, mixed(x) * mask, left_side=False, lower=True, transpose_a=True
        )
        return jnp.cumsum(mixed(x), 0), solved

    inverse = jaxinterp.inverse(f, example_args=(x,))
    y0, y1 = f(x)
    np.testing.assert_allclose(inverse((y0, y1)), x, rtol=0, atol=2e-5)
    assert np.all(np.isnan(inverse((y0, y1.at[1, 0].add(1e-3)))))


# Two solutions of one operand read twice by a call differ by the rounding of
# the result each was solved from (`log(exp(x))` keeps `exp(x)`'s), which is
# larger than `x`'s own when `x` is small: the call recomputed forwards decides,
# so there is no false NaN.
@pytest.mark.parametrize(
    "values", [[0.001, 0.0], [0.0, 0.00195], [1e-6, 3e-4], [-2e-5, 0.0]]
)
def test_copies_through_one_call_with_a_zero_element_and_a_small_one(values):
    f, _ = NONSQUARE["one call reading x twice"]
    x = jnp.array(values, jnp.float32)
    got, ildj = jaxinterp.inverse_and_ildj(f, example_args=(x,))(f(x))
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ildj,
        _manifold_ildj(f, x, READS["one call reading x twice"]),
        rtol=1e-4,
        atol=1e-4,
    )
    # Still a check: the second result moved off the first's by 1e-3.
    y0, y1 = f(x)
    assert np.all(np.isnan(jaxinterp.inverse(f, example_args=(x,))((y0, y1 * 1.001))))
