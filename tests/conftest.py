"""Suite-wide settings.

`JAXINTERP_TEST_FUTURE_FLAGS=1` runs the whole suite with JAX's opt-in future
defaults on (`jax_custom_jvp3`, `jax_custom_vjp3`, `jax_remat3`,
`jax_scan3`, JAX >= 0.11): `custom_jvp`, `custom_vjp`, `checkpoint` and `scan`
then stage as hijax `call_hi_primitive` equations and mutable references. The
flags are also exported as JAX's own environment variables, so the gallery
scripts and other subprocesses the tests start run with them too.
"""

from __future__ import annotations

import os

import jax
import pytest
from helpers import FUTURE_FLAGS, future_flags_available

FUTURE_FLAGS_ON = os.environ.get("JAXINTERP_TEST_FUTURE_FLAGS", "") not in ("", "0")

if FUTURE_FLAGS_ON:
    if not future_flags_available():
        raise pytest.UsageError(
            "JAXINTERP_TEST_FUTURE_FLAGS=1 needs JAX >= 0.11 (the hijax flags); "
            f"JAX {jax.__version__} is installed."
        )
    for _flag in FUTURE_FLAGS:
        jax.config.update(_flag, True)
        os.environ[_flag.upper()] = "1"


def pytest_report_header(config: pytest.Config) -> str:
    state = "on" if FUTURE_FLAGS_ON else "off"
    return f"JAX {jax.__version__}; hijax future-default flags {state}"


def future_flags_skip(reason: str) -> None:
    """Skip the calling test when the future flags are on, printing why."""
    if FUTURE_FLAGS_ON:
        print(f"skipped under JAXINTERP_TEST_FUTURE_FLAGS: {reason}")
        pytest.skip(f"future flags: {reason}")
