"""Two processes with four CPU devices each, joined by `jax.distributed`.

Each process runs the same script (SPMD): it joins the other through a local
coordinator, builds arrays on a global mesh of all eight devices, and compares
`evaluate`, `stage` and `inverse` with plain JAX computed in that process.
Values are compared after `process_allgather`, so each process checks the whole
global array, not only its own shards. Each process prints its results as JSON;
the test then requires both to pass and to agree with each other.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import jax
import pytest
from helpers import once_per_run

# Every test here checks the results of one run of fresh processes (about a
# minute): the whole file is `slow`, run by `--full`. On JAX 0.12.1 the two
# processes do not finish (they hang once the `pmap` checks start, after
# plain `jax.pmap` has run): skipped there, saying so.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        tuple(int(p) for p in jax.__version__.split(".")[:3]) >= (0, 12, 1),
        reason=f"two processes joined by jax.distributed hang on JAX {jax.__version__}",
    ),
]

# Seconds both processes get to start, join and run every check.
TIMEOUT = 150

SCRIPT = r"""
import json, sys, time, traceback

process_id, port = int(sys.argv[1]), sys.argv[2]
import jax

# CPU collectives across processes: gloo where this JAX has the option.
try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
except (AttributeError, ValueError) as err:
    print("NOTE no gloo option:", err, file=sys.stderr)
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=process_id,
    initialization_timeout=60,
)

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.multihost_utils import process_allgather
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, TESTS_DIR)
from helpers import assert_tree_equal, top_level_primitives
import jaxinterp
from jaxinterp import evaluate, stage

results = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "device_count": jax.device_count(),
    "local_device_count": jax.local_device_count(),
    "local_device_ids": sorted(d.id for d in jax.local_devices()),
}
# What both processes must report identically: gathered values and shardings.
shared = {}


timings = {}  # seconds per check, for the test's report


def check(name):
    def decorate(fn):
        start = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception as err:  # reported to the test
            text = "".join(traceback.format_exception(err))
            results[name] = f"{type(err).__name__}: {err}\n{text}"[:3000]
        timings[name] = round(time.perf_counter() - start, 2)
        return fn
    return decorate


def gathered(a):
    # The whole global value of an array spread over both processes.
    assert not a.is_fully_addressable, a.sharding
    return np.asarray(process_allgather(a, tiled=True))


def record(key, a):
    v = gathered(a)
    shared[key] = {
        "shape": list(v.shape),
        "dtype": str(v.dtype),
        "values": v.ravel().tolist(),
        "sharding": repr(a.sharding),
    }


def same_sharding(got, want, what):
    ok = got.sharding == want.sharding or got.sharding.is_equivalent_to(
        want.sharding, got.ndim
    )
    assert ok, f"{what}: {got.sharding} != {want.sharding}"


def same(got, want, what, key=None):
    # Bit for bit over the whole global array, and placed alike.
    g, w = gathered(got), gathered(want)
    assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, w.dtype)
    np.testing.assert_array_equal(g, w, err_msg=str(what))
    same_sharding(got, want, what)
    if key is not None:
        record(key, got)


AxisType = getattr(jax.sharding, "AxisType", None)
set_mesh = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
default_mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
MESHES = {"default": default_mesh}
if AxisType is None or set_mesh is None:
    results["explicit_skipped"] = "this JAX has no `AxisType` or `set_mesh`"
else:
    MESHES["explicit"] = jax.make_mesh(
        (8,), ("d",), axis_types=(AxisType.Explicit,)
    )

GLOBAL = (np.arange(64, dtype=np.float32).reshape(16, 4) - 20.0) / 16.0


def from_callback(mesh, spec=P("d")):
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(GLOBAL.shape, sharding, lambda i: GLOBAL[i])


