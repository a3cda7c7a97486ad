"""Piecewise-rational elementwise blocks, inverted interval by interval.

A rational-quadratic spline (Durkan et al., 2019) picks one of its bins by
comparing its unknown with the knots, clips the position inside each bin,
and is a quotient of quadratics in each bin: written with `jnp.where` over
four bins it has fourteen comparisons and clamps of the unknown, so the
piecewise method (`_block_solve.solve_piecewise`, at most `MAX_CASES` choices of
cases, each inverted by a formula) cannot enumerate its cases, and no case
has a formula the engine knows (a quadratic). Here it is inverted exactly:

1. **Breakpoints.** Every discrete choice the block makes depends on its
   unknown `x` through a comparison (`x >= knot`), a `max`/`min`/`clamp`
   against a known bound, an `abs` or a `sign` (-1, 0 or 1: a comparison
   with 0), of a value `u` computed from `x` by
   a chain of monotone steps, each with one unknown operand (`(x - k) / w`,
   `exp`, a clamp). The choice can change only where `u` crosses the bound,
   at the `x` the chain's inverse gives (and where a step of the chain
   leaves its domain: `log` at 0). Between consecutive breakpoints (sorted;
   they are traced values) every choice is constant, so the block is one
   formula there. A breakpoint too many only splits an interval; none is
   missing, because the chain is monotone between them.
2. **One formula per interval.** The block is walked once, with each value
   held as a quotient of polynomials of degree at most two in `z = x - c`
   (`c` the interval's point nearest 0, so that a root comes out to
   rounding of itself), the choices fixed as they fall at a point `r`
   inside the interval: a `select_n`, `max` or `abs` selects its operands'
   coefficients. Every interval is walked at
   once (a leading axis of representatives); a value used only by
   comparisons may be anything (`exp(x) > 1`).
3. **Candidates.** Per interval, the roots of `N(z) - y D(z)` (a quadratic:
   both roots) that lie in the interval (within rounding), and each
   breakpoint where the block's value there is `y`. Every preimage of `y`
   is among them, so: one candidate (or several within rounding of each
   other) is the answer; two apart are NaN (the map is not injective
   there); an interval on which the block is the constant `y` is NaN
   (every point of it a preimage); the answer must map back to `y`, else
   NaN (`y` outside the image).

Where the intervals are the same for every element (known operands that
are scalars or tables, as a spline's knots), the block is checked monotone
once, on the tables (`_monotone`: constant stretches allowed), and each `y`
is then looked up in the one interval that holds it (`_looked_up`): per
element, a comparison with each breakpoint's value, one quadratic, the
checks. Otherwise (or when the check fails, under a `lax.cond`) every
interval's quadratic is solved per element (`_every_interval`).

Nothing here is a numerical search (the answer gets one Newton step, as
a polish, from a root already within rounding of the interval's scale). A
block is taken only if every step that depends on `x` is of the kinds
above; its value may use `x` any number of times.

**Per-element blocks** (`_perelement.py`: a spline whose bins are picked
through an extra axis, distrax's one-hot sums) are walked too:

- `x[:, None]` compared with a row of knots gives a breakpoint per knot
  (`_unbroadcast`);
- values computed from comparisons and known values alone are piecewise
  constant (the bin's knots, picked by a one-hot sum); a chain through
  them (the clipped position `(x - knot) / width`) gives breakpoints of
  **level 1**, computed per interval between the level-0 ones from the
  piecewise-constant values there, and kept where they fall inside it;
- steps that move or sum axes (`broadcast_in_dim`, `slice`, `squeeze`,
  `reduce_sum`...) are applied to the values and to the quotients'
  coefficients, under `vmap` over the representatives;
- a known value broadcast to every element (the knots, in the program's
  own `broadcast_in_dim`) is taken from before the broadcast
  (`SolveState.compact`) and kept at size 1 along the elements' axes
  (`_bind`), so that the tables are one row and each `y` is looked up.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _interval_plan as ip, _rational as ra, _rounding as rd
from ._elementwise_steps import derivative
from ._rational import NotRational

# Method, as `explain_inverse` names it.
INTERVALS = "piecewise by intervals"

# -- solving -------------------------------------------------------------


class _Tables(NamedTuple):
    """Per interval (leading axis, `K + 1`): the quotient's coefficients
    (in `x - r`), the point `r` they are expanded about and the ends; per
    breakpoint (`K`): where it is and the block's value there; per
    interval, the block's value at a point inside it; per breakpoint, the
    magnitude it is computed to rounding of."""

    num: ra.Poly
    den: ra.Poly
    r: Any
    lo: Any
    hi: Any
    t: Any
    y_t: Any
    y_r: Any
    t_scale: Any  # per breakpoint, the magnitude it is rounded at


def _tables(plan: ip.Plan, known: Sequence[Any], rank: int, dtype: Any) -> _Tables:
    env = ip.known_env(plan, known)
    t, t_scale = ip.breakpoints(plan, env, rank, dtype)  # (K, ...) each
    # Representatives: one inside each interval (K + 1), then the K
    # breakpoints themselves (the block's value there).
    inside, lo, hi = ip.representatives(t)
    reps = jnp.concatenate([inside, t])
    k = t.shape[0]
    # Each interval's quotient is expanded about its point nearest 0 (not
    # its representative): a root is then computed to rounding of itself,
    # not of the interval's middle (a root near 0 in an interval around 1
    # came out as 0 and its sign lost), and the expansion stays within the
    # interval's width of every point of it.
    centers = jnp.clip(jnp.zeros_like(lo), lo, hi)
    walked = ip.walk(plan, env, reps, jnp.concatenate([centers, t]))

    def intervals(p: ra.Poly) -> ra.Poly:
        # (Coefficients without the representatives' axis are known values.)
        return tuple(c[: k + 1] if jnp.ndim(c) == rank + 1 else c for c in ra.padded(p))

    assert walked.frac is not None
    return _Tables(
        intervals(walked.frac.num),
        intervals(ra.denominator(walked.frac)),
        centers,
        lo,
        hi,
        t,
        walked.point[k + 1 :],
        walked.point[: k + 1],
        t_scale,
    )


def _in_interval(x: Any, lo: Any, hi: Any, s_lo: Any, s_hi: Any, eps: float) -> Any:
    """Whether a root `x` of an interval's quotient lies in the interval,
    within rounding at each end: of the end's value and of the magnitude
    it is computed from (`s_lo`, `s_hi`), and of `x`. (Not of the other
    end: a root of `[0, 16]` at -1e-6 is outside it, where another
    interval's root is the preimage.)"""

    def slack(end: Any, s: Any) -> Any:
        return 16 * eps * jnp.maximum(jnp.maximum(jnp.abs(x), s), jnp.abs(end))

    slack_lo, slack_hi = slack(_finite_or_0(lo), s_lo), slack(_finite_or_0(hi), s_hi)
    return (x >= lo - slack_lo) & (x <= hi + slack_hi)


class _Running(NamedTuple):
    """Candidates seen so far, per element: the first accepted (NaN until
    one is), its scale, the largest and smallest accepted, and the largest
    rounding scale of the breakpoints they come from."""

    x: Any
    scale: Any
    top: Any
    bottom: Any
    rounding: Any

    @staticmethod
    def start(zero: Any) -> _Running:
        # (From `zero`, computed from `y`: inside a `shard_map` the loop's
        # carry must vary over the mesh as `y` does.)
        return _Running(zero + jnp.nan, zero, zero - jnp.inf, zero + jnp.inf, zero)

    def seen(self, cand: Any, ok: Any, scale: Any, rounding: Any) -> _Running:
        ok = ok & ~jnp.isnan(cand)
        take = ok & jnp.isnan(self.x)
        return _Running(
            jnp.where(take, cand, self.x),
            jnp.where(take, scale, self.scale),
            jnp.where(ok, jnp.maximum(self.top, cand), self.top),
            jnp.where(ok, jnp.minimum(self.bottom, cand), self.bottom),
            jnp.where(ok, jnp.maximum(self.rounding, rounding), self.rounding),
        )

    def spread(self) -> Any:
        return jnp.where(self.top > self.bottom, self.top - self.bottom, 0.0)


def _every_interval(tab: _Tables, y: Any, eps: float) -> tuple:
    """The first candidate of every interval and breakpoint accepted, per
    element (NaN where none is, or on a plateau at `y`), how far apart the
    accepted ones are beyond the rounding of the breakpoints they come
    from, and the scale of the first.

    One interval at a time (a loop): stacking every interval's candidates
    held `(3K + 2) n` values at once, gigabytes for a million elements and
    `MAX_BREAKS` breakpoints; the loop holds a few times `n` besides the
    tables."""
    y = jnp.asarray(y)
    rank = y.ndim
    k = tab.t.shape[0]
    ends, interior = _ends(tab), _interior(tab, eps)
    lower, upper = _end_scales(tab)
    coefs = (*tab.num, *tab.den)
    # Per interval, whether its quotient is a constant (no `z` terms).
    fixed = functools.reduce(
        operator.and_, [c == 0 for p in (tab.num, tab.den) for c in p[1:]]
    )

    def at(v: Any, i: Any) -> Any:
        # (A coefficient without the intervals' axis is a known value.)
        if jnp.ndim(v) != rank + 1:
            return v
        return jax.lax.dynamic_index_in_dim(v, i, 0, keepdims=False)

    def interval(i: Any, carry: tuple) -> tuple:
        run, plateau = carry
        n0, n1, n2, d0, d1, d2 = (at(c, i) for c in coefs)
        e0, e1, e2 = n0 - y * d0, n1 - y * d1, ra.leading(n2, d2, y)
        r, lo, hi, scale = at(tab.r, i), at(tab.lo, i), at(tab.hi, i), at(ends, i)
        s_lo, s_hi = at(lower, i), at(upper, i)
        for z in ra.quadratic(e2, e1, e0):
            # (A root is computed to rounding of itself: its interval's
            # ends may be far, and computed at another scale.)
            inside = _in_interval(r + z, lo, hi, s_lo, s_hi, eps)
            run = run.seen(r + z, inside, scale, 0.0)
        # An interval (of some length) on which the block is the constant `y`.
        constant = ((e0 == 0) & (e1 == 0) & (e2 == 0)) | (
            at(fixed, i) & rd.close(at(tab.y_r, i), y, jnp.abs(y))
        )
        return run, plateau | (constant & at(interior, i))

    def breakpoint_(j: Any, run: _Running) -> _Running:
        y_t = at(tab.y_t, j)
        return run.seen(
            jnp.broadcast_to(at(tab.t, j), y.shape),
            rd.close(y_t, y, jnp.abs(y)),
            jnp.abs(_finite_or_0(y_t)),
            at(tab.t_scale, j),
        )

    zero = jnp.where(y == y, 0.0, 0.0).astype(y.dtype)
    start = (_Running.start(zero), zero != 0)
    run, plateau = _loop(k + 1, interval, start)
    run = _loop(k, breakpoint_, run)
    spread = _beyond_rounding(run.spread(), run.rounding, eps)
    return jnp.where(plateau, jnp.nan, run.x), spread, run.scale


def _loop(n: int, body: Callable[[Any, Any], Any], carry: Any) -> Any:
    """`body` for `i` in `range(n)`, as a `while_loop`: nothing here is
    differentiated (the method's derivatives are the implicit function's),
    and JAX's `fori_loop` with a known trip count is a `scan`, which under
    JAX 0.12's `jax_scan3` flag gave NaN inside a `jvp`."""

    def step(state: tuple[Any, Any]) -> tuple[Any, Any]:
        i, c = state
        return i + 1, body(i, c)

    return jax.lax.while_loop(lambda state: state[0] < n, step, (0, carry))[1]


def _finite_or_0(v: Any) -> Any:
    return jnp.where(jnp.isfinite(v), v, 0.0)


def _ends(tab: _Tables) -> Any:
    """Per interval, the larger magnitude of the block's values at its ends
    (the scale of the terms the block adds up there: its value is
    computed to rounding of that, not of `y`; a spline's `y` near 0 is
    its knot's height plus the bin's quotient)."""
    nan = jnp.full_like(tab.y_t[:1], jnp.nan)
    lower = jnp.concatenate([nan, tab.y_t])
    upper = jnp.concatenate([tab.y_t, nan])
    return jnp.maximum(jnp.abs(_finite_or_0(lower)), jnp.abs(_finite_or_0(upper)))


def _interior(tab: _Tables, eps: float) -> Any:
    """Which intervals are wider than rounding of their ends. A sliver a few
    ulps wide (a bin's clip saturating a few ulps before the next bin's
    knot, which the bin widths' rounding puts elsewhere) may hold a
    constant: its points are one preimage within rounding, and its ends
    are breakpoint candidates. The rounding is that of the computation of
    the ends (`t_scale`), not of their values: in the gallery's flow, a bin
    saturating at `knot + width = -0.069` (knot -1.38) made a sliver 16
    ulps of 0.069 wide, whose value a `y` within rounding of it hit (NaN)."""
    finite = jnp.isfinite(tab.lo) & jnp.isfinite(tab.hi)
    scale = jnp.maximum(jnp.maximum(jnp.abs(tab.lo), jnp.abs(tab.hi)), _scales(tab))
    return ~finite | (tab.hi - tab.lo > 8 * eps * scale)


def _end_scales(tab: _Tables) -> tuple[Any, Any]:
    """Per interval, the rounding scales of its lower and upper ends (0 for
    an infinite end)."""
    zero = jnp.zeros_like(tab.t_scale[:1])
    return jnp.concatenate([zero, tab.t_scale]), jnp.concatenate([tab.t_scale, zero])


def _scales(tab: _Tables) -> Any:
    """Per interval, the larger rounding scale of its two ends."""
    return jnp.maximum(*_end_scales(tab))


def _uniform(tab: _Tables) -> bool:
    """Whether the tables are the same for every element (each value's
    elements' axes of size one): then the interval of each `y` is looked up."""
    values = [*tab.num, *tab.den, tab.r, tab.t, tab.y_t, tab.t_scale]
    return all(int(np.prod(jnp.shape(v)[1:])) == 1 for v in values)


def _flat(tab: _Tables) -> _Tables:
    k1 = tab.r.shape[0]

    def one(v: Any, n: int) -> Any:
        if ra.static_zero(v):
            return v  # (kept static: `_looked_up` drops its terms)
        return jnp.broadcast_to(jnp.reshape(v, (-1,)) if jnp.ndim(v) else v, (n,))

    return _Tables(
        tuple(one(c, k1) for c in tab.num),
        tuple(one(c, k1) for c in tab.den),
        one(tab.r, k1),
        one(tab.lo, k1),
        one(tab.hi, k1),
        one(tab.t, k1 - 1),
        one(tab.y_t, k1 - 1),
        one(tab.y_r, k1),
        one(tab.t_scale, k1 - 1),
    )


def _monotone(tab: _Tables, eps: float) -> tuple[Any, Any, Any]:
    """Whether the block (1-D tables) is monotone: in each interval of some
    length the quotient goes one way, the same in every interval, or is
    constant (a saturated clamp), and `D` has no zero; across each
    breakpoint the values do not go back (within rounding of the value
    there). And the direction (+1 or -1), and which intervals are constant
    stretches.

    Within an interval the quotient turns only where the derivative's
    numerator `N'D - ND'` (a quadratic: the cubic terms cancel) is 0. On a
    finite interval it may turn by rounding (a nearly flat bin of a spline,
    whose numerator is rounding of its coefficients): its values at the
    ends and at those roots must not go back by more than rounding of the
    values there (`y` then has one preimage within rounding). On an
    infinite one the numerator keeps one sign."""
    n0, n1, n2 = tab.num
    d0, d1, d2 = tab.den
    p0 = n1 * d0 - n0 * d1
    p1 = 2 * (n2 * d0 - n0 * d2)
    p2 = n2 * d1 - n1 * d2
    zlo, zhi = tab.lo - tab.r, tab.hi - tab.r
    nonempty = _interior(tab, eps)

    def inside(z: Any) -> Any:
        return (z > zlo) & (z < zhi)

    def value(z: Any) -> Any:
        d = ra.polyval(tab.den, z)
        return ra.polyval(tab.num, z) / jnp.where(d == 0, 1.0, d)

    q1, q2 = ra.quadratic(p2, p1, p0)
    poles = ra.quadratic(d2, d1, d0)
    finite_lo, finite_hi = jnp.isfinite(zlo), jnp.isfinite(zhi)
    finite = finite_lo & finite_hi
    z_lo = jnp.where(finite_lo, zlo, 0.0)
    z_hi = jnp.where(finite_hi, zhi, 0.0)
    den_lo, den_hi = ra.polyval(tab.den, z_lo), ra.polyval(tab.den, z_hi)
    fl, fh = value(z_lo), value(z_hi)
    # The roots inside (in order; an end where there is none).
    first = jnp.where(inside(q1), q1, z_lo)
    second = jnp.where(inside(q2), q2, z_lo)
    first, second = jnp.minimum(first, second), jnp.maximum(first, second)
    path = [fl, value(first), value(second), fh]
    tol = (
        16
        * eps
        * functools.reduce(jnp.maximum, [jnp.abs(_finite_or_0(v)) for v in path])
    )
    flat = nonempty & (p0 == 0) & (p1 == 0) & (p2 == 0)
    moving = nonempty & ~flat
    # The way each interval goes: by its end values where both are finite
    # (neither, if they are within rounding), else by the numerator's sign.
    rising = jnp.where(finite, fh - fl > tol, p0 > 0)
    falling = jnp.where(finite, fl - fh > tol, p0 < 0)
    up = jnp.all(~falling | ~moving)
    down = jnp.all(~rising | ~moving)
    s = jnp.where(up, 1.0, -1.0).astype(tab.t.dtype)
    back = functools.reduce(
        operator.or_, [s * (path[i + 1] - path[i]) < -tol for i in range(3)]
    )
    bad = (
        jnp.where(finite, back, inside(q1) | inside(q2) | (p0 == 0))
        | functools.reduce(operator.or_, [inside(p) for p in poles])
        | (finite_lo & (den_lo == 0))
        | (finite_hi & (den_hi == 0))
        | ~jnp.isfinite(p0)
    )
    b = tab.y_t
    tol_b = 16 * eps * jnp.abs(b)
    ordered = (s * fh[:-1] <= s * b + tol_b) & (s * b <= s * fl[1:] + tol_b)
    ok = (
        jnp.all(~bad | ~moving)
        & (up | down)
        & jnp.any(moving & (rising | falling))
        & jnp.all(ordered)
        & jnp.all(jnp.isfinite(b))
    )
    return ok, s, flat


def _looked_up(tab: _Tables, s: Any, flat: Any, y: Any, eps: float) -> tuple:
    """As `_every_interval`, from the one interval whose values hold `y`
    (1-D tables of a monotone block, direction `s`) and its two ends; NaN
    where a constant stretch (`flat`) takes the value `y`."""
    k = tab.t.shape[0]
    sy = s * y
    # Which of the breakpoints' values `y` is above. Each column of the
    # tables is then picked by a chain of selects (XLA's CPU code for a
    # gather is not vectorized: a gather per column took several times as
    # long), from the tables computed once (an `optimization_barrier`:
    # else XLA computes their entries inside the chain, per element).
    above = [s * tab.y_t[j] < sy for j in range(k)]
    nan = jnp.full((1,), jnp.nan, tab.t.dtype)
    # (Coefficients that are 0 whatever the knots, the quadratic terms of a
    # linear-fractional block, stay out of the lookup: one root, no square
    # root.)
    coefs = (*tab.num, *tab.den)
    columns = [
        *(c for c in coefs if not ra.static_zero(c)),
        tab.r,
        tab.lo,
        tab.hi,
        jnp.concatenate([nan, tab.y_t]),  # the value at the lower end
        jnp.concatenate([tab.y_t, nan]),  # at the upper end
        _ends(tab),
    ]
    # The breakpoints' rounding: the largest of any (not a column per end:
    # two more columns made the gallery's spline 12% slower). The block is
    # monotone, so a candidate that counts by it is one preimage within
    # it, which the check of the answer then confirms; not so for a block
    # that turns (`_every_interval`: each end's own).
    columns, rounding = jax.lax.optimization_barrier(
        (
            [jnp.broadcast_to(c, tab.r.shape) for c in columns],
            jnp.max(tab.t_scale, initial=0.0),
        )
    )
    row = []
    for c in columns:
        v = jnp.broadcast_to(c[0], jnp.shape(y))
        for j in range(k):
            v = jnp.where(above[j], c[j + 1], v)
        row.append(v)
    *picked, r, lo, hi, y_lo, y_hi, scale = row
    it = iter(picked)
    n0, n1, n2, d0, d1, d2 = (c if ra.static_zero(c) else next(it) for c in coefs)
    cands, oks = [], []
    for z in ra.quadratic(ra.leading(n2, d2, y), n1 - y * d1, n0 - y * d0):
        cands.append(r + z)
        oks.append(_in_interval(r + z, lo, hi, rounding, rounding, eps))
    cands += [lo, hi]
    oks += [rd.close(y_lo, y, jnp.abs(y)), rd.close(y_hi, y, jnp.abs(y))]
    # (Row by row: a reduction over a stacked axis is several times slower.)
    oks = [o & ~jnp.isnan(c) for c, o in zip(cands, oks, strict=True)]
    x = jnp.full(jnp.shape(y), jnp.nan, jnp.result_type(y))
    for c, o in reversed(list(zip(cands, oks, strict=True))):
        x = jnp.where(o, c, x)
    # How far apart the accepted candidates are (not measured from `x`: so
    # that XLA need not compute the candidates twice).
    pairs = list(zip(cands, oks, strict=True))
    top = functools.reduce(jnp.maximum, [jnp.where(o, c, -jnp.inf) for c, o in pairs])
    bottom = functools.reduce(jnp.minimum, [jnp.where(o, c, jnp.inf) for c, o in pairs])
    spread = _beyond_rounding(jnp.where(top > bottom, top - bottom, 0.0), rounding, eps)
    plateau = functools.reduce(
        operator.or_,
        [flat[i] & rd.close(tab.y_r[i], y, jnp.abs(y)) for i in range(k + 1)],
    )
    return jnp.where(plateau, jnp.nan, x), spread, scale


def _beyond_rounding(spread: Any, rounding: Any, eps: float) -> Any:
    """How far apart candidates are beyond the rounding of the breakpoints
    they come from (`8 eps` of it, as `_rounding.one_preimage` allows of
    `|x|`). (Subtracted here, not passed on with the answer: one more
    per-element value through the answer's `optimization_barrier` made
    XLA's code for the gallery's spline 2.4 times slower.)"""
    return jnp.maximum(spread - 8 * eps * rounding, 0.0)


def solve(
    block: Any, y: Any, known: Sequence[Any], compacts: Sequence[Any]
) -> Any | None:
    """`x` with `g(x) = y` for a piecewise-rational block (module
    docstring), NaN where `y` has no single preimage; `None` if the block
    is not of that kind. Differentiable in `y` and `known` by the implicit
    function theorem (as the elementwise solver), not through the tables:
    the gradient of a flow through its spline compiled in 71 s that way,
    against 32 s for the solver's. `compacts`: the known values with their
    broadcasts undone (`SolveState.compact`), from which the tables are built."""
    # (Not only blocks with piecewise sites: a per-element block's clips
    # along its extra axis are none, `_perelement.py`.)
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.floating):
        return None
    # (`y`'s shape, not the block's: `_block_solve.flattened`.)
    x_spec = jax.ShapeDtypeStruct(jnp.shape(y), block.x.aval.dtype)
    specs = [jax.ShapeDtypeStruct(jnp.shape(k), jnp.result_type(k)) for k in known]
    closed = jax.make_jaxpr(lambda x, *kn: block.run(x, kn)[block.y])(x_spec, *specs)
    plan = ip.make_plan(closed)
    if plan is None:
        return None
    rank = jnp.ndim(y)
    try:
        # (Traced abstractly: whether the block's quotients stay of degree
        # two, and its breakpoints few enough.)
        jax.eval_shape(lambda *k: _tables(plan, k, rank, dtype), *compacts)
    except NotRational:
        return None
    n = len(known)

    @jax.custom_jvp
    def inverse(y: Any, *both: Any) -> Any:
        return _answer(block, plan, y, both[:n], both[n:])

    @inverse.defjvp
    def _inverse_jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
        # (The compact values' tangents are the known values': not added.)
        y, *both = primals
        dy, *dboth = tangents
        known, dknown = both[:n], dboth[:n]
        x = inverse(y, *both)
        slope = derivative(block.g, x, known)
        if known:
            _, dg = jax.jvp(lambda *k: block.g(x, *k), tuple(known), tuple(dknown))
            dy = dy - dg
        return x, dy / slope

    return inverse(y, *known, *compacts)


