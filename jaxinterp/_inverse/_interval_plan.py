"""The plan of a piecewise-rational block, and its walk (see `_intervals.py`).

`make_plan` finds the block's breakpoint sources (a comparison, a clamp, an
`abs` of a value computed from the unknown by a monotone chain) and checks
that every step is of a kind the walk knows; `breakpoints` computes where
they fall; `walk` evaluates the block on every interval between them at
once, each value a quotient of polynomials (`_rational.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import _jax_compat as compat
from . import (
    _elementwise_steps as ew,
    _rational as ra,
    _traits as tr,
)
from ._rational import NotRational

_Literal = compat.Literal

# At most this many breakpoints (each interval costs a quadratic per element).
MAX_BREAKS = 128

# Steps whose value is a quotient of polynomials in their operands'.
_ARITHMETIC = tr.having(tr.RATIONAL, tr.COPY) | {
    "convert_element_type",
    "stop_gradient",
}
# Steps that pick one of their operands by a discrete choice of `x`.
_PICKS = tr.having(tr.KINK) | {"select_n"}
# Steps with a discrete (boolean) result (a comparison in the total order
# differs only at NaN and between -0 and 0).
_COMPARE = tr.having(tr.COMPARE, tr.TOTAL_ORDER)
_LOGIC = tr.having(tr.LOGIC)
# Steps whose value is no polynomial: allowed where only comparisons read
# it (their point value is computed; a quotient through them is not).
_OTHER = tr.having(tr.NONRATIONAL)

# -- static analysis -----------------------------------------------------


class _Break(NamedTuple):
    """A breakpoint source: the value `u` compared, the bound(s) it is
    compared with, and the monotone chain from `u` down to `x` (equation,
    unknown operand). Level 0: the chain's other operands are known; level
    1: some are piecewise constant, fixed by level-0 breakpoints (a
    spline's bin, picked by comparing `x` with the knots, gives the
    position `(x - knot) / width` that a clip then bounds)."""

    u: Any
    bounds: list[Any]
    steps: list[tuple[Any, int]]
    level: int


class Plan(NamedTuple):
    jaxpr: Any
    consts: list[Any]
    x: Any
    breaks: list[_Break]
    discrete: frozenset[Any]  # unknown values that are piecewise constant


class _Planner:
    """The walk `plan` makes: which values depend on `x`, which of those are
    constant between breakpoints (`steady`, with their level: the highest
    level of the breakpoints they depend on), and the breakpoints found."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.producer: dict[Any, Any] = {}
        self.unknown = {x}
        self.steady: dict[Any, int] = {}
        self.breaks: list[_Break] = []

    def dep(self, v: Any) -> bool:
        return type(v) is not _Literal and v in self.unknown

    def moving(self, v: Any) -> bool:
        return self.dep(v) and v not in self.steady

    def level_of(self, vs: Sequence[Any]) -> int:
        steady = self.steady
        return max((steady[v] for v in vs if self.dep(v) and v in steady), default=-1)

    def chain(self, u: Any) -> tuple[list[tuple[Any, int]], int] | None:
        """The monotone chain from `u` down to `x`, and its level."""
        steps: list[tuple[Any, int]] = []
        level = -1
        while u is not self.x:
            if u in self.steady or u not in self.producer:
                return None
            eqn = self.producer[u]
            flags = [self.moving(v) for v in eqn.invars]
            if sum(flags) != 1 or not _invertible(eqn, flags.index(True)):
                return None
            i = flags.index(True)
            level = max(level, self.level_of(eqn.invars))
            steps.append((eqn, i))
            u = eqn.invars[i]
        return steps, level

    def add_break(self, u: Any, bounds: list[Any]) -> int | None:
        """Record a breakpoint where `u` crosses `bounds`: its level, or
        `None` if `u` is not reached from `x` by a monotone chain."""
        found = self.chain(u)
        if found is None:
            return None
        steps, level = found
        level = max(level, self.level_of(bounds)) + 1
        if level > 1:
            return None
        self.breaks.append(_Break(u, bounds, steps, level))
        return level

    def step(self, eqn: Any) -> bool:
        """Take one equation reading `x`; whether the walk may go on."""
        name = eqn.primitive.name
        outs, ins = eqn.outvars, eqn.invars
        floating = all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in outs)
        flags = [self.moving(v) for v in ins]
        level: int | None = -1
        if not any(flags):
            # Only piecewise-constant unknowns: piecewise constant (also a
            # table looked up at a piecewise-constant index).
            steps = ew._ELEMENTWISE | _SHAPE | _REDUCE | _LOOKUPS
            if compat.construct_name(eqn) not in steps:
                return False
            self.steady.update((v, self.level_of(ins)) for v in outs)
        elif name in _COMPARE and len(ins) == 2 and ins[0] is ins[1]:
            # `v != v`, a test for NaN: constant where `v` is a number.
            self.steady.update((v, -1) for v in outs)
        elif name in _COMPARE:
            # One side moves with `x`, the other is known or steady.
            if sum(flags) != 1:
                return False
            i = flags.index(True)
            level = self.add_break(ins[i], [ins[1 - i]])
            self.steady.update((v, level) for v in outs if level is not None)
        elif name == "sign":
            # -1, 0 or 1 by a comparison with 0: piecewise constant.
            level = self.add_break(ins[0], [0.0]) if floating else None
            self.steady.update((v, level) for v in outs if level is not None)
        elif name in ("max", "min"):
            if sum(flags) != 1 or not floating:
                return False
            i = flags.index(True)
            level = self.add_break(ins[i], [ins[1 - i]])
        elif name == "abs":
            level = self.add_break(ins[0], [0.0]) if floating else None
        elif name == "clamp":
            if flags[0] or flags[2] or not floating:
                return False
            level = self.add_break(ins[1], [ins[0], ins[2]])
        elif name == "select_n":
            level = None if flags[0] or not floating else -1
        elif name in _ARITHMETIC | _OTHER | _SHAPE or name == "reduce_sum":
            # (Not a float truncated to an integer: a staircase.)
            level = -1 if floating else None
        else:
            # Also a logical step on a value that is no comparison.
            return False
        if level is None:
            return False
        self.unknown.update(outs)
        self.producer.update(dict.fromkeys(outs, eqn))
        return True