def from_local(mesh):
    # This process's rows: those its devices hold (contiguous for a 1-D mesh).
    sharding = NamedSharding(mesh, P("d"))
    rows = sorted(
        r
        for index in sharding.addressable_devices_indices_map(GLOBAL.shape).values()
        for r in range(16)[index[0]]
    )
    assert rows == list(range(rows[0], rows[-1] + 1)), rows
    return jax.make_array_from_process_local_data(
        sharding, GLOBAL[rows[0] : rows[-1] + 1], GLOBAL.shape
    )


def in_mesh(name):
    mesh = MESHES[name]
    if name == "explicit":
        return set_mesh(mesh)
    import contextlib
    return contextlib.nullcontext()


@check("global_arrays")
def _():
    for name, mesh in MESHES.items():
        for make in (from_callback, from_local):
            v = make(mesh)
            assert not v.is_fully_addressable
            assert len(v.addressable_shards) == 4 and v.shape == (16, 4)
            np.testing.assert_array_equal(gathered(v), GLOBAL)


FNS = {
    "sin": lambda v: jnp.sin(v) * 2.0 + 1.0,
    "sum0": lambda v: jnp.sum(v, axis=0),
    "transpose": lambda v: v.T + 1.0,
    "softplus": jax.nn.softplus,
}


@check("stage_avals")
def _():
    for name in MESHES:
        with in_mesh(name):
            v = from_callback(MESHES[name])
            sds = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
            for fname, f in FNS.items():
                want = jax.make_jaxpr(f)(v)
                for arg in (v, sds):
                    got = stage(f, arg).closed_jaxpr
                    what = (name, fname, got)
                    assert list(got.in_avals) == list(want.in_avals), what
                    assert list(got.out_avals) == list(want.out_avals), what
                shared[f"stage_{name}_{fname}"] = str(want.in_avals + want.out_avals)


@check("evaluate_functions")
def _():
    for name in MESHES:
        with in_mesh(name):
            v = from_local(MESHES[name])
            for fname, f in FNS.items():
                for how, wrap in (("eager", lambda g: g), ("jit", jax.jit)):
                    what = f"{fname} {how} on {name}"
                    got, want = wrap(evaluate(f))(v), wrap(f)(v)
                    same(got, want, what, key=f"evaluate_{name}_{fname}_{how}")


@check("evaluate_sharded_jit")
def _():
    for name, mesh in MESHES.items():
        with in_mesh(name):
            v = from_callback(mesh)
            g = jax.jit(
                lambda u: jnp.exp(u) * 2.0 + jnp.sum(u),
                in_shardings=NamedSharding(mesh, P("d")),
                out_shardings=NamedSharding(mesh, P(None, None)),
            )
            assert g(v).sharding.is_fully_replicated
            for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                # Under an outer `jit` on an Explicit mesh JAX places the
                # result by its type (`f32[16@d,4]`), not by `out_shardings`.
                got, want = wrap(evaluate(g))(v), wrap(g)(v)
                same(got, want, f"{how} on {name}", key=f"jit_{name}_{how}")
                # Plain values around the sharded jit.
                h = lambda u: g(u * 0.5) - 1.0
                same(wrap(evaluate(h))(v), wrap(h)(v), f"around {how} on {name}")


RING = range(8)
BODIES = {
    "psum": lambda b: b * 2.0 + lax.psum(b, "d"),
    "all_gather": lambda b: b + lax.all_gather(b, "d", tiled=True)[: b.shape[0]],
    "psum_scalar": lambda b: jnp.sin(b) + lax.psum(jnp.sum(b), "d"),
    "axis_index": lambda b: b + lax.axis_index("d").astype(b.dtype),
    # Each device's block to the next device: blocks 3 -> 4 and 7 -> 0 cross
    # from one process to the other.
    "ppermute": lambda b: b + lax.ppermute(b, "d", [(i, (i + 1) % 8) for i in RING]),
}


