"""The gallery in `examples/`, each checked against an independent computation.

Examples are imported from their files (they are scripts, not a package). The
long `main()` runs are left to `nox -s examples`; these tests check the
pieces on small inputs.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import flags_off
from jax import lax
from jax.extend import core as jex_core

import jaxinterp
from jaxinterp._count import count_staged

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_loaded: dict[str, object] = {}


def load(name):
    """Import `examples/<name>.py` once, as module `example_<name>`."""
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(
            f"example_{name}", EXAMPLES / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


def line_of(module, text):
    """The line number of the first source line of `module` containing `text`."""
    lines = inspect.getsource(module).splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def all_eqns(jaxpr):
    """Every equation of `jaxpr`, nested ones included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else [value]:
                if isinstance(item, jex_core.Jaxpr | jex_core.ClosedJaxpr):
                    yield from all_eqns(item)


# ---------------------------------------------------------------------------
# 1. Operation and FLOP counter.


def test_op_counter_matches_hand_counts_and_xla(capsys):
    ex = load("op_counter")
    counter = ex.main()
    assert "XLA's estimate" in capsys.readouterr().out
    (n, c, h, w), (f, _, kh, kw) = ex.ARGS[0].shape, ex.ARGS[1].shape
    oh, ow = h - kh + 1, w - kw + 1  # "VALID"
    rows, width, classes = oh, ow, ex.ARGS[3].shape[1]
    assert counter.flops["conv_general_dilated"] == 2 * n * f * oh * ow * c * kh * kw
    # The scan runs `rows` steps of (n x width) @ (width x width).
    scan_dot = rows * 2 * n * width * width
    assert counter.flops["dot_general"] == scan_dot + 2 * n * width * classes
    assert counter.eqns["tanh"] == rows and counter.eqns["scan"] == 1
    assert counter.transcendentals["tanh"] == rows * n * width
    # XLA counts one iteration of the loop a scan becomes (and 2 for its counter).
    per_step_flops = 2 * n * width * width + n * width  # dot + add
    xla = flags_off(lambda: jax.jit(ex.model).lower(*ex.ARGS).cost_analysis())
    flops, transcendentals, _ = counter.total()
    assert flops - (rows - 1) * per_step_flops + 2 == xla["flops"]
    assert transcendentals - (rows - 1) * n * width == xla["transcendentals"]
    # The fuller counter behind `jaxinterp count` agrees on "VALID" models.
    full = count_staged(jaxinterp.stage(ex.model, *ex.ARGS))
    nonzero = lambda counts: {k: v for k, v in counts.items() if v}  # noqa: E731
    assert nonzero(full.flops) == nonzero(counter.flops)
    assert nonzero(full.transcendentals) == nonzero(counter.transcendentals)
    assert full.eqns == counter.eqns


def test_op_counter_cond_and_while():
    ex = load("op_counter")

    def f(p, x):
        y = lax.cond(p, lambda x: x @ x, lambda x: jnp.exp(x), x)
        body = lambda c: (c[0] + 1, c[1] * 2.0)  # noqa: E731
        return lax.while_loop(lambda c: c[0] < 10, body, (0, y))[1]

    counter = ex.count(f, True, jax.ShapeDtypeStruct((4, 4), jnp.float32))
    assert counter.flops["dot_general"] == 2 * 4**3  # the costlier branch
    assert "exp" not in counter.eqns
    assert counter.flops["mul"] == 16  # one iteration
    assert counter.flops["lt"] == counter.flops["add"] == 1


# ---------------------------------------------------------------------------
# 2. NaN/Inf locator.


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nan_locator_finds_the_scan_step(jit):
    ex = load("nan_locator")
    x = jnp.array([1.0, -2.0, 3.0])
    weights = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [0.5, 0.0, 1.0]])
    # Independently: step 1 normalises all-zero weights, 0 / 0.
    w = np.maximum(np.asarray(weights[1]), 0.0)
    with np.errstate(invalid="ignore"):
        assert np.isnan(w / w.sum()).all()
    out, first = ex.locate_nonfinite(ex.model, x, weights, jit=jit)
    assert jnp.isnan(out) and jnp.isnan(ex.model(x, weights))
    line = line_of(ex, "return x / jnp.sum(x)")
    assert first.primitive == "div" and first.kind == "nan"
    assert first.in_shapes == ("f32[3]", "f32[]") and first.out_shapes == ("f32[3]",)
    assert f"nan_locator.py:{line}:" in first.where and "(normalize)" in first.where


