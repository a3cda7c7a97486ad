"""Shared test configuration: hypothesis profiles and doctest namespace."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