# NumPy's value of each body's `shard_map` on `GLOBAL` (two rows a device), so
# the collectives are seen to span both processes, not only local devices.
BLOCKS = GLOBAL.reshape(8, 2, 4)
NUMPY_VALUES = {
    "psum": GLOBAL * 2.0 + np.tile(BLOCKS.sum(0), (8, 1)),
    "all_gather": GLOBAL + np.tile(BLOCKS[0], (8, 1)),
    "psum_scalar": np.sin(GLOBAL) + GLOBAL.sum(),
    "axis_index": GLOBAL + np.repeat(np.arange(8.0), 2)[:, None],
    "ppermute": GLOBAL + np.roll(BLOCKS, 1, axis=0).reshape(16, 4),
}


def shard_map(body, mesh, **kwargs):
    specs = dict(in_specs=P("d"), out_specs=P("d"), **kwargs)
    return jax.shard_map(body, mesh=mesh, **specs)


@check("evaluate_shard_map")
def _():
    for name, mesh in MESHES.items():
        with in_mesh(name):
            v = from_local(mesh)
            for bname, body in BODIES.items():
                f = shard_map(body, mesh)
                want = f(v)
                np.testing.assert_allclose(
                    gathered(want), NUMPY_VALUES[bname], rtol=1e-5, atol=1e-5
                )
                for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                    what = f"{bname} {how} on {name}"
                    key = f"sm_{name}_{bname}_{how}"
                    same(wrap(evaluate(f))(v), want, what, key=key)
                # The interpreter inside the body, on each process's shards.
                inner = shard_map(evaluate(body), mesh)
                same(inner(v), want, f"{bname} inside on {name}")


FLOW = lambda b: jnp.exp(b) * 2.0 + 1.0


def reference_ildj(v):
    # Elementwise: the log|det| of the Jacobian is the sum of log|f'(x)|.
    slope = jax.grad(lambda u: jnp.sum(FLOW(u)))(v)
    return -jnp.sum(jnp.log(jnp.abs(slope)))



# `inverse_and_ildj` of `FLOW` mapped over `mesh`, eager and jitted: the
# global input back with `v`'s sharding, the ildj over every process.
def inverse_of_flow(mesh, spec, v, label, key, name):
    flow = jax.shard_map(FLOW, mesh=mesh, in_specs=spec, out_specs=spec)
    y = flow(v)
    want_ildj = gathered(reference_ildj(v))
    for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
        what = f"{label} inverse {how} on {name}"
        back, ildj = wrap(jaxinterp.inverse_and_ildj(flow))(y)
        np.testing.assert_allclose(
            gathered(back), GLOBAL, rtol=1e-5, atol=1e-6, err_msg=what
        )
        same_sharding(back, v, what)
        np.testing.assert_allclose(gathered(ildj), want_ildj, rtol=1e-5, err_msg=what)
        record(f"inv_{key}_{name}_{how}", back)
        shared[f"ildj_{key}_{name}_{how}"] = float(gathered(ildj))


@check("inverse_shard_map")
def _():
    for name, mesh in MESHES.items():
        with in_mesh(name):
            v = from_callback(mesh)
            for check_vma in (True, False):
                f = shard_map(FLOW, mesh, check_vma=check_vma)
                y = f(v)
                want_ildj = gathered(reference_ildj(v))
                for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                    what = f"{how} on {name} check_vma={check_vma}"
                    back, ildj = wrap(jaxinterp.inverse_and_ildj(f))(y)
                    np.testing.assert_allclose(
                        gathered(back), GLOBAL, rtol=1e-5, atol=1e-6, err_msg=what
                    )
                    same_sharding(back, v, what)
                    assert ildj.shape == (), (what, ildj.shape)
                    np.testing.assert_allclose(
                        gathered(ildj), want_ildj, rtol=1e-5, err_msg=what
                    )
                    back_only = wrap(jaxinterp.inverse(f))(y)
                    np.testing.assert_array_equal(gathered(back_only), gathered(back))
                    record(f"inv_{name}_{check_vma}_{how}", back)
                    shared[f"ildj_{name}_{check_vma}_{how}"] = float(gathered(ildj))


