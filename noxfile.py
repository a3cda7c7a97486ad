"""Developer sessions: tests, lint, typecheck, docs, examples, bench."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

# The JAX releases the suite is run on (see pyproject.toml for the range):
# the oldest supported, the newest on Python 3.11, and the newest (which needs
# Python >= 3.12). `.ci/run` runs the same three.
OLDEST_JAX = "0.7.0"
JAX_MATRIX = [("3.11", OLDEST_JAX), ("3.11", "0.10.2"), ("3.12", "0.12.0.1")]
PYTHONS = ["3.11", "3.12", "3.13"]
# Sessions that run code on both ends of the range: the oldest Python's newest
# JAX and the newest JAX.
ENDS = ["3.11", "3.12"]
# The whole suite (`--full`: with the tests marked `methods` and `slow`, which
# the README's command leaves out), spread over one pytest-xdist worker per core.
PYTEST = ("pytest", "-n", "auto", "--full")


@nox.session(python=PYTHONS)
@nox.parametrize("x64", [False, True], ids=["x32", "x64"])
def tests(session: nox.Session, x64: bool) -> None:
    """Run the test suite on the newest JAX this Python gets (optionally with x64)."""
    session.install("-e", ".[test]")
    env = {"JAX_ENABLE_X64": "1"} if x64 else {}
    session.run(*PYTEST, *session.posargs, env=env)


@nox.session(python=ENDS[-1:])
def multidevice(session: nox.Session) -> None:
    """The multi-device check matrix (8 simulated CPU devices)."""
    session.install("-e", ".[test]")
    session.run(
        *PYTEST,
        "tests/test_multidevice.py",
        *session.posargs,
        env={"JAXINTERP_TEST_MATRIX": "1"},
    )


@nox.session(python=ENDS[-1:])
def tests_future_flags(session: nox.Session) -> None:
    """The suite and gallery with JAX's hijax future-default flags on (newest JAX)."""
    session.install("-e", ".[test]")
    session.run(*PYTEST, *session.posargs, env={"JAXINTERP_TEST_FUTURE_FLAGS": "1"})


@nox.session
@nox.parametrize(
    "python, jax_version", JAX_MATRIX, ids=[f"jax{v}" for _, v in JAX_MATRIX]
)
def tests_jax(session: nox.Session, jax_version: str) -> None:
    """Run the test suite on one pinned JAX release (`nox -s tests_jax`: all)."""
    session.install("-e", ".[test]", f"jax=={jax_version}", f"jaxlib=={jax_version}")
    session.run(*PYTEST, *session.posargs)


@nox.session(python="3.11")
def tests_oldest_jax(session: nox.Session) -> None:
    """Run the test suite on the oldest supported JAX."""
    session.install("-e", ".[test]", f"jax=={OLDEST_JAX}", f"jaxlib=={OLDEST_JAX}")
    session.run(*PYTEST, *session.posargs)


@nox.session(python="3.11")
def hypothesis_dev(session: nox.Session) -> None:
    """Long property-based exploration (the `dev` hypothesis profile)."""
    session.install("-e", ".[test]")
    session.run(
        *PYTEST,
        "-k",
        "property or hypothesis",
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": "dev"},
    )


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy over the package."""
    session.install("-e", ".", "mypy")
    session.run("mypy", "jaxinterp")


@nox.session(python=ENDS)
def docs(session: nox.Session) -> None:
    """Build the documentation site in strict mode."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict")


@nox.session(python=ENDS)
def examples(session: nox.Session) -> None:
    """Run every gallery script."""
    session.install("-e", ".[dev]")
    for name in sorted(os.listdir("examples")):
        if name.endswith(".py") and not name.startswith("_"):
            session.run("python", os.path.join("examples", name))


