"""Inverse rules for `shard_map` (and so for `jax.pmap`, which JAX >= 0.10
stages as a `jit` of a `shard_map`) and `xla_pmap` (`jax.pmap` before 0.10).

The body of a `shard_map` runs once per shard. Its inverse is a `shard_map`
too, on the same mesh: each shard inverts the body on its blocks of the
results (which come in with the forward `out_specs`) and returns its blocks of
the operands (which go out with the forward `in_specs`). The ildj each shard
computes is the log-determinant of its own block of the Jacobian; the global
ildj sums it over the distinct blocks with `lax.psum`. An `xla_pmap` is
inverted the same way, as a `jax.pmap` with `in_axes` and `out_axes` swapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _branches as br
from ._control_flow import _ildj_dtype, _invert_closed, _with_context
from ._rules import InverseContext, inverse_rules


def _spec_axes(spec: Any) -> frozenset[Any]:
    """The mesh axes a `PartitionSpec` shards over (`P('a', ('b', 'c'))` gives
    `{'a', 'b', 'c'}`); `None` entries and markers are not axes."""
    axes: set[Any] = set()
    for entry in tuple(spec):
        names = entry if isinstance(entry, tuple) else (entry,)
        axes.update(n for n in names if isinstance(n, str))
    return frozenset(axes)


def _ildj_axes(p: compat.ShardMapParams, mask: Sequence[bool]) -> tuple[Any, ...]:
    """The manual mesh axes the global ildj sums the shards' ildjs over.

    Those the unknown operands are sharded over: along any other axis each
    shard holds the same blocks, whose ildj is counted once. The unknown
    operands must be sharded over the same axes, or the shards' ildjs do not
    add up to the global one.
    """
    per_operand = {
        _spec_axes(spec) & p.axis_names
        for spec, unknown in zip(p.in_specs, mask, strict=True)
        if unknown
    }
    if len(per_operand) > 1:
        described = ", ".join(sorted(str(sorted(a)) for a in per_operand))
        raise NotInvertibleError(
            "the ildj of a `shard_map` whose unknown operands are sharded over "
            f"different mesh axes ({described}) is not the sum of its shards' "
            "ildjs; shard them over the same axes, or ask for `inverse` alone"
        )
    (axes,) = per_operand or {frozenset()}
    # In mesh order, for a deterministic `psum`.
    return tuple(a for a in p.mesh.axis_names if a in axes)


def _shard_map_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    if any(o is None for o in outvals):
        return None
    p = compat.shard_map_params(params)
    mask = tuple(v is None for v in invals)
    if not any(mask):
        return None
    wanted = ctx.want_ildj
    axes = _ildj_axes(p, mask) if wanted else ()
    known = [v for v in invals if v is not None]
    known_specs = [
        s for s, unknown in zip(p.in_specs, mask, strict=True) if not unknown
    ]
    solved_specs = tuple(
        s for s, unknown in zip(p.in_specs, mask, strict=True) if unknown
    )
    out_branches = tuple(ctx.result_branches)
    n_out = len(outvals)
    branches_in: list[br.Interval | None] = []

    inverse_body = _shard_inverse(
        p.jaxpr, mask, n_out, out_branches, wanted, ctx.solvers, branches_in, axes
    )

    inverse_p = p._replace(
        in_specs=(*p.out_specs, *known_specs),
        out_specs=(solved_specs, PartitionSpec()),
    )
    try:
        xs, ildj = compat.shard_map(inverse_body, inverse_p)(*outvals, *known)
    except NotInvertibleError as err:
        raise _with_context("a `shard_map` body", err) from None
    it = iter(xs)
    solved = [next(it) if v is None else v for v in invals]
    return solved, ildj, list(branches_in) or None


if compat.shard_map_p is not None:
    inverse_rules.register(compat.shard_map_p, _shard_map_inverse)


def _pmap_inverse(
    ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
) -> Any:
    if any(o is None for o in outvals):
        return None
    p = compat.pmap_params(params)
    mask = tuple(v is None for v in invals)
    if not any(mask):
        return None
    wanted = ctx.want_ildj
    mapped = {p.in_axes[i] is not None for i, unknown in enumerate(mask) if unknown}
    if wanted and len(mapped) > 1:
        raise NotInvertibleError(
            "the ildj of a `pmap` whose unknown operands are mapped over its "
            "axis and broadcast (`in_axes=None`) is not the sum of its "
            "devices' ildjs; map them alike, or ask for `inverse` alone"
        )
    summed = wanted and mapped == {True}
    known = [v for v in invals if v is not None]
    known_axes = [a for a, u in zip(p.in_axes, mask, strict=True) if not u]
    solved_axes = tuple(a for a, u in zip(p.in_axes, mask, strict=True) if u)
    out_branches = tuple(ctx.result_branches)
    n_out = len(outvals)
    branches_in: list[br.Interval | None] = []

    inverse_body = _shard_inverse(
        p.jaxpr,
        mask,
        n_out,
        out_branches,
        wanted,
        ctx.solvers,
        branches_in,
        p.axis_name if summed else (),
    )

    inverse_body.__name__ = inverse_body.__qualname__ = f"inverse_{p.name}"
    # Over this process's devices only, as `jax.pmap` stages from JAX 0.10
    # on: in a multi-process program the ildj is that of the process's data.
    local = p._replace(global_axis_size=p.axis_size, explicit_axis_size=True)
    fn = compat.pmap(
        inverse_body,
        local,
        in_axes=(*p.out_axes, *known_axes),
        out_axes=(solved_axes, 0),
    )
    try:
        xs, ildjs = fn(*outvals, *known)
    except NotInvertibleError as err:
        raise _with_context(f"`pmap` of `{p.name}`", err) from None
    # Every device holds the same (summed) ildj; `out_axes=None` would say so,
    # but an `xla_pmap` with it does not run inside `jax.jit` (JAX 0.7).
    ildj = ildjs[0]
    it = iter(xs)
    solved = [next(it) if v is None else v for v in invals]
    return solved, ildj, list(branches_in) or None


if compat.pmap_p is not None:
    inverse_rules.register(compat.pmap_p, _pmap_inverse)


# In a multi-process program `jax.pmap` (JAX >= 0.10, a `jit` of a
# `shard_map`) turns its process-local operands into global arrays on entry and
# its results back on exit. Each conversion is undone by the other, with the
# same mesh and spec; no value changes, so the ildj is zero.
def _register_host_global(forward: Any, backward: Any) -> None:
    def rule(ctx: InverseContext, outvals: Sequence[Any], x: Any, **params: Any) -> Any:
        if x is not None or outvals[0] is None:
            return None
        return [backward.bind(outvals[0], **params)], 0.0

    rule.__name__ = rule.__qualname__ = f"_{forward.name}_inverse"
    inverse_rules.register(forward, rule)


_register_host_global(
    multihost_utils.host_local_array_to_global_array_p,
    multihost_utils.global_array_to_host_local_array_p,
)
_register_host_global(
    multihost_utils.global_array_to_host_local_array_p,
    multihost_utils.host_local_array_to_global_array_p,
)


def _shard_inverse(
    jaxpr: compat.Jaxpr | compat.ClosedJaxpr,
    mask: Sequence[bool],
    n_out: int,
    out_branches: tuple[Any, ...],
    wanted: bool,
    solvers: bool,
    branches_in: list[Any],
    sum_over: Any,
) -> Callable[..., tuple[tuple[Any, ...], Any]]:
    """The per-shard inverse of a mapped body: `(*ys, *knowns) -> (xs, ildj)`,
    its ildj summed over the mesh axes `sum_over` (none when empty); it fills
    `branches_in` with the solved operands' branch intervals."""

    def inverse_body(*args: Any) -> tuple[tuple[Any, ...], Any]:
        ys, knowns = list(args[:n_out]), iter(args[n_out:])
        blocks = [None if unknown else next(knowns) for unknown in mask]
        solved, ildj, branches = _invert_closed(
            jaxpr, blocks, ys, out_branches, want_ildj=wanted, solvers=solvers
        )
        branches_in[:] = branches
        xs = tuple(s for s, unknown in zip(solved, mask, strict=True) if unknown)
        ildj = jnp.asarray(ildj).astype(_ildj_dtype(ys))
        if sum_over:
            ildj = lax.psum(ildj, sum_over)
        return xs, ildj

    return inverse_body
