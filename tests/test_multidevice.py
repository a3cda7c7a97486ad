"""`shard_map`, `pmap` and sharded `jit` on 8 simulated CPU devices.

The device count must be set before JAX is imported, so the checks run in one
subprocess (started once per session) that reports each result as JSON.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import once_per_run, run_python
from multidevice_matrix import CHECK_NAMES

# Every test here checks the results of one run of a fresh process (about a
# minute): the whole file is `slow`, run by `--full` and `nox -s multidevice`.
pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, TESTS_DIR)
from helpers import (
    SinToCos, abs_no_formula, assert_tree_equal, primitive_names, top_level_primitives,
)
import jaxinterp
from jaxinterp import Interpreter, evaluate, stage

results = {"devices": jax.device_count()}


def check(name):
    def decorate(fn):
        try:
            fn()
            results[name] = "ok"
        except Exception as err:  # reported to the test
            results[name] = f"{type(err).__name__}: {err}"[:2000]
        return fn
    return decorate


mesh = jax.sharding.Mesh(np.array(jax.devices()), ("i",))
x = jnp.arange(16.0) / 4.0


def make(op):
    def body(block):
        return op(block) * 2.0 + lax.psum(block.sum(), "i")
    return jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))


sm, sm_cos = make(jnp.sin), make(jnp.cos)
shard_map_p = stage(sm, x).jaxpr.eqns[0].primitive


@check("shard_map_bitwise")
def _():
    got = evaluate(sm)(x)
    assert_tree_equal(got, sm(x))
    assert got.sharding == sm(x).sharding, (got.sharding, sm(x).sharding)


@check("shard_map_rebuilt")
def _():
    closed = jax.make_jaxpr(evaluate(sm))(x)
    assert top_level_primitives(closed) == [shard_map_p], closed


@check("shard_map_reached")
def _():
    transformed = SinToCos().transform(sm)
    np.testing.assert_allclose(transformed(x), sm_cos(x), rtol=1e-6)
    names = primitive_names(jax.make_jaxpr(transformed)(x))
    assert "sin" not in names and "cos" in names, names


@check("shard_map_opaque")
def _():
    transformed = SinToCos(higher_order="opaque").transform(sm)
    assert_tree_equal(transformed(x), sm(x))


@check("shard_map_under_transformations")
def _():
    loss = lambda f: (lambda v: jnp.sum(f(v) ** 2))
    np.testing.assert_allclose(jax.jit(evaluate(sm))(x), jax.jit(sm)(x), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(loss(evaluate(sm)))(x), jax.grad(loss(sm))(x), rtol=1e-5
    )
    np.testing.assert_allclose(
        evaluate(jax.grad(loss(sm)))(x), jax.grad(loss(sm))(x), rtol=1e-5
    )


@check("scan_in_shard_map_in_jit")
def _():
    def body(block):
        carry, ys = lax.scan(lambda c, v: (c + jnp.sin(v), c), block[0] * 0.0, block)
        return ys + lax.pmax(carry, "i")
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    assert_tree_equal(evaluate(f)(x), f(x))
    names = primitive_names(jax.make_jaxpr(SinToCos().transform(f))(x))
    assert "sin" not in names and {"scan", "cos"} <= names, names


@check("jit_shardings_kept")
def _():
    row = NamedSharding(mesh, P("i"))
    replicated = NamedSharding(mesh, P())
    g = jax.jit(lambda v: jnp.sin(v) * 2.0, in_shardings=replicated, out_shardings=row)
    got, want = evaluate(g)(x), g(x)
    assert_tree_equal(got, want)
    assert got.sharding == want.sharding == row, (got.sharding, want.sharding)
    got = evaluate(lambda v: g(v) + 1.0)(x)
    assert got.sharding == (want + 1.0).sharding


y = jnp.arange(8.0) / 2.0
pm = jax.pmap(lambda v: jnp.sin(v) + lax.psum(v, "j"), axis_name="j")
pm_cos = jax.pmap(lambda v: jnp.cos(v) + lax.psum(v, "j"), axis_name="j")
pm_exp = jax.pmap(lambda v: jnp.exp(v) * 2.0 - 1.0, axis_name="j")


@check("pmap_bitwise")
def _():
    assert_tree_equal(evaluate(pm)(y), pm(y))
    assert_tree_equal(SinToCos(higher_order="opaque").transform(pm)(y), pm(y))
    np.testing.assert_allclose(jax.jit(evaluate(pm))(y), pm(y), rtol=1e-6)


# The walker reaches inside `pmap`: a `jit` of a `shard_map` (JAX >= 0.10) or
# an `xla_pmap` equation (before), rebuilt with the same params.
pmap_p = jaxinterp._jax_compat.pmap_p
prims = top_level_primitives(stage(pm, y).jaxpr)
results["pmap_is_primitive"] = pmap_p is not None and pmap_p in prims


@check("pmap_reached")
def _():
    transformed = SinToCos().transform(pm)
    np.testing.assert_allclose(transformed(y), pm_cos(y), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(transformed)(y), pm_cos(y), rtol=1e-6)
    got, want = jax.make_jaxpr(transformed)(y), jax.make_jaxpr(pm)(y)
    names = primitive_names(got)
    assert "sin" not in names and "cos" in names, names
    assert top_level_primitives(got) == top_level_primitives(want)
    if results["pmap_is_primitive"]:
        read = jaxinterp._jax_compat.pmap_params
        (g,), (w,) = got.jaxpr.eqns, want.jaxpr.eqns
        assert read(g)[1:] == read(w)[1:], (g, w)


# --------------------------------------------------------------------------
# Explicit and Auto meshes (issue 13): shardings in types, shard_map bodies,
# inverses through sharded constructs.

from jax.sharding import AxisType

set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
explicit_2d = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
auto_2d = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
explicit_1d = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
auto_1d = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
data = jnp.arange(32.0).reshape(8, 4) / 8.0
PLACEMENTS = [
    (explicit_2d, P("a", "b")),
    (explicit_2d, P("a")),
    (auto_2d, P("a", "b")),
    (explicit_1d, P("d")),
    (auto_1d, P("d")),
]
SHARDED_FNS = {
    "zeros_like": jnp.zeros_like,
    "sin": lambda v: jnp.sin(v) * 2.0,
    "sum0": lambda v: jnp.sum(v, axis=0),
    "transpose": lambda v: v.T + 1.0,
    "softplus": jax.nn.softplus,
}


def explicit(mesh):
    return all(t == AxisType.Explicit for t in mesh.axis_types)


def placed(mesh, spec, value=data):
    return jax.device_put(value, NamedSharding(mesh, spec))


def same_sharding(got, want, what):
    ok = got.sharding == want.sharding or got.sharding.is_equivalent_to(
        want.sharding, got.ndim
    )
    assert ok, f"{what}: {got.sharding} != {want.sharding}"


@check("stage_keeps_explicit_sharding")
def _():
    for mesh, spec in PLACEMENTS:
        with set_mesh(mesh):
            v = placed(mesh, spec)
            sds = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
            for name, f in SHARDED_FNS.items():
                want = jax.make_jaxpr(f)(v)
                for arg in (v, sds):
                    got = stage(f, arg).closed_jaxpr
                    what = (name, spec, got)
                    assert list(got.in_avals) == list(want.in_avals), what
                    assert list(got.out_avals) == list(want.out_avals), what
    # The cache keys on the sharding: the same function, shape and dtype
    # placed two ways stages twice, each as `jax.make_jaxpr` does.
    f = SHARDED_FNS["sin"]
    with set_mesh(explicit_2d):
        for spec in (P("a", "b"), P("b", "a"), P()):
            v = placed(explicit_2d, spec)
            got = stage(f, v).closed_jaxpr.in_avals
            assert list(got) == list(jax.make_jaxpr(f)(v).in_avals), (spec, got)


@check("evaluate_keeps_shardings")
def _():
    for mesh, spec in PLACEMENTS:
        with set_mesh(mesh):
            v = placed(mesh, spec)
            for name, f in SHARDED_FNS.items():
                for how, wrap in (("eager", lambda g: g), ("jit", jax.jit)):
                    got, want = wrap(evaluate(f))(v), wrap(f)(v)
                    what = f"{name} {how} on {spec} {mesh.axis_types}"
                    if name == "zeros_like" and not explicit(mesh):
                        # Eager `jnp.zeros_like` places its result like its
                        # argument by hand; on an Auto mesh the Jaxpr has no
                        # trace of that (the type carries no sharding), and
                        # `evaluate` gives what the Jaxpr does under `jax.jit`.
                        want = jax.jit(f)(v)
                    assert_tree_equal(got, want, what)
                    same_sharding(got, want, what)


SHARD_BODIES = {
    "psum": lambda b: b * 2.0 + lax.psum(b, "d"),
    "all_gather": lambda b: b + lax.all_gather(b, "d", tiled=True)[: b.shape[0]],
    "ppermute": lambda b: lax.ppermute(b, "d", [(i, (i + 1) % 8) for i in range(8)]),
    "axis_index": lambda b: b + lax.axis_index("d").astype(b.dtype),
    "pmax_relu": lambda b: jax.nn.relu(b - 1.0) + lax.pmax(b, "d"),
}
line = jnp.arange(16.0) / 4.0 - 1.0


@check("shard_map_explicit_mesh")
def _():
    with set_mesh(explicit_1d):
        v = placed(explicit_1d, P("d"), line)
        for name, body in SHARD_BODIES.items():
            sm_e = jax.shard_map(body, in_specs=P("d"), out_specs=P("d"))
            got, want = evaluate(sm_e)(v), sm_e(v)
            assert_tree_equal(got, want, name)
            same_sharding(got, want, name)
            got = jax.jit(evaluate(sm_e))(v)
            assert_tree_equal(got, want, name)
            same_sharding(got, want, name)


@check("shard_map_rebuilt_same_params")
def _():
    compat = jaxinterp._jax_compat
    for check_vma in (True, False):
        for mesh, spec in ((auto_1d, P("d")), (auto_2d, P(("a", "b")))):
            axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
            body = lambda b: jnp.sin(b) + lax.psum(b, axes)
            f = jax.shard_map(
                body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=check_vma
            )
            want = compat.shard_map_params(jax.make_jaxpr(f)(line).jaxpr.eqns[0])
            eqns = jax.make_jaxpr(evaluate(f))(line).jaxpr.eqns
            assert [e.primitive for e in eqns] == [shard_map_p], eqns
            got = compat.shard_map_params(eqns[0])
            for field in ("mesh", "in_specs", "out_specs", "check", "axis_names"):
                assert getattr(got, field) == getattr(want, field), (
                    field, getattr(got, field), getattr(want, field))
            assert_tree_equal(evaluate(f)(line), f(line))


@check("collectives_pass_through")
def _():
    for check_vma in (True, False):
        for name, body in SHARD_BODIES.items():
            f = jax.shard_map(
                body, mesh=auto_1d, in_specs=P("d"), out_specs=P("d"),
                check_vma=check_vma,
            )
            assert_tree_equal(evaluate(f)(line), f(line), f"{name} {check_vma}")
            assert_tree_equal(jax.jit(evaluate(f))(line), jax.jit(f)(line), name)
            want_prims = primitive_names(jax.make_jaxpr(f)(line))
            got_prims = primitive_names(jax.make_jaxpr(evaluate(f))(line))
            assert got_prims == want_prims, (name, got_prims, want_prims)


@check("interpret_inside_shard_map_body")
def _():
    for name, body in SHARD_BODIES.items():
        for interp in (evaluate, SinToCos(higher_order="opaque").transform):
            f = jax.shard_map(body, mesh=auto_1d, in_specs=P("d"), out_specs=P("d"))
            g = jax.shard_map(
                interp(body), mesh=auto_1d, in_specs=P("d"), out_specs=P("d")
            )
            assert_tree_equal(g(line), f(line), name)
            assert_tree_equal(jax.jit(g)(line), jax.jit(f)(line), name)

    # Staged inside a body, inputs keep their varying manual axes.
    seen = {}

    def body(b):
        seen["stage"] = list(stage(SHARD_BODIES["psum"], b).closed_jaxpr.in_avals)
        seen["jax"] = list(jax.make_jaxpr(SHARD_BODIES["psum"])(b).in_avals)
        return b

    jax.shard_map(body, mesh=auto_1d, in_specs=P("d"), out_specs=P("d"))(line)
    assert seen["stage"] == seen["jax"], seen


# The forward log|det J| of `f` at `v`, from its dense Jacobian.
def log_abs_det(f, v):
    jac = jax.jacfwd(f)(v).reshape(v.size, v.size)
    return jnp.linalg.slogdet(jac)[1]


@check("inverse_jit_shardings")
def _():
    for mesh, spec in PLACEMENTS:
        with set_mesh(mesh):
            x_in = placed(mesh, spec)
            for out_spec in (P("a") if "a" in mesh.axis_names else P(), P()):
                g = jax.jit(
                    lambda v: jnp.exp(v) * 2.0,
                    in_shardings=NamedSharding(mesh, spec),
                    out_shardings=NamedSharding(mesh, out_spec),
                )
                y_out = g(x_in)
                for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                    got = wrap(jaxinterp.inverse(g))(y_out)
                    what = f"{spec} -> {out_spec} {how} {mesh.axis_types}"
                    np.testing.assert_allclose(got, x_in, rtol=1e-5, err_msg=what)
                    same_sharding(got, x_in, what)


@check("inverse_shard_map")
def _():
    cases = [
        (auto_1d, P("d"), line),
        (auto_2d, P("a"), data),  # replicated over `b`: counted once
        (auto_2d, P("a", "b"), data),
        (auto_1d, P(), line),  # replicated everywhere
    ]
    for mesh, spec, v in cases:
        for check_vma in (True, False):
            f = jax.shard_map(
                lambda b: jnp.exp(b) * 3.0 - 1.0, mesh=mesh, in_specs=spec,
                out_specs=spec, check_vma=check_vma,
            )
            what = f"{spec} check_vma={check_vma}"
            y_v = f(v)
            for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                got, ildj = wrap(jaxinterp.inverse_and_ildj(f))(y_v)
                np.testing.assert_allclose(got, v, rtol=1e-5, atol=1e-6, err_msg=what)
                want = -log_abs_det(f, v)
                np.testing.assert_allclose(ildj, want, rtol=1e-5, err_msg=what)
                same_sharding(got, y_v, what)
            # The inverse is a shard_map again.
            names = primitive_names(jax.make_jaxpr(jaxinterp.inverse(f))(y_v))
            assert "shard_map" in names, names
    # A known operand goes in with its own spec.
    f = jax.shard_map(
        lambda b, s: b * s + lax.axis_index("d").astype(b.dtype),
        mesh=auto_1d, in_specs=(P("d"), P()), out_specs=P("d"),
    )
    scale = jnp.float32(1.5)
    got, ildj = jaxinterp.inverse_and_ildj(f, argnums=0)(f(line, scale), scale)
    np.testing.assert_allclose(got, line, rtol=1e-6)
    np.testing.assert_allclose(
        ildj, -log_abs_det(lambda v: f(v, scale), line), rtol=1e-5
    )


@check("inverse_shard_map_mixed_axes")
def _():
    f = jax.shard_map(
        lambda u, w: (jnp.exp(u), jnp.exp(w)), mesh=auto_2d,
        in_specs=(P("a"), P("b")), out_specs=(P("a"), P("b")),
    )
    u, w = jnp.arange(8.0) / 8, jnp.arange(2.0) / 2
    got = jaxinterp.inverse(f)(f(u, w))
    np.testing.assert_allclose(got[0], u, rtol=1e-6)
    np.testing.assert_allclose(got[1], w, rtol=1e-6)
    try:
        jaxinterp.ildj(f)(f(u, w))
    except jaxinterp.NotInvertibleError as err:
        text = str(err)
        assert "shard_map" in text and "different mesh axes" in text, text
        assert "['a'], ['b']" in text, text
    else:
        raise AssertionError("the ildj of shards over different axes was not refused")


@check("inverse_solve_in_shard_map")
def _():
    # The numerical solve in each shard's body, with few `y` off the image
    # per shard (one gather) and many (gathered in chunks, `_lazy._chunks`).
    # (Softsign with `|v|` or `v * sign(v)` has an exact method.)
    softsign = lambda v: v / (1 + abs_no_formula(v))
    f = jax.shard_map(softsign, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    y0 = softsign(jnp.linspace(-4.0, 4.0, 8 * 8192))
    inv = jax.jit(jaxinterp.inverse(f))
    for every in (400, 10):
        y_v = y0.at[::every].set(2.0)
        got = np.asarray(inv(y_v))
        inside = np.abs(np.asarray(y_v)) < 1
        np.testing.assert_array_equal(np.isnan(got), ~inside)
        want = np.asarray(y_v / (1 - jnp.abs(y_v)))
        np.testing.assert_allclose(got[inside], want[inside], rtol=2e-5, atol=1e-6)


# Memory kinds of arrays spread over the mesh (`NamedSharding(...,
# memory_kind=...)`): staged with `jax.make_jaxpr`'s types, staged apart when
# only the memory differs, evaluated into the memories plain JAX uses.
def in_memory(kind):
    try:
        return jax.device_put(x, NamedSharding(mesh, P("i"), memory_kind=kind))
    except ValueError as err:  # plain JAX cannot place it there
        results.setdefault("memory_kinds_skipped", "")
        results["memory_kinds_skipped"] += (
            f"plain JAX {jax.__version__} cannot place an array in `{kind}` "
            f"memory: {err}. "
        )


@check("memory_kinds_on_a_mesh")
def _():
    placed = {k: in_memory(k) for k in ("device", "pinned_host")}
    if any(v is None for v in placed.values()):
        return
    f = lambda v: jnp.sin(v) * 2.0 + 1.0
    staged = []
    for kind, v in placed.items():
        want = jax.make_jaxpr(f)(v)
        got = stage(f, v)
        assert str(got.closed_jaxpr.in_avals) == str(want.in_avals), (got, want)
        assert list(got.closed_jaxpr.in_avals) == list(want.in_avals), kind
        staged.append(got)
        for wrap in (lambda g: g, jax.jit):
            out, ref = wrap(evaluate(f))(v), wrap(f)(v)
            assert_tree_equal(out, ref, kind)
            assert out.sharding == ref.sharding, (kind, out.sharding, ref.sharding)
    want_apart = [jax.make_jaxpr(f)(v).in_avals for v in placed.values()]
    assert (staged[0] is staged[1]) == (want_apart[0] == want_apart[1]), want_apart


@check("inverse_pmap")
def _():
    # A `jit` of a `shard_map` (JAX >= 0.10) or an `xla_pmap` (before).
    got, ildj = jaxinterp.inverse_and_ildj(pm_exp)(pm_exp(y))
    np.testing.assert_allclose(got, y, rtol=1e-6)
    np.testing.assert_allclose(ildj, -log_abs_det(pm_exp, y), rtol=1e-5)
    got = jax.jit(jaxinterp.inverse(pm_exp))(pm_exp(y))
    np.testing.assert_allclose(got, y, rtol=1e-6)
    # Two values per device, and a known operand broadcast to every device.
    scaled = jax.pmap(lambda v, s: jnp.exp(v) * s, axis_name="j", in_axes=(0, None))
    v = jnp.arange(16.0).reshape(8, 2) / 8.0
    s = jnp.float32(2.0)
    got, ildj = jaxinterp.inverse_and_ildj(scaled, argnums=0)(scaled(v, s), s)
    np.testing.assert_allclose(got, v, rtol=1e-6)
    np.testing.assert_allclose(
        ildj, -log_abs_det(lambda u: scaled(u, s), v), rtol=1e-5
    )


@check("inverse_fold_found_when_it_runs")
def _():
    # Operands that decide whether the map folds (between grid points),
    # traced and sharded: the elements whose map folds are NaN, the others
    # solved, and the result keeps the elements' sharding (the runtime
    # search is a host callback on the operands; each element is tested
    # against the boxes it returns where the element lives).
    f = lambda u, a, c: u - a * jnp.tanh(100.0 * (u - c))
    row = NamedSharding(mesh, P("i"))
    u = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)
    a = jnp.where(jnp.arange(16) < 8, 0.005, 0.02).astype(jnp.float32)
    want = np.where(np.arange(16) < 8, np.asarray(u), np.nan)
    y, a_ = jax.device_put(f(u, a, 0.3), row), jax.device_put(a, row)
    got = jax.jit(jaxinterp.inverse(f, argnums=0))(y, a_, jnp.float32(0.3))
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert got.sharding.is_equivalent_to(row, 1), got.sharding
    body = jax.shard_map(
        jaxinterp.inverse(f, argnums=0),
        mesh=mesh,
        in_specs=(P("i"), P("i"), P()),
        out_specs=P("i"),
    )
    np.testing.assert_allclose(
        jax.jit(body)(y, a_, jnp.float32(0.3)), want, atol=2e-6
    )
    # On a mesh with Explicit axes (the sharding in the type): the grid
    # check's table lookups name their result's sharding (they raised).
    if hasattr(jax.sharding, "AxisType") and hasattr(jax.sharding, "reshard"):
        explicit = jax.make_mesh(
            (8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,)
        )
        row = NamedSharding(explicit, P("i"))
        y, a_ = jax.device_put(f(u, a, 0.3), row), jax.device_put(a, row)
        got = jax.jit(jaxinterp.inverse(f, argnums=0))(y, a_, jnp.float32(0.3))
        np.testing.assert_allclose(got, want, atol=2e-6)
        assert got.sharding.spec == P("i"), got.sharding


print("RESULTS" + json.dumps(results))
"""