@nox.session(python=ENDS)
def bench(session: nox.Session) -> None:
    """Run the benchmarks (each prints ratios against a reference), record
    their figures in `benchmarks/results/` and rewrite the tables of
    `docs/benchmarks.md` from them (`benchmarks/tables.py`). Options after
    `--` go to every script; with `--quick` nothing is recorded."""
    session.install("-e", ".")
    record = [] if "--quick" in session.posargs else ["--record"]
    for name in sorted(os.listdir("benchmarks")):
        if name.startswith("bench_") and name.endswith(".py"):
            session.run(
                "python", os.path.join("benchmarks", name), *record, *session.posargs
            )
    if record:
        session.run("python", "benchmarks/tables.py")


ECOSYSTEM = [("3.11", "0.10.2"), ("3.12", "0.12.0.1")]


@nox.session
@nox.parametrize(
    "python, jax_version", ECOSYSTEM, ids=[f"jax{v}" for _, v in ECOSYSTEM]
)
def ecosystem(session: nox.Session, jax_version: str) -> None:
    """Check flax, equinox, optax, diffrax and numpyro programs (see ecosystem/).

    Writes `.nox/ecosystem-jax<version>.json`; compare two releases with
    `python ecosystem/check.py --compare A.json B.json`.
    """
    minor = ".".join(jax_version.split(".")[:2])
    requirements = f"ecosystem/requirements-jax{jax_version}.txt"
    if not os.path.exists(requirements):
        requirements = f"ecosystem/requirements-jax{minor}.txt"
    session.install(f"jax=={jax_version}", f"jaxlib=={jax_version}")
    session.install("-r", requirements)
    session.install("--no-deps", "-e", ".")
    out = os.path.join(".nox", f"ecosystem-jax{jax_version}.json")
    session.run("python", "ecosystem/check.py", "--out", out, *session.posargs)


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """Long differential fuzzing of `inverse` (`-- --programs N --seed S`)."""
    session.install("-e", ".[test]")
    args = session.posargs or ["--programs", "10000", "--seed", "0"]
    session.run("python", "tests/fuzz_inverse_main.py", *args)


# Peer bijector libraries (`nox -s peers`): unpinned, so the newest releases
# that resolve against jaxinterp's JAX range. TFP is used only through its
# JAX substrate (`tensorflow_probability.substrates.jax`): no TensorFlow.
PEER_LIBRARIES = ["numpyro", "distrax", "tfp-nightly"]


@nox.session(python="3.12")
def peers(session: nox.Session) -> None:
    """Check `inverse` against NumPyro, distrax and TFP bijectors (tests/peers/).

    Writes `.nox/peers.json` and prints per-library, per-check and per-reason
    tables and every wrong answer (`-- --library tfp --only Softplus`, ...).
    Exits 0 with findings; `-- --fail-on-wrong` exits 1 on a wrong answer.
    """
    session.install("-e", ".", *PEER_LIBRARIES)
    out = os.path.join(".nox", "peers.json")
    session.run("python", "tests/peers/check_peers.py", "--out", out, *session.posargs)


@nox.session(python="3.12")
def bench_peers(session: nox.Session) -> None:
    """Time `inverse` against the peer libraries' own inverses
    (`benchmarks/peers_solver.py`): the cases it solves numerically, then
    those of the exact methods; record the figures and rewrite their tables
    in `docs/benchmarks.md`. Options after `--` replace the defaults
    (`-- --sizes 10000 --only Softsign`, nothing recorded). Not part of
    `nox -s bench`: it installs the peers."""
    session.install("-e", ".", *PEER_LIBRARIES)
    script = "benchmarks/peers_solver.py"
    if session.posargs:
        session.run("python", script, *session.posargs)
        return
    sizes = ["--sizes", "10000", "1000000", "--repeat", "10"]
    session.run("python", script, "--record", *sizes)
    exact = ["piecewise by intervals", "piecewise", "linear-fractional formula"]
    methods = [arg for m in exact for arg in ("--method", m)]
    session.run("python", script, "--record", *sizes, *methods)
    session.run("python", "benchmarks/tables.py")
