"""Projective blocks: ratios of affine maps of the unknowns.

Split from `_normalized.py`, which tries them where its own walk back from a
`div` of two unknowns finds nothing to pin: an inverse stereographic
projection, `2 x / (|x|^2 + 1)` and `(|x|^2 - 1) / (|x|^2 + 1)`, is a ratio
of maps affine in `x` and in the reductions it divides by (`|x|^2`), taken
as extra unknowns and checked once the others are solved. The ratios
sharing unknowns are solved as one system; identical reductions written
twice are one unknown (`_value_numbers.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_compat as compat
from . import (
    _block_find as bf,
    _block_solve as bs,
    _blocks as bl,
    _nonsquare,
    _traits as tr,
    _value_numbers as vn,
)

_Literal = compat.Literal

PROJECTIVE = "projective solve"

# Reductions whose results a projective block takes as extra unknowns (and
# checks once its other unknowns are solved): a squared norm, a total.
_CUTS = tr.having(tr.REDUCE) - {"reduce_or", "reduce_and"}

# At most this many equations in a projective block.
_MAX_PROJECTIVE = 256


def _known(st: Any, v: Any) -> bool:
    return type(v) is _Literal or v in st.env


def _ratio(st: Any, top: int) -> bool:
    """Whether equation `top` is a `div` of two unknowns with a known
    floating result."""
    eqn = st.eqns[top]
    if eqn.primitive.name != "div" or len(eqn.outvars) != 1:
        return False
    (y,) = eqn.outvars
    if y not in st.env or not jnp.issubdtype(y.aval.dtype, jnp.floating):
        return False
    # One unknown operand: `div`'s own rule, and its refusals.
    return not any(_known(st, v) for v in eqn.invars)


def _affine_region(st: Any, tops: list[int]) -> tuple[set[int], set[Any]] | None:
    """The equations affine in the unknowns below the ratios `tops`, and the
    unknown values they start from (the leaves)."""
    known = st.env.__contains__

    def member(e: Any) -> bool:
        flags = [type(v) is not _Literal and not known(v) for v in e.invars]
        return e.primitive.name not in _CUTS and bl.is_linear(e, flags)

    return bf.grow_region(
        tops, st.eqns, st.producer, known, member=member, max_eqns=_MAX_PROJECTIVE
    )


def solve_projective(st: Any, top: int) -> tuple[bl.Block, Any, Any, str] | None:
    """`y = m / o` with `m` and `o` affine in some unknown values (`x`, and
    reductions of it taken as extra unknowns, as `|x|^2` in an inverse
    stereographic projection): `m - y * o = 0` is a linear system in them,
    solved when it determines them; `None` when the block is not one.

    A reduction written twice (`|x|^2` in the numerator and again in the
    divisor) is one unknown (`_value_numbers.py`), and the other blocked
    ratios that share an unknown with this one (`x / (|x|^2 + 1)` and
    `(|x|^2 - 1) / (|x|^2 + 1)` concatenated) are solved with it, as one
    system whose results all constrain the unknowns."""
    if not _ratio(st, top):
        return None
    grown = _affine_region(st, [top])
    if grown is None:
        return None
    numbers = vn.ValueNumbers(st.eqns, st.producer)
    tops = [top]
    seen = {numbers.number(v) for v in grown[1]}
    joined = True
    while joined:
        joined = False
        for other in sorted(st.reasons):
            if other in tops or not _ratio(st, other):
                continue
            got = _affine_region(st, [other])
            if got is None:
                continue
            theirs = {numbers.number(v) for v in got[1]}
            if theirs & seen:
                tops.append(other)
                seen |= theirs
                joined = True
    if len(tops) > 1:
        tops.sort()
        together = _affine_region(st, tops)
        if together is not None:
            found = _solve_ratios(st, tops, *together, numbers)
            if found is not None:
                return found
    return _solve_ratios(st, [top], *grown, numbers)


def _affine(eqn: Any, known: Any) -> bool:
    """Whether `eqn`'s results are affine in its unknown operands."""
    return bl.is_linear(
        eqn, [type(v) is not _Literal and not known(v) for v in eqn.invars]
    )


