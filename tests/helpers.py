"""Shared helpers for the interpreter-core tests.

`tree_allclose` and `compare_with_reference` live in `jaxinterp.testing`; this
module adds bitwise comparison, a few small interpreters and Jaxpr inspection.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax import lax

import jaxinterp
from jaxinterp._env import release_plan
from jaxinterp.testing import compare_with_reference, tree_allclose

__all__ = [
    "FUTURE_FLAGS",
    "abs_no_formula",
    "PrimitiveLog",
    "SinToCos",
    "assert_program_result",
    "assert_tree_equal",
    "check_release_plan",
    "compare_with_reference",
    "construct_name",
    "construct_names",
    "flags_off",
    "future_flags",
    "future_flags_on",
    "matches_flags_off",
    "iter_eqns",
    "primitive_names",
    "run_python",
    "top_level_primitives",
    "tree_allclose",
]


# JAX's opt-in future defaults (JAX >= 0.11): `custom_jvp`, `custom_vjp` and
# `checkpoint` stage as hijax `call_hi_primitive` equations, `scan` as mutable
# references around a hijax `Scan3`.
FUTURE_FLAGS = ("jax_custom_jvp3", "jax_custom_vjp3", "jax_remat3", "jax_scan3")


def x64() -> contextlib.AbstractContextManager[None]:
    """A context in which arrays default to 64 bits."""
    # (`jax.enable_x64` is newer than JAX 0.7; the experimental one is older.)
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


def future_flags_available() -> bool:
    """Whether the installed JAX has all of `FUTURE_FLAGS`."""
    return all(hasattr(jax.config, flag) for flag in FUTURE_FLAGS)


@contextlib.contextmanager
def future_flags(on: bool = True) -> Iterator[None]:
    """Set every flag of `FUTURE_FLAGS` to `on` inside the block (JAX >= 0.11)."""
    before = {flag: getattr(jax.config, flag) for flag in FUTURE_FLAGS}
    try:
        for flag in FUTURE_FLAGS:
            jax.config.update(flag, on)
        yield
    finally:
        for flag, value in before.items():
            jax.config.update(flag, value)


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key)


def assert_tree_equal(actual: Any, expected: Any, what: str = "result") -> None:
    """Assert two pytrees are equal bit for bit: structure, avals and bytes."""
    a_leaves, a_tree = jtu.tree_flatten(actual)
    e_leaves, e_tree = jtu.tree_flatten(expected)
    assert a_tree == e_tree, f"{what}: structure {a_tree} != {e_tree}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        a_aval, e_aval = jax.typeof(a), jax.typeof(e)
        assert a_aval.shape == e_aval.shape, f"{what} leaf {i}: {a_aval} != {e_aval}"
        assert a_aval.dtype == e_aval.dtype, f"{what} leaf {i}: {a_aval} != {e_aval}"
        assert a_aval.weak_type == e_aval.weak_type, (
            f"{what} leaf {i}: weak type {a_aval} != {e_aval}"
        )
        if _is_key(a):
            assert jax.random.key_impl(a) == jax.random.key_impl(e)
            a, e = jax.random.key_data(a), jax.random.key_data(e)
        # `jnp.asarray` keeps a Python scalar's JAX dtype (`np.asarray` widens).
        a_np, e_np = np.asarray(jnp.asarray(a)), np.asarray(jnp.asarray(e))
        np.testing.assert_array_equal(a_np, e_np, err_msg=f"{what} leaf {i}")
        # assert_array_equal treats 0.0 == -0.0 and NaN == NaN; bytes do not.
        assert a_np.tobytes() == e_np.tobytes(), f"{what} leaf {i}: bits differ"


class SinToCos(jaxinterp.Interpreter):
    """Replaces every `sin` by `cos`, wherever it is nested."""

    name = "sin_to_cos"

    def process_eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        if eqn.primitive is lax.sin_p:
            return [lax.cos(*invals)]
        return super().process_eqn(eqn, invals)


class PrimitiveLog(jaxinterp.Interpreter):
    """Records the name of every primitive it processes (nested ones too)."""

    name = "primitive_log"
    cache_subcalls = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.names: list[str] = []
        self.constructs: list[str] = []  # hijax equations by what they replace

    def process_eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        self.names.append(eqn.primitive.name)
        self.constructs.append(construct_name(eqn))
        return super().process_eqn(eqn, invals)


construct_name = jaxinterp._jax_compat.construct_name


# Every equation of a Jaxpr and of the Jaxprs it runs, hijax bodies included.
iter_eqns = jaxinterp.iter_eqns


def primitive_names(jaxpr: Any) -> set[str]:
    """The names of all primitives in `jaxpr`, sub-Jaxprs included."""
    return {eqn.primitive.name for eqn in iter_eqns(jaxpr)}


def construct_names(jaxpr: Any) -> set[str]:
    """`primitive_names`, with hijax equations named by what they replace."""
    return {construct_name(eqn) for eqn in iter_eqns(jaxpr)}


def top_level_primitives(jaxpr: Any) -> list[Any]:
    """The primitives of the top-level equations of `jaxpr`, in order."""
    return [eqn.primitive for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns]


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 240) -> str:
    """Run `code` in a fresh Python with extra environment variables; return stdout.

    The variables are set before the interpreter starts, so before JAX is
    imported. Raises `AssertionError` with the output if the script fails.
    """
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


_JITTED: dict[Any, Any] = {}


def jit_once(key: Any, build: Callable[[], Callable[..., Any]]) -> Any:
    """`jax.jit(build())`, built once per `key` (hashable, unique across the
    suite: start it with the test's name) for the whole run, so that the
    examples of a hypothesis test reuse one compilation per map and shape
    instead of compiling a new function each."""
    if key not in _JITTED:
        _JITTED[key] = jax.jit(build())
    return _JITTED[key]


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    compute: Callable[[], Any],
    timeout: float = 600.0,
) -> Any:
    """`compute()` (a JSON value) once per test run, shared by the
    pytest-xdist workers: a module fixture runs once per worker that runs
    any of the module's tests, and a subprocess with 8 devices or two joined
    processes should start once. The first worker to ask computes and
    writes the result beside the workers' temporary directories; the others
    wait for it and read it. Without xdist, `compute()`."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return compute()
    root = tmp_path_factory.getbasetemp().parent  # (shared by the workers)
    done = root / f"{name}-{run}.json"
    try:
        fd = os.open(root / f"{name}-{run}.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        fd = None  # another worker computes it
    if fd is None:
        deadline = time.monotonic() + timeout
        while not done.exists():
            assert time.monotonic() < deadline, f"{name}: no result after {timeout} s"
            time.sleep(0.2)
        payload = json.loads(done.read_text())
        if "error" in payload:
            raise AssertionError(f"{name} failed in another worker: {payload['error']}")
        return payload["value"]
    os.close(fd)
    try:
        value = compute()
        payload = {"value": value}
    except BaseException as e:
        payload = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
        raise
    finally:
        partial = done.with_suffix(".partial")
        partial.write_text(json.dumps(payload))
        os.replace(partial, done)
    return value


def check_release_plan(jaxpr: Any) -> list[tuple[Any, ...]]:
    """Replay `release_plan(jaxpr)`: after each equation exactly the values used
    later (or returned) must be held. Returns the plan."""
    plan = release_plan(jaxpr)
    assert len(plan) == len(jaxpr.eqns)
    eqns = jaxpr.eqns

    def variables(vs):
        return {v for v in vs if not isinstance(v, jax.extend.core.Literal)}

    outvars = variables(jaxpr.outvars)
    drop = jaxinterp._jax_compat.DropVar
    defined = set(jaxpr.invars) | set(jaxpr.constvars)
    held = set(defined)
    for k, eqn in enumerate(eqns):
        results = {v for v in eqn.outvars if not isinstance(v, drop)}
        defined |= results
        held = (held | results) - set(plan[k])
        used_later = {v for e in eqns[k + 1 :] for v in variables(e.invars)}
        needed = {v for v in defined if v in used_later or v in outvars}
        assert held == needed, f"after equation {k}: held {held}, needed {needed}"
    return plan


def future_flags_on() -> bool:
    """Whether any of `FUTURE_FLAGS` is on now."""
    return any(getattr(jax.config, flag, False) for flag in FUTURE_FLAGS)


def flags_off(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with the hijax future flags off: the reference value of a
    program, whose meaning does not depend on them. (Under the flags, JAX
    0.12.0.1's `jit` drops a `Scan3` whose only use is its carry, returning
    the initial carry; jaxinterp rebuilds such a loop as a classic `scan`.)"""
    if not future_flags_available() or not future_flags_on():
        return fn(*args)
    with future_flags(False):
        return fn(*args)


def assert_program_result(actual: Any, fn: Callable[..., Any], *args: Any) -> None:
    """`assert_tree_equal(actual, fn(*args))`; under the hijax future flags,
    the types are those `fn` has under the flags (weak types can differ) and
    the bits those of `flags_off(fn, *args)`."""
    if not future_flags_on():
        assert_tree_equal(actual, fn(*args))
        return
    types = jax.eval_shape(fn, *args)
    got = [
        (a.shape, a.dtype, a.weak_type)
        for a in map(jax.typeof, jtu.tree_leaves(actual))
    ]
    want = [(t.shape, t.dtype, t.weak_type) for t in jtu.tree_leaves(types)]
    assert got == want, f"types {got} != {want}"
    values = flags_off(fn, *args)
    for i, (a, e) in enumerate(
        zip(jtu.tree_leaves(actual), jtu.tree_leaves(values), strict=True)
    ):
        a_np, e_np = np.asarray(a), np.asarray(jnp.asarray(e, a.dtype))
        assert a_np.tobytes() == e_np.tobytes(), f"result leaf {i}: {a_np} != {e_np}"


def matches_flags_off(
    transformed: Callable[..., Any], reference: Callable[..., Any], *args: Any
) -> None:
    """Assert `transformed(*args)` equals `reference(*args)` computed with the
    hijax future flags off (the meaning does not depend on them).

    Under the flags, when `transformed` fails and plain JAX fails `reference`
    under the flags too (no `grad` or `vmap` of `Scan3` in JAX 0.12.0.1, for
    a transformation applied inside the interpreted function), the test is
    skipped with the reason; otherwise the failure stands.
    """
    if not future_flags_available():
        tree_allclose(transformed(*args), reference(*args))
        return
    with future_flags(False):
        expected = reference(*args)
    try:
        got = transformed(*args)
    except Exception:
        if future_flags_on():
            plain_or_skip("the reference under the future flags", reference, *args)
        raise
    tree_allclose(got, expected)


def plain_or_skip(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in plain JAX, or skip the test (printing why) when plain JAX
    itself fails `what`: the reference is what jaxinterp is compared with."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - whatever JAX raises
        reason = f"plain JAX fails {what}: {type(err).__name__}"
        print(reason, str(err)[:200])
        pytest.skip(reason)


def lower_factors(n: int, bound: float, diagonal: float) -> Any:
    """A hypothesis strategy: `n x n` lower-triangular float32 matrices with
    entries in `[-bound, bound]` below the diagonal and a diagonal of at
    least `diagonal`."""
    from hypothesis import strategies as st

    return st.lists(
        st.floats(-bound, bound, width=32), min_size=n * n, max_size=n * n
    ).map(
        lambda v: (
            np.tril(np.reshape(np.asarray(v, np.float32), (n, n)), -1)
            + np.diag(diagonal + np.abs(np.asarray(v[:n], np.float32)))
        )
    )


def lower_coordinates_ildj(f: Callable[[Any], Any], x: Any) -> float:
    """`-log|det J|` of `f` at `x` on the lower triangles of `x` and `f(x)`
    (`jax.jacfwd` and `slogdet`)."""
    n = x.shape[-1]
    rows, cols = np.tril_indices(n)

    def g(v: Any) -> Any:
        return f(jnp.zeros((n, n), v.dtype).at[rows, cols].set(v))[rows, cols]

    jac = np.asarray(jax.jacfwd(g)(x[rows, cols]), np.float64)
    return float(-np.linalg.slogdet(jac)[1])


def abs_no_formula(x: Any) -> Any:
    """`|x|` written so that no exact method of `inverse` sees through it:
    `x * sign(x**3)`, the same values and derivatives (`x**3` underflows to
    0 only where `1 + |x|` rounds to 1 anyway). Tests of the numerical
    solver build softsign and logit on it: `|x|` is a case split of the
    piecewise method, and `x * sign(x)` one of the interval method (a
    breakpoint at 0), but a `sign` of a value that uses `x` more than once
    is no breakpoint either method can pull back to `x`. (The cube is
    written `(x * 1) * x * x`, which `inverse` does not read as the power
    `x**3`, as it reads `x * x * x`.)"""
    return x * jnp.sign((x * 1.0) * x * x)
