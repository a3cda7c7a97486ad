"""Shared test configuration: hypothesis profiles and doctest namespace."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pytest.doctest import DoctestItem
from hypothesis import HealthCheck, settings

# --- How the suite compiles -----------------------------------------------
# XLA's compile time is most of the suite's time: a test compiles its
# inverse eagerly, under `jit`, `vmap` and `grad`, many small programs each
# compiled once. Two settings cut it; both are also exported as JAX's
# environment variables, so the scripts and subprocesses tests start share
# them.
# * A persistent compilation cache in `.jax-test-cache/<JAX version>/`: the
#   pytest-xdist workers reuse what the other compiled, and a second run
#   reuses the first's (CI's run with the future flags reuses the run before
#   it). `JAXINTERP_TEST_CACHE=0` turns it off; the folder is emptied when it
#   passes 2 GiB.
# * XLA's backend optimizations off (`jax_disable_most_optimizations`, which
#   halves the compile time of small programs), unless
#   `JAXINTERP_TEST_XLA_OPTIMIZE=1`. CI runs the newest JAX with them on,
#   the code users get; `benchmarks/` always run with them on.
_CACHE_LIMIT_BYTES = 2 << 30


def _flag_on(name: str, default: str = "") -> bool:
    return os.environ.get(name, default) not in ("", "0")


def _configure_compilation() -> None:
    options: dict[str, object] = {}
    if not _flag_on("JAXINTERP_TEST_XLA_OPTIMIZE"):
        options["jax_disable_most_optimizations"] = True
    if _flag_on("JAXINTERP_TEST_CACHE", default="1"):
        root = Path(__file__).resolve().parent / ".jax-test-cache"
        if "PYTEST_XDIST_WORKER" not in os.environ and root.is_dir():
            size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
            if size > _CACHE_LIMIT_BYTES:
                shutil.rmtree(root, ignore_errors=True)
        folder = root / jax.__version__
        folder.mkdir(parents=True, exist_ok=True)
        options["jax_compilation_cache_dir"] = str(folder)
        # Every program, however small or quick to compile.
        options["jax_persistent_cache_min_compile_time_secs"] = 0.0
        options["jax_persistent_cache_min_entry_size_bytes"] = -1
    for name, value in options.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(int(value)) if value is True else str(value)


_configure_compilation()

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Reproducible draws: the same examples on every run of one hypothesis release.
_FIXED = {
    "derandomize": True,
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": _QUIET,
}
# `quick` (8 examples): the default selection (the README's command, CI's
# runs of it). `ci` (15): a `--full` run (CI's newest JAX, the nox
# sessions). Tests that need more examples say so. `dev` draws 500, at
# random. `HYPOTHESIS_PROFILE` picks one by name.
settings.register_profile("ci", max_examples=15, **_FIXED)
settings.register_profile("quick", max_examples=8, **_FIXED)
settings.register_profile(
    "dev", deadline=None, max_examples=500, suppress_health_check=_QUIET
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


# --- Which tests run by default ---------------------------------------------
# The default run (the README's command) leaves out the tests marked `methods`
# (files that test one of the inverse's numerical methods on many maps) and
# `slow` (a test that takes over about 3 seconds on two cores with an empty
# compilation cache): three quarters of the suite's time, for a run of about
# 5 minutes. `--full` (or `JAXINTERP_TEST_FULL=1`) runs them too, as CI's run
# on the newest JAX and the nox sessions do; so does naming their file on
# the command line, or any `-m` expression.
_LEFT_OUT = ("methods", "slow")


def pytest_configure(config: pytest.Config) -> None:
    if "HYPOTHESIS_PROFILE" not in os.environ and _full_run(config):
        settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="also run the tests marked `methods` and `slow` (left out by default)",
    )


def _full_run(config: pytest.Config) -> bool:
    return bool(
        config.getoption("--full")
        or _flag_on("JAXINTERP_TEST_FULL")
        or config.getoption("markexpr", "")
    )


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files named on the command line (alone or in a node id)."""
    named = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.is_file():
            named.add(path.resolve())
    return named


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if _full_run(config):
        return
    named = _named_files(config)
    keep, left_out = [], []
    for item in items:
        marked = any(item.get_closest_marker(m) for m in _LEFT_OUT)
        named_here = Path(item.path).resolve() in named
        (left_out if marked and not named_here else keep).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    if _full_run(config):
        return "all tests selected (--full, JAXINTERP_TEST_FULL or -m)"
    return "tests marked `methods` or `slow` left out: `--full` runs them (conftest.py)"


@pytest.fixture(autouse=True)
def _add_doctest_namespace(doctest_namespace: dict) -> None:
    import jaxinterp

    doctest_namespace.update(
        jax=jax, jnp=jnp, np=np, jaxinterp=jaxinterp, stage=jaxinterp.stage
    )


_HIJAX_FLAGS = ("jax_custom_jvp3", "jax_custom_vjp3", "jax_remat3", "jax_scan3")


@pytest.fixture(autouse=True)
def _doctests_stage_as_jax_does_by_default(
    request: pytest.FixtureRequest,
) -> Iterator[None]:
    """Docstring examples show the equations JAX stages by default, so they run
    with the hijax future flags off even in the suite's flags-on run
    (`JAXINTERP_TEST_FUTURE_FLAGS=1`, tests/conftest.py)."""
    if not isinstance(request.node, DoctestItem):
        yield
        return
    before = {f: getattr(jax.config, f) for f in _HIJAX_FLAGS if hasattr(jax.config, f)}
    try:
        for flag in before:
            jax.config.update(flag, False)
        yield
    finally:
        for flag, value in before.items():
            jax.config.update(flag, value)
