"""Normalized blocks: a value divided by a function of itself.

A softmax, `e / sum(e)`, and a row normalized to unit length, `u / |u|`,
end in a `div` whose two operands are both unknown, so its rule is stuck.
But the divisor is constant along some axes (a `keepdims` reduction,
broadcast back), so the result fixes the numerator up to one unknown factor
per row: `e = y * s`. Walking back from the numerator through steps that
keep such a family exact, the engine tracks a value `v` as **known up to a
per-row scale** (`v = base * s`) or **shift** (`v = base + c`):

- `exp` turns a scale into a shift (`log|base|`), `log` a shift into a scale;
- adding, subtracting, multiplying or dividing by a known value transforms
  `base`; by an unknown value that is itself constant along the same axes
  (the `max` a stable softmax subtracts) the row's unknown absorbs it.

Once some elements of `v` do not depend on the unknowns at all (a `0`
appended by `pad`, a diagonal of ones set by `where`), each row's unknown is
pinned by one of them, and `v` is known: the only value any preimage can give
it. The block (the equations from `v` to the `div`) is then run forwards on
`v`, and a result that does not map back to `y` (within rounding), a row with
no element to pin it or with pinned elements that disagree, gives NaN. `v`
is handed to the engine, which inverts what produced it by formulas.

The block maps the free elements of `v` onto a manifold (the simplex, unit
rows), so its ildj follows the non-square convention, `-0.5 log det(J^T J)`
with `J` the Jacobian of the results with respect to those elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from . import (
    _blocks as bl,
    _nonsquare,
    _projective,
    _rounding as rd,
    _sources as sr,
)
from ._dataflow import shape_of

_Literal = compat.Literal

NORMALIZATION = "normalization"

_SCALE, _SHIFT = "scale", "shift"

# At most this many steps back from the `div` to the value that pins it.
_MAX_STEPS = 16


def normalized_step(st: Any) -> tuple[bl.Block, Any, Any, str] | None:
    """Solve the first normalized block of the engine state `st` (a
    `SolveState`): (the block, the pinned value, its ildj, the method), or
    `None`."""
    for top in sorted(st.reasons, reverse=True):
        eqn = st.eqns[top]
        if eqn.primitive.name != "div" or len(eqn.outvars) != 1:
            continue
        found = _solve(st, top)
        if found is None or isinstance(found, str):
            projective = _projective.solve_projective(st, top)
            if projective is not None:
                return projective
        if isinstance(found, str):
            st.refuse(top, found)
        elif found is not None:
            return found
    return None


def _unpinned(axes: set[int], walked: list[str]) -> str:
    through = f" (back through {', '.join(walked)})" if walked else ""
    return (
        "its result fixes its numerator only up to one unknown factor per row "
        f"along axes {sorted(axes)}, where the divisor is constant, and no "
        f"element of the numerator{through} is fixed independently of the "
        "unknowns to pin that factor: such a normalization (a softmax, a unit "
        "vector) of unconstrained values loses one degree of freedom per row"
    )


# -- which axes a value is constant along -----------------------------------


def _constant_axes(v: Any, shape: tuple[int, ...], st: Any) -> set[int]:
    """Axes of `shape` along which `v`, broadcast to `shape`, is constant
    whatever the unknowns are: size-1 axes of `v` (or all, for a scalar),
    and axes a `broadcast_in_dim` producing `v` added."""
    if type(v) is _Literal or not hasattr(v.aval, "shape"):
        return set(range(len(shape)))
    vshape = tuple(v.aval.shape)
    if len(vshape) == 0:
        return set(range(len(shape)))
    if len(vshape) != len(shape):
        return set()
    axes = {d for d, (n, m) in enumerate(zip(vshape, shape, strict=True)) if n == 1}
    p = st.producer.get(v)
    if p is not None and st.eqns[p].primitive.name == "broadcast_in_dim":
        eqn = st.eqns[p]
        (w,) = eqn.invars[:1]
        dims = [int(d) for d in compat.params_of(eqn).get("broadcast_dimensions", ())]
        wshape = tuple(getattr(w.aval, "shape", ()))
        for d in range(len(shape)):
            if d not in dims:
                axes.add(d)
        for k, d in enumerate(dims):
            if k < len(wshape) and wshape[k] == 1:
                axes.add(d)
    return axes


# -- the walk back from the `div` --------------------------------------------


def _known(st: Any, v: Any) -> bool:
    return type(v) is _Literal or v in st.env


def _value(st: Any, v: Any) -> Any:
    return v.val if type(v) is _Literal else st.env[v]


def _step(
    st: Any, eqn: Any, v: Any, kind: str, base: Any, axes: set[int]
) -> tuple[Any, str, Any] | None:
    """One step back from `v` (known up to `kind` along `axes`, with `base`)
    to the one operand of `eqn` it depends on: (operand, kind, base)."""
    name = eqn.primitive.name
    shape = tuple(v.aval.shape)
    ins = list(eqn.invars)
    if name in _UNARY:
        (u,) = ins
        if _known(st, u) or tuple(u.aval.shape) != shape:
            return None
        back = _UNARY[name](kind, base)
        return None if back is None else (u, *back)
    if name not in _BINARY or len(ins) != 2:
        return None
    # The operand `v` depends on: unknown, of `v`'s shape, not constant along
    # `axes`; the other is known or constant along them (absorbed).
    const = [
        axes <= _constant_axes(a, shape, st) if not _known(st, a) else False
        for a in ins
    ]
    on_path = [
        k
        for k, a in enumerate(ins)
        if not _known(st, a) and not const[k] and tuple(a.aval.shape) == shape
    ]
    if len(on_path) != 1:
        return None
    (k,) = on_path
    u, other = ins[k], ins[1 - k]
    if not _known(st, other) and not const[1 - k]:
        return None
    absorbed = not _known(st, other)
    o = None if absorbed else _value(st, other)
    # Known operands that vary along `axes` may scale, not shift, a row.
    varies = not absorbed and not axes <= _constant_axes(other, shape, st)
    back = _BINARY[name](_Other(k, o, absorbed, varies), kind, base)
    return None if back is None else (u, *back)


# Each step back, by primitive: from `v`'s kind and base to its operand's,
# or `None` where the step does not keep the form. A unary step:
_UNARY = {
    "exp": lambda kind, base: (
        (_SHIFT, jnp.log(jnp.abs(base))) if kind == _SCALE else None
    ),
    "log": lambda kind, base: (_SCALE, jnp.exp(base)) if kind == _SHIFT else None,
    "sqrt": lambda kind, base: (_SCALE, base * base) if kind == _SCALE else None,
    "neg": lambda kind, base: (kind, -base),
}


class _Other(NamedTuple):
    """A binary step's other operand: which side the unknown is on (`k`),
    its value `o` unless it is `absorbed` (constant along the axes), and
    whether it `varies` along them."""

    k: int
    o: Any
    absorbed: bool
    varies: bool


def _add_back(other: _Other, kind: str, base: Any) -> tuple[str, Any] | None:
    if kind != _SHIFT:
        return None
    return _SHIFT, base if other.absorbed else base - other.o


def _sub_back(other: _Other, kind: str, base: Any) -> tuple[str, Any] | None:
    if kind != _SHIFT:
        return None
    if other.k == 0:  # v = u - other
        return _SHIFT, base if other.absorbed else base + other.o
    return _SHIFT, -base if other.absorbed else other.o - base  # v = other - u


def _scaled_back(
    other: _Other, kind: str, base: Any, times: bool
) -> tuple[str, Any] | None:
    """`v = u * other` (`times`) or `v = u / other`."""
    o = other.o
    if kind == _SCALE:
        return _SCALE, base if other.absorbed else (base / o if times else base * o)
    if kind == _SHIFT and not other.absorbed and not other.varies:
        return _SHIFT, base / o if times else base * o
    return None


def _div_back(other: _Other, kind: str, base: Any) -> tuple[str, Any] | None:
    if other.k == 0:
        return _scaled_back(other, kind, base, times=False)
    if kind == _SCALE:  # v = other / u
        return _SCALE, 1 / base if other.absorbed else other.o / base
    return None


_BINARY = {
    "add": _add_back,
    "add_any": _add_back,
    "sub": _sub_back,
    "mul": lambda other, kind, base: _scaled_back(other, kind, base, times=True),
    "div": _div_back,
}


# -- which elements of a value do not depend on the unknowns ----------------


def _ancestors(st: Any, v: Any) -> list[int]:
    """The equations producing `v` from the unknowns, in program order."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        a = todo.pop()
        if _known(st, a):
            continue
        p = st.producer.get(a)
        if p is None or p in seen:
            continue
        seen.add(p)
        todo.extend(st.eqns[p].invars)
    return sorted(seen)


