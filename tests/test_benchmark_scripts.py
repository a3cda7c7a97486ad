"""The benchmark scripts run: `nox -s bench` is outside the suite, and the
tracing section of `benchmarks/bench_inverse.py` twice stopped with an
`AttributeError` after an internal rename, unnoticed for sessions. Each
section here runs at its `--quick` size in a fresh process and must print
its figures."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize(
    "section, lines",
    [
        ("tracing", ["chain of 1000 equations: ratio", "wide graph", "first call"]),
        (
            "blocks",
            [
                "piecewise, linear-fractional cases (softsign)",
                "elementwise solve (softsign as",
                "piecewise (leaky ReLU)",
            ],
        ),
        (
            "compile",
            [
                "spline, parameters closed over: compile",
                "spline, parameters as arguments: compile",
                "spline, parameters as arguments: time ratio",
            ],
        ),
        ("runtime", ["new a each call, 1000 elements", "same a each call"]),
    ],
)
def test_bench_inverse_section_runs(section, lines):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_inverse.py", "--quick", "--only", section],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for line in lines:
        assert line in run.stdout, run.stdout
