"""Running a solver only on the elements that need it.

The root search runs in tiers: a cheap one for every element, then, for
the few elements it leaves undecided (NaN), a full search. `lazily` runs
that search only if some element needs it, inside a `while_loop` of at
most one step (`once`: a `cond` that stays lazy under `vmap`), on those
elements gathered with their known operands: a few at once
(`_compacted`), else in chunks (`_chunks`). A `y` off the map's image in
an array of a million would otherwise cost a million full searches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax


def lazily(
    x: Any,
    y: Any,
    solve: Callable[..., Any],
    known: Sequence[Any] | None = None,
    sizes: Callable[[Any, Sequence[Any]], list[int]] | None = None,
) -> Any:
    """`x`, with `solve(y)` where `x` is NaN and `y` is not: `solve` runs
    only if there is such an element, inside a `while_loop` of at most one
    step (`once`: a `cond` that stays lazy under `vmap`).

    First a test on `x` alone, whether it may hold a NaN (a reduction that
    reads `x` and writes nothing per element), then only if so the exact
    test, which also reads `y` (XLA writes the mask it reduces to memory).

    With `known` (the operands of `g` besides `x`, each broadcastable to
    `y`), `solve(y, *known)` runs on those elements only, gathered with
    their known operands: up to `_FEW` at once (`_compacted`), else in
    chunks of 1/`_FRACTION` of the elements (`_chunks`). A `y` off the
    map's image in an array of a million would otherwise cost a million
    full searches. `sizes(y, known)`: the sizes of those gathers, in
    increasing order (`_caps` by default), the last one the chunks'."""

    def exact(x: Any, y: Any) -> Any:
        need = jnp.isnan(x) & ~jnp.isnan(y)
        if known is None:
            return once(jnp.any(need), x, y, lambda x, y: _fill(x, y, solve))
        count = jnp.sum(need, dtype=jnp.int32)
        caps = (sizes or _caps)(y, known)
        if not caps:
            return once(count > 0, x, y, lambda x, y: _fill(x, y, solve, known))
        # Few undecided elements: one gather of the smallest size that holds
        # them. More: chunks of the largest size, in a loop. By default the
        # program holds at most two copies of the later tiers (each copy is
        # most of the solver's compile time).
        *few, cap = caps
        below = 0
        for small in few:
            compact = functools.partial(_compacted, small, solve, known)
            x = once((count > below) & (count <= small), x, y, compact)
            below = small
        return _chunks(count > below, cap, solve, known, x, y)

    # A sum holding a NaN is NaN (so is one of inf and -inf: then the exact
    # test runs for nothing). Not a `max`: XLA's CPU reductions may drop
    # NaN there.
    some_nan = jnp.isnan(jnp.sum(x))
    return once(some_nan, x, y, exact)


def gather_where(
    mask: Any, x: Any, solve: Callable[..., Any], known: Sequence[Any] = ()
) -> Any:
    """`x`, with `solve(x, *known)` run where `mask` holds (and `x` is not
    NaN): lazily, on those elements gathered with their known operands (as
    `lazily` gathers undecided elements: `_compacted`, `_chunks`), or not
    at all if there is none. (A size of gather between `_FEW` and the
    chunks' too, `_MIDDLE`: a test on a few hundred elements is cheap to
    hold a copy of, and a chunk of 1/64 of a million costs a search of the
    whole array for them: TFP-like maps with a corner at 0 hold about a
    hundred such roots.)"""

    def sizes(y: Any, known: Sequence[Any]) -> list[int]:
        caps = _caps(y, known)
        if len(caps) == 2 and caps[0] < _MIDDLE < caps[1]:
            return [caps[0], _MIDDLE, caps[1]]
        return caps

    return lazily(jnp.where(mask, jnp.nan, x), x, solve, known, sizes)


# The sizes of the gathers of undecided elements (`_caps`): a few, or a
# fraction of the elements (and for `gather_where`, `_MIDDLE` between).
_FEW = 64
_FRACTION = 64
_MIDDLE = 256
# The chunks hold at least this many elements (at most a quarter of all):
# each round of `_chunks` costs tens of microseconds besides its elements
# on a CPU (its loops, gathers and scatter), so at 10^4 elements, chunks of
# 1/64 cost more in rounds than in work where most elements are undecided
# (TFP's `Softfloor(0.05)`: 47 rounds, 2.8 ms).
_MIN_CHUNK = 1024