def make_plan(closed: Any) -> Plan | None:
    """The block's plan (`closed`: the block as a closed Jaxpr of its
    unknown first), or `None` if it is not piecewise rational."""
    jaxpr = closed.jaxpr
    x = jaxpr.invars[0]
    if not jnp.issubdtype(x.aval.dtype, jnp.floating):
        return None
    planner = _Planner(x)
    for eqn in jaxpr.eqns:
        if any(planner.dep(v) for v in eqn.invars) and not planner.step(eqn):
            return None
    out = jaxpr.outvars[0]
    if type(out) is _Literal or out not in planner.unknown or out in planner.steady:
        return None
    if not planner.breaks or len(planner.breaks) > MAX_BREAKS:
        return None
    discrete = frozenset(planner.steady)
    return Plan(jaxpr, list(closed.consts), x, planner.breaks, discrete)


# Steps a breakpoint chain passes through: monotone in their unknown
# operand (on each side of a domain edge or pole, which is a breakpoint too).
# A `select_n` of a piecewise-constant predicate is its moving case where it
# picks that and constant elsewhere (`jnp.searchsorted` maps -0 to 0 so).
_CHAIN = tr.having(tr.RATIONAL, tr.COPY, tr.KINK, tr.INCREASING) | {
    "convert_element_type",
    "stop_gradient",
    "broadcast_in_dim",
    "select_n",
}


def _invertible(eqn: Any, i: int) -> bool:
    name = eqn.primitive.name
    if name not in _CHAIN:
        return False
    if name == "clamp":
        return i == 1
    if name == "select_n":
        return i > 0  # (a case, not the predicate)
    return all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in eqn.outvars)


# Chain steps whose result crosses `c` where their moving operand does.
_PASSED = {"max", "min", "clamp", "select_n", "convert_element_type", "copy", "copy_p"}