def _run_eight_devices() -> dict:
    script = SCRIPT.replace("TESTS_DIR", repr(os.path.dirname(__file__)))
    out = run_python(
        script, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    )
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULTS")]
    return json.loads(line[len("RESULTS") :])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # (Once per run, not once per pytest-xdist worker.)
    return once_per_run(tmp_path_factory, "multidevice", _run_eight_devices)


def test_eight_devices(results):
    assert results["devices"] == 8


@pytest.mark.parametrize(
    "check",
    [
        "shard_map_bitwise",
        "shard_map_rebuilt",
        "shard_map_reached",
        "shard_map_opaque",
        "shard_map_under_transformations",
        "scan_in_shard_map_in_jit",
        "jit_shardings_kept",
        "pmap_bitwise",
        "stage_keeps_explicit_sharding",
        "evaluate_keeps_shardings",
        "shard_map_explicit_mesh",
        "shard_map_rebuilt_same_params",
        "collectives_pass_through",
        "interpret_inside_shard_map_body",
        "inverse_jit_shardings",
        "inverse_shard_map",
        "inverse_shard_map_mixed_axes",
        "inverse_solve_in_shard_map",
        "inverse_fold_found_when_it_runs",
    ],
)
def test_multidevice(results, check):
    assert results[check] == "ok", results[check]