def _caps(y: Any, known: Sequence[Any]) -> list[int]:
    """How many undecided elements `_compacted` and `_chunks` gather at
    once, in increasing order: none where the known operands do not
    broadcast to `y` or the array is small (then all elements are solved)."""
    shape = jnp.shape(y)
    if not all(_broadcasts(jnp.shape(k), shape) for k in known):
        return []
    size = math.prod(shape)
    if size >= 2**31:  # (`_chunks` counts positions in int32)
        return []
    chunk = size // _FRACTION
    if chunk >= _FEW:  # (else one size, `_FEW`: one copy of the later tiers)
        chunk = max(chunk, min(_MIN_CHUNK, size // 4))
    return sorted({c for c in (_FEW, chunk) if _FEW <= c <= size // 4})


def _broadcasts(have: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether an array of shape `have` broadcasts to `shape` (a known
    operand of another shape, a table the map reads whole, is not per
    element)."""
    if len(have) > len(shape):
        return False
    tail = shape[len(shape) - len(have) :]
    return all(h in (1, s) for h, s in zip(have, tail, strict=True))


def _compacted(
    cap: int, solve: Callable[..., Any], known: Sequence[Any], x: Any, y: Any
) -> Any:
    """`x`, with `solve` run on the (at most `cap`) elements where `x` is NaN
    and `y` is not, gathered into an array of `cap` (the rest NaN), with
    the same elements of the known operands."""
    flat_x, flat_y = jnp.ravel(x), jnp.ravel(y)
    index = _first(jnp.isnan(flat_x) & ~jnp.isnan(flat_y), cap)
    return _gathered(index, solve, known, x, y)


def _gathered(
    index: Any, solve: Callable[..., Any], known: Sequence[Any], x: Any, y: Any
) -> Any:
    """`x`, with `solve` run on its elements at the flat positions `index`
    (past the end: padding, solved as NaN and dropped), gathered with the
    same elements of the known operands."""
    shape = jnp.shape(y)
    flat_x, flat_y = jnp.ravel(x), jnp.ravel(y)
    sub_y = flat_y.at[index].get(mode="fill", fill_value=jnp.nan)
    sub_known = [
        jnp.ravel(jnp.broadcast_to(k, shape)).at[index].get(mode="clip")
        if jnp.shape(k)
        else k
        for k in known
    ]
    # (Indices past the end: `index`'s padding, which reads the last
    # element of a known operand and is dropped on the way back.)
    sub_x = solve(sub_y, *sub_known)
    return flat_x.at[index].set(sub_x, mode="drop").reshape(shape)


def _chunks(
    flag: Any,
    cap: int,
    solve: Callable[..., Any],
    known: Sequence[Any],
    x: Any,
    y: Any,
) -> Any:
    """`x`, with `solve` run (if `flag`) on the elements where `x` is NaN and
    `y` is not, `cap` at a time in row-major order (`_gathered`), in a
    `while_loop`: one copy of `solve` for any number of them. Each round
    starts past the last element the one before gathered, so elements left
    NaN (a `y` off the image) are not taken again."""
    size = math.prod(jnp.shape(y))
    flat_y = jnp.ravel(y)
    position = lax.iota(jnp.int32, size)

    def waiting(x: Any, start: Any) -> Any:
        return jnp.isnan(jnp.ravel(x)) & ~jnp.isnan(flat_y) & (position >= start)

    def body(state: tuple[Any, Any]) -> tuple[Any, Any]:
        start, x = state
        index = _first(waiting(x, start), cap)
        last = jnp.max(jnp.where(index < size, index, -1)).astype(jnp.int32)
        return jnp.maximum(start, last + 1), _gathered(index, solve, known, x, y)

    # (The state behind an optimisation barrier, as in `once`: XLA must
    # not inline or hoist the loop's work out of it.)
    start = lax.optimization_barrier((jnp.int32(0), x))
    _, x = lax.while_loop(lambda s: flag & jnp.any(waiting(s[1], s[0])), body, start)
    return x


# Elements per block where `_first` looks for blocks first.
_BLOCK = 1024


def _first(mask: Any, cap: int) -> Any:
    """The indices of the first `cap` true elements of the 1-D `mask` (its
    size where there are fewer). `jnp.nonzero` takes a cumulative sum over
    all of `mask`, several milliseconds for a million elements on a CPU;
    where `cap` blocks of `_BLOCK` are a small part of it, the first `cap`
    blocks holding a true element are found first (a reduction and a
    cumulative sum over the blocks), then the elements within them."""
    size = mask.shape[0]
    if cap * _BLOCK * 2 > size:
        return jnp.nonzero(mask, size=cap, fill_value=size)[0]
    count = -(-size // _BLOCK)
    blocks = jnp.pad(mask, (0, count * _BLOCK - size)).reshape(count, _BLOCK)
    (chosen,) = jnp.nonzero(jnp.any(blocks, axis=1), size=cap, fill_value=count)
    within = blocks.at[chosen].get(mode="fill", fill_value=False).ravel()
    (at,) = jnp.nonzero(within, size=cap, fill_value=within.size)
    block = chosen.at[at // _BLOCK].get(mode="clip")
    return jnp.where(at < within.size, block * _BLOCK + at % _BLOCK, size)


def _fill(x: Any, y: Any, solve: Callable[..., Any], known: Sequence[Any] = ()) -> Any:
    return jnp.where(jnp.isnan(x) & ~jnp.isnan(y), solve(y, *known), x)


def once(flag: Any, x: Any, y: Any, step: Callable[[Any, Any], Any]) -> Any:
    """`step(x, y)` if `flag`, else `x`: a `while_loop` of at most one step
    (a batched `cond` runs both branches; the loop runs once if any member
    of a `vmap` needs it)."""
    nan = jnp.full_like(y, jnp.nan)

    # XLA hoists work that does not depend on a loop's state out of the
    # loop, and inlines a loop it can prove runs at most once; either would
    # run `step` always. So `step` reads `y` through the loop's flag
    # (false inside the loop: `y` itself), and the state starts behind an
    # optimisation barrier (the trip count is unknown).
    def body(state: tuple[Any, Any]) -> tuple[Any, Any]:
        ran, x = state
        # (`ran | True`, not a fresh `True`: it keeps the flag's type, which
        # varies over the mesh axes inside a `shard_map` body on older JAX.)
        done = ran | jnp.bool_(True)
        return done, step(x, jnp.where(ran, nan, y))

    start = lax.optimization_barrier((jnp.bool_(False), x))
    _, x = lax.while_loop(lambda s: ~s[0] & flag, body, start)
    return x
