"""Shared test configuration: hypothesis profiles and doctest namespace."""

from __future__ import annotations

import os
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pytest.doctest import DoctestItem
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