def _twins(vs: list[Any], numbers: vn.ValueNumbers) -> list[list[Any]]:
    """`vs` grouped into values that are one computation, in program order."""
    groups: dict[int, list[Any]] = {}
    for v in vs:
        groups.setdefault(numbers.number(v), []).append(v)
    return list(groups.values())


def _place(u: Any, groups: list[list[Any]]) -> list[Any]:
    """The flat vector `u` (one slice per group) as one value per variable
    of `groups`, twins getting the same one."""
    parts, start = [], 0
    for group in groups:
        aval = group[0].aval
        size = math.prod(aval.shape)
        part = jnp.reshape(u[start : start + size], aval.shape).astype(aval.dtype)
        parts.extend([part] * len(group))
        start += size
    return parts


def _one_or_all(parts: list[Any]) -> Any:
    """`parts` as `Block.run` takes them: the value alone for one unknown."""
    return parts if len(parts) > 1 else parts[0]


def _free_and_cuts(st: Any, leaves: set[Any]) -> tuple[list[Any], list[Any]]:
    """The leaves in program order, split into the free unknowns and the
    cuts: leaves computed from the other leaves alone (extra unknowns,
    checked)."""
    eqns, producer, known = st.eqns, st.producer, st.env.__contains__
    by_order = sorted(leaves, key=lambda v: producer.get(v, -1))
    cuts: list[Any] = []
    for v in by_order:
        p = producer.get(v)
        if p is None:
            continue
        others = leaves - {v}

        def stops(u: Any, others: set[Any] = others) -> bool:
            return known(u) or u in others

        got = bf.grow_region([p], eqns, producer, stops)
        if got is not None and not got[1]:
            cuts.append(v)
    return [v for v in by_order if v not in cuts], cuts


def _cut_chains(
    st: Any, cuts: list[Any], free: list[Any]
) -> tuple[set[int], set[int], list[Any]] | None:
    """The equations that compute the cuts from the free unknowns, those of
    them in cuts affine in the free unknowns (`sum(c * x)`: computed from
    them in the system), and the other cuts (`sum(x * x)`: unknowns of the
    system); `None` if a cut is not computed from the free unknowns alone."""
    eqns, producer, known = st.eqns, st.producer, st.env.__contains__
    chains: set[int] = set()
    affine: set[int] = set()
    solved: list[Any] = []
    for c in cuts:
        got = bf.grow_region(
            [producer[c]], eqns, producer, lambda u: known(u) or u in free
        )
        if got is None or got[1]:
            return None
        chains |= got[0]
        if all(_affine(eqns[i], known) for i in got[0]):
            affine |= got[0]
        else:
            solved.append(c)
    return chains, affine, solved


