"""`custom_inverse`: user-given inverses for functions the rules cannot invert."""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.flatten_util import ravel_pytree

from .. import _jax_compat as compat
from .._custom_types import PyTree
from .._errors import StagingError

_registry: weakref.WeakValueDictionary[str, custom_inverse] = (
    weakref.WeakValueDictionary()
)
_counter = itertools.count()
_lock = threading.Lock()


class custom_inverse:  # noqa: N801 - named like jax.custom_jvp, a decorator
    """Decorate a function so `inverse` uses an inverse you give.

    The decorated function computes exactly what `fn` computes, with the
    same gradients; it is staged as a `jit` named after it, so the marker
    survives `jax.jit`, `jax.vmap`, `lax.scan` and nesting inside other
    functions. When `inverse` meets it, it calls your inverse instead of
    inverting the body. Write the inverse for the shapes you call `fn` with:
    under `inverse(jax.vmap(fn))` it is vmapped over the same batch axes
    (recorded when the batched `fn` was traced) and its ildj summed over the
    batch.

    Args:
        fn: the function.
        argnums: the positional arguments the inverse recovers (the others are
            known, like parameters); default `0`.

    Example:
        >>> @custom_inverse
        ... def cube_root_ish(x):
        ...     return jnp.sign(x) * jnp.abs(x) ** (1 / 3)
        >>> @cube_root_ish.def_inverse
        ... def _(y):
        ...     return y**3
        >>> y = cube_root_ish(jnp.array([-8.0, 27.0]))
        >>> print(jaxinterp.inverse(cube_root_ish)(y).round(2))
        [-8. 27.]
    """

    def __init__(self, fn: Callable[..., Any], argnums: int | Sequence[int] = 0):
        if not callable(fn):
            raise StagingError(
                f"`custom_inverse` expects a callable, got {type(fn).__name__}."
            )
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        self.inverse_fn: Callable[..., Any] | None = None
        self.ildj_fn: Callable[..., Any] | None = None
        base = getattr(fn, "__name__", "fn")
        with _lock:
            self.marker = f"{base}__custom_inverse_{next(_counter)}"
            _registry[self.marker] = self
        # Per input leaf types: (input pytree, output pytree, output leaf types,
        # the `vmap` layouts it was called under: see `_vmap_layout`).
        self._trees: dict[Any, tuple[Any, Any, Any, set[Any]]] = {}

        def body(*args: Any) -> Any:
            return fn(*args)

        body.__name__ = body.__qualname__ = self.marker
        self._jitted = jax.jit(body)

    def def_inverse(
        self,
        inverse_fn: Callable[..., Any],
        ildj: Callable[..., Any] | None = None,
    ) -> Callable[..., Any]:
        """Set the inverse: `inverse_fn(y, *known_args) -> x` (a tuple if several).

        Args:
            inverse_fn: computes the unknown arguments from the output `y` and
                the known arguments, in order.
            ildj: optional `ildj(y, *known_args) -> scalar`, the
                log-det-Jacobian of `inverse_fn` in `y`; by default computed
                with `jax.jacfwd` and `slogdet`.

        Returns:
            `inverse_fn`, so this can be used as a decorator.
        """
        self.inverse_fn = inverse_fn
        if ildj is not None:
            self.ildj_fn = ildj
        return inverse_fn

    def def_ildj(self, ildj: Callable[..., Any]) -> Callable[..., Any]:
        """Set `ildj(y, *known_args) -> scalar`; usable as a decorator."""
        self.ildj_fn = ildj
        return ildj

    def __call__(self, *args: Any, **kwargs: Any) -> PyTree:
        if kwargs:
            raise StagingError(
                f"`{self.marker}`: functions with a custom inverse take positional "
                "arguments only."
            )
        leaves, in_tree = jtu.tree_flatten(args)
        key = tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves)
        out = self._jitted(*args)
        out_leaves, out_tree = jtu.tree_flatten(out)
        layout = _vmap_layout(leaves, out_leaves)
        known = self._trees.get(key)
        if known is None:
            out_types = tuple((jnp.shape(y), jnp.result_type(y)) for y in out_leaves)
            known = self._trees.setdefault(key, (in_tree, out_tree, out_types, set()))
        if layout is not None:
            known[3].add(layout)
        return out

    # ------------------------------------------------------------------

    def solve(
        self, outvals: Sequence[Any], invals: Sequence[Any], body: compat.ClosedJaxpr
    ) -> Any:
        """The inverse rule for the marker `jit`; `None` if it does not apply.

        The marker `jit` has the shapes `fn` was called with or, under
        `jax.vmap` (nested or not), those shapes with batch axes inserted where
        `vmap` put them, as recorded when `fn` was called. The inverse is then
        vmapped the same way and the ildj summed over the batch (the Jacobian
        is block diagonal). If no recorded call explains the shapes, the rule
        does not apply and the body is inverted as usual.
        """
        if self.inverse_fn is None or any(o is None for o in outvals):
            return None
        ins = [_shape_dtype(v) for v in body.jaxpr.invars]
        outs = [_shape_dtype(v) for v in body.jaxpr.outvars]
        match = self._match(ins, outs)
        if match is None:
            return None
        (in_tree, out_tree), (in_dims, out_dims) = match
        arg_trees = in_tree.children()
        n_args = len(arg_trees)
        bounds = list(itertools.accumulate(t.num_leaves for t in arg_trees))
        starts = [0, *bounds[:-1]]
        unknown = [i in self.argnums for i in range(n_args)]
        for i, (s, e) in enumerate(zip(starts, bounds, strict=True)):
            if any((x is None) != unknown[i] for x in invals[s:e]):
                return None
        known_pos = [
            k
            for i, (s, e) in enumerate(zip(starts, bounds, strict=True))
            if not unknown[i]
            for k in range(s, e)
        ]
        known_set = set(known_pos)
        unknown_pos = [k for k in range(len(invals)) if k not in known_set]

        def invert(y_leaves: Sequence[Any], known_leaves: Sequence[Any]) -> Any:
            """Per example: the unknown leaves and the ildj."""
            leaves: list[Any] = [None] * len(invals)
            for k, val in zip(known_pos, known_leaves, strict=True):
                leaves[k] = val
            known_args = [
                jtu.tree_unflatten(t, leaves[s:e])
                for t, s, e, u in zip(arg_trees, starts, bounds, unknown, strict=True)
                if not u
            ]
            y = jtu.tree_unflatten(out_tree, list(y_leaves))
            xs, ildj = self._invert(y, known_args)
            return jtu.tree_leaves(xs), ildj

        y_leaves = list(outvals)
        known_leaves = [invals[k] for k in known_pos]
        n_levels = max(map(len, [*in_dims, *out_dims]), default=0)
        if n_levels == 0:
            x_leaves, ildj = invert(y_leaves, known_leaves)
        else:
            if any(len(in_dims[k]) != n_levels for k in unknown_pos):
                return None  # an unbatched unknown cannot come out of the batch
            batched = invert
            for level in range(n_levels):  # innermost `vmap` first
                batched = jax.vmap(
                    batched,
                    in_axes=(
                        [d[level] if d else None for d in out_dims],
                        [in_dims[k][level] if in_dims[k] else None for k in known_pos],
                    ),
                    out_axes=([in_dims[k][level] for k in unknown_pos], 0),
                )
            x_leaves, ildjs = batched(y_leaves, known_leaves)
            ildj = jnp.sum(ildjs)
        solved = list(invals)
        for k, val in zip(unknown_pos, x_leaves, strict=True):
            solved[k] = val
        return solved, ildj

    def _match(self, ins: list[Any], outs: list[Any]) -> Any:
        """The pytrees `fn` was called with and the `vmap` layout that give
        these leaf types, or `None` if no recorded call explains them."""
        for key, (in_tree, out_tree, out_types, layouts) in list(self._trees.items()):
            if len(key) != len(ins) or len(out_types) != len(outs):
                continue
            for in_dims, out_dims in list(layouts):
                sizes: dict[int, int] = {}
                if _explains(ins, key, in_dims, sizes) and _explains(
                    outs, out_types, out_dims, sizes
                ):
                    return (in_tree, out_tree), (in_dims, out_dims)
        return None

    def _invert(self, y: Any, known_args: list[Any]) -> tuple[tuple[Any, ...], Any]:
        """The unknown arguments from `y`, and the ildj of the inverse at `y`."""
        inverse_fn = self.inverse_fn
        assert inverse_fn is not None
        x = inverse_fn(y, *known_args)
        xs = (x,) if len(self.argnums) == 1 else tuple(x)
        if self.ildj_fn is not None:
            return xs, self.ildj_fn(y, *known_args)
        flat_y, unravel = ravel_pytree(y)

        def flat_inverse(t: Any) -> Any:
            return ravel_pytree(inverse_fn(unravel(t), *known_args))[0]

        jac = jax.jacfwd(flat_inverse)(flat_y)
        return xs, jnp.linalg.slogdet(jac)[1]