def _pull(eqn: Any, i: int, c: Any, read: Callable[[Any], Any]) -> list[Any]:
    """The values of operand `i` of `eqn` at which its result crosses `c`
    (or may change how it depends on the operand: a domain edge, a pole)."""
    name = eqn.primitive.name
    others = [read(v) for j, v in enumerate(eqn.invars) if j != i]
    k = others[0] if others else None
    if name in ("add", "add_any"):
        return [c - k]
    if name == "sub":
        return [c + k] if i == 0 else [k - c]
    if name == "mul":
        return [c / k]
    if name == "div":
        return [c * k] if i == 0 else [k / c, jnp.zeros_like(c)]
    if name == "neg":
        return [-c]
    if name == "broadcast_in_dim":
        return _unbroadcast(eqn, c)
    if name in _PASSED:
        return [c]
    if name == "stop_gradient":
        return [c]
    if name == "abs":
        return [c, -c]
    if name == "exp":
        return [jnp.log(c)]
    if name == "log":
        return [jnp.exp(c), jnp.zeros_like(c)]
    if name == "log1p":
        return [jnp.expm1(c), -jnp.ones_like(c)]
    if name == "expm1":
        return [jnp.log1p(c)]
    if name == "tanh":
        return [jnp.arctanh(c)]
    if name == "logistic":
        return [jnp.log(c) - jnp.log1p(-c)]
    if name == "sqrt":
        return [c * c, jnp.zeros_like(c)]
    if name == "cbrt":
        return [c * c * c]
    power = 2 if name == "square" else int(compat.params_of(eqn)["y"])
    root = jnp.abs(c) ** (1.0 / abs(power))
    found = [root, -root] if power % 2 == 0 else [jnp.sign(c) * root]
    return found + ([jnp.zeros_like(c)] if power < 0 else [])


def _unbroadcast(eqn: Any, c: Any) -> list[Any]:
    """The values of the operand of a `broadcast_in_dim` at which its
    result crosses `c`: an operand element is compared with every entry of
    `c` along the axes the step broadcasts it over (a spline's `x[:, None]`
    against its knots), each of those entries one breakpoint."""
    params = compat.params_of(eqn)
    dims = tuple(params["broadcast_dimensions"])
    op_shape = eqn.invars[0].aval.shape
    c = _full_rank(c, len(params["shape"]))
    spread = [
        d
        for d in range(c.ndim)
        if c.shape[d] > 1 and (d not in dims or op_shape[dims.index(d)] == 1)
    ]
    pieces = [c]
    for d in spread:
        pieces = [p for q in pieces for p in jnp.split(q, q.shape[d], axis=d)]
    return [jnp.reshape(p, tuple(p.shape[d] for d in dims)) for p in pieces]


# -- evaluation ----------------------------------------------------------


# Steps that move or drop axes (a per-element block's extra axes: the
# one-hot sums over a spline's bins, see `_perelement.py`).
_SHAPE = tr.having(tr.ALONG_AXES)
_REDUCE = tr.having(tr.REDUCE) - {"reduce_prod"}
_LOOKUPS = tr.having(tr.LOOKUP)


def _bind(eqn: Any, ins: Sequence[Any], batched: Sequence[bool] = ()) -> list[Any]:
    """`eqn` on operands that may stand for broadcasts: an axis of size 1
    where the equation's operand has more (or a missing leading axis) holds
    one value for all of them, and the results keep it so (a spline's knots
    broadcast over a million elements stay one row). With `batched`, the
    flagged operands have a leading axis of representatives, mapped over."""
    if any(batched) and eqn.primitive.name not in ew._ELEMENTWISE:
        axes = [0 if b else None for b in batched]
        return list(jax.vmap(lambda *a: _bind(eqn, a), in_axes=axes)(*ins))
    name = eqn.primitive.name
    if name in ew._ELEMENTWISE:
        # (Operands broadcast among themselves, representatives' axis first.)
        ins = jnp.broadcast_arrays(*ins) if len(ins) > 1 else list(ins)
        params = compat.params_of(eqn)
    else:
        ins = [
            v if type(var) is _Literal else _full_rank(v, var.aval.ndim)
            for v, var in zip(ins, eqn.invars, strict=True)
        ]
        params, ins, scale = _shrunk_params(eqn, ins)
        if scale != 1:
            out = _bind_plain(eqn, ins, params)[0]
            return [out * scale if name == "reduce_sum" else out]
    return _bind_plain(eqn, ins, params)


def _full_rank(v: Any, ndim: int) -> Any:
    v = jnp.asarray(v)
    return jnp.reshape(v, (1,) * (ndim - v.ndim) + v.shape)