@check("inverse_sharded_jit")
def _():
    for name, mesh in MESHES.items():
        with in_mesh(name):
            v = from_local(mesh)
            g = jax.jit(
                FLOW,
                in_shardings=NamedSharding(mesh, P("d")),
                out_shardings=NamedSharding(mesh, P()),
            )
            y = g(v)
            want_ildj = gathered(reference_ildj(v))
            for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                what = f"{how} on {name}"
                back, ildj = wrap(jaxinterp.inverse_and_ildj(g))(y)
                np.testing.assert_allclose(
                    gathered(back), GLOBAL, rtol=1e-5, atol=1e-6, err_msg=what
                )
                same_sharding(back, v, what)
                np.testing.assert_allclose(gathered(ildj), want_ildj, rtol=1e-5)
                record(f"inv_jit_{name}_{how}", back)


# A 2-D mesh over both processes' devices: `psum` over `a` and the ildj's
# sum run across processes; NumPy gives the reference values.
MESHES_2D = {
    "default": jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
}
if "explicit" in MESHES:
    MESHES_2D["explicit"] = jax.make_mesh(
        (4, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2
    )


@check("mesh_2d")
def _():
    spec = P("a", "b")
    blocks_a = GLOBAL.reshape(4, 4, 4)  # the four row-blocks along `a`
    want_values = GLOBAL * 2.0 + np.tile(blocks_a.sum(0), (4, 1))
    for name, mesh in MESHES_2D.items():
        ctx = set_mesh(mesh) if name == "explicit" else in_mesh("default")
        with ctx:
            sharding = NamedSharding(mesh, spec)
            v = jax.make_array_from_callback(
                GLOBAL.shape, sharding, lambda i: GLOBAL[i]
            )
            body = lambda b: b * 2.0 + lax.psum(b, "a")
            f = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
            want = f(v)
            np.testing.assert_allclose(gathered(want), want_values, rtol=1e-6)
            for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                what = f"2-D {how} on {name}"
                same(wrap(evaluate(f))(v), want, what, key=f"2d_{name}_{how}")
                inner = jax.shard_map(
                    evaluate(body), mesh=mesh, in_specs=spec, out_specs=spec
                )
                same(wrap(inner)(v), want, f"{what} inside")
                g = lambda u: jnp.sin(u) * 2.0 + 1.0
                same(wrap(evaluate(g))(v), wrap(g)(v), f"{what} elementwise")
            inverse_of_flow(mesh, spec, v, "2-D", "2d", name)


# A 2x4 mesh whose two axes both span the processes: the devices are laid out
# as a checkerboard (process 0's on the cells where `p + q` is even), so along
# `p` and along `q` neighbouring blocks sit in different processes. `ppermute`
# over `q` and `psum` over `p` then both pass data between processes.
def checkerboard(axis_types=None):
    own = iter(d for d in jax.devices() if d.process_index == 0)
    other = iter(d for d in jax.devices() if d.process_index != 0)
    grid = [
        [next(own if (p + q) % 2 == 0 else other) for q in range(4)]
        for p in range(2)
    ]
    kwargs = {} if axis_types is None else {"axis_types": axis_types}
    return jax.sharding.Mesh(np.array(grid), ("p", "q"), **kwargs)


MESHES_2X4 = {"default": checkerboard()}
if "explicit" in MESHES:
    MESHES_2X4["explicit"] = checkerboard((AxisType.Explicit,) * 2)
QRING = [(i, (i + 1) % 4) for i in range(4)]
BODY_2X4 = lambda b: b + lax.ppermute(b, "q", QRING) + lax.psum(b, "p")
# `P("p", "q")` gives each device an 8x1 block: `ppermute` moves column `q`
# to `q + 1`, `psum` adds the two row halves.
NUMPY_2X4 = (
    GLOBAL + np.roll(GLOBAL, 1, axis=1) + np.tile(GLOBAL[:8] + GLOBAL[8:], (2, 1))
)


@check("mesh_2x4")
def _():
    spec = P("p", "q")
    for name, mesh in MESHES_2X4.items():
        for axis in ("p", "q"):  # each axis spans both processes
            line = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), -1)[0]
            procs = {d.process_index for d in line}
            assert procs == {0, 1}, (name, axis, mesh.devices)
        ctx = set_mesh(mesh) if name == "explicit" else in_mesh("default")
        with ctx:
            sharding = NamedSharding(mesh, spec)
            v = jax.make_array_from_callback(
                GLOBAL.shape, sharding, lambda i: GLOBAL[i]
            )
            # A sharded `jit`, resharding from `P("p", "q")` to `P("q", "p")`.
            g = jax.jit(
                lambda u: jnp.exp(u) * 2.0 + jnp.sum(u, axis=0),
                in_shardings=sharding,
                out_shardings=NamedSharding(mesh, P("q", "p")),
            )
            f = jax.shard_map(BODY_2X4, mesh=mesh, in_specs=spec, out_specs=spec)
            want_f = f(v)
            np.testing.assert_allclose(gathered(want_f), NUMPY_2X4, rtol=1e-6)
            for how, wrap in (("eager", lambda h: h), ("jit", jax.jit)):
                what = f"2x4 {how} on {name}"
                key = f"{name}_{how}"
                same(wrap(evaluate(g))(v), wrap(g)(v), what, key=f"2x4_jit_{key}")
                same(wrap(evaluate(f))(v), want_f, what, key=f"2x4_sm_{key}")
            # The interpreter inside the body (eagerly: `jit` adds nothing new).
            inner = jax.shard_map(
                evaluate(BODY_2X4), mesh=mesh, in_specs=spec, out_specs=spec
            )
            same(inner(v), want_f, f"2x4 inside on {name}")
            # `inverse` of a `shard_map` on the 2x4 mesh; the ildj sums over
            # both axes, so over both processes.
            inverse_of_flow(mesh, spec, v, "2x4", "2x4", name)


