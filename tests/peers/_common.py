"""What the peer-library case lists share: the `Case` record and domain samplers.

A case is one bijector instance of one library: its forward map `x -> y`,
the library's own inverse `y -> x` and inverse log-det-Jacobian `y -> scalar`
(summed over every element, whatever the library's event dims), and a
sampler of points `x` in the bijector's domain. Nothing here imports the peer
libraries; each `cases_*.py` module does, inside its `cases()` function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any  # nested tuples/lists/dicts of arrays
Sampler = Callable[[np.random.Generator], PyTree]


@dataclasses.dataclass
class Case:
    """One bijector instance, with the library's own inverse and ildj.

    `square` is False when the domain or codomain is a constrained manifold
    (a simplex, triangular or symmetric matrices, a sphere) or the dimension
    changes: the library's log-det then follows its own parametrization, which
    a flattened Jacobian does not reproduce, so an ildj that differs is
    reported as `n/a`, not as wrong.
    """

    library: str
    name: str
    forward: Callable[[PyTree], PyTree]
    inverse: Callable[[PyTree], PyTree] | None
    ildj: Callable[[PyTree], Any] | None
    sample: Sampler
    square: bool = True
    note: str = ""


def unavailable(library: str, name: str, error: BaseException) -> Case:
    """A case whose construction failed in the library: every check skips."""

    def forward(x: PyTree) -> PyTree:
        raise RuntimeError(f"the library could not build it: {error!r}")

    return Case(library, name, forward, None, None, real(1))


def sum_leaves(tree: PyTree) -> jax.Array:
    """The sum of every element of every leaf (a scalar)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return sum((jnp.sum(leaf) for leaf in leaves), jnp.zeros((), jnp.float32))


def _f32(a: Any) -> jax.Array:
    return jnp.asarray(np.asarray(a, dtype=np.float32))


# --- samplers: each returns `rng -> x` -------------------------------------


def real(*shape: int, low: float = -2.0, high: float = 2.0) -> Sampler:
    return lambda rng: _f32(rng.uniform(low, high, shape))


def positive(*shape: int, low: float = 0.2, high: float = 3.0) -> Sampler:
    return real(*shape, low=low, high=high)


def unit(*shape: int, low: float = 0.05, high: float = 0.95) -> Sampler:
    return real(*shape, low=low, high=high)


def simplex(n: int) -> Sampler:
    return lambda rng: _f32(rng.dirichlet(np.full(n, 2.0)))


def ordered(n: int, low: float = -2.0) -> Sampler:
    return lambda rng: _f32(low + np.cumsum(rng.uniform(0.2, 1.0, n)))


def positive_ordered(n: int) -> Sampler:
    return ordered(n, low=0.0)


def _pd(rng: np.random.Generator, n: int) -> np.ndarray:
    a = rng.normal(size=(n, n))
    return a @ a.T + n * np.eye(n)


def positive_definite(n: int) -> Sampler:
    return lambda rng: _f32(_pd(rng, n))


def lower_cholesky(n: int) -> Sampler:
    return lambda rng: _f32(np.linalg.cholesky(_pd(rng, n)))


def unit_lower(n: int) -> Sampler:
    def sample(rng: np.random.Generator) -> jax.Array:
        return _f32(np.tril(rng.uniform(-1, 1, (n, n)), -1) + np.eye(n))

    return sample


def _corr(rng: np.random.Generator, n: int) -> np.ndarray:
    c = _pd(rng, n)
    d = np.sqrt(np.diag(c))
    return c / np.outer(d, d)


def corr_matrix(n: int) -> Sampler:
    return lambda rng: _f32(_corr(rng, n))


def corr_cholesky(n: int) -> Sampler:
    return lambda rng: _f32(np.linalg.cholesky(_corr(rng, n)))


def l1_ball(n: int) -> Sampler:
    def sample(rng: np.random.Generator) -> jax.Array:
        v = rng.uniform(-1, 1, n)
        return _f32(v / np.abs(v).sum() * rng.uniform(0.2, 0.9))

    return sample


def zero_sum(n: int) -> Sampler:
    def sample(rng: np.random.Generator) -> jax.Array:
        v = rng.uniform(-2, 2, n)
        return _f32(v - v.mean())

    return sample


def unit_vector(n: int) -> Sampler:
    def sample(rng: np.random.Generator) -> jax.Array:
        v = rng.normal(size=n)
        v[-1] = abs(v[-1]) + 0.5  # away from the pole the inverse is singular at
        return _f32(v / np.linalg.norm(v))

    return sample


def invertible_lower(n: int) -> Sampler:
    def sample(rng: np.random.Generator) -> jax.Array:
        low = np.tril(rng.uniform(-1, 1, (n, n)), -1)
        return _f32(low + np.diag(rng.uniform(0.5, 2.0, n)))

    return sample


def tree(**samplers: Sampler) -> Sampler:
    return lambda rng: {k: s(rng) for k, s in samplers.items()}


def seq(*samplers: Sampler) -> Sampler:
    return lambda rng: [s(rng) for s in samplers]


# --- parameters --------------------------------------------------------------


def params_rng(name: str) -> np.random.Generator:
    """A generator for a case's parameters that depends only on its name."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(name)) % (2**31)
    return np.random.default_rng(seed)


def well_conditioned(n: int, rng: np.random.Generator) -> jax.Array:
    return _f32(np.eye(n) * 1.5 + 0.3 * rng.uniform(-1, 1, (n, n)))


def fmt(value: Any) -> str:
    """A short text for a parameter value in a case name."""
    if isinstance(value, (int, float, str, bool)):
        return repr(value)
    arr = np.asarray(value)
    if arr.size <= 4:
        return np.array2string(arr, precision=3, separator=",").replace("\n", "")
    return f"{arr.dtype}{list(arr.shape)}"