def _dependence(st: Any, v: Any) -> np.ndarray:
    """Which elements of `v` may depend on an unknown input (conservatively:
    `True` unless proven otherwise)."""
    got = sr.sources(st, v, known=True)
    if got is None:
        shape = np.shape(v.val) if type(v) is _Literal else shape_of(v)
        return np.zeros(shape, bool)
    return got != sr.CONSTANT


def _static_values(st: Any, v: Any) -> Any:
    """`v` computed with every unknown input replaced by zeros: right at the
    elements that do not depend on them."""
    env: dict[Any, Any] = {}

    def read(a: Any) -> Any:
        if _known(st, a):
            return _value(st, a)
        got = env.get(a)
        return jnp.zeros(a.aval.shape, a.aval.dtype) if got is None else got

    for p in _ancestors(st, v):
        eqn = st.eqns[p]
        user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
        with user_ctx, eqn_ctx:
            outs = compat.bind_eqn(
                eqn.primitive, [read(a) for a in eqn.invars], eqn.params
            )
        env.update(zip(eqn.outvars, outs, strict=True))
    return read(v)


# -- the block ----------------------------------------------------------------


def _region(st: Any, top: int, v: Any) -> tuple[list[int], list[Any]] | None:
    """The equations from `v` to equation `top` and the known values they
    read, or `None` if an unknown they read does not come from `v`."""
    region: set[int] = set()
    known: list[Any] = []
    todo = [top]
    while todo:
        i = todo.pop()
        if i in region:
            continue
        region.add(i)
        for a in st.eqns[i].invars:
            if type(a) is _Literal or a is v:
                continue
            if a in st.env:
                if a not in known:
                    known.append(a)
                continue
            p = st.producer.get(a)
            if p is None or a in st.pieces:
                return None
            todo.append(p)
    for i in region:
        for o in st.eqns[i].outvars:
            if i != top and (o in st.env or o in st.pieces):
                return None  # a second constraint inside: not this method's
    return sorted(region), known


