"""Test helpers: compare a transformed function with a reference, under JAX transforms.

Every transformation's tests use `compare_with_reference`: it checks a function
eagerly, under `jax.jit`, under `jax.vmap` (against a Python loop of the
reference) and, for float outputs, under `jax.grad`, with tolerances chosen
from each leaf's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._custom_types import PyTree

__all__ = ["compare_with_reference", "default_tolerance", "tree_allclose"]


def default_tolerance(dtype: Any) -> tuple[float, float]:
    """Return `(rtol, atol)` suited to comparing values of `dtype`.

    Exact (`0, 0`) for integers, booleans and PRNG keys.
    """
    dtype = np.dtype(dtype) if not _is_key_dtype(dtype) else dtype
    if _is_key_dtype(dtype) or not jnp.issubdtype(dtype, jnp.inexact):
        return 0.0, 0.0
    bits = jnp.finfo(dtype).bits
    if bits <= 16:
        return 2e-2, 2e-2
    if bits == 32 or (jnp.issubdtype(dtype, jnp.complexfloating) and bits == 64):
        return 2e-5, 1e-5
    return 1e-10, 1e-12


def _is_key_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def tree_allclose(
    actual: PyTree,
    expected: PyTree,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    what: str = "result",
) -> None:
    """Assert two pytrees have the same structure, shapes, dtypes and close values.

    Args:
        actual: the value under test.
        expected: the reference value.
        rtol: relative tolerance; by default from each leaf's dtype.
        atol: absolute tolerance; by default from each leaf's dtype.
        what: a name for the compared values, used in failure messages.

    Raises:
        AssertionError: describing the first mismatch.
    """
    a_leaves, a_tree = jtu.tree_flatten(actual)
    e_leaves, e_tree = jtu.tree_flatten(expected)
    if cast(Any, a_tree) != e_tree:  # the stubs' `PyTreeDef` lacks `__ne__`
        raise AssertionError(f"{what}: structure {a_tree} != expected {e_tree}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        a_dtype, e_dtype = jnp.result_type(a), jnp.result_type(e)
        if a_dtype != e_dtype:
            raise AssertionError(f"{what} leaf {i}: dtype {a_dtype} != {e_dtype}")
        if jnp.shape(a) != jnp.shape(e):
            raise AssertionError(
                f"{what} leaf {i}: shape {jnp.shape(a)} != {jnp.shape(e)}"
            )
        if _is_key_dtype(a_dtype):
            a, e = jax.random.key_data(a), jax.random.key_data(e)
        d_rtol, d_atol = default_tolerance(a_dtype)
        r = d_rtol if rtol is None else rtol
        t = d_atol if atol is None else atol
        a_np = np.asarray(a.astype(jnp.float32) if a_dtype == jnp.bfloat16 else a)
        e_np = np.asarray(e.astype(jnp.float32) if e_dtype == jnp.bfloat16 else e)
        np.testing.assert_allclose(
            a_np, e_np, rtol=r, atol=t, equal_nan=True, err_msg=f"{what} leaf {i}"
        )


def _is_float(x: Any) -> bool:
    dtype = jnp.result_type(x)
    return not _is_key_dtype(dtype) and jnp.issubdtype(dtype, jnp.floating)


def _float_sum(tree: PyTree) -> Any:
    """A scalar that depends on every float leaf (weighted to avoid symmetry)."""
    total = jnp.zeros((), jnp.float32)
    for i, leaf in enumerate(jtu.tree_leaves(tree)):
        if _is_float(leaf):
            weights = 1.0 + 0.1 * jnp.arange(jnp.size(leaf), dtype=jnp.float32)
            flat = jnp.reshape(leaf, (-1,)).astype(jnp.float32)
            total = total + (i + 1) * jnp.sum(flat * weights)
    return total


def compare_with_reference(
    transformed: Callable[..., Any],
    reference: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    check_jit: bool = True,
    check_vmap: bool = True,
    check_grad: bool = True,
    vmap_args: Sequence[Any] | None = None,
    compiled: bool = False,
) -> None:
    """Check `transformed` against `reference` eagerly and under JAX transformations.

    * eager: `transformed(*args, **kwargs)` equals `reference(*args, **kwargs)`;
    * `jax.jit(transformed)` equals the reference;
    * `jax.vmap(transformed)` over a batch equals a Python loop of the
      reference over the same batch (by default, `args` stacked with a
      scaled copy of itself);
    * if any output and any positional argument are floating point,
      `jax.grad` of a weighted sum of the float outputs with respect to the
      float arguments equals the reference's gradient.

    Tolerances default to `default_tolerance` of each leaf's dtype.

    Args:
        transformed: the function under test.
        reference: a function computing the expected results another way.
        args: positional arguments (pytrees).
        kwargs: keyword arguments, passed unchanged (not batched or
            differentiated).
        rtol: relative tolerance overriding the dtype defaults.
        atol: absolute tolerance overriding the dtype defaults.
        check_jit: run the `jax.jit` check.
        check_vmap: run the `jax.vmap` check.
        check_grad: run the `jax.grad` check.
        vmap_args: the batched arguments for the `vmap` check (each leaf with
            a leading batch axis); by default built from `args`.
        compiled: run the `vmap` and `grad` checks under `jax.jit`
            (`jax.jit(jax.vmap(transformed))`): one compilation instead of
            dispatching every step of a long program on its own, for
            programs with hundreds of steps. Values under `vmap` and `grad`
            are tracers either way; eagerly, `grad`'s also carry their
            concrete primal values.

    Raises:
        AssertionError: on the first mismatch, naming the check.
    """
    kwargs = dict(kwargs or {})
    args = tuple(args)
    tol = {"rtol": rtol, "atol": atol}
    expected = reference(*args, **kwargs)
    tree_allclose(transformed(*args, **kwargs), expected, what="eager", **tol)

    if check_jit:
        jitted = jax.jit(lambda *a: transformed(*a, **kwargs))
        tree_allclose(jitted(*args), expected, what="jit", **tol)

    if check_vmap and jtu.tree_leaves(args):
        batch = tuple(vmap_args) if vmap_args is not None else _default_batch(args)
        size = jtu.tree_leaves(batch)[0].shape[0]
        batched = jax.vmap(lambda *a: transformed(*a, **kwargs))
        got = (jax.jit(batched) if compiled else batched)(*batch)
        loop = [
            reference(*jtu.tree_map(lambda x, i=i: x[i], batch), **kwargs)
            for i in range(size)
        ]
        want = jtu.tree_map(lambda *xs: jnp.stack(xs), *loop)
        tree_allclose(got, want, what="vmap", **tol)

    if check_grad:
        _check_grad(transformed, reference, args, kwargs, expected, tol, compiled)


def _default_batch(args: tuple[Any, ...]) -> tuple[Any, ...]:
    def stack(x: Any) -> Any:
        x = jnp.asarray(x)
        if _is_float(x):
            return jnp.stack([x, x * 0.5])
        return jnp.stack([x, x])

    return jtu.tree_map(stack, args)


def _check_grad(
    transformed: Callable[..., Any],
    reference: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    expected: PyTree,
    tol: dict[str, float | None],
    compiled: bool = False,
) -> None:
    if not any(_is_float(leaf) for leaf in jtu.tree_leaves(expected)):
        return
    leaves, tree = jtu.tree_flatten(args)
    float_idx = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]
    if not float_idx:
        return

    def scalar(fn: Callable[..., Any]) -> Callable[..., Any]:
        def loss(float_leaves: list[Any]) -> Any:
            full = list(leaves)
            for i, leaf in zip(float_idx, float_leaves, strict=True):
                full[i] = leaf
            return _float_sum(fn(*jtu.tree_unflatten(tree, full), **kwargs))

        return loss

    primals = [jnp.asarray(leaves[i]) for i in float_idx]
    grad = jax.grad(scalar(transformed))
    got = (jax.jit(grad) if compiled else grad)(primals)
    want = jax.grad(scalar(reference))(primals)
    rtol = tol["rtol"]
    atol = tol["atol"]
    tree_allclose(
        got,
        want,
        rtol=None if rtol is None else max(rtol, 1e-5),
        atol=None if atol is None else max(atol, 1e-6),
        what="grad",
    )