# `jax.pmap` takes and returns each process's local data (one row a local
# device), and its collectives span both processes. Before JAX 0.10 it stages
# as an `xla_pmap` equation, which `evaluate` re-binds as it is and which JAX
# cannot run inside `jax.jit` across processes. From 0.10 it stages (by
# `jax.make_jaxpr`, so by `jax.jit` and by jaxinterp) as a `jit` of a
# `shard_map` over this process's devices only, between conversions of the
# local data to a global array and back: `evaluate` gives what `jax.jit` gives.
LOCAL = GLOBAL[:8].reshape(4, 2, 4) + 4.0 * process_id
pm_flow = jax.pmap(FLOW, axis_name="j")
pm_psum = jax.pmap(lambda v: jnp.sin(v) + lax.psum(v, "j"), axis_name="j")
pmap_p = jaxinterp._jax_compat.pmap_p
pmap_is_primitive = pmap_p is not None and pmap_p in top_level_primitives(
    stage(pm_psum, LOCAL).jaxpr
)
results["pmap_is_primitive"] = pmap_is_primitive
pmap_wraps = [("eager", lambda h: h)]
if pmap_is_primitive:
    results["pmap_jit"] = (
        "skip: this JAX stages `jax.pmap` as `xla_pmap`, which it cannot run "
        "inside `jax.jit` across processes"
    )
else:
    pmap_wraps.append(("jit", jax.jit))


@check("pmap")
def _():
    for how, wrap in pmap_wraps:
        got = wrap(evaluate(pm_flow))(LOCAL)
        assert_tree_equal(got, wrap(pm_flow)(LOCAL), f"flow {how}")
        got = wrap(evaluate(pm_psum))(LOCAL)
        want = (pm_psum if pmap_is_primitive else jax.jit(pm_psum))(LOCAL)
        assert_tree_equal(got, want, f"psum {how}")
    slope = jax.grad(lambda u: jnp.sum(FLOW(u)))(LOCAL)
    want_ildj = -jnp.sum(jnp.log(jnp.abs(slope)))
    y = pm_flow(LOCAL)
    for how, wrap in pmap_wraps:
        back, ildj = wrap(jaxinterp.inverse_and_ildj(pm_flow))(y)
        np.testing.assert_allclose(back, LOCAL, rtol=1e-5, atol=1e-6, err_msg=how)
        np.testing.assert_allclose(ildj, want_ildj, rtol=1e-5, err_msg=how)
        results[f"pmap_inverse_{how}"] = "ok"
    if not pmap_is_primitive:
        results["pmap_jit"] = "ok"


