"""Differential fuzzing of `inverse` (bounded): random programs are inverted
correctly or refused, never answered wrongly, and never crash.

The generator and classifier live in `inverse_fuzz.py`; a long run is
`python tests/fuzz_inverse_main.py --programs 10000 --seed 0`. The random
programs here (one Hypothesis-drawn seed each, for variety; a failure is
shrunk by `inverse_fuzz.shrink`) may use every op. Should a bug be found that
cannot be fixed at once, give it a strict `xfail` regression test below with
its minimal program and list its ops in `KNOWN_BUGGY_OPS` until it is fixed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import construct_name
from hypothesis import given, settings
from inverse_fuzz import (
    check_inverse,
    classify,
    describe,
    op_primitives,
    programs,
    rule_primitives,
    shrink,
)
from jax import lax

import jaxinterp


def _refusal(f, *xs) -> str:
    """The whole message of `inverse_and_ildj`'s refusal for `f` at `xs`
    (`Outcome.detail` is cut to one line of bounded length, and the source
    paths it names differ in length between checkouts)."""
    with pytest.raises(jaxinterp.NotInvertibleError) as info:
        inv = jaxinterp.inverse_and_ildj(
            f, argnums=tuple(range(len(xs))), example_args=xs
        )
        inv(f(*xs))
    return str(info.value)


# Ops that trigger open bugs (see `inverse_fuzz.op_names()`): none today.
KNOWN_BUGGY_OPS: tuple[str, ...] = ()

# Primitives with an inverse rule that the generator does not stage: public
# JAX code does not emit them as such on every supported release.
NOT_GENERATED = {
    "call": "`core.call_p` is not reachable from public JAX APIs",
    "closed_call": "`jax.named_call` and friends inline their body",
    "eval_jaxpr": "JAX >= 0.12's merged `call`/`closed_call`, as above",
    "call_hi_primitive": "staged only under JAX's opt-in hijax flags; "
    "inverted in test_inverse_hijax.py",
    "global_array_to_host_local_array": "staged by a multi-process `pmap`: "
    "inverted in test_multiprocess.py",
    "host_local_array_to_global_array": "staged by a multi-process `pmap`: "
    "inverted in test_multiprocess.py",
    "xla_pmap": "`jax.pmap` before JAX 0.10 needs several devices: inverted in "
    "test_multidevice.py and test_multiprocess.py",
    "shard_map": "needs several devices: inverted in test_multidevice.py (8 "
    "simulated CPU devices, in a subprocess)",
    "cholesky": "needs a symmetric positive definite operand, and `jnp.linalg."
    "cholesky` reads only its symmetric part (not injective on the matrices a "
    "random program makes): inverted in test_inverse_linear.py, by hypothesis "
    "over SPD matrices",
}


# Ten programs in the `ci` profile (about 40 s on one core): the suite's
# share of the fuzzer; the long runs are `fuzz_inverse_main.py` and
# `nox -s hypothesis_dev`.
@pytest.mark.slow
@settings(max_examples=min(500, 10 * settings.default.max_examples // 15))
@given(prog=programs(max_stmts=8, exclude=KNOWN_BUGGY_OPS, injective=True, seeded=True))
def test_random_programs_are_inverted_correctly_or_refused(prog):
    outcome = classify(prog)
    if outcome.kind not in ("correct", "refused"):
        small, small_outcome = shrink(prog, outcome, budget=60)
        raise AssertionError(
            f"{outcome}\n\nShrunk reproducer:\n{describe(small, small_outcome)}"
        )


def _wrapper_primitives() -> set[str]:
    """The primitives the generator's wrappers stage on this JAX release."""

    def body(a):
        return jnp.exp(a)

    jvp = jax.custom_jvp(body)
    jvp.defjvp(lambda p, t: jax.jvp(body, p, t))
    vjp = jax.custom_vjp(body)
    vjp.defvjp(lambda a: (body(a), a), lambda r, ct: jax.vjp(body, r)[1](ct))

    def f(x):
        x = jax.jit(body)(x)
        x = jax.checkpoint(body)(x)
        x = jvp(x) + vjp(x)
        x = lax.cond(True, body, body, x)
        x = lax.scan(lambda c, _: (body(c), None), x, None, length=2)[0]
        return lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1]), (0, x))

    # By construct: under JAX's hijax flags a `custom_vjp` stages as a
    # `call_hi_primitive` standing for `custom_vjp_call`, whose rule it uses.
    return {construct_name(e) for e in jaxinterp.iter_eqns(jax.make_jaxpr(f)(1.0))}


