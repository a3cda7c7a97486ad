"""Piecewise-rational elementwise blocks, inverted interval by interval.

A rational-quadratic spline (Durkan et al., 2019) picks one of its bins by
comparing its unknown with the knots, clips the position inside each bin,
and is a quotient of quadratics in each bin: written with `jnp.where` over
four bins it has fourteen comparisons and clamps of the unknown, so the
piecewise method (`_blocks.solve_piecewise`, at most `MAX_CASES` choices of
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

from .. import _jax_compat as compat
from . import _blocks as bl, _elementwise_steps as ew, _solve

_Literal = compat.Literal

# Method, as `explain_inverse` names it.
INTERVALS = "piecewise by intervals"

# At most this many breakpoints (each interval costs a quadratic per element).
MAX_BREAKS = 128

# Steps whose value is a quotient of polynomials in their operands'.
_ARITHMETIC = frozenset(
    "add sub add_any mul div neg integer_pow square "
    "convert_element_type copy copy_p stop_gradient".split()
)
# Steps that pick one of their operands by a discrete choice of `x`.
_PICKS = frozenset("select_n max min abs clamp".split())
# Steps with a discrete (boolean) result.
_COMPARE = frozenset("eq ne lt le gt ge".split())
_LOGIC = frozenset("and or not xor".split())
# Steps whose value is no polynomial: allowed where only comparisons read
# it (their point value is computed; a quotient through them is not).
_OTHER = frozenset(
    "exp log log1p expm1 tanh logistic sqrt cbrt rsqrt sin cos atan".split()
)

_DEGREE = 2


class _Failed(Exception):
    """The block is not piecewise rational of degree at most two."""


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


class _Plan(NamedTuple):
    jaxpr: Any
    consts: list[Any]
    x: Any
    breaks: list[_Break]
    discrete: frozenset[Any]  # unknown values that are piecewise constant


def _plan(closed: Any) -> _Plan | None:
    jaxpr = closed.jaxpr
    x = jaxpr.invars[0]
    if not jnp.issubdtype(x.aval.dtype, jnp.floating):
        return None
    producer: dict[Any, tuple[Any, list[bool]]] = {}
    unknown = {x}
    # Unknown values constant between breakpoints (comparisons, and what is
    # computed from them and known values alone), with their level: the
    # highest level of the breakpoints they depend on.
    steady: dict[Any, int] = {}
    breaks: list[_Break] = []

    def dep(v: Any) -> bool:
        return type(v) is not _Literal and v in unknown

    def moving(v: Any) -> bool:
        return dep(v) and v not in steady

    def level_of(vs: Sequence[Any]) -> int:
        return max((steady[v] for v in vs if dep(v) and v in steady), default=-1)

    def chain(u: Any) -> tuple[list[tuple[Any, int]], int] | None:
        steps: list[tuple[Any, int]] = []
        level = -1
        while u is not x:
            if u in steady or u not in producer:
                return None
            eqn, _ = producer[u]
            flags = [moving(v) for v in eqn.invars]
            if sum(flags) != 1 or not _invertible(eqn, flags.index(True)):
                return None
            i = flags.index(True)
            level = max(level, level_of(eqn.invars))
            steps.append((eqn, i))
            u = eqn.invars[i]
        return steps, level

    def add_break(u: Any, bounds: list[Any]) -> int | None:
        found = chain(u)
        if found is None:
            return None
        steps, level = found
        level = max(level, level_of(bounds)) + 1
        if level > 1:
            return None
        breaks.append(_Break(u, bounds, steps, level))
        return level

    for eqn in jaxpr.eqns:
        deps = [dep(v) for v in eqn.invars]
        if not any(deps):
            continue
        name = eqn.primitive.name
        outs = eqn.outvars
        floating = all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in outs)
        flags = [moving(v) for v in eqn.invars]
        if not any(flags):
            # Only piecewise-constant unknowns: piecewise constant.
            if name not in ew._ELEMENTWISE and name not in _SHAPE | _REDUCE:
                return None
            steady.update((v, level_of(eqn.invars)) for v in outs)
        elif name in _COMPARE:
            # One side moves with `x`, the other is known or steady.
            if sum(flags) != 1:
                return None
            i = flags.index(True)
            level = add_break(eqn.invars[i], [eqn.invars[1 - i]])
            if level is None:
                return None
            steady.update((v, level) for v in outs)
        elif name in _LOGIC:
            return None  # (a logical step on a value that is no comparison)
        elif name == "sign":
            # -1, 0 or 1 by a comparison with 0: piecewise constant.
            level = add_break(eqn.invars[0], [0.0]) if floating else None
            if level is None:
                return None
            steady.update((v, level) for v in outs)
        elif name in ("max", "min"):
            if sum(flags) != 1 or not floating:
                return None
            other = eqn.invars[1 - flags.index(True)]
            if add_break(eqn.invars[flags.index(True)], [other]) is None:
                return None
        elif name == "abs":
            if not floating or add_break(eqn.invars[0], [0.0]) is None:
                return None
        elif name == "clamp":
            lo, u, hi = eqn.invars
            if flags[0] or flags[2] or not floating or add_break(u, [lo, hi]) is None:
                return None
        elif name == "select_n":
            if flags[0] or not floating:
                return None
        elif (
            name in _ARITHMETIC
            or name in _OTHER
            or name in _SHAPE
            or name == "reduce_sum"
        ):
            if not floating:
                return None  # (a float truncated to an integer: a staircase)
        else:
            return None
        unknown.update(outs)
        for v in outs:
            producer[v] = (eqn, deps)
    out = jaxpr.outvars[0]
    if type(out) is _Literal or out not in unknown or out in steady:
        return None
    if not breaks or len(breaks) > MAX_BREAKS:
        return None
    discrete = frozenset(steady)
    return _Plan(jaxpr, list(closed.consts), x, breaks, discrete)


# Steps a breakpoint chain passes through: monotone in their unknown
# operand (on each side of a domain edge or pole, which is a breakpoint too).
_CHAIN = frozenset(
    "add sub add_any mul div neg convert_element_type copy copy_p "
    "stop_gradient max min clamp abs exp log log1p expm1 tanh logistic sqrt "
    "cbrt integer_pow square broadcast_in_dim".split()
)


def _invertible(eqn: Any, i: int) -> bool:
    name = eqn.primitive.name
    if name not in _CHAIN:
        return False
    if name == "clamp":
        return i == 1
    return all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in eqn.outvars)


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
    if name in ("max", "min", "clamp", "convert_element_type", "copy", "copy_p"):
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


# -- quotients of polynomials in z ---------------------------------------

Poly = tuple[Any, ...]  # coefficients of z^0, z^1, ...


class _Frac(NamedTuple):
    num: Poly
    den: Poly | None  # None: 1


def _const(v: Any) -> _Frac:
    return _Frac((v,), None)


def _padd(p: Poly, q: Poly, sign: int = 1) -> Poly:
    out = []
    for i in range(max(len(p), len(q))):
        if i >= len(q):
            out.append(p[i])
        elif i >= len(p):
            out.append(q[i] if sign > 0 else -q[i])
        else:
            out.append(p[i] + q[i] if sign > 0 else p[i] - q[i])
    return _check(tuple(out))


def _pmul(p: Poly, q: Poly) -> Poly:
    if len(p) + len(q) - 2 > _DEGREE:
        raise _Failed
    out: list[Any] = [None] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            term = a * b
            out[i + j] = term if out[i + j] is None else out[i + j] + term
    return tuple(out)


def _check(p: Poly) -> Poly:
    if len(p) - 1 > _DEGREE:
        raise _Failed
    return p


def _den(f: _Frac) -> Poly:
    return f.den if f.den is not None else (1.0,)


def _frac_step(name: str, ins: Sequence[_Frac], params: dict[str, Any]) -> _Frac:
    if name in ("convert_element_type", "copy", "copy_p", "stop_gradient"):
        return ins[0]
    if name == "neg":
        return _Frac(tuple(-a for a in ins[0].num), ins[0].den)
    if name in ("add", "add_any", "sub"):
        f, g = ins
        sign = -1 if name == "sub" else 1
        if f.den is None and g.den is None:
            return _Frac(_padd(f.num, g.num, sign), None)
        if f.den is g.den:
            return _Frac(_padd(f.num, g.num, sign), f.den)
        num = _padd(_pmul(f.num, _den(g)), _pmul(g.num, _den(f)), sign)
        return _Frac(num, _pmul(_den(f), _den(g)))
    if name == "mul":
        f, g = ins
        den = None if f.den is None and g.den is None else _pmul(_den(f), _den(g))
        return _Frac(_pmul(f.num, g.num), den)
    if name == "div":
        f, g = ins
        return _Frac(_pmul(f.num, _den(g)), _pmul(_den(f), g.num))
    if name in ("square", "integer_pow"):
        (f,) = ins
        power = 2 if name == "square" else int(params["y"])
        if power == 0:
            return _const(1.0)
        out = f
        for _ in range(abs(power) - 1):
            out = _frac_step("mul", [out, f], {})
        if power < 0:
            out = _Frac(_den(out), out.num)
        return out
    raise _Failed


def _select(which: Any, cases: Sequence[_Frac]) -> _Frac:
    """Coefficient by coefficient, the case `which` picks (a bool or an int
    per element)."""
    if all(c is cases[0] for c in cases):
        return cases[0]

    def pick(polys: Sequence[Poly]) -> Poly:
        n = max(len(p) for p in polys)
        out: list[Any] = []
        for i in range(n):
            terms = [p[i] if i < len(p) else 0.0 for p in polys]
            if jnp.result_type(which) == jnp.bool_:
                out.append(jnp.where(which, terms[1], terms[0]))
            else:
                v = terms[0]
                for j in range(1, len(terms)):
                    v = jnp.where(which == j, terms[j], v)
                out.append(v)
        return tuple(out)

    num = pick([c.num for c in cases])
    if all(c.den is None for c in cases):
        return _Frac(num, None)
    return _Frac(num, pick([_den(c) for c in cases]))


# -- evaluation ----------------------------------------------------------


# Steps that move or drop axes (a per-element block's extra axes: the
# one-hot sums over a spline's bins, see `_perelement.py`).
_SHAPE = frozenset("broadcast_in_dim squeeze slice transpose rev".split())
_REDUCE = frozenset("reduce_sum reduce_max reduce_min reduce_or reduce_and".split())


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


def _known_env(plan: _Plan, known: Sequence[Any]) -> dict[Any, Any]:
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
            raise _Failed
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
        raise _Failed
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
        raise _Failed
    ok = jnp.isfinite(t)
    top = jnp.max(jnp.where(ok, t, -jnp.inf), axis=0)
    # (No finite breakpoint at all: one interval around 0.)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    t, scale = jnp.where(ok, t, top), jnp.where(ok & jnp.isfinite(scale), scale, 0.0)
    t, scale = jax.lax.sort((t, scale), dimension=0, num_keys=1)
    return t, scale


def _reps(t: Any) -> tuple[Any, Any, Any]:
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


def _breakpoints(
    plan: _Plan, env: dict[Any, Any], rank: int, dtype: Any
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
    reps, lo, hi = _reps(t)
    point = _walk(plan, env, reps, None).point
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
    frac: _Frac | None
    point: Any  # the values at each representative (the block's: its result's)


def _walk(plan: _Plan, env: dict[Any, Any], reps: Any, centers: Any | None) -> _Walked:
    """The block's value as a quotient in `z = x - c` per representative
    `r` (leading axis of `reps`; `c` the same row of `centers`), its choices
    fixed as they fall at `r`. Without `centers`, only every step's value
    at the representatives (`point`: a dict)."""
    point: dict[Any, Any] = {plan.x: reps}
    fracs: dict[Any, _Frac | None] = {}
    if centers is not None:
        fracs[plan.x] = _Frac((centers, jnp.ones_like(centers)), None)

    def val(v: Any) -> Any:
        if type(v) is _Literal:
            return v.val
        return point[v] if v in point else env[v]

    def frac(v: Any) -> _Frac | None:
        if type(v) is _Literal:
            return _const(v.val)
        if v in plan.discrete:
            return _const(point[v])
        return fracs[v] if v in fracs else _const(env[v])

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
        result: _Frac | None = None
        if name not in _OTHER and all(f is not None for f in maybe):
            operands = [f for f in maybe if f is not None]
            result = _frac_of(name, eqn, ins, operands, point)
        fracs[out] = result
    if centers is None:
        return _Walked(None, point)
    y = plan.jaxpr.outvars[0]
    got = fracs.get(y)
    if got is None:
        raise _Failed
    return _Walked(got, point[y])


def _moved(eqn: Any, f: _Frac) -> _Frac | None:
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
    return _Frac(num, None if f.den is None else tuple(one(c) for c in f.den))


def _frac_of(
    name: str,
    eqn: Any,
    ins: Sequence[Any],
    operands: Sequence[_Frac],
    point: dict[Any, Any],
) -> _Frac | None:
    """One step of the walk on quotients (`ins`: the operands' values at
    the representatives, which fix the choices)."""
    if name == "select_n":
        return _select(ins[0], operands[1:])
    if name in _SHAPE or name == "reduce_sum":
        return _moved(eqn, operands[0])
    if name in ("max", "min"):
        v0 = eqn.invars[0]
        i = 0 if type(v0) is not _Literal and v0 in point else 1
        u, k = ins[i], ins[1 - i]
        keep = u >= k if name == "max" else u <= k
        return _select(keep, [operands[1 - i], operands[i]])
    if name == "abs":
        f = operands[0]
        return _select(ins[0] >= 0, [_frac_step("neg", [f], {}), f])
    if name == "clamp":
        lo, u, hi = ins
        which = jnp.where(u < lo, 1, jnp.where(u > hi, 2, 0))
        return _select(which, [operands[1], operands[0], operands[2]])
    try:
        return _frac_step(name, operands, eqn.params)
    except _Failed:
        return None


# -- solving -------------------------------------------------------------


def _quadratic(a: Any, b: Any, c: Any) -> tuple[Any, ...]:
    """Both real roots of `a z^2 + b z + c` (the stable pair of formulas; one
    root where `a == 0`), NaN where there is none. Safe to differentiate:
    no NaN is computed where it is not returned. Only the one root of
    `b z + c` where `a` is 0 whatever the known values are
    (`_static_zero`: a linear-fractional block), with no square root."""
    if _static_zero(a):
        nonzero = b != 0
        return (jnp.where(nonzero, -c / jnp.where(nonzero, b, 1.0), jnp.nan),)
    disc = b * b - 4 * a * c
    real = disc >= 0
    # (No square root of 0 or less is differentiated: its infinite slope
    # times a zero cotangent would be NaN in the other rows' gradients. A
    # double root's slope is infinite anyway: the map turns there.)
    positive = disc > 0
    sq = jnp.where(positive, jnp.sqrt(jnp.where(positive, disc, 1.0)), 0.0)
    q = -0.5 * (b + jnp.where(b < 0, -sq, sq))
    nan = jnp.asarray(jnp.nan, jnp.result_type(a, b, c))
    nonzero_a, nonzero_q = a != 0, q != 0
    z1 = jnp.where(real & nonzero_a, q / jnp.where(nonzero_a, a, 1.0), nan)
    z2 = jnp.where(real & nonzero_q, c / jnp.where(nonzero_q, q, 1.0), nan)
    return z1, z2


def _padded(p: Poly) -> Poly:
    return tuple(p[i] if i < len(p) else 0.0 for i in range(_DEGREE + 1))


def _static_zero(c: Any) -> bool:
    """Whether a coefficient is 0 whatever the block's known values are (a
    Python number: `_padded`'s, or a literal's)."""
    return isinstance(c, (int, float)) and c == 0


def _leading(n2: Any, d2: Any, y: Any) -> Any:
    """The quadratic coefficient of `N(z) - y D(z)`: a static 0 where both
    are (`_quadratic` then solves a linear equation)."""
    return 0.0 if _static_zero(n2) and _static_zero(d2) else n2 - y * d2


def _polyval(p: Poly, z: Any) -> Any:
    out = p[-1]
    for c in reversed(p[:-1]):
        out = out * z + c
    return out


class _Tables(NamedTuple):
    """Per interval (leading axis, `K + 1`): the quotient's coefficients
    (in `x - r`), the point `r` they are expanded about and the ends; per
    breakpoint (`K`): where it is and the block's value there; per
    interval, the block's value at a point inside it; per breakpoint, the
    magnitude it is computed to rounding of."""

    num: Poly
    den: Poly
    r: Any
    lo: Any
    hi: Any
    t: Any
    y_t: Any
    y_r: Any
    t_scale: Any  # per breakpoint, the magnitude it is rounded at


def _tables(plan: _Plan, known: Sequence[Any], rank: int, dtype: Any) -> _Tables:
    env = _known_env(plan, known)
    t, t_scale = _breakpoints(plan, env, rank, dtype)  # (K, ...) each
    # Representatives: one inside each interval (K + 1), then the K
    # breakpoints themselves (the block's value there).
    inside, lo, hi = _reps(t)
    reps = jnp.concatenate([inside, t])
    k = t.shape[0]
    # Each interval's quotient is expanded about its point nearest 0 (not
    # its representative): a root is then computed to rounding of itself,
    # not of the interval's middle (a root near 0 in an interval around 1
    # came out as 0 and its sign lost), and the expansion stays within the
    # interval's width of every point of it.
    centers = jnp.clip(jnp.zeros_like(lo), lo, hi)
    walked = _walk(plan, env, reps, jnp.concatenate([centers, t]))

    def intervals(p: Poly) -> Poly:
        # (Coefficients without the representatives' axis are known values.)
        return tuple(c[: k + 1] if jnp.ndim(c) == rank + 1 else c for c in _padded(p))

    assert walked.frac is not None
    return _Tables(
        intervals(walked.frac.num),
        intervals(_den(walked.frac)),
        centers,
        lo,
        hi,
        t,
        walked.point[k + 1 :],
        walked.point[: k + 1],
        t_scale,
    )


def _close(value: Any, y: Any, eps: float, tiny: float) -> Any:
    """Where the block's `value` at a point is `y` within rounding of `y`."""
    return jnp.abs(value - y) <= 16 * eps * jnp.abs(y) + 16 * tiny


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


