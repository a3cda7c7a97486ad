"""`lax.cond` and `lax.switch` whose branch index depends on the unknowns.

The engine unfolds such a `cond` into its branches and a `select_n` on the
index, a piecewise map (`jaxinterp/_inverse/_unfold.py`). Each map here is
checked against a hand-written inverse and `-log|f'(x)|` from `jax.grad`,
and under `jax.jit`, `jax.vmap` and `jax.grad`; a `y` with no preimage or
several gives NaN. An index computed from a whole vector (`jnp.sum(x) >
0`) is not elementwise: the program is then solved once per branch, and
the candidate that takes its own branch kept (`_unfold._by_branch`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax import lax
from jax.experimental import io_callback

import jaxinterp
from jaxinterp import NotInvertibleError


def two_slopes(x):
    return lax.cond(x > 0, lambda v: 2.0 * v, lambda v: 0.5 * v, x)


def two_slopes_inverse(y):
    return jnp.where(y > 0, y / 2.0, y / 0.5)


def three_pieces(x):
    k = jnp.clip(jnp.floor(x), 0, 2).astype(jnp.int32)
    return lax.switch(k, [lambda v: v, lambda v: 2 * v - 1, lambda v: 3 * v - 3], x)


def three_pieces_inverse(y):
    return jnp.where(y < 1, y, jnp.where(y < 3, (y + 1) / 2, (y + 3) / 3))


def nested(x):
    def positive(v):
        return lax.cond(v > 1, lambda u: 3 * u - 2, lambda u: u, v)

    return lax.cond(x > 0, positive, lambda v: jnp.expm1(v), x)


def nested_inverse(y):
    return jnp.where(y > 1, (y + 2) / 3, jnp.where(y > 0, y, jnp.log1p(y)))


def inside_jit(x):
    # The `cond` inside a `jit` body, with a known closed-over parameter.
    a = jnp.float32(0.25)
    return jax.jit(
        lambda v: lax.cond(v > a, lambda w: jnp.exp(w - a) + a - 1, lambda w: w, v)
    )(x)


def inside_jit_inverse(y):
    a = 0.25
    return jnp.where(y > a, jnp.log(jnp.maximum(y - a + 1, 1e-30)) + a, y)


MAPS = {
    "cond, two slopes": (two_slopes, two_slopes_inverse),
    "switch, three pieces": (three_pieces, three_pieces_inverse),
    "nested conds": (nested, nested_inverse),
    "cond inside a jit": (inside_jit, inside_jit_inverse),
}

X = jnp.float32(0.3)


@functools.cache
def _compiled(name):
    f, _ = MAPS[name]
    return jax.jit(jaxinterp.inverse_and_ildj(f, example_args=(X,)))


@pytest.mark.parametrize("name", sorted(MAPS))
@given(x=st.floats(-3.0, 4.0, width=32))
def test_inverse_and_ildj_match_hand_written_and_the_derivative(name, x):
    f, f_inv = MAPS[name]
    x = jnp.float32(x)
    y = f(x)
    got, ildj = _compiled(name)(y)
    np.testing.assert_allclose(got, f_inv(y), rtol=1e-5, atol=1e-6)
    want = -jnp.log(jnp.abs(jax.grad(f)(f_inv(y))))
    np.testing.assert_allclose(ildj, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_eager_vmap_and_grad(name):
    f, f_inv = MAPS[name]
    xs = jnp.array([-2.5, -0.4, 0.3, 1.2, 2.2, 3.5], jnp.float32)
    ys = jax.vmap(f)(xs)
    inv = jaxinterp.inverse(f, example_args=(X,))
    np.testing.assert_allclose(inv(ys[2]), f_inv(ys[2]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(inv)(ys), xs, rtol=1e-5, atol=1e-6)
    grads = jax.vmap(jax.grad(inv))(ys)
    np.testing.assert_allclose(grads, 1 / jax.vmap(jax.grad(f))(xs), rtol=1e-5)


def test_explain_names_the_piecewise_method_at_the_users_line():
    report = jaxinterp.explain_inverse(two_slopes, X)
    assert report.endswith("Invertible: every unknown input is recovered."), report
    assert "= select_n" in report and "(piecewise)" in report, report


def test_a_y_off_the_image_or_with_two_preimages_is_nan():
    def gap(x):  # image: (-inf, -1] and (1, inf)
        return lax.cond(x > 0, lambda v: 1 + v, lambda v: v - 1, x)

    def fold(x):  # y > 0 has two preimages
        return lax.cond(x > 0, lambda v: 2.0 * v, lambda v: -v, x)

    inv = jaxinterp.inverse(gap, example_args=(X,))
    got = [float(inv(jnp.float32(y))) for y in (-2.0, -0.5, 0.5, 1.0, 2.0)]
    np.testing.assert_allclose(got, [-1.0, np.nan, np.nan, np.nan, 1.0])
    assert np.isnan(jaxinterp.inverse(fold, example_args=(X,))(jnp.float32(0.6)))


def test_a_cond_with_a_known_parameter_and_its_gradient():
    def scaled(x, a):
        return lax.cond(x > 0, lambda v: a * v, lambda v: v, x)

    ildj = jaxinterp.ildj(scaled, argnums=0, example_args=(X,))
    np.testing.assert_allclose(ildj(jnp.float32(0.6), 2.0), -np.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(ildj(jnp.float32(-0.6), 2.0), 0.0, atol=1e-7)
    # d ildj / d a = -1 / a on the positive branch.
    grad = jax.grad(ildj, argnums=1)(jnp.float32(0.6), jnp.float32(2.0))
    np.testing.assert_allclose(grad, -0.5, rtol=1e-6)


def test_a_cond_in_a_scan_body():
    def f(x):
        def body(c, _):
            return lax.cond(c > 0, lambda v: 1.5 * v, lambda v: 0.5 * v, c), None

        return lax.scan(body, x, None, length=3)[0]

    inv = jaxinterp.inverse(f, example_args=(X,))
    for x in (-1.0, 0.7):
        np.testing.assert_allclose(inv(f(jnp.float32(x))), x, rtol=1e-6)


def test_an_index_the_outputs_give_first_keeps_the_cond_rule():
    def f(x):
        return x, lax.cond(x > 0, lambda v: 2.0 * v, lambda v: 0.5 * v, x)

    inv = jaxinterp.inverse(f, example_args=(X,))
    np.testing.assert_allclose(inv(f(jnp.float32(-0.4))), -0.4)
    # The second output disagrees with the first: NaN.
    assert np.isnan(inv((jnp.float32(-0.4), jnp.float32(3.0))))
    report = jaxinterp.explain_inverse(f, X)
    assert "= cond " in report and "select_n" not in report, report


@pytest.mark.parametrize("ordered", [False, True], ids=["print", "ordered_print"])
def test_a_cond_whose_branches_print_is_unfolded_without_the_prints(ordered, capsys):
    def loud(v):
        jax.debug.print("positive {}", v, ordered=ordered)
        return 2.0 * v

    def f(x):
        return lax.cond(x > 0, loud, lambda v: 0.5 * v, x)

    xs = jnp.asarray([0.6, -0.4, 1.5, -2.0], jnp.float32)
    ys = jnp.stack([f(x) for x in xs])
    jax.effects_barrier()
    assert "positive" in capsys.readouterr().out  # the forward prints
    inv = jaxinterp.inverse_and_ildj(f, example_args=(X,))
    for x, y in zip(xs, ys, strict=True):
        got, ildj = inv(y)
        np.testing.assert_allclose(got, x, rtol=1e-6)
        slope = jnp.where(x > 0, 2.0, 0.5)  # (`jax.grad(f)` would print)
        np.testing.assert_allclose(ildj, -jnp.log(slope), rtol=1e-6)
    got, _ = jax.jit(jax.vmap(inv))(ys)
    np.testing.assert_allclose(got, xs, rtol=1e-6)
    jax.effects_barrier()
    # The inverse does not print (as it leaves out a print outside a `cond`).
    assert capsys.readouterr().out == ""


def test_a_printing_cond_on_a_whole_vector_is_solved_by_branch(capsys):
    def loud(v):
        jax.debug.print("positive sum {}", v)
        return 2.0 * v

    def f(x):
        return lax.cond(jnp.sum(x) > 0, loud, lambda v: 0.5 * v, x)

    inv = jaxinterp.inverse(f)
    for x in (jnp.asarray([0.5, -0.2, 0.3]), jnp.asarray([-0.5, 0.2, -0.3])):
        y = f(x)
        jax.effects_barrier()
        capsys.readouterr()
        np.testing.assert_allclose(inv(y), x, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(inv)(y), x, rtol=1e-6)
        jax.effects_barrier()
        assert capsys.readouterr().out == ""


def test_a_cond_whose_branches_have_other_effects_is_refused():
    def f(x):
        def called(v):
            io_callback(lambda u: None, None, v)
            return 2.0 * v

        return lax.cond(x > 0, called, lambda v: 0.5 * v, x)

    with pytest.raises(NotInvertibleError) as info:
        jaxinterp.inverse(f, example_args=(X,))(jnp.float32(0.6))
    message = " ".join(str(info.value).split())
    assert "the branch index of a `cond` depends on an unknown input" in message
    assert "effects other than debug prints" in message
    assert "test_inverse_cond_index.py:" in message


# -- an index computed from a whole vector: solved once per branch ----------


def scaled_by_sum(x):
    return lax.cond(jnp.sum(x) > 0, lambda v: 2.0 * v, lambda v: 0.5 * v, x)


def scaled_by_sum_inverse(y):
    return jnp.where(jnp.sum(y) > 0, y / 2.0, y / 0.5)


def switched_by_sum(x):
    k = jnp.clip(jnp.floor(jnp.sum(x)), 0, 2).astype(jnp.int32)
    return lax.switch(
        k, [lambda v: v - 10.0, lambda v: 3.0 * v, lambda v: jnp.exp(v) + 10.0], x
    )


def switched_by_sum_inverse(y):
    # Branch 0 gives sums below -20 + 1, branch 1 in [3, 6), branch 2 above 20.
    total = jnp.sum(y)
    return jnp.where(
        total < 0, y + 10.0, jnp.where(total < 10, y / 3.0, jnp.log(y - 10.0))
    )


WHOLE = {
    "scaled_by_sum": (scaled_by_sum, scaled_by_sum_inverse),
    "switched_by_sum": (switched_by_sum, switched_by_sum_inverse),
}
vectors = st.lists(
    st.floats(-3.0, 3.0, width=32).filter(lambda v: abs(v) > 1e-3),
    min_size=2,
    max_size=2,
)


@pytest.mark.parametrize("name", sorted(WHOLE))
@given(x=vectors)
def test_an_index_of_a_whole_vector_is_solved_by_branch(name, x):
    f, f_inv = WHOLE[name]
    x = jnp.asarray(x, jnp.float32)
    # (Away from the switching sums: there, rounding of the sum decides.)
    total = float(jnp.sum(x))
    if min(abs(total - c) for c in (0.0, 1.0, 2.0)) < 1e-3:
        return
    y = f(x)
    got, ildj = jaxinterp.inverse_and_ildj(f)(y)
    np.testing.assert_allclose(got, f_inv(y), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-6)
    _, logdet = np.linalg.slogdet(np.asarray(jax.jacfwd(f)(x), np.float64))
    np.testing.assert_allclose(ildj, -logdet, rtol=1e-5, atol=1e-5)


def test_by_branch_under_jit_vmap_and_grad():
    f, f_inv = WHOLE["switched_by_sum"]
    xs = jnp.array([[-0.5, 0.25], [0.5, 0.75], [1.5, 1.25]], jnp.float32)
    ys = jax.vmap(f)(xs)
    inv = jaxinterp.inverse(f)
    np.testing.assert_allclose(jax.jit(jax.vmap(inv))(ys), xs, rtol=1e-5)
    for y in ys:
        np.testing.assert_allclose(
            jax.grad(lambda v: jnp.sum(inv(v) ** 2))(y),
            jax.grad(lambda v: jnp.sum(f_inv(v) ** 2))(y),
            rtol=1e-5,
        )


def test_by_branch_nan_off_the_image_or_with_two_preimages():
    def shifted(x):  # sums in (-2, 0] are no branch's
        return lax.cond(jnp.sum(x) > 0, lambda v: 2.0 * v, lambda v: v - 1.0, x)

    def folded(x):  # x and -x map alike where sum(x) > 0
        return lax.cond(jnp.sum(x) > 0, lambda v: v, lambda v: -v, x)

    off = jnp.array([0.5, -0.75], jnp.float32)
    assert np.isnan(jaxinterp.inverse(shifted)(off)).all()
    x, ildj = jaxinterp.inverse_and_ildj(folded)(jnp.array([0.5, 0.25], jnp.float32))
    assert np.isnan(x).all() and np.isnan(ildj)

    # A `y` whose preimage is the same in both branches is answered.
    def same(x):
        return lax.cond(jnp.sum(x) > 0, lambda v: 2.0 * v, lambda v: v + v, x)

    y = jnp.array([0.5, -1.5], jnp.float32)
    np.testing.assert_allclose(jaxinterp.inverse(same)(y), y / 2.0)


def test_by_branch_nan_stays_with_the_elements_the_branches_disagree_on():
    # Both branches give a preimage, differing only in `x1[0]`: `x0`, which
    # the `cond` does not read, and `x1[1]`, which both give alike, are
    # recovered; the ildj, of a map not injective at `y`, is NaN.
    flip = jnp.array([-2.0, 2.0], jnp.float32)

    def f(x0, x1):
        out = lax.cond(x1[0] > 0, lambda v: 2.0 * v, lambda v: v * flip, x1)
        return x0 * 3.0, out

    x0, x1 = jnp.float32(0.5), jnp.array([1.0, 2.0], jnp.float32)
    inv = jaxinterp.inverse_and_ildj(f, argnums=(0, 1), example_args=(x0, x1))
    (got0, got1), ildj = inv(f(x0, x1))
    np.testing.assert_allclose(got0, x0)
    assert np.isnan(got1[0]) and np.isnan(ildj)
    np.testing.assert_allclose(got1[1], x1[1])


def test_explain_names_the_by_branch_method():
    report = jaxinterp.explain_inverse(scaled_by_sum, jnp.ones(2, jnp.float32))
    assert "= cond " in report and "(by branch)" in report
    assert report.splitlines()[-1].startswith("Invertible")


def test_a_cond_after_an_implicit_broadcast_is_unfolded():
    # (`x * scale` with `scale` of shape (1,) is a broadcast written out
    # before the engine runs: the `cond`'s index is read from that program.)
    scale = jnp.array([2.0], jnp.float32)

    def f(x):
        z = x * scale
        return lax.cond(z[0] > 0, lambda v: 2.0 * v, lambda v: v - 1.0, z)

    for x in (jnp.array([0.5, 0.25]), jnp.array([-0.5, 0.25])):
        np.testing.assert_allclose(jaxinterp.inverse(f)(f(x)), x, rtol=1e-6)


def test_a_branch_that_is_not_invertible_is_refused_at_the_users_line():
    def f(x):
        return lax.cond(jnp.sum(x) > 0, lambda v: 2.0 * v, jnp.floor, x)

    line = f.__code__.co_firstlineno + 1
    with pytest.raises(NotInvertibleError) as info:
        jaxinterp.inverse(f, example_args=(jnp.ones(3),))(jnp.ones(3))
    message = str(info.value)
    assert f"test_inverse_cond_index.py:{line}" in message
    assert "solved once per branch: its branch 0 alone is refused" in message
    assert "Blocked at `floor`" in message


def test_a_switch_of_more_branches_than_are_tried_says_so():
    def f(x):
        k = jnp.clip(jnp.floor(jnp.sum(x)), 0, 9).astype(jnp.int32)
        branches = [lambda v, i=i: v * (i + 1.0) + 10.0 * i for i in range(10)]
        return lax.switch(k, branches, x)

    with pytest.raises(NotInvertibleError) as info:
        jaxinterp.inverse(f, example_args=(jnp.ones(2),))(jnp.ones(2))
    message = " ".join(str(info.value).split())
    line = f.__code__.co_firstlineno + 3
    assert f"test_inverse_cond_index.py:{line}" in message
    assert "has 10 branches: at most 8 are tried" in message