def test_pmap_reached(results):
    assert results["pmap_reached"] == "ok", results["pmap_reached"]


def test_memory_kinds_on_a_mesh(results):
    if "memory_kinds_skipped" in results:
        pytest.skip(results["memory_kinds_skipped"])
    assert results["memory_kinds_on_a_mesh"] == "ok", results["memory_kinds_on_a_mesh"]


def test_inverse_pmap(results):
    assert results["inverse_pmap"] == "ok", results["inverse_pmap"]


# The check matrix of issue 13 (`tests/multidevice_matrix.py`), in a second
# subprocess: every walker x Explicit/Auto x 1-D/2-D x eager/jit, collectives
# and control flow in `shard_map` bodies, inverses through mapped bodies, weak
# types and memory spaces.


# It takes minutes (the collectives), so the default suite leaves it to
# `nox -s multidevice` (`JAXINTERP_TEST_MATRIX=1`), which CI runs.
needs_matrix = pytest.mark.skipif(
    os.environ.get("JAXINTERP_TEST_MATRIX", "") in ("", "0"),
    reason="the multi-device check matrix runs under JAXINTERP_TEST_MATRIX=1 "
    "(`nox -s multidevice`)",
)


@pytest.fixture(scope="module")
def matrix() -> dict:
    script = os.path.join(os.path.dirname(__file__), "multidevice_matrix.py")
    out = run_python(
        f"import runpy, sys; sys.path.insert(0, {os.path.dirname(script)!r}); "
        f"runpy.run_path({script!r}, run_name='__main__')",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
        timeout=900,
    )
    (line,) = [ln for ln in out.splitlines() if ln.startswith("MATRIX")]
    return json.loads(line[len("MATRIX") :])


@needs_matrix
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_matrix(matrix, check):
    result = matrix["results"][check]
    if result.startswith("skip: "):  # plain JAX itself fails the program
        pytest.skip(result[len("skip: ") :])
    assert result == "ok", result


@needs_matrix
def test_matrix_cases_skipped_only_where_plain_jax_fails(matrix):
    # Cases inside a check that plain JAX cannot run (`matmul` contracting
    # sharded dimensions of an Explicit mesh, ...) are left out of it; each
    # note quotes plain JAX's own error (and each check still ran cases: the
    # walkers assert so).
    for note in matrix["notes"]:
        assert "plain JAX: " in note, note
    print("\n".join(matrix["notes"]))
