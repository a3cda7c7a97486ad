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
    inverting the body.

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
        self._trees: dict[Any, tuple[Any, Any]] = {}

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
        if key not in self._trees:
            self._trees[key] = (in_tree, jtu.tree_structure(out))
        return out

    # ------------------------------------------------------------------

    def solve(self, outvals: Sequence[Any], invals: Sequence[Any], body: Any) -> Any:
        """The inverse rule for the marker `jit`; `None` if it does not apply."""
        if self.inverse_fn is None:
            return None
        key = tuple((v.aval.shape, v.aval.dtype) for v in body.jaxpr.invars)
        trees = self._trees.get(key)
        if trees is None or any(o is None for o in outvals):
            return None
        in_tree, out_tree = trees
        arg_trees = in_tree.children()
        n_args = len(arg_trees)
        bounds = list(itertools.accumulate(t.num_leaves for t in arg_trees))
        starts = [0, *bounds[:-1]]
        args_leaves = [list(invals[s:e]) for s, e in zip(starts, bounds, strict=True)]
        unknown = [i in self.argnums for i in range(n_args)]
        for leaves, u in zip(args_leaves, unknown, strict=True):
            if any((x is None) != u for x in leaves):
                return None
        known_args = [
            jtu.tree_unflatten(t, leaves)
            for t, leaves, u in zip(arg_trees, args_leaves, unknown, strict=True)
            if not u
        ]
        y = jtu.tree_unflatten(out_tree, list(outvals))
        inverse_fn = self.inverse_fn
        x = inverse_fn(y, *known_args)
        xs = (x,) if len(self.argnums) == 1 else tuple(x)
        if self.ildj_fn is not None:
            ildj = self.ildj_fn(y, *known_args)
        else:
            flat_y, unravel = ravel_pytree(y)

            def flat_inverse(t: Any) -> Any:
                return ravel_pytree(inverse_fn(unravel(t), *known_args))[0]

            jac = jax.jacfwd(flat_inverse)(flat_y)
            ildj = jnp.linalg.slogdet(jac)[1]
        solved = list(invals)
        x_it = iter(xs)
        for i, (s, e) in enumerate(zip(starts, bounds, strict=True)):
            if unknown[i]:
                solved[s:e] = jtu.tree_leaves(next(x_it))
        return solved, ildj


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