def _solve(st: Any, top: int) -> tuple[bl.Block, Any, Any, str] | str | None:
    """The normalized block ending at equation `top` solved, why it cannot
    be (a row with nothing to pin it), or `None` when it is not one."""
    eqn = st.eqns[top]
    (y,) = eqn.outvars
    m, o = eqn.invars
    if y not in st.env or _known(st, m) or _known(st, o):
        return None
    if not jnp.issubdtype(y.aval.dtype, jnp.floating):
        return None
    shape = tuple(y.aval.shape)
    if tuple(m.aval.shape) != shape:
        return None
    axes = {d for d in _constant_axes(o, shape, st) if shape[d] > 1}
    if not axes:
        return None
    kind, base, v = _SCALE, st.env[y], m
    walked: list[str] = []
    for _ in range(_MAX_STEPS):
        free = _dependence(st, v)
        if not free.all():
            break
        p = st.producer.get(v)
        if p is None or v in st.pieces:
            return _unpinned(axes, walked)
        stepped = _step(st, st.eqns[p], v, kind, base, axes)
        if stepped is None:
            return None
        walked.append(st.eqns[p].primitive.name)
        v, kind, base = stepped
    else:
        return None
    if v in st.pieces or tuple(v.aval.shape) != shape:
        return None
    groups = _first_fixed(free, axes)
    if groups is None:
        return _unpinned(axes, walked)  # some row has no element to pin it
    got = _region(st, top, v)
    if got is None:
        return None
    indices, known_vars = got
    n_free = int(free.sum())
    if n_free > bl.MAX_LINEAR:
        return (
            f"its numerator is pinned as a normalization of {n_free} free "
            f"elements, more than jaxinterp checks densely ({bl.MAX_LINEAR}): "
            "map the inverse over the rows with `jax.vmap` instead"
        )
    block = bl.Block(
        top,
        indices,
        [st.eqns[i] for i in indices],
        v,
        y,
        known_vars,
        {},
        False,
        bl.ELEMENTWISE,
    )
    fixed = _static_values(st, v)
    known = [st.env[k] for k in block.known]
    value = _pin(kind, base, fixed, free, groups, axes)
    value = _checked(block, value, free, st.env[y], known, st.options.want_ildj)
    return value


