"""Front end: stage a Python function into a `ClosedJaxpr` and remember its pytrees."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from . import _caches, _jax_compat as compat, _recursion
from ._custom_types import PyTree
from ._errors import StagingError, describe_aval, describe_value

# Staged signatures kept per function; the oldest is dropped past this.
_PER_FUNCTION_CACHE_SIZE = 64
# Functions that cannot be weakly referenced share one bounded cache.
_STRONG_CACHE_SIZE = 128
# How many functions' caches are kept (each dies with its function anyway).
_FUNCTIONS_CACHE_SIZE = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class Staged:
    """A function staged for one signature: its Jaxpr and pytree structures.

    Attributes:
        closed_jaxpr: the `ClosedJaxpr`; its invars are the flattened
            `(args, kwargs)` leaves with static arguments removed.
        in_tree: the `PyTreeDef` of `(dynamic_args, kwargs)`.
        out_tree: the `PyTreeDef` of the result.
        in_avals: the abstract values of the flat inputs.
        out_avals: the abstract values of the flat outputs.
        static_argnums: the positions of the static positional arguments.
        static_args: their values, in `static_argnums` order.
        fn_name: the staged function's name, for messages.
        nesting: how deep sub-Jaxprs (of `jit`, `scan`...) nest, 0 for none.
    """

    closed_jaxpr: compat.ClosedJaxpr
    in_tree: Any
    out_tree: Any
    in_avals: tuple[Any, ...]
    out_avals: tuple[Any, ...]
    static_argnums: tuple[int, ...] = ()
    static_args: tuple[Any, ...] = ()
    fn_name: str = "<function>"
    nesting: int = 0

    @property
    def jaxpr(self) -> Any:
        """The open `Jaxpr` of `closed_jaxpr`."""
        return compat.open_jaxpr(self.closed_jaxpr)

    @property
    def consts(self) -> Sequence[Any]:
        """The values of the Jaxpr's constvars (closed-over arrays)."""
        return compat.jaxpr_consts(self.closed_jaxpr)

    def flatten_args(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Flatten a call's dynamic arguments, checking them against the staging.

        Static arguments (those at `static_argnums`) must be left out.

        Raises:
            StagingError: if the pytree structure or an abstract value differs
                from what was staged.
        """
        leaves, in_tree = jtu.tree_flatten((args, kwargs))
        if in_tree != self.in_tree:
            raise StagingError(
                f"`{self.fn_name}` was staged for arguments with structure\n"
                f"  {self.in_tree}\nbut was called with\n  {in_tree}.\n"
                "Stage it again for the new structure with `jaxinterp.stage`."
            )
        for i, (leaf, aval) in enumerate(zip(leaves, self.in_avals, strict=True)):
            got = compat.aval_of(leaf)
            if got.shape != aval.shape or got.dtype != aval.dtype:
                raise StagingError(
                    f"`{self.fn_name}` was staged with {_leaf_name(args, kwargs, i)} "
                    f"of type {describe_aval(aval)} but was called with "
                    f"{describe_value(leaf)}.\n"
                    "Stage it again for the new types with `jaxinterp.stage`."
                )
        return leaves

    def unflatten_out(self, flat_out: Sequence[Any]) -> PyTree:
        """Rebuild the result pytree from flat outputs."""
        return jtu.tree_unflatten(self.out_tree, list(flat_out))


def _leaf_name(args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> str:
    """Spell the path of flat leaf `index` of `(args, kwargs)`, as `args[1]['a']`."""
    path, _ = jtu.tree_flatten_with_path((args, kwargs))[0][index]
    head = "args" if getattr(path[0], "idx", 0) == 0 else "kwargs"
    return f"{head}{jtu.keystr(tuple(path[1:]))}"


# -------------------------------------------------------------------------
# The staging cache.


# Per function that can be weakly referenced, an LRU of its signatures,
# dying with the function; others share one LRU keyed by the function too.
_weak_cache = _caches.Cache(_FUNCTIONS_CACHE_SIZE, weak=True)
_strong_cache = _caches.Cache(_STRONG_CACHE_SIZE)
_cache_lock = threading.Lock()


def _cache_for(fn: Callable[..., Any]) -> tuple[_caches.Cache | None, Any]:
    """Return the cache that holds `fn`'s staged signatures and `fn`'s key part.

    Functions that can be weakly referenced get their own LRU, which dies with
    them. Others share a bounded LRU keyed by the function itself; an
    unhashable one is not cached at all.
    """
    try:
        lru = _weak_cache.get(fn)  # (lock-free: a dict read is atomic)
        if lru is None:
            with _cache_lock:
                lru = _weak_cache.get(fn)
                if lru is None:
                    lru = _weak_cache.put(
                        fn, _caches.Cache(_PER_FUNCTION_CACHE_SIZE, register=False)
                    )
        return lru, None
    except TypeError:  # not weakly referenceable, or unhashable
        pass
    try:
        hash(fn)
    except TypeError:
        return None, None
    return _strong_cache, fn


def cache_size(fn: Callable[..., Any]) -> int:
    """Return how many signatures of `fn` are cached."""
    try:
        lru = _weak_cache.get(fn)
    except TypeError:
        return 0
    return len(lru) if lru is not None else 0


# -------------------------------------------------------------------------
# Staging.


def normalize_argnums(
    argnums: int | Sequence[int], nargs: int, *, what: str = "static_argnums"
) -> tuple[int, ...]:
    """Sorted, de-duplicated non-negative positions for `argnums` among `nargs`.

    Raises:
        StagingError: naming `what` if a position is out of range.
    """
    if isinstance(argnums, int):
        argnums = (argnums,)
    out = []
    for i in argnums:
        j = i + nargs if i < 0 else i
        if not 0 <= j < nargs:
            raise StagingError(
                f"{what}={tuple(argnums)} is out of range for a call with "
                f"{nargs} positional arguments."
            )
        out.append(j)
    return tuple(sorted(set(out)))


def spec_of(aval: Any) -> Any:
    """What `jax.make_jaxpr` stages an argument of type `aval` from.

    Every attribute of the type is kept: weak type, the sharding of an array
    on a mesh with explicit axes, the varying manual axes of a value in a
    `shard_map` body, the memory space; the type of a mutable reference
    (`jax.new_ref`) stays a reference (see `compat.staging_spec`).
    """
    return compat.staging_spec(aval)


def _fn_name(fn: Any) -> str:
    return str(
        getattr(fn, "__qualname__", None)
        or getattr(fn, "__name__", None)
        or type(fn).__name__
    )


def check_callable(fn: Any, transform: str) -> None:
    """Raise a `TypeError` naming `transform` if `fn` is not callable."""
    if not callable(fn):
        raise StagingError(
            f"`{transform}` expects a callable, got {type(fn).__name__}: {fn!r}."
        )


def stage(
    fn: Callable[..., Any],
    *args: Any,
    static_argnums: int | Sequence[int] = (),
    **kwargs: Any,
) -> Staged:
    """Stage `fn` for the given arguments into a `Staged` Jaxpr, cached per signature.

    Arguments and results may be any pytrees; keyword arguments are traced
    like positional ones. Closed-over arrays become the Jaxpr's consts, and
    Python scalars keep JAX's weak typing. Arguments may be arrays or
    `jax.ShapeDtypeStruct`s.

    The Jaxpr's inputs have the types `jax.make_jaxpr` gives them: weak
    types, the shardings of arrays on meshes with explicit axes, the varying
    manual axes of values inside a `shard_map` body, memory spaces. The result
    is cached per (function, static arguments, pytree structure, those full
    types), so staging the same signature twice traces once. The cache holds
    functions weakly and is bounded.

    Args:
        fn: the function to stage.
        *args: its positional arguments (values or `jax.ShapeDtypeStruct`s).
        static_argnums: positions of arguments that are hashable Python values
            baked into the Jaxpr rather than traced.
        **kwargs: its keyword arguments.

    Returns:
        The `Staged` Jaxpr with the input and output pytree structures.

    Raises:
        StagingError: if `fn` is not callable or a static argument is unhashable.

    Example:
        >>> import jax.numpy as jnp
        >>> staged = stage(lambda x, y: {"s": jnp.sin(x) * y}, 1.0, 2.0)
        >>> [eqn.primitive.name for eqn in staged.jaxpr.eqns]
        ['sin', 'mul']
    """
    check_callable(fn, "stage")
    staged, _ = stage_flat(fn, args, kwargs, static_argnums)
    return staged


def stage_flat(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    static_argnums: int | Sequence[int],
) -> tuple[Staged, list[Any]]:
    """Stage `fn` (cached) and return it with the flat dynamic arguments."""
    if static_argnums == ():
        static: tuple[int, ...] = ()
        static_args: tuple[Any, ...] = ()
        dyn_args = tuple(args)
    else:
        static = normalize_argnums(static_argnums, len(args))
        static_args = tuple(args[i] for i in static)
        dyn_args = tuple(a for i, a in enumerate(args) if i not in static)
    leaves, in_tree = jtu.tree_flatten((dyn_args, kwargs))
    in_avals = tuple([_leaf_aval(leaf) for leaf in leaves])
    key = (static, static_args, in_tree, in_avals, compat.staging_flags())
    try:
        hash(key)
    except TypeError as err:
        raise StagingError(
            f"Static arguments of `{_fn_name(fn)}` must be hashable; got "
            f"{static_args!r}."
        ) from err

    lru, fn_key = _cache_for(fn)
    full_key = key if fn_key is None else (fn_key, key)
    if lru is not None:
        staged = lru.get(full_key)
        if staged is not None:
            return staged, leaves

    staged = _trace(fn, static, static_args, leaves, in_tree, in_avals)
    # A staging that captured a tracer of an enclosing transformation (a
    # closure over a traced value) is only valid inside that trace.
    if lru is not None and not any(compat.is_tracer(c) for c in staged.consts):
        lru.put(full_key, staged)
    return staged, leaves


_ArrayImpl = compat.array_impl_type()
_SingleDevice = jax.sharding.SingleDeviceSharding


def _leaf_aval(leaf: Any) -> Any:
    """The full type of an argument (`jax.typeof`: a `jax.ShapeDtypeStruct`'s
    sharding included), which keys the staging cache. An abstract value (what
    `spec_of` gives) is its own type."""
    if type(leaf) is _ArrayImpl and type(leaf.sharding) is _SingleDevice:
        return leaf.aval  # (the common case first: `compat.aval_of`'s shortcut)
    if isinstance(leaf, compat.ShapedArray) or compat.is_ref_aval(leaf):
        return leaf
    try:
        return compat.aval_of(leaf)
    except TypeError as err:
        raise StagingError(
            f"Cannot stage an argument of type {type(leaf).__name__}: {leaf!r}. "
            "Arguments must be arrays, scalars or pytrees of them; mark other "
            "Python values with `static_argnums`."
        ) from err


def _trace(
    fn: Callable[..., Any],
    static: tuple[int, ...],
    static_args: tuple[Any, ...],
    leaves: list[Any],
    in_tree: Any,
    in_avals: tuple[Any, ...],
) -> Staged:
    out_tree_box: list[Any] = []

    def flat_fn(*flat_args: Any) -> list[Any]:
        dyn_args, kwargs = jtu.tree_unflatten(in_tree, flat_args)
        full_args = _merge_args(dyn_args, static, static_args)
        out = fn(*full_args, **kwargs)
        out_leaves, out_tree = jtu.tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_leaves

    functools.update_wrapper(flat_fn, fn, updated=())
    flat_fn.__signature__ = inspect.Signature()  # type: ignore[attr-defined]
    specs = [spec_of(a) for a in in_avals]
    # Tracing deeply nested `jit`s needs as much stack as walking them.
    with _recursion.recursion_limit(_recursion.DEEP_RECURSION_LIMIT):
        closed = jax.make_jaxpr(flat_fn)(*specs)
    jaxpr = compat.open_jaxpr(closed)
    return Staged(
        closed_jaxpr=closed,
        in_tree=in_tree,
        out_tree=out_tree_box[-1],
        in_avals=in_avals,
        out_avals=tuple(v.aval for v in jaxpr.outvars),
        static_argnums=static,
        static_args=static_args,
        fn_name=_fn_name(fn),
        nesting=_recursion.nesting_depth(jaxpr),
    )


def _merge_args(
    dyn_args: Sequence[Any], static: tuple[int, ...], static_args: tuple[Any, ...]
) -> list[Any]:
    if not static:
        return list(dyn_args)
    full: list[Any] = []
    dyn = iter(dyn_args)
    stat = dict(zip(static, static_args, strict=True))
    for i in range(len(dyn_args) + len(static)):
        full.append(stat[i] if i in stat else next(dyn))
    return full
