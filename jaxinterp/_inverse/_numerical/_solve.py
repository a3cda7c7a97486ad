"""A numerical solver for elementwise equations `g(x, *known) = y`.

`inverse` uses it when no formula recovers a value: the unknown is used more
than once, every operation between it and a known result is elementwise, so
each element is a scalar equation of one unknown. Per element:

1. start from the best of a few points where `g` is defined (`y` itself, 0,
   +-1/2, +-1, +-2);
2. bracket a root: step away from the start, doubling the step while the
   residual keeps its sign and halving it where `g` is undefined (NaN), until
   the residual changes sign;
3. safeguarded Newton inside the bracket: a Newton step when it stays inside
   and halves the residual, else bisection (geometric when the bracket spans
   orders of magnitude), until the bracket is a few ulps wide;
4. check the residual: an element whose `g(x)` is not within rounding of `y`
   (or, once the bracket is a few ulps wide, within `sqrt(eps) * (1 + |y|)`
   of it, for maps that round intermediates larger than `y`, where none
   of the map's discrete choices changes across the bracket) is NaN (a `y`
   outside the image, a jump of a discontinuous `g`), never a
   plausible wrong number; so is one where many `x` give `y`: on a plateau
   (`g'(x) == 0` and `g` flat on a side of `x`: a constant branch, a
   saturated clamp) or at an extremum (`g(x - d)` and `g(x + d)` both above or both
   below `g(x)` beyond rounding, for `d` from `16 eps |x|` to
   `sqrt(eps) |x|`).

A map that turns (not monotone on a grid of points from `2**-12` to the
dtype's largest powers of two in magnitude, `monotone_on_grid`) is not
injective: its elements are NaN, or, when its known operands are constants
and scalars, it is inverted only where `y` has one preimage (`_turning.py`;
refused if no value has one). The grid and the check are in `_grid.py`.
With constant scalar operands, folds between grid points are found by
enclosing the map's slope (`_enclose.py`) and sampled too.
When the known operands are scalars, the map is the same for every element
and each call of `g` samples as many grid points as there are elements (the
calls run in a loop: the program holds one copy of `g`).

Most elements never need steps 2 and 3. A fast path runs first
(`_fast`): from the best start, a few Newton steps, then the acceptance test
of step 4 (`_accept`, the same test), as a few passes over the elements
without a loop (one per Newton step: XLA's CPU code for one long fusion is
several times slower per operation). Rounds of Newton steps, then the full
search, run only if some element is left undecided, and then inside a loop
of at most one step, so that they cost nothing otherwise (also under
`vmap`), on the undecided elements gathered with their known operands: up
to 64 at once (`_compacted`), else 1/64 of the elements at a time in a loop
(`_chunks`), so the program holds at most two copies of the later tiers. One
`y` off the image in 10^6 costs about 3x the first tier, not a search of
every element (seconds for softsign). For
softsign on 10^6 elements the first tier is about 9x the closed form,
against about 175x for the full search on every element.

When the map is the same for every element and known while tracing (its
known operands constants), a table of its inverse (`_table.py`) gives a
start within about `1e-4`, so the fast path is `_from_table`: one Newton
step (three in float64) and a cheaper form of the same acceptance test, in
four passes (start, step, test, NaN test). Where the solver differentiates
a block, its `div` is `quotient`, whose derivative takes one division
fewer. For softsign on 10^6 float32 elements that is about 10x the closed
form timed back to back, 3.7-4.3x timed one call at a time after a collection
(`benchmarks/bench_inverse.py`; docs/benchmarks.md says how each is timed).

All elements are solved at once (the loops run until every element is done),
so the solver composes with `jax.jit` and `jax.vmap`. Derivatives come from the
implicit function theorem (`jax.custom_jvp`), not from the iterations:
`dx = (dy - dg/dknown . dknown) / g'(x)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ... import _jax_compat as compat
from .. import _rounding as rd
from .._elementwise_steps import derivative
from . import _lazy as lazy, _table
from ._grid import grid, monotone_on_grid

__all__ = ["grid", "monotone_on_grid", "solver"]

# Where the search starts (besides `y` itself): small numbers first, so that a
# map defined on (0, 1) or on the positive reals has a point to start from.
_STARTS = (0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0)

# The second tier's rounds of Newton steps (each fused): at most this many.
_MAX_ROUNDS = 4


def _newton_round(y: Any) -> int:
    """Newton steps in the first tier, and in each round of the second: from
    a start within about 10%, enough for the dtype's precision (convergence
    is quadratic)."""
    return 4 if jnp.finfo(jnp.result_type(y)).bits <= 32 else 6


Elementwise = Callable[..., Any]  # g(x, *known) -> y, elementwise in x
Choices = Callable[..., list[Any]]  # choices(x, *known): see `solver`


def solver(
    g: Elementwise,
    *,
    check_grid: bool = True,
    table: _table.Table | None = None,
    choices: Choices | None = None,
    uniform: bool = True,
    gather: bool = False,
    turns: Callable[..., Any] | None = None,
    kinks: Choices | None = None,
) -> Callable[..., Any]:
    """`solve(y, *known)`: `x` with `g(x, *known) == y` elementwise (NaN where
    none is found, and with `check_grid` where `g` is not monotone on
    `grid`), differentiable in `y` and `known` by the implicit function
    theorem. `table`: starts for the map (`_table.build`, of these known
    operands). `choices(x, *known)`: `g`'s discrete choices at `x` (a list of
    arrays `(*x.shape, k)`, `_turning.choices_of`), where `g` may jump: a
    root is not accepted by the looser test for maps that round (step 4)
    where they change across its bracket. `uniform=False`: `g` differs
    between elements even with scalar known operands (a per-element
    constant inside it), so the grid is checked element by element.
    `gather`: the elements the first tier leaves undecided may be solved
    apart, gathered with their known operands (`_find_roots`); only for a
    `g` that holds no per-element constant of its own. `turns(*known)`:
    where `g` is proven to turn between grid points (`_blocks.
    _runtime_turns`), NaN there. `kinks(x, *known)`: `choices` with the
    places where a value may turn (`monotone_on_grid`)."""

    @jax.custom_jvp
    def solve(y: Any, *known: Any) -> Any:
        x = _find_roots(g, y, known, table, choices, gather=gather)
        at = None if choices is None else (lambda x: choices(x, *known))
        if check_grid:
            shape, dtype = jnp.shape(y), jnp.result_type(y)
            same = uniform and all(not jnp.shape(k) for k in known)
            # (`at`: a piecewise map's switches, which move with its known
            # operands, located where they fall between grid points.)
            ok = monotone_on_grid(
                lambda x: g(x, *known),
                shape,
                dtype,
                uniform=same,
                like=y,
                choices=at,
                kinks=None if kinks is None else (lambda x: kinks(x, *known)),
            )
            x = jnp.where(ok, x, jnp.nan)
        if turns is not None:
            x = jnp.where(turns(*known), jnp.nan, x)
        return x

    @solve.defjvp
    def _solve_jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
        y, *known = primals
        dy, *dknown = tangents
        x = solve(y, *known)
        slope = derivative(g, x, known)
        if known:
            _, dg = jax.jvp(lambda *k: g(x, *k), tuple(known), tuple(dknown))
            dy = dy - dg
        return x, dy / slope

    return solve


def _finite(v: Any) -> Any:
    return ~jnp.isnan(v)


def _find_roots(
    g: Elementwise,
    y: Any,
    known: Sequence[Any] = (),
    table: _table.Table | None = None,
    choices: Choices | None = None,
    *,
    gather: bool = True,
) -> Any:
    """`x` with `g(x, *known) == y` per element, NaN where none is accepted.

    In tiers, each accepting only what the full search would (`_accept`):

    1. `_fast`: the best of the fixed starts, one round of Newton steps, the
       acceptance test; no loop, a few passes over the elements. It usually
       decides every element.
    2. only if some element is left undecided, `_rounds`: from the same
       start, rounds of safeguarded Newton steps while some residual is not
       down to rounding (a far root: Newton's steps double on the way);
    3. only if some element is still undecided, the full search (`_search`),
       from the same start.

    The later tiers run on the elements the first left undecided, gathered
    (`_compacted`: at most 64 of them, else 1/64 of the elements at a time,
    `_chunks`; not with `gather=False`, for a `g` whose constants hold a
    value per element), with the results of the earlier tier kept where accepted
    (`_lazy.lazily`); each computes what it needs (the start) itself: a value the
    first tier shared with it would be written to memory for every element,
    and work that XLA can move out of the lazy loop would run always.

    With a `table` (`_table.py`), tier 1 is `_from_table` instead, and the
    later tiers start from the table's start where it has one.
    """

    def later(y: Any, *known: Any) -> Any:
        g_k = lambda x: g(x, *known)  # noqa: E731
        at = None if choices is None else (lambda x: choices(x, *known))
        search = lambda y, s: _search(g_k, y, s, at)  # noqa: E731
        if table is None:
            return _rounds(g_k, y, search)
        # From the table's start, a round of Newton steps (as `_fast`: for a
        # cell where the inverse curves, at the edge of the map's image),
        # the neighbours tested where not `_steep`; then the later tiers.
        x = _from_table(g_k, y, table, steps=_newton_round(y))
        x = _accepted(g_k, y, x, False, split=False)
        return lazy.lazily(x, y, lambda y: _rounds(g_k, y, search, table))

    g_k = lambda x: g(x, *known)  # noqa: E731
    x = _fast(g_k, y) if table is None else _from_table(g_k, y, table)
    if gather:
        return lazy.lazily(x, y, later, known)
    return lazy.lazily(x, y, lambda y: later(y, *known))


def _from_table(
    g: Callable[[Any], Any], y: Any, table: _table.Table, *, steps: int = 0
) -> Any:
    """Tier 1 of `_find_roots` with a table of starts: the table's start
    (a pass of its own: XLA would repeat its gathers for each use), one
    Newton step (two in float64), and in the same pass the acceptance test
    at the result, `g(x)` and `g'(x)` evaluated once: close, settled (as
    `_accepted`), and `_steep` (its neighbours pass `_single`). Else NaN,
    left to the later tiers (which test the neighbours). With `steps`, that
    many Newton steps instead, and the point reached, untested."""
    x = _split(_table.lookup(table, y))
    one = 1 if jnp.finfo(jnp.result_type(y)).bits <= 32 else 3
    for _ in range(steps or one):
        residual, slope = _residual_and_slope(g, y, x)
        x = jnp.where(residual == 0, x, x - residual / slope)
    if steps:
        return x
    x = _split(x)
    # `g(x)` used once, through the residual: XLA writes a value with an
    # expensive step (a division) to memory rather than fuse it into a
    # consumer that reads it twice.
    residual, slope = _residual_and_slope(g, y, x)
    return jnp.where(_plainly_accepted(y, x, residual, slope), x, jnp.nan)


def _plainly_accepted(y: Any, x: Any, residual: Any, slope: Any) -> Any:
    """Per element, whether `_accepted` (nothing settled before) accepts `x`
    and its neighbours need no test (`_steep`), in fewer operations (the
    first tier's time is mostly its operations), never where `_accepted`
    would not. With a finite slope and `t = rd.through(x, slope)`
    (`_rounding.maps_back`'s scale is then `|y| + t`): a residual within
    `2 eps (|y| + t)` is `_accepted`'s rounding floor; one within `4 eps t`
    is a Newton step of at most `4 eps |x|` (a margin of `16 eps` relative
    covers the rounding of the bound); both are within
    `_rounding.maps_back`'s `16 eps (|y| + t)`."""
    eps, tiny = _eps_tiny(y)
    # (`slope` read once: XLA's CPU backend does not fuse a division into a
    # consumer that reads it twice, and `g'` often ends in one.)
    size = jnp.abs(slope)
    through = rd.through(x, size)
    step = float(4 - 16 * eps) * through
    bound = eps * jnp.maximum(2 * (jnp.abs(y) + through), step)
    ok = jnp.isfinite(size) & (jnp.abs(residual) <= bound)
    # `_steep`, its constants gathered: |g'| max(|x|, 1) sqrt(eps) above
    # 64 (4 eps |g(x)| + tiny).
    root = math.sqrt(float(eps))
    noise = (256 * root) * jnp.abs(residual + y) + float(64 * tiny / root)
    return ok & (size * jnp.maximum(jnp.abs(x), 1.0) > noise)


def _value_and_slope(g: Callable[[Any], Any], x: Any) -> tuple[Any, Any]:
    return jax.jvp(g, (x,), (jnp.ones_like(x),))


def _best_start(
    g: Callable[[Any], Any], y: Any, table: _table.Table | None = None
) -> Any:
    """Per element, the start (`y`, one of `_STARTS`, or the `table`'s) with
    the smallest residual that is a number (NaN: none), as the full search
    picks it."""
    x = jnp.full_like(y, jnp.nan)
    # (`best` is never NaN: inf until a start is taken. A NaN residual
    # compares false, so it is never taken.)
    best = jnp.full_like(y, jnp.inf)
    starts = [y, *(jnp.full_like(y, s) for s in _STARTS)]
    if table is not None:
        starts.append(_table.lookup(table, y))
    for s in starts:
        fs = jnp.abs(g(s) - y)
        better = fs < best
        if s is y or s is starts[-1]:
            better = better & jnp.isfinite(s)
        x = jnp.where(better, s, x)
        best = jnp.where(better, fs, best)
    return x


def _newton(g: Callable[[Any], Any], y: Any, x: Any) -> tuple[Any, Any]:
    """A Newton step from `x`: the new point, and whether the step was down
    to rounding (it moved `x` by a few ulps, or the residual at `x` was
    within rounding), which is when the full search's Newton steps stop."""
    gx, slope = _value_and_slope(g, x)
    residual = gx - y
    step = jnp.where(residual == 0, 0, residual / slope)
    eps, tiny = _eps_tiny(y)
    floor = 2 * eps * (jnp.abs(y) + rd.through(x, slope))
    settled = (jnp.abs(step) <= 4 * eps * jnp.maximum(jnp.abs(x), tiny)) | (
        jnp.abs(residual) <= floor
    )
    return x - step, settled


def _eps_tiny(y: Any) -> tuple[Any, Any]:
    finfo = jnp.finfo(jnp.result_type(y))
    return finfo.eps, finfo.tiny


def _accepted(
    g: Callable[[Any], Any], y: Any, x: Any, settled: Any, *, split: bool = True
) -> Any:
    """`x` where `_accept` accepts it and it is as accurate as the full
    search makes it: the last step to it was `settled`, or a Newton step
    from it would be (its residual is within the same rounding floor, or the
    step would move it by a few ulps). Else NaN.

    With `split`, in two passes (`_split`): the tests on `g(x)` and `g'(x)`,
    then those on the neighbours of `x` (`_single`), which evaluate `g(x)`
    and `g'(x)` again, lazily: only if some element is not `_steep` (its
    neighbours cannot tell it from a plateau or an extremum otherwise)."""
    at, slope = _value_and_slope(g, x)
    close = rd.maps_back(at, y, x, slope)
    eps, tiny = _eps_tiny(y)
    residual = at - y
    floor = 2 * eps * (jnp.abs(y) + rd.through(x, slope))
    step = 4 * eps * jnp.maximum(jnp.abs(x), tiny) * jnp.abs(slope)
    settled = settled | (jnp.abs(residual) <= floor) | (jnp.abs(residual) <= step)
    x = jnp.where(settled & close, x, jnp.nan)
    if not split:
        return jnp.where(_single(g, x, at, slope == 0), x, jnp.nan)
    # The neighbours in a pass of their own: `g(x)` and `g'(x)` evaluated
    # again there cost less at 10^6 elements than handing them over; and only
    # if some element needs them (six evaluations of `g`, a third of the
    # first tier's time at 10^6 elements).
    x = _split(x)

    def neighbours(x: Any, _: Any) -> Any:
        at, slope = _value_and_slope(g, x)
        single = _steep(x, at, slope) | _single(g, x, at, slope == 0)
        return jnp.where(single, x, jnp.nan)

    at, slope = _value_and_slope(g, x)
    need = jnp.any(~_steep(x, at, slope) & ~jnp.isnan(x))
    return lazy.once(need, x, y, neighbours)


def _steep(x: Any, at: Any, slope: Any) -> Any:
    """Per element, whether `g` moves so fast at `x` that `_single`'s
    neighbours pass: at the farthest one, `sqrt(eps) |x|` away, the
    first-order change is 64 times `_single`'s rounding noise. Not on a
    plateau then (`g'(x) != 0`); an extremum there would be a turn within
    `sqrt(eps) |x|` sharp enough to outweigh that slope, and both preimages
    within that distance: the grid trusted by the monotonicity check
    (`monotone_on_grid`) does not see turns of that size either."""
    eps, tiny = _eps_tiny(x)
    far = jnp.sqrt(eps) * jnp.maximum(jnp.abs(x), 1.0)
    return jnp.abs(slope) * far > 64 * (4 * eps * jnp.abs(at) + tiny)


def _split(*values: Any) -> Any:
    """`values`, each written to memory (through `lax.optimization_barrier`,
    which XLA does not fuse across): the first tier runs as several passes
    over the elements instead of one. XLA's CPU backend compiles a long
    elementwise fusion to much slower code per operation than short ones
    (a chain of 48 divisions over 10^6 float32 elements: 14 ms as one
    fusion, 5.5 ms as passes of 4 to 8); writing and reading an array
    between passes costs far less."""
    out = lax.optimization_barrier(values)
    return out if len(values) > 1 else out[0]


def _fast(g: Callable[[Any], Any], y: Any) -> Any:
    """Tier 1 of `_find_roots`: one round of Newton steps from the best start,
    accepted where its residual is down to rounding, else NaN. No loop; a
    pass over the elements for the start, one per Newton step and two for
    the acceptance test (`_split`), each with one value out (an
    intermediate XLA would hand to two consumers is written to memory)."""
    x = _split(_best_start(g, y))
    for _ in range(_newton_round(y)):
        # The plain step (no test of its size: a second use of each point
        # would be a second value out of the pass).
        residual, slope = _residual_and_slope(g, y, x)
        x = _split(jnp.where(residual == 0, x, x - residual / slope))
    return _accepted(g, y, x, False)


def _residual_and_slope(g: Callable[[Any], Any], y: Any, x: Any) -> tuple[Any, Any]:
    gx, slope = _value_and_slope(g, x)
    return gx - y, slope


def _rounds(
    g: Callable[[Any], Any],
    y: Any,
    otherwise: Callable[[Any, Any], Any],
    table: _table.Table | None = None,
) -> Any:
    """Tier 2 of `_find_roots`: rounds of Newton steps from the best start,
    while the residual of some element is not down to rounding (at most
    `_MAX_ROUNDS`); a step that leaves the domain (NaN) goes back halfway.
    Accepted, or else (lazily) `otherwise(y, start)`. With a `table`, its
    start is one of the starts (where it fits best: a cell at the edge of
    the map's image may give a poor one)."""
    start = _best_start(g, y, table)

    def round_(x: Any) -> tuple[Any, Any]:
        previous = x
        settled = jnp.zeros(jnp.shape(y), bool)
        for _ in range(_newton_round(y)):
            moved, settled = _newton(g, y, x)
            # NaN: `x` itself is outside the domain; back halfway to the
            # last point inside.
            outside = jnp.isnan(moved)
            x, previous = (
                jnp.where(outside, previous / 2 + x / 2, moved),
                jnp.where(outside, previous, x),
            )
        return x, settled

    def cond(state: tuple[Any, Any, Any]) -> Any:
        i, _, settled = state
        return (i < _MAX_ROUNDS) & jnp.any(~settled)

    def body(state: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        i, x, settled = state
        x_new, now = round_(x)
        x = jnp.where(settled, x, x_new)
        return i + 1, x, settled | now | jnp.isnan(x)

    x = start
    _, x, settled = lax.while_loop(cond, body, (jnp.int32(0), x, jnp.isnan(x)))
    # (One pass: the evaluations a second would repeat cost more here than
    # in the first tier, where every call pays for them.)
    x = _accepted(g, y, x, settled, split=False)
    return lazy.lazily(x, y, lambda y: otherwise(y, start))


def _search(
    g: Callable[[Any], Any],
    y: Any,
    start: Any = None,
    choices: Callable[[Any], Any] | None = None,
) -> Any:
    """The full search (steps 1 to 4 of the module's docstring), for every
    element: what the fast path (`_find_roots`) leaves undecided. `start`:
    the best start (`_best_start`) if the caller has it; `choices`: `g`'s
    discrete choices at a point (see `solver`)."""
    eps = jnp.finfo(jnp.result_type(y)).eps

    def residual(x: Any) -> Any:
        return g(x) - y

    # 1. A start where the residual is a number (NaN marks a point outside
    # the domain; +-inf still tells which side the root is on).
    if start is None:
        start = _best_start(g, y)
    best_f = residual(start)
    started = ~jnp.isnan(start) & ~jnp.isnan(best_f)
    best_x = jnp.where(started, start, 0.0)
    best_f = jnp.where(started, best_f, jnp.inf)
    # 2. Bracket; 3. refine.
    a, fa, b, fb = _bracket(g, y, best_x, best_f, started)
    bracketed = ~jnp.isnan(b)
    x, fx, neg, pos = _refine(g, y, a, fa, b, fb, bracketed)
    # 4. Accept only a root within rounding: of `y`, and of `x` through g';
    # or, where `g` rounds intermediates larger than `y`, a sign change of
    # the residual across a few ulps of `x` with a residual below
    # `sqrt(eps) * (1 + |y|)` (a jump of a discontinuous `g` is larger).
    at, slope = jax.jvp(g, (x,), (jnp.ones_like(x),))
    close, single = _accept(g, y, x, at, slope)
    tight = _width_small(neg, pos) & ~jnp.isnan(neg) & ~jnp.isnan(pos)
    small = jnp.abs(fx) <= jnp.sqrt(eps) * (1 + jnp.abs(y))
    if choices is not None:
        # A discrete choice that changes inside the bracket: a jump of `g`
        # (however small), not rounding. Only a root within rounding then.
        small = small & _same_choices(choices(neg), choices(pos))
    ok = bracketed & (close | (tight & small))
    return jnp.where(ok & single, x, jnp.nan)


def _width_small(neg: Any, pos: Any) -> Any:
    """Whether a bracket is down to a few ulps of its ends."""
    finfo = jnp.finfo(jnp.result_type(neg))
    scale = jnp.maximum(jnp.maximum(jnp.abs(neg), jnp.abs(pos)), finfo.tiny)
    return jnp.abs(pos - neg) <= 4 * finfo.eps * scale


def _bracket(
    g: Callable[[Any], Any],
    y: Any,
    best_x: Any,
    best_f: Any,
    started: Any,
) -> tuple[Any, Any, Any, Any]:
    """Step 2: from the start `best_x`, step away until the residual changes
    sign: `(a, f(a), b, f(b))`, `b` NaN where no bracket was found."""
    dtype = jnp.result_type(y)
    finfo = jnp.finfo(dtype)
    eps, tiny = finfo.eps, finfo.tiny
    # The direction in which the residual moves towards zero, from the slope
    # at the start (a monotone `g` has one sign of slope throughout).
    _, slope = jax.jvp(g, (best_x,), (jnp.ones_like(best_x),))
    slope_sign = jnp.sign(jnp.where(jnp.isnan(slope), 0.0, slope))
    direction = -jnp.sign(best_f) * slope_sign
    direction = jnp.where(direction == 0, 1.0, direction).astype(dtype)
    exp_range = int(finfo.maxexp - finfo.minexp)
    max_expand = 2 * exp_range + 2 * int(finfo.nmant) + 8
    is_root = best_f == 0

    def expand_cond(state: tuple[Any, ...]) -> Any:
        i, _, _, _, _, _, active, _ = state
        return (i < max_expand) & jnp.any(active)

    def expand_body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, a, fa, b, fb, step, active, flips = state
        xb = a + direction * step * jnp.where(flips > 0, -1.0, 1.0).astype(dtype)
        f_new = g(xb) - y
        undefined = jnp.isnan(f_new) | ~jnp.isfinite(xb)
        crossed = ~undefined & ((jnp.sign(f_new) != jnp.sign(fa)) | (f_new == 0))
        # Further from zero on the same side: the step jumped a pole or an
        # extremum, or the slope at the start misled. Shrink the step like
        # where `g` is undefined; once it is tiny, turn round (once).
        # From a start on a plateau (slope 0: no direction to go), a step
        # that moves nothing is no better: the root may lie the other way.
        flat = (slope_sign == 0) & (flips == 0) & (jnp.abs(f_new) == jnp.abs(fa))
        worse = ~undefined & ~crossed & ((jnp.abs(f_new) > jnp.abs(fa)) | flat)
        go_on = active & ~undefined & ~crossed & ~worse
        shrink = active & (undefined | worse)
        new_step = jnp.where(go_on, step * 2, jnp.where(shrink, step / 2, step))
        tiny_step = new_step <= eps * jnp.maximum(jnp.abs(a), tiny)
        turn = shrink & tiny_step & (flips == 0)
        give_up = shrink & tiny_step & (flips > 0)
        new_step = jnp.where(turn, jnp.maximum(jnp.abs(a), 1.0), new_step)
        a = jnp.where(go_on, xb, a)
        fa = jnp.where(go_on, f_new, fa)
        b = jnp.where(active & crossed, xb, b)
        fb = jnp.where(active & crossed, f_new, fb)
        flips = jnp.where(turn, flips + 1, flips)
        still = active & ~crossed & ~give_up
        return i + 1, a, fa, b, fb, new_step, still, flips

    # First step: twice Newton's, at most the start's magnitude (or 1).
    newton_step = 2 * jnp.abs(best_f / slope)
    step0 = jnp.maximum(jnp.abs(best_x), 1.0)
    step0 = jnp.where(
        jnp.isfinite(newton_step) & (newton_step > 0),
        jnp.minimum(newton_step, step0),
        step0,
    )
    nan = jnp.full_like(y, jnp.nan)
    state = (
        jnp.int32(0),
        best_x,
        best_f,
        jnp.where(is_root, best_x, nan),
        jnp.where(is_root, best_f, nan),
        step0,
        started & ~is_root,
        jnp.zeros(jnp.shape(y), jnp.int32),
    )
    # Inside a `shard_map` body every carry varies as `y` does.
    state = compat.vary_like(state, y)
    _, a, fa, b, fb, _, _, _ = lax.while_loop(expand_cond, expand_body, state)
    return a, fa, b, fb


def _refine(
    g: Callable[[Any], Any],
    y: Any,
    a: Any,
    fa: Any,
    b: Any,
    fb: Any,
    bracketed: Any,
) -> tuple[Any, Any, Any, Any]:
    """Step 3: safeguarded Newton between `neg` (residual < 0) and `pos`
    (> 0): `(x, f(x), neg, pos)`, `x` the best point found."""
    finfo = jnp.finfo(jnp.result_type(y))
    eps, tiny = finfo.eps, finfo.tiny
    neg = jnp.where(fa < 0, a, b)
    pos = jnp.where(fa < 0, b, a)
    max_refine = 4 * (int(finfo.nmant) + 16)

    def value_and_slope(x: Any) -> tuple[Any, Any]:
        gx, dgx = jax.jvp(g, (x,), (jnp.ones_like(x),))
        return gx - y, dgx

    x0 = jnp.where(jnp.abs(fa) <= jnp.abs(fb), a, b)
    x0 = jnp.where(bracketed, x0, 0.0)
    f0, d0 = value_and_slope(x0)

    def refine_cond(state: tuple[Any, ...]) -> Any:
        i, *_, active = state
        return (i < max_refine) & jnp.any(active)

    def refine_body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        i, x, fx, dfx, neg, pos, bisect, active = state
        x_old = x
        lo, hi = jnp.minimum(neg, pos), jnp.maximum(neg, pos)
        newton = x - fx / dfx
        use_newton = ~bisect & (newton > lo) & (newton < hi)
        same_sign = (lo > 0) | (hi < 0)
        ratio_big = same_sign & (jnp.abs(hi) > 8 * jnp.abs(lo))
        mag = jnp.exp(0.5 * (jnp.log(jnp.abs(lo)) + jnp.log(jnp.abs(hi))))
        geometric = jnp.sign(hi) * mag
        arithmetic = lo / 2 + hi / 2
        mid = jnp.where(ratio_big, geometric, arithmetic)
        mid = jnp.where((mid > lo) & (mid < hi), mid, arithmetic)
        x_new = jnp.where(use_newton, newton, mid)
        f_new, d_new = value_and_slope(x_new)
        neg = jnp.where(active & (f_new < 0), x_new, neg)
        pos = jnp.where(active & (f_new > 0), x_new, pos)
        slow = ~(jnp.abs(f_new) <= 0.5 * jnp.abs(fx))
        take = active & (jnp.abs(f_new) <= jnp.abs(fx)) | active & jnp.isnan(fx)
        x = jnp.where(take, x_new, x)
        fx = jnp.where(take, f_new, fx)
        dfx = jnp.where(take, d_new, dfx)
        # Newton's steps shrink the bracket from one side only: stop once a
        # step no longer moves `x` beyond rounding.
        settled = use_newton & (
            jnp.abs(x_new - x_old) <= 4 * eps * jnp.maximum(jnp.abs(x_old), tiny)
        )
        # ... or once the residual is down to rounding.
        floor = 2 * eps * (jnp.abs(y) + rd.through(x_new, d_new))
        settled = settled | (jnp.abs(f_new) <= floor)
        done = (f_new == 0) | _width_small(neg, pos) | jnp.isnan(f_new) | settled
        return i + 1, x, fx, dfx, neg, pos, slow, active & ~done

    state = (
        jnp.int32(0),
        x0,
        f0,
        d0,
        neg,
        pos,
        jnp.zeros(jnp.shape(y), bool),
        bracketed & (f0 != 0) & ~_width_small(neg, pos),
    )
    state = compat.vary_like(state, y)
    _, x, fx, dfx, neg, pos, _, _ = lax.while_loop(refine_cond, refine_body, state)
    # The bracket's ends: keep whichever fits best.
    for end in (neg, pos):
        f_end = g(end) - y
        better = jnp.abs(f_end) < jnp.abs(fx)
        x = jnp.where(better, end, x)
        fx = jnp.where(better, f_end, fx)
    return x, fx, neg, pos


def _same_choices(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """Per element, whether two evaluations' discrete choices agree."""
    same: Any = True
    for u, v in zip(a, b, strict=True):
        same = same & jnp.all((u == v) | (jnp.isnan(u) & jnp.isnan(v)), axis=-1)
    return same


def _accept(g: Callable[[Any], Any], y: Any, x: Any, at: Any, slope: Any) -> Any:
    """`(close, single)` per element, for a candidate `x` with `g(x) = at`
    and `g'(x) = slope`: whether `at` is `y` within rounding (of `y`, and of
    `x` through `g'`), and whether no other `x` nearby shares it
    (`_single`)."""
    return rd.maps_back(at, y, x, slope), _single(g, x, at, slope == 0)


def edge_of_plateau(g: Callable[[Any], Any], x: Any) -> Any:
    """Per element, whether `x` is the end of a stretch on which `g` is
    constant: `g(x)` is repeated exactly at `x - d` or at `x + d` (`d =
    sqrt(eps) max(|x|, 1)`) while `g` moves beyond rounding on the other
    side. At such a corner (`relu(x) + relu(x)**2` at 0) the slope is not 0,
    so `_single`'s plateau test, and for a steep map its neighbours, pass it,
    yet every point of the stretch shares `g(x)`. A smooth map is constant
    on no stretch, unless it rounds to one (a sigmoid at 1): flat on both
    sides, or moving on both, it is left to the other tests. The flat side
    must be flat four steps away as well: a map computed from terms larger
    than its value rounds to steps, and may repeat `g(x)` one step away."""
    finfo = jnp.finfo(jnp.result_type(x))
    eps, tiny = finfo.eps, finfo.tiny
    d = plateau_step(x)
    at, below, above = g(x), g(x - d), g(x + d)
    noise = 4 * eps * jnp.abs(at) + tiny
    moves_below, moves_above = jnp.abs(below - at) > noise, jnp.abs(above - at) > noise
    # A stretch, not the rounding of a map computed from larger terms, whose
    # values come in steps (TFP's `Softfloor(0.05)` at `y = -2e-5`: steps of
    # 1.9e-6, one per 8.7e-4 of `x`): the same value four steps away too.
    flat_below = (below == at) & (g(x - 4 * d) == at)
    flat_above = (above == at) & (g(x + 4 * d) == at)
    return (flat_below & moves_above) | (flat_above & moves_below)


def plateau_step_size(dtype: Any) -> float:
    """`plateau_step`'s step relative to `max(|x|, 1)`: `sqrt(eps)`."""
    return math.sqrt(float(jnp.finfo(dtype).eps))


def plateau_step(x: Any) -> Any:
    """The step `d` from `x` to the neighbours `edge_of_plateau` compares
    with `g(x)`: `sqrt(eps) max(|x|, 1)` (`plateau_step_size`)."""
    eps = jnp.finfo(jnp.result_type(x)).eps
    return jnp.sqrt(eps) * jnp.maximum(jnp.abs(x), 1.0)


def _single(g: Callable[[Any], Any], x: Any, at: Any, flat: Any) -> Any:
    """Per element, for a candidate `x` with `g(x) = at`, and `flat` where
    `g'(x) == 0`: whether no other `x` nearby shares `at`: not on a plateau
    (a constant branch, a saturated clamp: `g'(x) == 0` and `g` flat on a
    side) nor at an extremum (both neighbours on one side of `g(x)`, beyond
    rounding, for steps of three sizes; a neighbour outside the domain,
    NaN, counts as neither)."""
    finfo = jnp.finfo(jnp.result_type(x))
    eps, tiny = finfo.eps, finfo.tiny
    minus = -at
    noise = 4 * eps * jnp.abs(minus) + tiny
    extremum = jnp.zeros(jnp.shape(x), bool)
    flat_below = flat_above = jnp.ones(jnp.shape(x), bool)
    magnitude = jnp.maximum(jnp.abs(x), 1.0)
    for rel in (jnp.sqrt(eps), eps**0.75, 16 * eps):
        below = g(x - rel * magnitude) + minus
        above = g(x + rel * magnitude) + minus
        # (Both beyond `noise` on one side; a NaN compares false.)
        extremum = extremum | (jnp.minimum(below, above) > noise)
        extremum = extremum | (jnp.maximum(below, above) < -noise)
        flat_below = flat_below & ~(jnp.abs(below) > noise)
        flat_above = flat_above & ~(jnp.abs(above) > noise)
    return (~flat | ~(flat_below | flat_above)) & ~extremum