def test_nan_locator_eager_top_level_and_clean_runs():
    ex = load("nan_locator")
    x = jnp.array([1.0, -2.0, 3.0])
    fine = jnp.array([[1.0, 1.0, 1.0], [0.5, 0.0, 1.0]])
    out, first = ex.locate_nonfinite(ex.model, x, fine)
    assert first is None and out == ex.model(x, fine)
    out, first = ex.locate_nonfinite(ex.model, -x, fine)
    assert (first.primitive, first.kind) == ("log", "nan")
    assert f"nan_locator.py:{line_of(ex, 'return jnp.log(total)')}:" in first.where
    _, first = ex.locate_nonfinite(lambda v: 1.0 / v, jnp.zeros(2))
    assert (first.primitive, first.kind) == ("div", "inf")


# ---------------------------------------------------------------------------
# 3. Interval arithmetic.


def normal(rng, *shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def sample_box(box, rng, n=4000):
    """`n` points drawn uniformly from `box`, and its two extreme corners."""
    xs = rng.uniform(box.lo, box.hi, (n, *box.lo.shape))
    return jnp.concatenate([jnp.asarray(xs, jnp.float32), box.lo[None], box.hi[None]])


@pytest.mark.parametrize("radius", [0.01, 0.3, 2.0])
def test_interval_bounds_are_sound(radius):
    ex = load("interval")
    rng = np.random.default_rng(0)
    for _ in range(3):
        x0 = normal(rng, 3)
        box = ex.Interval(x0 - radius, x0 + radius)
        out = jax.jit(ex.bounds, static_argnums=0)(ex.net, box)
        ys = jax.vmap(ex.net)(sample_box(box, rng))
        tol = 1e-5 * (1 + jnp.abs(ys))
        assert bool(jnp.all(ys >= out.lo - tol)) and bool(jnp.all(ys <= out.hi + tol))


def test_interval_bounds_through_a_scan():
    ex = load("interval")

    def rnn(x):
        step = lambda c, a: (jnp.tanh(c * 0.5 + a), c)  # noqa: E731
        return lax.scan(step, jnp.zeros(()), x)[0]

    x0 = jnp.array([0.3, -0.2, 0.5])
    box = ex.Interval(x0 - 0.1, x0 + 0.1)
    out = ex.bounds(rnn, box)
    samples = np.random.default_rng(5).uniform(box.lo, box.hi, (2000, 3))
    ys = flags_off(jax.vmap(rnn), jnp.asarray(samples, jnp.float32))
    assert out.lo <= ys.min() and ys.max() <= out.hi  # sound
    assert out.hi - out.lo < 4 * (ys.max() - ys.min())  # and not vacuous


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("radius", [0.05, 1.0])
def test_interval_bounds_through_scan_and_while(radius, jit):
    ex = load("interval")
    rng = np.random.default_rng(7)
    x0 = normal(rng, 3)
    box = ex.Interval(x0 - radius, x0 + radius)
    run = jax.jit(ex.bounds, static_argnums=0) if jit else ex.bounds
    out = run(ex.rnn, box)
    ys = flags_off(jax.vmap(ex.rnn), sample_box(box, rng))
    tol = 1e-5 * (1 + jnp.abs(ys))
    assert bool(jnp.all(ys >= out.lo - tol)) and bool(jnp.all(ys <= out.hi + tol))
    assert out.hi - out.lo < 4 * (ys.max() - ys.min())  # and not vacuous


def test_interval_has_no_rule_for_control_flow():
    ex = load("interval")
    registered = {p.name for p in ex.interval_rules}
    walked = {p.name for p in jaxinterp.higher_order_primitives()}
    assert "cond" not in registered and not registered & walked
    assert ex.IntervalInterpreter.higher_order == "recursive"


def test_interval_while_condition_on_an_interval_is_refused():
    ex = load("interval")

    def f(x):
        return lax.while_loop(lambda v: v < 3.0, lambda v: v + 1.0, x)

    with pytest.raises(jaxinterp.CustomValueError) as info:
        ex.bounds(f, ex.Interval(0.0, 1.0))
    message = str(info.value)
    assert message.startswith("`interval` at primitive `while`, used at ")
    assert f"test_examples.py:{inspect.getsourcelines(f)[1] + 1}" in message
    assert "the condition of `while` is a `Interval`, not a plain boolean" in message


def test_interval_rules_on_their_own():
    ex = load("interval")

    def f(x, w):
        y = (x @ w) ** 2 - jnp.exp(x).sum() / (x[0] + 4.0) + jnp.maximum(x, -0.5).max()
        return jnp.where(y > 1.0, y, -y), jnp.sum(x**3) - x[1] ** -2

    lo, hi = jnp.array([-1.0, 0.5, -0.2]), jnp.array([0.5, 1.5, 0.3])
    w = ex.Interval(jnp.full((3, 2), -0.5), jnp.full((3, 2), 1.0))
    (a, b) = jax.jit(ex.bounds, static_argnums=0)(f, ex.Interval(lo, hi), w)
    rng = np.random.default_rng(1)
    xs = sample_box(ex.Interval(lo, hi), rng, 3000)
    ws = sample_box(w, rng, 3000)
    ya, yb = jax.vmap(f)(xs, ws)
    for out, ys in ((a, ya), (b, yb)):
        assert bool(jnp.all(ys >= out.lo - 1e-5)) and bool(jnp.all(ys <= out.hi + 1e-5))


def test_interval_cond_joins_only_the_reachable_branches():
    ex = load("interval")

    def f(x):
        return lax.cond(x > 0, lambda v: v + 10.0, lambda v: v - 10.0, x)

    assert float(ex.bounds(f, ex.Interval(1.0, 2.0)).lo) == 11.0  # only branch 1
    both = ex.bounds(f, ex.Interval(-1.0, 2.0))
    assert (float(both.lo), float(both.hi)) == (-11.0, 12.0)  # the join


def test_interval_exact_for_monotone_functions():
    ex = load("interval")
    f = jax.jit(lambda x: jnp.sum(jnp.exp(x)) + jnp.tanh(x).max())
    lo, hi = jnp.array([-1.0, 0.0, 2.0]), jnp.array([0.0, 1.0, 2.5])
    out = ex.bounds(f, ex.Interval(lo, hi))
    np.testing.assert_allclose([out.lo, out.hi], [f(lo), f(hi)], rtol=1e-6)


def test_interval_missing_rule_cites_the_user_line():
    ex = load("interval")

    def f(x):
        return jnp.sin(x)  # no interval rule for sin

    with pytest.raises(jaxinterp.MissingRuleError, match="`sin`") as info:
        ex.bounds(f, ex.Interval(0.0, 1.0))
    assert f"test_examples.py:{inspect.getsourcelines(f)[1] + 1}" in str(info.value)


# ---------------------------------------------------------------------------
# 4. Mixed precision.


@pytest.fixture(scope="module")
def attention():
    ex = load("mixed_precision")
    return ex, ex.init(tokens=16, width=16)


def test_mixed_precision_accuracy_and_output_dtype(attention):
    ex, args = attention
    mp = ex.MixedPrecision()
    got = jax.jit(mp.transform(ex.attention_model))(*args)
    exact = ex.attention_model(*args)
    assert got.dtype == jnp.float32
    assert abs(got - exact) <= 2e-2 * abs(exact)
    # The interpreter's own log: keep-list primitives ran in float32, others low.
    for name, dtypes in mp.log:
        floats = {d for d in dtypes if d in ("float32", "bfloat16")}
        assert floats <= ({"float32"} if name in ex.KEEP else {"bfloat16"}), name


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_mixed_precision_dtypes_of_every_intermediate(attention, low):
    ex, args = attention
    keep = {"exp", "reduce_sum"}
    closed = jax.make_jaxpr(ex.mixed_precision(ex.attention_model, low, keep))(*args)
    names = set()
    for eqn in all_eqns(closed):
        name = eqn.primitive.name
        if name in ("convert_element_type", "scan", "jit", "pjit", "cond", "while"):
            continue  # the casts themselves, and containers
        names.add(name)
        floats = {str(v.aval.dtype) for v in eqn.outvars} & {"float32", low}
        assert floats <= ({"float32"} if name in keep else {low}), (name, floats)
    assert {"exp", "reduce_sum", "dot_general", "log", "reduce_max"} <= names
    assert closed.out_avals[0].dtype == jnp.float32


# ---------------------------------------------------------------------------
# 5. Harvest: sow / reap / plant.


def test_reap_and_plant_through_jit():
    ex = load("harvest")
    x, w = normal(np.random.default_rng(0), 2, 3), jnp.eye(3) * 0.5
    out, sown = jax.jit(ex.reap(ex.mlp))(x, w)
    np.testing.assert_allclose(sown["hidden"], jnp.tanh(x @ w), rtol=1e-6)
    np.testing.assert_allclose(out, jnp.sum(jnp.tanh(x @ w) ** 2), rtol=1e-6)
    planted = ex.plant(ex.mlp, {"hidden": jnp.full((2, 3), 2.0)})(x, w)
    assert float(planted) == 24.0
    assert float(ex.plant(ex.mlp, {"other": 1.0})(x, w)) == pytest.approx(float(out))


def test_reap_and_plant_per_scan_step():
    ex = load("harvest")
    h0, xs = jnp.array([0.1, -0.3]), normal(np.random.default_rng(1), 5, 2)
    (_, sums), sown = ex.reap(ex.rnn)(h0, xs)
    states, h = [], h0
    for x in xs:  # a Python loop as the reference
        h = jnp.tanh(h + x)
        states.append(h)
    np.testing.assert_allclose(sown["state"], jnp.stack(states), rtol=1e-6)
    planted = jnp.arange(10.0).reshape(5, 2)
    (h_end, sums), _ = ex.reap(ex.plant(ex.rnn, {"state": planted}))(h0, xs)
    np.testing.assert_allclose(sums, planted.sum(axis=1))
    np.testing.assert_allclose(h_end, planted[-1])


def test_harvest_under_vmap_and_grad():
    ex = load("harvest")
    xs, w = normal(np.random.default_rng(2), 4, 2, 3), jnp.eye(3) * 0.7
    _, sown = jax.vmap(ex.reap(ex.mlp), in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(sown["hidden"], jnp.tanh(xs @ w), rtol=1e-6)
    _, sown = ex.reap(jax.vmap(ex.mlp, in_axes=(0, None)))(xs, w)  # sow under vmap
    np.testing.assert_allclose(sown["hidden"], jnp.tanh(xs @ w), rtol=1e-6)
    plain = lambda x, w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    np.testing.assert_allclose(
        jax.grad(ex.mlp, argnums=1)(xs[0], w),
        jax.grad(plain, argnums=1)(xs[0], w),
        rtol=1e-5,
        atol=1e-6,
    )
    grad_reaped = jax.grad(lambda w: ex.reap(ex.mlp)(xs[0], w)[1]["hidden"].sum())(w)
    grad_plain = jax.grad(lambda w: jnp.tanh(xs[0] @ w).sum())(w)
    np.testing.assert_allclose(grad_reaped, grad_plain, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# 6. Primitive substitution.


@pytest.fixture(scope="module")
def rnn_model():
    ex = load("substitute")
    rng = np.random.default_rng(0)
    params = {"w": normal(rng, 4, 4) / 3, "out": normal(rng, 4, 3)}
    return ex, params, normal(rng, 3, 4)


def reference_model(params, xs, exp, dot):
    """`substitute.model` written out by hand with `exp` and `dot` swapped in."""
    h = jnp.zeros(xs.shape[1])
    sums = []
    for x in xs:
        h = jnp.tanh(dot(h, params["w"]) + x) * exp(-jnp.abs(x))
        h = jnp.where(jnp.sum(h) > 0, exp(h) - 1, h)
        sums.append(jnp.sum(h))
    z = dot(h, params["out"])
    m = jnp.max(z)
    return m + jnp.log(jnp.sum(exp(z - m))) + jnp.sum(exp(jnp.stack(sums)))


def test_substitute_exp_everywhere(rnn_model):
    ex, params, xs = rnn_model
    swapped = ex.substitute(ex.model, {lax.exp_p: ex.poly_exp})
    reference = jax.jit(reference_model, static_argnums=(2, 3))
    want = reference(params, xs, ex.poly_exp, jnp.dot)
    np.testing.assert_allclose(jax.jit(swapped)(params, xs), want, rtol=1e-5)
    assert ex.count_primitive(ex.model, "exp", params, xs) == 4
    assert ex.count_primitive(swapped, "exp", params, xs) == 0
    # The polynomial is a good exp, and the gradient differentiates it.
    z = jnp.linspace(-5.0, 5.0, 101)
    np.testing.assert_allclose(jax.jit(ex.poly_exp)(z), jnp.exp(z), rtol=2e-5)
    grad = jax.jit(jax.grad(swapped))(params, xs)
    grad_ref = jax.jit(jax.grad(reference_model), static_argnums=(2, 3))(
        params, xs, ex.poly_exp, jnp.dot
    )
    np.testing.assert_allclose(grad["w"], grad_ref["w"], rtol=1e-4, atol=1e-6)


def test_substitute_dot_general_and_count_call_sites(rnn_model):
    ex, params, xs = rnn_model

    def bf16_dot(a, b):
        out = jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                      preferred_element_type=jnp.float32)  # fmt: skip
        return out.astype(jnp.float32)

    swapped = ex.substitute(ex.model, {lax.dot_general_p: ex.bf16_dot})
    want = jax.jit(reference_model, static_argnums=(2, 3))(
        params, xs, jnp.exp, bf16_dot
    )
    np.testing.assert_allclose(swapped(params, xs), want, rtol=1e-5)
    calls = []

    def spy(*args, **params):
        calls.append(args[0].shape)
        return lax.exp_p.bind(*args, **params)

    jax.make_jaxpr(ex.substitute(ex.model, {lax.exp_p: spy}))(params, xs)
    # Traced once each: the jitted cell, the cond branch, logsumexp, the top.
    assert len(calls) == ex.count_primitive(ex.model, "exp", params, xs) == 4


# ---------------------------------------------------------------------------
# 7. Normalizing flow.


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(jaxinterp, "inverse_and_ildj"), reason="inverse not landed yet"
)
def test_normalizing_flow_trains_and_integrates_to_one():
    ex = load("normalizing_flow")
    result = ex.main(steps=300, out=None)  # `nox -s examples` draws the PNG
    assert result["after"] > result["before"] + 0.5  # the log-likelihood improves
    assert abs(result["mass"] - 1.0) < 0.02  # a density: integrates to 1
    # Independently: the ildj is minus the log-determinant of the forward
    # flow's Jacobian (by autodiff) at the recovered noise, which maps back.
    params, x = result["params"], jnp.array([0.4, -0.7])
    (z1, z2), ildj = ex.inverse_flow((x[0], x[1]), params)
    np.testing.assert_allclose(ex.flow(z1, z2, params), x, rtol=1e-4, atol=1e-5)
    jac = jax.jacfwd(lambda z: jnp.stack(ex.flow(z[0], z[1], params)))(
        jnp.stack([z1, z2])
    )
    np.testing.assert_allclose(ildj, -jnp.log(jnp.abs(jnp.linalg.det(jac))), atol=1e-4)


@pytest.mark.slow
def test_normalizing_flow_inverse_of_random_parameters():
    """The quick check of the flow (its training is `slow`): with random
    parameters, spline knot slopes away from 1 included, the inverse maps
    data points back to the noise the forward flow took, and the ildj is
    minus the log-determinant of the forward Jacobian there."""
    ex = load("normalizing_flow")
    rng = np.random.default_rng(7)
    params = ex.init(rng, layers=2, hidden=8)
    params = jax.tree_util.tree_map(
        lambda v: v + jnp.asarray(rng.normal(scale=0.5, size=v.shape), v.dtype), params
    )
    z = jnp.asarray(rng.normal(size=(2, 16)), jnp.float32)
    x1, x2 = jax.vmap(ex.flow, in_axes=(0, 0, None))(z[0], z[1], params)
    inverse = jax.jit(jax.vmap(ex.inverse_flow, in_axes=((0, 0), None)))
    (z1, z2), ildj = inverse((x1, x2), params)
    np.testing.assert_allclose(z1, z[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z2, z[1], rtol=1e-4, atol=1e-4)
    for i in (0, 5):
        jac = jax.jacfwd(lambda u: jnp.stack(ex.flow(u[0], u[1], params)))(z[:, i])
        want = -np.linalg.slogdet(np.asarray(jac, np.float64))[1]
        np.testing.assert_allclose(ildj[i], want, rtol=1e-4, atol=1e-4)


def test_normalizing_flow_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    ex = load("normalizing_flow")
    pts = jnp.asarray(np.random.default_rng(0).normal(size=(50, 2)), jnp.float32)
    ex.plot(pts, jnp.ones((8, 8)), pts, 4.0, tmp_path / "flow.png")
    assert (tmp_path / "flow.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------
# Dual numbers (more constructs in test_custom_values.py).


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_dual_numbers_model_matches_jax_jvp(jit):
    ex = load("dual_numbers")
    x, t = normal(np.random.default_rng(3), 5), normal(np.random.default_rng(4), 5)
    run = lambda x, t: ex.dual_jvp(ex.model, x, t)  # noqa: E731
    got = (jax.jit(run) if jit else run)(x, t)
    want = jax.jvp(ex.model, (x,), (t,))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


@jax.custom_jvp
def _sin_times(x):
    return jnp.sin(x) * x


_sin_times.defjvp(
    lambda p, t: (_sin_times(p[0]), (jnp.cos(p[0]) * p[0] + jnp.sin(p[0])) * t[0])
)

DUAL_PROGRAMS = {
    "scan": lambda x: (lambda c, ys: c + ys.sum())(  # the carry starts plain
        *lax.scan(lambda c, a: (c * jnp.sin(a) + a, c), 0.0, x)
    ),
    "while": lambda x: lax.while_loop(
        lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.tanh(s[1]) * x), (0, x)
    )[1],
    "cond": lambda x: lax.cond(x[0] > 0, jnp.sin, lambda y: y**2, x),
    "custom_jvp": lambda x: jax.nn.softplus(x) + _sin_times(x),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(DUAL_PROGRAMS))
def test_dual_numbers_match_jax_jvp_through(name, jit):
    ex = load("dual_numbers")
    f = DUAL_PROGRAMS[name]
    rng = np.random.default_rng(5)
    for _ in range(3):
        x, t = normal(rng, 4), normal(rng, 4)
        run = lambda x, t: ex.dual_jvp(f, x, t)  # noqa: E731
        got = (jax.jit(run) if jit else run)(x, t)
        want = flags_off(jax.jvp, f, (x,), (t,))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_dual_numbers_example_is_short():
    assert len((EXAMPLES / "dual_numbers.py").read_text().splitlines()) < 150


SCRIPTS = sorted(
    p.name
    for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.py")
    if not p.name.startswith("_")
)


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "normalizing_flow.py"])
def test_every_example_runs_as_a_script(script, capsys):
    """Each gallery script runs end to end as `python examples/<script>` would.

    (`normalizing_flow.py` trains for 1,000 steps as a script; its `main` is
    run above with fewer steps and its results checked.)
    """
    import runpy

    path = Path(__file__).resolve().parents[1] / "examples" / script
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip(), f"{script} printed nothing"