def test_every_primitive_with_an_inverse_rule_is_generated():
    covered = {p for prims in op_primitives().values() for p in prims}
    covered |= _wrapper_primitives()
    missing = sorted(set(rule_primitives()) - covered - set(NOT_GENERATED))
    assert not missing, f"no generator op stages {missing}: add one to inverse_fuzz"


# ---------------------------------------------------------------------------
# The classifier itself: it must notice wrong answers (else the fuzz test
# above proves nothing).


def _custom(fn, inverse_fn, ildj_fn=None):
    wrapped = jaxinterp.custom_inverse(fn)
    wrapped.def_inverse(inverse_fn)
    if ildj_fn is not None:
        wrapped.def_ildj(ildj_fn)
    return wrapped


X = jnp.array([-1.2, 0.7, -0.4])


def test_classifier_accepts_a_correct_inverse_and_counts_refusals():
    assert check_inverse(lambda x: jnp.exp(x) * 2.0, (X,), (0,)).kind == "correct"
    assert check_inverse(jnp.floor, (X,), (0,)).kind == "refused"


def test_classifier_flags_an_inverse_that_does_not_round_trip():
    f = _custom(lambda x: jnp.exp(x), lambda y: y)
    outcome = check_inverse(f, (X,), (0,), variants=False)
    assert (outcome.kind, outcome.check) == ("wrong", "roundtrip")


def test_classifier_flags_an_element_no_output_depends_on():
    mask = jnp.array([True, False, True])
    f = _custom(lambda x: jnp.where(mask, x, 0.0), lambda y: y)
    outcome = check_inverse(f, (X,), (0,), variants=False)
    assert (outcome.kind, outcome.check) == ("wrong", "influence")


def test_classifier_flags_a_wrong_ildj_and_nan():
    f = _custom(lambda x: 2.0 * x, lambda y: y / 2.0, lambda y: 0.0 * y.sum())
    outcome = check_inverse(f, (X,), (0,), variants=False)
    assert (outcome.kind, outcome.check) == ("wrong", "ildj")
    g = _custom(lambda x: 2.0 * x, lambda y: jnp.log(y - 10.0))
    outcome = check_inverse(g, (X,), (0,), variants=False)
    assert (outcome.kind, outcome.check) == ("wrong", "nan")


# ---------------------------------------------------------------------------
# Open bugs the fuzzer found, one minimal program each. Each asserts what a
# fixed `inverse` does: answer correctly or refuse.

P = jnp.float32(0.3)


def _ok(f, args, argnums, **kw):
    outcome = check_inverse(f, args, argnums, **kw)
    assert outcome.kind in ("correct", "refused"), str(outcome)


def test_where_with_a_known_runtime_predicate_is_nan_and_strict_raises():
    # NaN exactly where the runtime predicate drops x; strict mode raises.
    outcome = check_inverse(
        lambda x, p: jnp.where(p > 0.5, x, jnp.exp(p)), (X, P), (0,)
    )
    assert (outcome.kind, outcome.check) == ("refused", "strict"), str(outcome)


@pytest.mark.slow
def test_where_inside_cond_refuses_dropped_elements():
    mask = jnp.array([True, False, True])

    def f(x):
        return lax.cond(True, lambda a: jnp.where(mask, a, 1.0), lambda a: a, x)

    _ok(f, (X,), (0,))


@pytest.mark.slow
def test_take_inside_cond_refuses_missing_indices():
    def f(x):
        idx = jnp.array([2, 1, 2])
        return lax.switch(0, [lambda a: jnp.take(a, idx, axis=0), lambda a: a], x)

    _ok(f, (X,), (0,))


def test_take_of_integers_with_runtime_indices_refuses_missing_indices():
    def f(x, p):
        return jnp.take(x, jnp.array([1, 1, 2]) * jnp.int32(p < 100.0), axis=0)

    _ok(f, (jnp.array([4, -7, 9]), P), (0,))


def test_integer_mul_is_inverted_or_refused():
    _ok(lambda x: x * 3, (jnp.array([1, -4, 7]),), (0,))


def test_a_principal_branch_does_not_override_an_exact_solution():
    # The copy pins x exactly; x**2's root is only a principal branch.
    f = lambda x: (jnp.copy(x), x**2)  # noqa: E731
    outcome = check_inverse(f, (X,), (0,))
    assert outcome.kind == "correct", str(outcome)


def test_outputs_not_used_to_solve_are_consistent():
    # ceil(x) may contradict the root x**2's rule picks: refused, not answered.
    outcome = check_inverse(lambda x: (x**2, jnp.ceil(x)), (X,), (0,))
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")