def _solve_ratios(
    st: Any,
    tops: list[int],
    region: set[int],
    leaves: set[Any],
    numbers: vn.ValueNumbers,
) -> tuple[bl.Block, Any, Any, str] | None:
    """The projective block of the ratios `tops` (in program order) over the
    affine `region` from the unknowns `leaves`, solved; `None` when it is
    not one or does not determine them."""
    eqns, producer, env = st.eqns, st.producer, st.env
    known = env.__contains__
    if any(v in st.pieces for v in leaves):
        return None
    free, cuts = _free_and_cuts(st, leaves)
    if not free or not bf.independent(free, region, eqns, producer, known):
        return None
    found = _cut_chains(st, cuts, free)
    if found is None:
        return None
    chains, affine, solved = found
    inside = region | chains
    for i in inside:
        for o in eqns[i].outvars:
            if i not in tops and (o in env or o in st.pieces):
                return None
    # One unknown per value, however often it is written.
    free_groups, cut_groups = _twins(free, numbers), _twins(solved, numbers)
    groups = [*free_groups, *cut_groups]
    ys = [eqns[t].outvars[0] for t in tops]
    n = sum(math.prod(g[0].aval.shape) for g in groups)
    m_eq = sum(math.prod(y.aval.shape) for y in ys)
    if (
        n > m_eq
        or n > bl.MAX_LINEAR
        or not all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in leaves)
    ):
        return None
    known_vars = sorted(
        {
            v
            for i in inside
            for v in eqns[i].invars
            if type(v) is not _Literal and known(v)
        },
        key=lambda v: producer.get(v, -1),
    )
    ratios = [tuple(eqns[t].invars) for t in tops]

    def block(indices: set[int], xs: list[Any]) -> bl.Block:
        order = sorted(indices)
        return bl.Block(
            tops[0],
            order,
            [eqns[i] for i in order],
            xs[0],
            ys[0],
            known_vars,
            {},
            False,
            bl.LINEAR,
            ys=list(ys),
            xs=xs,
        )

    # `m` and `o` from all the unknowns; `y` from the free ones (cuts computed).
    lin = block((region | affine) - set(tops), [v for g in groups for v in g])
    full = block(inside, [v for g in free_groups for v in g])
    kn = [env[v] for v in known_vars]
    dtype = jnp.result_type(*(v.aval.dtype for v in leaves))

    def residual(u: Any, y_vals: Sequence[Any]) -> Any:
        run = lin.run(_one_or_all(_place(u, groups)), kn)
        rows = []
        for (m_var, o_var), y_val in zip(ratios, y_vals, strict=True):
            mv = run[m_var] if type(m_var) is not _Literal else m_var.val
            ov = run[o_var] if type(o_var) is not _Literal else o_var.val
            rows.append(jnp.ravel(mv - y_val * ov))
        return jnp.concatenate(rows)

    zero = jnp.zeros((n,), dtype)
    n_free = sum(math.prod(g[0].aval.shape) for g in free_groups)

    def g_flat(w: Any) -> Any:
        run = full.run(_one_or_all(_place(w, free_groups)), kn)
        return jnp.concatenate([jnp.ravel(run[y]) for y in ys])

    if not _determined(g_flat, residual, (n, n_free), ys, kn, dtype):
        return None
    y_vals = [env[y] for y in ys]
    jac = jax.jacfwd(lambda u: residual(u, y_vals))(zero)
    offset = residual(zero, y_vals)
    u, _, ok = bs.least_squares(jac, -offset)
    # The cuts must be what the solved unknowns give them, and `y` what they
    # map to: both hold when `y` comes back within rounding.
    w = jnp.where(jnp.all(ok), u[:n_free], jnp.nan).astype(dtype)
    y_flat = jnp.concatenate([jnp.ravel(y) for y in y_vals])
    good, ildj = _nonsquare.flat_maps_back(g_flat, w, y_flat, True)
    x_parts = [jnp.where(good, a, jnp.nan) for a in _place(w, free_groups)]
    return full, _one_or_all(x_parts), ildj if st.options.want_ildj else 0.0, PROJECTIVE


def _determined(
    g_flat: Any,
    residual: Any,
    sizes: tuple[int, int],
    ys: Sequence[Any],
    kn: Sequence[Any],
    dtype: Any,
) -> bool:
    """Whether the system determines its unknowns (`sizes`: all of them, the
    free ones) at a generic `y` on the image; if not there, never (refused
    now rather than NaN at run time): `e / sum(e)` is a system in `e` whose
    images (summing to one) all make it singular. True when the known
    values are traced (the solve's check decides, NaN)."""
    if any(compat.is_tracer(k) for k in kn) or compat.in_manual_body():
        return True
    n, n_free = sizes
    with jax.ensure_compile_time_eval():
        probe = _probe(g_flat, n_free, ys, dtype)
        at = jnp.zeros((n,), dtype)
        jac_probe = np.asarray(jax.jacfwd(lambda u: residual(u, probe))(at))
    return bool(np.linalg.matrix_rank(jac_probe) >= n)


def _probe(g_flat: Any, n_free: int, ys: Sequence[Any], dtype: Any) -> list[Any]:
    """Generic results for the rank probe, one per ratio: the image of a
    generic point, or generic values where that is not finite."""
    rng = np.random.default_rng(0)
    w = np.asarray(0.2 + 0.6 * rng.random(n_free), dtype)
    flat = np.asarray(g_flat(jnp.asarray(w)))
    parts, start = [], 0
    for y in ys:
        size = math.prod(y.aval.shape)
        part = flat[start : start + size].reshape(y.aval.shape).astype(y.aval.dtype)
        if not np.all(np.isfinite(part)):
            part = np.asarray(0.2 + 0.6 * rng.random(y.aval.shape), y.aval.dtype)
        parts.append(part)
        start += size
    return parts