def _shrunk_params(eqn: Any, ins: list[Any]) -> tuple[dict[str, Any], list[Any], int]:
    """The params of `eqn` for operands with axes of size 1 standing for
    broadcasts (kept so where the step allows; other steps get their
    operands at full size), and the factor a sum over such axes takes."""
    name = eqn.primitive.name
    params = dict(compat.params_of(eqn))
    avals = [v.aval for v in eqn.invars]
    if name not in _SHAPE and name not in _REDUCE:
        full = [
            v if type(var) is _Literal else jnp.broadcast_to(v, var.aval.shape)
            for v, var in zip(ins, eqn.invars, strict=True)
        ]
        return params, full, 1
    op, aval = ins[0], avals[0]
    shrunk = [i for i in range(aval.ndim) if op.shape[i] == 1 < aval.shape[i]]
    scale = 1
    if name == "broadcast_in_dim":
        shape = [1] * len(params["shape"])
        for i, d in enumerate(params["broadcast_dimensions"]):
            shape[d] = op.shape[i]
        params["shape"] = tuple(shape)
    elif name == "slice":
        start = list(params["start_indices"])
        limit = list(params["limit_indices"])
        strides = params.get("strides")
        for i in shrunk:
            start[i], limit[i] = 0, 1
        params["start_indices"], params["limit_indices"] = tuple(start), tuple(limit)
        if strides is not None:
            params["strides"] = tuple(
                1 if i in shrunk else s for i, s in enumerate(strides)
            )
    elif name in _REDUCE:
        for i in params["axes"]:
            if i in shrunk:
                scale *= aval.shape[i]
    return params, ins, scale


def _bind_plain(eqn: Any, ins: Sequence[Any], params: dict[str, Any]) -> list[Any]:
    user_ctx, eqn_ctx = compat.eqn_contexts(eqn)
    with user_ctx, eqn_ctx:
        return compat.bind_eqn(eqn.primitive, ins, params)


def known_env(plan: Plan, known: Sequence[Any]) -> dict[Any, Any]:
    """The values of the steps of known values only."""
    jaxpr = plan.jaxpr
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, plan.consts, strict=True))
    env.update(zip(jaxpr.invars[1:], known, strict=True))
    moving = {plan.x}
    for eqn in jaxpr.eqns:
        if any(type(v) is not _Literal and v in moving for v in eqn.invars):
            moving.update(eqn.outvars)
            continue
        ins = [v.val if type(v) is _Literal else env[v] for v in eqn.invars]
        env.update(zip(eqn.outvars, _bind(eqn, ins), strict=True))
    return env


def _pulled(
    brk: _Break, read: Callable[[Any], Any], dtype: Any
) -> list[tuple[Any, Any]]:
    """The values of `x` at which `brk`'s choice may change, each with the
    magnitude it is computed to rounding of (`_pull_scaled`)."""
    values = []
    for b in brk.bounds:
        c = jnp.asarray(b if isinstance(b, float) else read(b), dtype)
        values.append((c, jnp.abs(c)))
    for eqn, i in brk.steps:
        values = [p for c, s in values for p in _pull_scaled(eqn, i, c, s, read)]
        if len(values) > MAX_BREAKS:
            raise NotRational
    return values


def _pull_scaled(
    eqn: Any, i: int, c: Any, s: Any, read: Callable[[Any], Any]
) -> list[tuple[Any, Any]]:
    """`_pull`, each value with its rounding scale: `s` (that of `c`)
    carried through the pull's derivative, at least the value's own
    magnitude, and for a sum the known term's (the program's `x - knot`
    rounds at the knot's magnitude). A spline's bin that saturates at
    `knot + width` near 0, with the knot at -1.4, is computed to rounding
    of 1.4, not of its value; the next bin's knot, a cumulative sum of
    widths, lies a few such ulps away."""
    values, moved = jax.jvp(lambda u: _pull(eqn, i, u, read), (c,), (s,))
    extra: Any = 0.0
    if eqn.primitive.name in ("add", "add_any", "sub"):
        extra = jnp.abs(read(eqn.invars[1 - i]))
    out = []
    for v, m in zip(values, moved, strict=True):
        m = jnp.where(jnp.isfinite(m), jnp.abs(m), 0.0)
        out.append((v, jnp.maximum(jnp.maximum(m, jnp.abs(v)), extra)))
    return out