results["shared"] = shared
results["timings"] = timings
print("RESULTS" + json.dumps(results), flush=True)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_two_processes() -> list[dict]:
    """Start both processes, wait (bounded), and return their parsed results."""
    script = SCRIPT.replace("TESTS_DIR", repr(os.path.dirname(__file__)))
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    port = str(_free_port())
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for i in range(2):
            out = open(os.path.join(tmp, f"out{i}"), "w+")  # noqa: SIM115
            err = open(os.path.join(tmp, f"err{i}"), "w+")  # noqa: SIM115
            outs.append((out, err))
            cmd = [sys.executable, "-c", script, str(i), port]
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=err))
        deadline = time.monotonic() + TIMEOUT
        failed_at = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if any(p.poll() not in (None, 0) for p in procs):
                # One process failed: the other may wait on it forever.
                failed_at = failed_at or now
            if now > deadline or (failed_at and now > failed_at + 10):
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                break
            time.sleep(0.2)
        texts = []
        for (out, err), p in zip(outs, procs, strict=True):
            out.seek(0)
            err.seek(0)
            texts.append((p.returncode, out.read(), err.read()))
            out.close()
            err.close()
    report = "\n".join(
        f"--- process {i}: exit {rc}\n{out[-3000:]}\n{err[-6000:]}"
        for i, (rc, out, err) in enumerate(texts)
    )
    timed_out = time.monotonic() > deadline
    assert not timed_out, f"the processes ran past {TIMEOUT} s:\n{report}"
    assert all(rc == 0 for rc, _, _ in texts), f"a process failed:\n{report}"
    results = []
    for _, out, _ in texts:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULTS")]
        assert len(lines) == 1, report
        results.append(json.loads(lines[0][len("RESULTS") :]))
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    # (Once per run, not once per pytest-xdist worker.)
    return once_per_run(tmp_path_factory, "multiprocess", _run_two_processes)


CHECKS = [
    "global_arrays",
    "stage_avals",
    "evaluate_functions",
    "evaluate_sharded_jit",
    "evaluate_shard_map",
    "inverse_shard_map",
    "inverse_sharded_jit",
    "mesh_2d",
    "mesh_2x4",
    "pmap",
]


def test_two_processes_joined(results):
    print("seconds per check:", results[0]["timings"])
    assert [r["process_index"] for r in results] == [0, 1]
    for r in results:
        assert r["process_count"] == 2
        assert r["device_count"] == 8 and r["local_device_count"] == 4
    ids = [set(r["local_device_ids"]) for r in results]
    assert not ids[0] & ids[1] and len(ids[0] | ids[1]) == 8, ids


@pytest.mark.parametrize("check", CHECKS)
def test_multiprocess(results, check):
    for r in results:
        assert r[check] == "ok", f"process {r['process_index']}: {r[check]}"


def test_processes_agree(results):
    first, second = (r["shared"] for r in results)
    assert first.keys() == second.keys()
    for key in first:
        assert first[key] == second[key], key


def test_pmap_under_jit(results):
    for r in results:
        if r["pmap_jit"].startswith("skip: "):
            print(r["pmap_jit"])
            pytest.skip(r["pmap_jit"][len("skip: ") :])
    assert all(r["pmap_jit"] == "ok" for r in results), results[0]["pmap"]


def test_explicit_mesh(results):
    for r in results:
        if "explicit_skipped" in r:
            print(r["explicit_skipped"])
            pytest.skip(r["explicit_skipped"])
    assert any(k.startswith("evaluate_explicit_") for k in results[0]["shared"])