def _row_order(ndim: int, axes: set[int]) -> list[int]:
    """The axes with those of a row (`axes`) last."""
    return [d for d in range(ndim) if d not in axes] + sorted(axes)


def _first_fixed(free: np.ndarray, axes: set[int]) -> np.ndarray | None:
    """Per row (the positions along the axes not in `axes`), the flat index
    along `axes` of its first element that depends on no unknown; `None` if
    some row has none."""
    rows = math.prod(free.shape[d] for d in range(free.ndim) if d not in axes)
    fixed = ~np.transpose(free, _row_order(free.ndim, axes)).reshape(rows, -1)
    if not fixed.any(axis=1).all():
        return None
    return np.argmax(fixed, axis=1)


def _rows(a: Any, axes: set[int]) -> Any:
    """`a` (of the block's shape) as (rows, elements along `axes`)."""
    rows = math.prod(a.shape[d] for d in range(a.ndim) if d not in axes)
    return jnp.transpose(a, _row_order(a.ndim, axes)).reshape(rows, -1)


def _unrows(a: Any, axes: set[int], shape: tuple[int, ...]) -> Any:
    order = _row_order(len(shape), axes)
    a = jnp.reshape(a, [shape[d] for d in order])
    return jnp.transpose(a, [int(d) for d in np.argsort(order)])


def _pin(
    kind: str,
    base: Any,
    fixed: Any,
    free: np.ndarray,
    groups: np.ndarray,
    axes: set[int],
) -> Any:
    """The value known up to a scale or shift per row, pinned by each row's
    first fixed element; NaN in a row whose fixed elements disagree."""
    shape = free.shape
    dtype = jnp.result_type(base)
    b_rows, f_rows = (
        _rows(jnp.asarray(base, dtype), axes),
        _rows(jnp.asarray(fixed, dtype), axes),
    )
    at = jnp.asarray(groups)[:, None]
    b_at = jnp.take_along_axis(b_rows, at, axis=1)
    f_at = jnp.take_along_axis(f_rows, at, axis=1)
    if kind == _SHIFT:
        rows = b_rows + (f_at - b_at)
    else:
        rows = b_rows * (f_at / b_at)
    # Every fixed element must agree with the pinned row.
    fixed_rows = _rows(jnp.asarray(~free), axes)
    agree = rd.close(rows, f_rows, jnp.abs(rows) + jnp.abs(f_rows))
    ok = jnp.all(agree | ~fixed_rows, axis=1, keepdims=True)
    rows = jnp.where(fixed_rows, f_rows, rows)
    rows = jnp.where(ok, rows, jnp.nan)
    return _unrows(rows, axes, shape)


def _checked(
    block: bl.Block,
    value: Any,
    free: np.ndarray,
    y: Any,
    known: Sequence[Any],
    want_ildj: bool,
) -> tuple[bl.Block, Any, Any, str]:
    """The pinned value, NaN unless the block maps it back to `y` within
    rounding; the block's ildj on the free elements."""
    idx = np.flatnonzero(free)
    flat = jnp.ravel(value)

    def g_free(u: Any) -> Any:
        return jnp.ravel(block.g(jnp.reshape(flat.at[idx].set(u), value.shape), *known))

    ok, ildj = _nonsquare.flat_maps_back(g_free, flat[idx], jnp.ravel(y), want_ildj)
    return block, jnp.where(ok, value, jnp.nan), ildj, NORMALIZATION