def _sorted(found: list[tuple[Any, Any]], rank: int, dtype: Any) -> tuple[Any, Any]:
    """Breakpoints (each entry of `found` a leading axis of them, with their
    rounding scales), sorted, shape `(K, ...)`: non-finite ones (a bound the
    chain never reaches, a candidate outside its interval) replaced by the
    largest finite one (an empty interval), of scale 0. And their scales."""
    shape = jnp.broadcast_shapes(*(jnp.shape(v)[1:] for v, _ in found))
    if len(shape) > rank:
        raise NotRational
    shape = (1,) * (rank - len(shape)) + tuple(shape)

    def stacked(k: int) -> Any:
        return jnp.concatenate(
            [
                jnp.broadcast_to(jnp.asarray(f[k], dtype), (f[0].shape[0], *shape))
                for f in found
            ]
        )

    t, scale = stacked(0), stacked(1)
    if t.shape[0] > MAX_BREAKS:
        raise NotRational
    ok = jnp.isfinite(t)
    top = jnp.max(jnp.where(ok, t, -jnp.inf), axis=0)
    # (No finite breakpoint at all: one interval around 0.)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    t, scale = jnp.where(ok, t, top), jnp.where(ok & jnp.isfinite(scale), scale, 0.0)
    t, scale = jax.lax.sort((t, scale), dimension=0, num_keys=1)
    return t, scale


def representatives(t: Any) -> tuple[Any, Any, Any]:
    """A point inside each interval between sorted breakpoints `t` (and
    below and above them all), and the intervals' ends."""
    first, last = t[0], t[-1]
    below = first - jnp.maximum(1.0, jnp.abs(first))
    above = last + jnp.maximum(1.0, jnp.abs(last))
    mids = t[:-1] + (t[1:] - t[:-1]) / 2
    inf = jnp.full_like(first, jnp.inf)
    lo = jnp.concatenate([-inf[None], t])
    hi = jnp.concatenate([t, inf[None]])
    return jnp.concatenate([below[None], mids, above[None]]), lo, hi


def breakpoints(
    plan: Plan, env: dict[Any, Any], rank: int, dtype: Any
) -> tuple[Any, Any]:
    """The sorted breakpoints, shape `(K, ...)`, and their rounding scales:
    those of level 0 from the known values; those of level 1 per interval
    between the level-0 ones, from the piecewise-constant values there
    (kept where they fall inside it)."""

    def read(v: Any) -> Any:
        return jnp.asarray(v.val if type(v) is _Literal else env[v], dtype)

    found = [
        (v[None], s[None])
        for brk in plan.breaks
        if brk.level == 0
        for v, s in _pulled(brk, read, dtype)
    ]
    t, t_scale = _sorted(found, rank, dtype)
    upper = [brk for brk in plan.breaks if brk.level == 1]
    if not upper:
        return t, t_scale
    reps, lo, hi = representatives(t)
    point = walk(plan, env, reps, None).point
    needed = list(
        {
            v
            for brk in upper
            for v in [*brk.bounds, *(w for eqn, _ in brk.steps for w in eqn.invars)]
            if type(v) is not _Literal and not isinstance(v, float) and v in point
        }
    )

    def per_interval(here: list[Any]) -> Any:
        values = dict(zip(needed, here, strict=True))

        def read_here(v: Any) -> Any:
            if type(v) is not _Literal and v in values:
                return jnp.asarray(values[v], dtype)
            return read(v)

        pieces = [
            _full_rank(p, rank)
            for brk in upper
            for pair in _pulled(brk, read_here, dtype)
            for p in pair
        ]
        both = jnp.stack(jnp.broadcast_arrays(*pieces))
        return both[0::2], both[1::2]

    # (K+1, P, ...) each
    cands, scales = jax.vmap(per_interval)([point[v] for v in needed])
    lo, hi = (
        _full_rank(lo, cands.ndim - 1)[:, None],
        _full_rank(hi, cands.ndim - 1)[:, None],
    )
    inside = (cands > lo) & (cands < hi)
    cands = jnp.where(inside, cands, jnp.nan)
    cands = jnp.reshape(cands, (-1, *cands.shape[2:]))
    scales = jnp.reshape(scales, (-1, *scales.shape[2:]))
    return _sorted([(t, t_scale), (cands, scales)], rank, dtype)


class _Walked(NamedTuple):
    frac: ra.Frac | None
    point: Any  # the values at each representative (the block's: its result's)