def _every_interval(tab: _Tables, y: Any, eps: float, tiny: float) -> tuple:
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
        e0, e1, e2 = n0 - y * d0, n1 - y * d1, _leading(n2, d2, y)
        r, lo, hi, scale = at(tab.r, i), at(tab.lo, i), at(tab.hi, i), at(ends, i)
        s_lo, s_hi = at(lower, i), at(upper, i)
        for z in _quadratic(e2, e1, e0):
            # (A root is computed to rounding of itself: its interval's
            # ends may be far, and computed at another scale.)
            inside = _in_interval(r + z, lo, hi, s_lo, s_hi, eps)
            run = run.seen(r + z, inside, scale, 0.0)
        # An interval (of some length) on which the block is the constant `y`.
        constant = ((e0 == 0) & (e1 == 0) & (e2 == 0)) | (
            at(fixed, i) & _close(at(tab.y_r, i), y, eps, tiny)
        )
        return run, plateau | (constant & at(interior, i))

    def breakpoint_(j: Any, run: _Running) -> _Running:
        y_t = at(tab.y_t, j)
        return run.seen(
            jnp.broadcast_to(at(tab.t, j), y.shape),
            _close(y_t, y, eps, tiny),
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
        if _static_zero(v):
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
        d = _polyval(tab.den, z)
        return _polyval(tab.num, z) / jnp.where(d == 0, 1.0, d)

    q1, q2 = _quadratic(p2, p1, p0)
    poles = _quadratic(d2, d1, d0)
    finite_lo, finite_hi = jnp.isfinite(zlo), jnp.isfinite(zhi)
    finite = finite_lo & finite_hi
    z_lo = jnp.where(finite_lo, zlo, 0.0)
    z_hi = jnp.where(finite_hi, zhi, 0.0)
    den_lo, den_hi = _polyval(tab.den, z_lo), _polyval(tab.den, z_hi)
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


def _looked_up(
    tab: _Tables, s: Any, flat: Any, y: Any, eps: float, tiny: float
) -> tuple:
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
        *(c for c in coefs if not _static_zero(c)),
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
    n0, n1, n2, d0, d1, d2 = (c if _static_zero(c) else next(it) for c in coefs)
    cands, oks = [], []
    for z in _quadratic(_leading(n2, d2, y), n1 - y * d1, n0 - y * d0):
        cands.append(r + z)
        oks.append(_in_interval(r + z, lo, hi, rounding, rounding, eps))
    cands += [lo, hi]
    oks += [_close(y_lo, y, eps, tiny), _close(y_hi, y, eps, tiny)]
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
        [flat[i] & _close(tab.y_r[i], y, eps, tiny) for i in range(k + 1)],
    )
    return jnp.where(plateau, jnp.nan, x), spread, scale