def _answer(
    block: Any, plan: ip.Plan, y: Any, known: Sequence[Any], compacts: Sequence[Any]
) -> Any:
    dtype = jnp.result_type(y)
    tab = _tables(plan, compacts, jnp.ndim(y), dtype)
    finfo = jnp.finfo(dtype)
    eps = float(finfo.eps)
    if _uniform(tab):
        # The same intervals for every element: where the block is monotone
        # (checked on the tables, once), each `y` is looked up in its
        # interval; else every interval is tried.
        # (The lookup runs outside the `cond`, whose results are then
        # selected: XLA's CPU code for the same steps inside a branch of a
        # conditional is about ten times slower.)
        flat = _flat(tab)
        monotone, s, stretches = _monotone(flat, eps)
        fast = _looked_up(flat, s, stretches, y, eps)
        full = jax.lax.cond(
            monotone,
            lambda: tuple(jnp.zeros_like(v) for v in fast),
            lambda: _every_interval(tab, y, eps),
        )
        x, spread, scale = (
            jnp.where(monotone, a, b) for a, b in zip(fast, full, strict=True)
        )
    else:
        x, spread, scale = _every_interval(tab, y, eps)
    # Candidates within rounding of each other are one preimage (as in
    # `_block_solve.solve_piecewise`); the answer must map back to `y`.
    # (`x` computed once: XLA's CPU fusion would otherwise recompute it
    # inside the checks, once per use of the unknown in the block.)
    x, spread, scale = jax.lax.optimization_barrier((x, spread, scale))
    # The block and its slope, once, at the answer (a spline of 16 bins
    # through one-hot sums costs as much as its library's inverse). (The
    # slope is not the interval quotient's: reading the looked-up row again
    # after the answer made XLA's CPU code write every column out, four
    # times slower for the gallery's spline.)
    g_x, slope = jax.jvp(lambda u: block.g(u, *known), (x,), (jnp.ones_like(x),))
    # (Candidates are within rounding of the breakpoints they come from,
    # taken off `spread` already, and the block's values of its ends'
    # magnitude: at a knot of a spline on [-3, 3] near 0, its two bins'
    # candidates are an ulp of the knots' sums apart.)
    tol = rd.one_preimage(x, y, slope, y_scale=scale)
    back = rd.maps_back(g_x, y, x, slope) | rd.close(g_x, y, scale)
    # Then one Newton step on it: the root of an interval's quadratic
    # carries the rounding of its coefficients. (Only a step within the
    # rounding the check allowed, of `x` or of the interval's values moved
    # through the slope: whatever the slope, the answer stays within
    # rounding of the one checked.)
    steep = jnp.isfinite(slope) & (slope != 0)
    step = (g_x - y) / jnp.where(steep, slope, 1.0)
    reach = jnp.maximum(jnp.abs(x), scale / jnp.where(steep, jnp.abs(slope), 1.0))
    small = jnp.abs(step) <= 16 * eps * reach
    x = jnp.where(steep & small, x - step, x)
    return jnp.where(~(spread > tol) & back, x, jnp.nan)