def _vmap_layout(in_leaves: Sequence[Any], out_leaves: Sequence[Any]) -> Any:
    """Where `jax.vmap` put batch axes on a call's leaves, or `None` if unsure.

    Per leaf, the batch axis of each `vmap` level, innermost first, or `()`
    for a leaf no level batches. Only layouts where each leaf is batched by
    every level or by none are kept (levels then line up across leaves).
    """
    levels = [compat.vmap_levels(x) for x in [*in_leaves, *out_leaves]]
    if any(lv is None for lv in levels):
        return None
    traces = max((tuple(t for t, _ in lv) for lv in levels if lv), key=len, default=())
    dims = []
    for lv in levels:
        assert lv is not None
        if lv and tuple(t for t, _ in lv) != traces:
            return None
        dims.append(tuple(d for _, d in lv))
    n_in = len(in_leaves)
    return tuple(dims[:n_in]), tuple(dims[n_in:])


def _explains(
    types: Sequence[Any],
    example: Sequence[Any],
    dims: Sequence[tuple[int, ...]],
    sizes: dict[int, int],
) -> bool:
    """Whether inserting each leaf's batch axes (`dims`, innermost level first)
    into the example's shapes gives `types`, with one size per level."""
    for (shape, dtype), (ex_shape, ex_dtype), leaf_dims in zip(
        types, example, dims, strict=True
    ):
        if dtype != ex_dtype or len(shape) != len(ex_shape) + len(leaf_dims):
            return False
        axes: list[Any] = [("example", d) for d in ex_shape]
        for level, axis in enumerate(leaf_dims):
            if not 0 <= axis <= len(axes):
                return False
            axes.insert(axis, ("batch", level))
        for (kind, value), size in zip(axes, shape, strict=True):
            if kind == "example" and value != size:
                return False
            if kind == "batch" and sizes.setdefault(value, size) != size:
                return False
    return True


def custom_inverse_rule(name: str) -> Callable[..., Any] | None:
    """Return the rule for a `jit` named `name` if it marks a `custom_inverse`."""
    if "__custom_inverse_" not in name:
        return None
    target = _registry.get(name)
    if target is None:
        return None

    def rule(outvals: Sequence[Any], invals: Sequence[Any], p: Any) -> Any:
        return target.solve(outvals, invals, p.jaxpr)

    return rule


def _shape_dtype(v: Any) -> tuple[Any, Any]:
    aval: Any = v.aval  # (a shaped value: typed as `AbstractValue`)
    return aval.shape, aval.dtype