def _beyond_rounding(spread: Any, rounding: Any, eps: float) -> Any:
    """How far apart candidates are beyond the rounding of the breakpoints
    they come from (`8 eps` of it, as `_blocks.one_preimage` allows of
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
    # (`y`'s shape, not the block's: `_blocks.flattened`.)
    x_spec = jax.ShapeDtypeStruct(jnp.shape(y), block.x.aval.dtype)
    specs = [jax.ShapeDtypeStruct(jnp.shape(k), jnp.result_type(k)) for k in known]
    closed = jax.make_jaxpr(lambda x, *kn: block.run(x, kn)[block.y])(x_spec, *specs)
    plan = _plan(closed)
    if plan is None:
        return None
    rank = jnp.ndim(y)
    try:
        # (Traced abstractly: whether the block's quotients stay of degree
        # two, and its breakpoints few enough.)
        jax.eval_shape(lambda *k: _tables(plan, k, rank, dtype), *compacts)
    except _Failed:
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
        slope = _solve.derivative(block.g, x, known)
        if known:
            _, dg = jax.jvp(lambda *k: block.g(x, *k), tuple(known), tuple(dknown))
            dy = dy - dg
        return x, dy / slope

    return inverse(y, *known, *compacts)


def _answer(
    block: Any, plan: _Plan, y: Any, known: Sequence[Any], compacts: Sequence[Any]
) -> Any:
    dtype = jnp.result_type(y)
    tab = _tables(plan, compacts, jnp.ndim(y), dtype)
    finfo = jnp.finfo(dtype)
    eps, tiny = float(finfo.eps), float(finfo.tiny)
    if _uniform(tab):
        # The same intervals for every element: where the block is monotone
        # (checked on the tables, once), each `y` is looked up in its
        # interval; else every interval is tried.
        # (The lookup runs outside the `cond`, whose results are then
        # selected: XLA's CPU code for the same steps inside a branch of a
        # conditional is about ten times slower.)
        flat = _flat(tab)
        monotone, s, stretches = _monotone(flat, eps)
        fast = _looked_up(flat, s, stretches, y, eps, tiny)
        full = jax.lax.cond(
            monotone,
            lambda: tuple(jnp.zeros_like(v) for v in fast),
            lambda: _every_interval(tab, y, eps, tiny),
        )
        x, spread, scale = (
            jnp.where(monotone, a, b) for a, b in zip(fast, full, strict=True)
        )
    else:
        x, spread, scale = _every_interval(tab, y, eps, tiny)
    # Candidates within rounding of each other are one preimage (as in
    # `_blocks.solve_piecewise`); the answer must map back to `y`.
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
    tol = bl.one_preimage(x, y, slope, y_scale=scale)
    back = bl.maps_back(block, x, g_x, y, known, slope) | (
        jnp.abs(g_x - y) <= 16 * eps * scale
    )
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