def walk(plan: Plan, env: dict[Any, Any], reps: Any, centers: Any | None) -> _Walked:
    """The block's value as a quotient in `z = x - c` per representative
    `r` (leading axis of `reps`; `c` the same row of `centers`), its choices
    fixed as they fall at `r`. Without `centers`, only every step's value
    at the representatives (`point`: a dict)."""
    point: dict[Any, Any] = {plan.x: reps}
    fracs: dict[Any, ra.Frac | None] = {}
    if centers is not None:
        fracs[plan.x] = ra.Frac((centers, jnp.ones_like(centers)), None)

    def val(v: Any) -> Any:
        if type(v) is _Literal:
            return v.val
        return point[v] if v in point else env[v]

    def frac(v: Any) -> ra.Frac | None:
        if type(v) is _Literal:
            return ra.const(v.val)
        if v in plan.discrete:
            return ra.const(point[v])
        return fracs[v] if v in fracs else ra.const(env[v])

    for eqn in plan.jaxpr.eqns:
        batched = [type(v) is not _Literal and v in point for v in eqn.invars]
        if not any(batched):
            continue
        ins = [val(v) for v in eqn.invars]
        outs = _bind(eqn, ins, batched)
        point.update(zip(eqn.outvars, outs, strict=True))
        out = eqn.outvars[0]
        name = eqn.primitive.name
        if (
            centers is None
            or out in plan.discrete
            or name in _COMPARE
            or name in _LOGIC
        ):
            continue
        maybe = [frac(v) for v in eqn.invars]
        result: ra.Frac | None = None
        if name not in _OTHER and all(f is not None for f in maybe):
            operands = [f for f in maybe if f is not None]
            result = _frac_of(name, eqn, ins, operands, point)
        fracs[out] = result
    if centers is None:
        return _Walked(None, point)
    y = plan.jaxpr.outvars[0]
    got = fracs.get(y)
    if got is None:
        raise NotRational
    return _Walked(got, point[y])


def _moved(eqn: Any, f: ra.Frac) -> ra.Frac | None:
    """A step that moves or sums axes (`_SHAPE`, `reduce_sum`), applied to
    each coefficient of a quotient (a sum only of a polynomial)."""
    if eqn.primitive.name == "reduce_sum" and f.den is not None:
        return None
    ndim = eqn.invars[0].aval.ndim

    def one(c: Any) -> Any:
        batched = jnp.ndim(c) == ndim + 1
        c = c if batched else _full_rank(c, ndim)
        return _bind(eqn, [c], [batched])[0]

    num = tuple(one(c) for c in f.num)
    return ra.Frac(num, None if f.den is None else tuple(one(c) for c in f.den))


# Steps whose quotient depends on the choice they make at the
# representatives (`ins`: the operands' values there), by primitive name:
# (eqn, ins, operands' quotients, which operand is the unknown) -> quotient.
Choice = Callable[[Any, Sequence[Any], Sequence[ra.Frac], int], ra.Frac]


def _select(eqn: Any, ins: Sequence[Any], fs: Sequence[ra.Frac], u: int) -> ra.Frac:
    return ra.select(ins[0], fs[1:])


def _extremum(eqn: Any, ins: Sequence[Any], fs: Sequence[ra.Frac], u: int) -> ra.Frac:
    x, k = ins[u], ins[1 - u]
    keep = x >= k if eqn.primitive.name == "max" else x <= k
    return ra.select(keep, [fs[1 - u], fs[u]])


def _abs(eqn: Any, ins: Sequence[Any], fs: Sequence[ra.Frac], u: int) -> ra.Frac:
    return ra.select(ins[0] >= 0, [ra.step("neg", fs, {}), fs[0]])


def _clamp(eqn: Any, ins: Sequence[Any], fs: Sequence[ra.Frac], u: int) -> ra.Frac:
    lo, x, hi = ins
    which = jnp.where(x < lo, 1, jnp.where(x > hi, 2, 0))
    return ra.select(which, [fs[1], fs[0], fs[2]])


_CHOICES: dict[str, Choice] = {
    "select_n": _select,
    "max": _extremum,
    "min": _extremum,
    "abs": _abs,
    "clamp": _clamp,
}


def _frac_of(
    name: str,
    eqn: Any,
    ins: Sequence[Any],
    operands: Sequence[ra.Frac],
    point: dict[Any, Any],
) -> ra.Frac | None:
    """One step of the walk on quotients (`ins`: the operands' values at
    the representatives, which fix the choices), or `None` where the step's
    value is no quotient."""
    if name in _SHAPE or name == "reduce_sum":
        return _moved(eqn, operands[0])
    choice = _CHOICES.get(name)
    if choice is not None:
        v0 = eqn.invars[0]
        unknown = 0 if type(v0) is not _Literal and v0 in point else 1
        return choice(eqn, ins, operands, unknown)
    try:
        return ra.step(name, operands, eqn.params)
    except NotRational:
        return None
