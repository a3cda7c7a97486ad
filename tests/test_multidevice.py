"""`shard_map`, `pmap` and sharded `jit` on 8 simulated CPU devices.

The device count must be set before JAX is imported, so the checks run in one
subprocess (started once per session) that reports each result as JSON.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_python

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, TESTS_DIR)
from helpers import SinToCos, assert_tree_equal, primitive_names, top_level_primitives
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


@check("pmap_bitwise")
def _():
    assert_tree_equal(evaluate(pm)(y), pm(y))
    assert_tree_equal(SinToCos(higher_order="opaque").transform(pm)(y), pm(y))
    np.testing.assert_allclose(jax.jit(evaluate(pm))(y), pm(y), rtol=1e-6)


# Where `pmap` stages to `jit` of `shard_map` (newer JAX) the walker reaches
# inside it; an `xla_pmap` equation (older JAX) is re-bound as it is.
pmap_p = jaxinterp._jax_compat.pmap_p
prims = top_level_primitives(stage(pm, y).jaxpr)
results["pmap_is_primitive"] = pmap_p is not None and pmap_p in prims


@check("pmap_reached")
def _():
    if results["pmap_is_primitive"]:
        return
    np.testing.assert_allclose(SinToCos().transform(pm)(y), pm_cos(y), rtol=1e-6)


print("RESULTS" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def results() -> dict:
    script = SCRIPT.replace("TESTS_DIR", repr(os.path.dirname(__file__)))
    out = run_python(
        script, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    )
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULTS")]
    return json.loads(line[len("RESULTS") :])


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
    ],
)
def test_multidevice(results, check):
    assert results[check] == "ok", results[check]


def test_pmap_reached(results):
    if results["pmap_is_primitive"]:
        pytest.skip(
            "this JAX stages `pmap` as an `xla_pmap` primitive, which the walker "
            "re-binds without reaching inside"
        )
    assert results["pmap_reached"] == "ok", results["pmap_reached"]