def test_composed_principal_branches_do_not_return_nan():
    # cosh's branch gives 1 - x**2 >= 0, which square's root cannot undo
    # where x**2 > 1: refused, not NaN.
    x = jnp.array([1.5, 0.5, -1.3])
    outcome = check_inverse(
        lambda x: jnp.cosh(1.0 - jnp.square(x)), (x,), (0,), injective=False
    )
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")


def test_a_principal_branch_meets_pieces_of_a_later_value():
    # Found by `fuzz_inverse_main.py --seed 11` (program 817): the slice pins
    # row 1 of cbrt(x0) exactly, the cosh branch gives all of x0 up to signs;
    # computing cbrt(x0) forwards from the branch would ignore that row.
    def f(x0):
        v0 = jnp.cbrt(x0)
        v1 = jnp.concatenate([jnp.full((3, 1), 2, jnp.float32), x0], axis=1)
        return jnp.cosh(v1), v0[1:2]

    x0 = jnp.array([[1.24, 1.06, 0.62], [-1.5, 1.49, -0.72], [0.47, -0.34, -1.32]])
    outcome = check_inverse(f, (x0,), (0,))
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")
    assert "through `cbrt`" in _refusal(f, x0)


@pytest.mark.slow
def test_a_narrowing_conversion_is_a_rounding_not_an_exact_inverse():
    # Found by `fuzz_inverse_main.py --seed 23` (program 5113): the bfloat16
    # round trip was inverted as if exact, and won over the exact cube root.
    x0 = jnp.array([0.7, -1.41, 0.37])

    def f(x0):
        return x0**3, x0.astype(jnp.bfloat16).astype(jnp.float32)

    assert check_inverse(f, (x0,), (0,)).kind == "correct"
    # Alone, the rounded value is a valid preimage (not x itself) ...
    g = lambda x: jnp.exp(x).astype(jnp.bfloat16)  # noqa: E731
    assert check_inverse(g, (x0,), (0,), injective=False).kind == "correct"
    # ... but it is refused where another output also constrains it.
    h = lambda x: (x.astype(jnp.bfloat16), jnp.ceil(x))  # noqa: E731
    outcome = check_inverse(h, (x0,), (0,), injective=False)
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")
    assert "rounds its operand to a narrower floating type" in _refusal(h, x0)


@pytest.mark.slow
def test_equal_infinite_ildjs_agree_between_variants():
    # Found by `fuzz_inverse_main.py --seed 31` (program 84): a non-square map
    # whose ildj is inf both eagerly and under jit was flagged as a mismatch.
    def f(x1, v3):
        v4 = v3 * x1[jnp.array([0, 1])]
        return x1, jnp.concatenate([v4, v3], axis=2)

    x1 = jnp.array([[[0.66, 0.5]], [[0.83, -1.71]]])
    v3 = jnp.array([[[1.0, 0.0]], [[1.0, -2.0]]])
    assert check_inverse(f, (x1, v3), (0, 1)).kind == "correct"


def test_a_principal_branch_used_as_a_known_operand_meets_a_second_constraint():
    # Found by `fuzz_inverse_main.py --seed 31` (program 2215): the branch of
    # x**2 inside a custom_jvp gave all of x0; the update's result, which
    # also holds column 0 of x0 exactly, was then ignored.
    def f(x0):
        v0 = lax.dynamic_update_slice(x0, jnp.full((3, 2), 3.0), (0, 1))
        g = jax.custom_jvp(lambda a: a**2)
        g.defjvp(lambda p, t: (g(p[0]), 2 * p[0] * t[0]))
        return g(x0), v0

    x0 = jnp.array([[0.9, 1.04, 1.69], [-1.03, 0.61, 1.02], [-0.32, -1.04, -1.8]])
    outcome = check_inverse(f, (x0,), (0,))
    assert (outcome.kind, outcome.check) == ("refused", "NotInvertibleError")
    assert "through `dynamic_update_slice`" in _refusal(f, x0)


def test_classifier_accepts_a_clamp_at_its_bound():
    # `maximum` at a tie has slope 1/2 in JAX; the inverse there is the
    # identity's (ildj 0): a convention at a kink, not a wrong answer.
    bound = jnp.array([-0.32, 0.73, -0.51])

    def f(x):
        return (jnp.maximum(x, bound),)

    x = jnp.array([-0.55, -0.72, 1.65])
    assert check_inverse(f, (x,), (0,), injective=False).kind == "correct"
    # Not injective, so the classifier must know: the preimage is the bound.
    assert check_inverse(f, (x,), (0,)).check == "preimage"
