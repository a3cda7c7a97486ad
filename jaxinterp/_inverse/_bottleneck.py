"""Maps through a scalar bottleneck, solved by one scalar equation.

A planar flow `y = x + u * tanh(w @ x + b)` and a map onto a ball `y = x /
(1 + |x|)` reach their result from the unknown `x` along two paths:
directly, and through one number computed from the whole of `x` (`w @ x`,
`|x|`). No equation can be solved alone, and the map is neither
elementwise, nor linear, nor triangular (`_sequential.py`). With that
number `s` known, though, the rest is solved by the engine's formulas: `x =
y - u * tanh(s + b)`. Then `s` must be what that `x` gives:

    G(s) = phi(x(s, y)) - s = 0,

one equation in one unknown, which the elementwise solver solves
(`_solve.py`: bracketing and safeguarded Newton, NaN where `G` turns on the
solver's grid, checked for each `y`).

Why the answer is the only preimage: every preimage `x` of `y` gives a root
`s = phi(x)` of `G`, with `x(s, y) = x` (the formulas' solution is the only
`x` that gives `y` for that `s`); every root `s` gives a preimage `x(s, y)`.
So `y` has as many preimages as `G` has roots, and one where `G` is monotone.
The answer must also map back to `y` within rounding (`_sequential._checked`),
else NaN (`y` outside the image: a point outside the ball). The grid check
cannot see a pole or a jump of `G` between its points, and their places
move with `y`: `G` must be continuous and finite where defined, checked on
its equations (`_continuous`), so a radial flow, whose `G` divides by a
value of unknown sign, is refused.

The block is the sequential method's (`_sequential.find_sequential`: the
blocked equations that reach one unknown), square (as many result elements
as unknown ones), tried when it is not triangular, and only if its Jacobian
is regular at one of that method's two pseudo-random points (`_regular`: a
softmax, singular everywhere, keeps its refusal, which says which freedom
it loses, rather than a `G` that is flat). The candidates for `s`
are its values of one element that depend on `x`, earliest first (at most
`MAX_CANDIDATES`); the first for which the engine solves the rest by exact
methods (no numerical solve, no bottleneck within: `G` is evaluated many
times by the solver) and whose `G` is continuous is used, alone. The ildj
is `-log|det J|` with `J` the block's Jacobian at the answer
(`MAX_ELEMENTS` elements at most), and derivatives come from the implicit
function theorem on the whole block, not from the iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from .. import _jax_compat as compat
from .._errors import NotInvertibleError
from . import _blocks as bl, _sequential as sq, _solve

_Literal = compat.Literal

BOTTLENECK_SOLVE = "scalar bottleneck solve"
NO_BOTTLENECK = (
    "no one-element value inside it, once known, lets the exact methods "
    "solve the rest (with a continuous equation left for that value)"
)

# The most values tried as the bottleneck of one block (each is a copy of
# the elementwise solver in the program).
MAX_CANDIDATES = 4
# The most elements the unknown may have (its Jacobian is formed).
MAX_ELEMENTS = sq.MAX_SEQUENTIAL


def _size(v: Any) -> int:
    return math.prod(v.aval.shape)


def _candidates(block: bl.Block) -> list[int]:
    """Positions in `block.eqns` of the equations whose one result is a
    floating value of one element (not a result of the block)."""
    found = []
    for k, eqn in enumerate(block.eqns):
        if len(eqn.outvars) != 1:
            continue
        (v,) = eqn.outvars
        aval = v.aval
        if (
            hasattr(aval, "shape")
            and _size(v) == 1
            and jnp.issubdtype(aval.dtype, jnp.floating)
            and v not in block.ys
        ):
            found.append(k)
    return found[:MAX_CANDIDATES]


def _rest(block: bl.Block, k: int) -> bl.Block:
    """The block without its equation `k`, whose result it reads as known."""
    s = block.eqns[k].outvars[0]
    keep = [j for j in range(len(block.eqns)) if j != k]
    return bl.Block(
        block.top,
        [block.indices[j] for j in keep],
        [block.eqns[j] for j in keep],
        block.x,
        block.y,
        [s, *block.known],
        {},
        False,
        block.kind,
        block.ys,
    )


def _spec(v: Any) -> Any:
    return compat.staging_spec(v.aval)


def _x_of(walker: Any, block: bl.Block, k: int) -> Any | None:
    """`x(s, ys, *known)`: the block's unknown from its results with the
    value of its equation `k` known (the engine's solve, as a closed Jaxpr
    staged once), or `None` if the engine cannot solve it so."""
    rest = _rest(block, k)
    s = block.eqns[k].outvars[0]

    def results(x: Any, s_val: Any, *kn: Any) -> list[Any]:
        env = rest.run(x, [s_val, *kn])
        return [env[v] for v in block.ys]

    known_specs = [_spec(v) for v in block.known]
    try:
        closed = jax.make_jaxpr(results)(_spec(block.x), _spec(s), *known_specs)

        def x_of(s_val: Any, ys: Sequence[Any], *kn: Any) -> Any:
            sol = walker.solve(
                compat.open_jaxpr(closed),
                compat.jaxpr_consts(closed),
                [None, s_val, *kn],
                list(ys),
                strict=True,
                want_ildj=False,
                # (Exact methods only: a numerical solve inside `G`, which
                # the solver evaluates at many places, made programs that
                # took minutes to compile.)
                solvers=False,
            )
            if sol.pieces or sol.uncovered or sol.chose:
                # (A chosen branch: `x(s, y)` might not be the only `x`.)
                raise NotInvertibleError("not by formulas alone")
            return sol.invals[0]

        ys_specs = [_spec(v) for v in block.ys]
        staged = jax.make_jaxpr(x_of)(_spec(s), ys_specs, *known_specs)

        def phi(s_val: Any, ys: Sequence[Any], *kn: Any) -> Any:
            (x,) = jex_core.jaxpr_as_fun(staged)(s_val, *ys, *kn)
            return block.run(x, kn)[s]

        whole = jax.make_jaxpr(phi)(_spec(s), ys_specs, *known_specs)
    except NotInvertibleError:
        return None
    except Exception:  # noqa: BLE001 - not this method (a rule's own error)
        return None
    if not _continuous(whole):
        return None
    return _as_fun(staged)


# Primitives continuous in every operand, finite wherever their operands
# are (an overflow to infinity aside), with the signs of their results
# where they follow from the operands' (`_Signs`).
_CONTINUOUS = frozenset(
    {
        "add", "sub", "mul", "neg", "max", "min", "abs", "square", "sqrt",
        "cbrt", "exp", "exp2", "expm1", "tanh", "logistic", "erf", "sin",
        "cos", "sinh", "cosh", "asinh", "atan", "dot_general", "reduce_sum",
        "reduce_max", "reduce_min", "broadcast_in_dim", "reshape", "squeeze",
        "expand_dims", "slice", "dynamic_slice", "concatenate", "transpose",
        "pad", "rev", "copy", "copy_p", "stop_gradient", "reduce_precision",
        "convert_element_type", "integer_pow", "div", "select_n",
        # Only of a value known to be positive (non-negative for `log1p`).
        "log", "log1p",
        # Booleans: only as the predicate of a NaN guard (`select_n` below).
        "eq", "ne", "lt", "le", "gt", "ge", "is_finite", "not", "and", "or",
    }
)  # fmt: skip
# Calls whose body's inputs are the equation's operands, one for one.
_CALLS = frozenset(
    {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "checkpoint"}
)
_POSITIVE = frozenset({"exp", "exp2", "logistic", "cosh"})
_NONNEGATIVE = frozenset({"abs", "square", "sqrt"})
_KEEP_SIGN = frozenset(
    {
        "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "slice",
        "dynamic_slice", "transpose", "rev", "copy", "copy_p", "stop_gradient",
        "reduce_precision", "convert_element_type",
    }
)  # fmt: skip


def _continuous(closed: Any) -> bool:
    """Whether `G`'s values (the closed Jaxpr of `phi(x(s, y))`, `s` its
    first input) are continuous in `s` and finite wherever defined: every
    equation that reads a value computed from `s` is in `_CONTINUOUS`, a
    `div` by such a value only by one that is positive (`1 + |x|`,
    `exp(...)`), `integer_pow` only to a power >= 0, `select_n` only on a
    predicate not computed from `s`; bodies (`jit`, `custom_jvp`) alike.
    A pole of `G` moves with `y` and may fall between any two points of
    the solver's grid, where it hides two more roots (`x - 1e-30 /
    sum(x)`); a jump may hide one (`where(sum(x) > 0, x, -x)`). So the
    method is only for maps whose `G` has neither."""
    jaxpr = compat.open_jaxpr(closed)
    consts = dict(zip(jaxpr.constvars, compat.jaxpr_consts(closed), strict=True))
    return _Signs(consts).continuous(jaxpr, {jaxpr.invars[0]})


def _live(jaxpr: Any) -> list[Any]:
    """The equations of `jaxpr` that its results depend on, in order."""
    need = {v for v in jaxpr.outvars if not isinstance(v, compat.Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in need for v in eqn.outvars) or eqn.effects:
            kept.append(eqn)
            need.update(v for v in eqn.invars if not isinstance(v, compat.Literal))
    return kept[::-1]


class _Signs:
    """The values known to be positive or non-negative while walking a
    Jaxpr (constants by their values), for `_continuous`."""

    def __init__(self, consts: dict[Any, Any]) -> None:
        self.positive: set[Any] = set()
        self.nonnegative: set[Any] = set()
        self.nans: set[Any] = set()
        self.nan_checks: set[Any] = set()  # `v != v`
        for v, c in consts.items():
            self._of_value(v, c)

    def _of_value(self, v: Any, c: Any) -> None:
        try:
            arr = np.asarray(c)
        except Exception:  # noqa: BLE001 - a traced constant: no sign
            return
        if arr.dtype.kind not in "fiu" or not arr.size:
            return
        if np.all(arr > 0):
            self.positive.add(v)
        if np.all(arr >= 0):
            self.nonnegative.add(v)
        if np.all(np.isnan(arr)):
            self.nans.add(v)

    def pos(self, v: Any) -> bool:
        if isinstance(v, compat.Literal):
            return bool(np.all(np.asarray(v.val) > 0))
        return v in self.positive

    def nonneg(self, v: Any) -> bool:
        if isinstance(v, compat.Literal):
            return bool(np.all(np.asarray(v.val) >= 0))
        return v in self.nonnegative or v in self.positive

    def nan(self, v: Any) -> bool:
        if isinstance(v, compat.Literal):
            return bool(np.all(np.isnan(np.asarray(v.val, np.float64))))
        return v in self.nans

    def _inner(self, outer: Sequence[Any], inner: Sequence[Any]) -> _Signs:
        """The signs of a body's inputs `inner`, bound to `outer`."""
        signs = _Signs({})
        for o, i in zip(outer, inner, strict=True):
            if self.pos(o):
                signs.positive.add(i)
            if self.nonneg(o):
                signs.nonnegative.add(i)
            if self.nan(o):
                signs.nans.add(i)
        return signs

    def continuous(self, jaxpr: Any, moving: set[Any]) -> bool:
        """Whether `jaxpr` is continuous in its values `moving` (updated
        with those computed from them). Equations whose results go nowhere
        (an ildj's `log` the formulas leave behind) do not count."""
        for eqn in _live(jaxpr):
            ins = list(eqn.invars)
            reads = [not isinstance(v, compat.Literal) and v in moving for v in ins]
            name = compat.construct_name(eqn)
            bodies = compat.sub_jaxprs(eqn)
            if any(reads):
                if bodies and name in _CALLS and len(bodies) == 1:
                    (body,) = bodies
                    if len(body.invars) != len(ins):
                        return False
                    inner = self._inner(ins, body.invars)
                    bound = {i for i, r in zip(body.invars, reads, strict=True) if r}
                    if not inner.continuous(body, bound):
                        return False
                    self._results(body.outvars, eqn.outvars, inner)
                elif bodies:
                    # A `cond` on `s` jumps between its branches, a loop's
                    # count of steps may change with `s`: not judged.
                    return False
                elif not self._allowed(name, eqn, ins, reads):
                    return False
                moving.update(eqn.outvars)
            self._signs(name, eqn, ins)
        return True

    def _results(
        self, inner: Sequence[Any], outer: Sequence[Any], signs: _Signs
    ) -> None:
        for i, o in zip(inner, outer, strict=True):
            if signs.pos(i):
                self.positive.add(o)
            elif signs.nonneg(i):
                self.nonnegative.add(o)

    def _allowed(self, name: str, eqn: Any, ins: list[Any], reads: list[bool]) -> bool:
        if name not in _CONTINUOUS:
            return False
        if name == "div":
            return not reads[1] or self.pos(ins[1])
        if name == "integer_pow":
            return compat.params_of(eqn)["y"] >= 0
        if name == "log1p":  # (softplus: `log1p(exp(-|x|))`)
            return self.nonneg(ins[0])
        if name == "log":
            return self.pos(ins[0])
        if name == "select_n":
            # A NaN guard (`where(c == 0, nan, y / c)`) leaves `G` continuous
            # where it is defined; a choice between values does not.
            # So does one on whether a value is NaN (`logaddexp`'s
            # `where(d != d, d + e, ...)`): false wherever it is defined.
            guard = sum(not self.nan(v) for v in ins[1:]) <= 1
            return not reads[0] or guard or ins[0] in self.nan_checks
        if name == "convert_element_type":
            return bool(jnp.issubdtype(ins[0].aval.dtype, jnp.inexact))
        return True

    def _signs(self, name: str, eqn: Any, ins: list[Any]) -> None:
        if len(eqn.outvars) != 1:
            return
        (out,) = eqn.outvars
        if name == "ne" and ins[0] is ins[1]:
            self.nan_checks.add(out)
        pos, nonneg = self.pos, self.nonneg
        if name in _POSITIVE or (name == "sqrt" and pos(ins[0])):
            self.positive.add(out)
        elif name in _NONNEGATIVE:
            self.nonnegative.add(out)
        elif name == "integer_pow" and compat.params_of(eqn)["y"] % 2 == 0:
            self.nonnegative.add(out)
        elif name in _KEEP_SIGN and ins:
            if self.nan(ins[0]):
                self.nans.add(out)
            if pos(ins[0]):
                self.positive.add(out)
            elif nonneg(ins[0]):
                self.nonnegative.add(out)
        elif name in ("add", "max") and len(ins) == 2:
            a, b = ins
            if (pos(a) and nonneg(b)) or (nonneg(a) and pos(b)):
                self.positive.add(out)
            elif nonneg(a) and nonneg(b):
                self.nonnegative.add(out)
        elif name in ("mul", "div") and len(ins) == 2:
            a, b = ins
            if pos(a) and pos(b):
                self.positive.add(out)
            elif nonneg(a) and nonneg(b):
                self.nonnegative.add(out)
        elif name == "reduce_sum" and nonneg(ins[0]):
            self.nonnegative.add(out)


def _as_fun(closed: Any) -> Any:
    fn = jex_core.jaxpr_as_fun(closed)

    def call(s_val: Any, ys: Sequence[Any], *kn: Any) -> Any:
        (x,) = fn(s_val, *ys, *kn)
        return x

    return call


def bottleneck_step(walker: Any, st: Any) -> tuple[bl.Block, Any, Any, str] | None:
    """Solve the first block of the engine state `st` through a scalar
    bottleneck: (the block, its unknown's value, its ildj, the method), or
    `None`."""
    if compat.in_manual_body():
        return None
    env = st.env
    for block in sq.find_sequential(st):
        n = _size(block.x)
        if n > MAX_ELEMENTS or sum(_size(v) for v in block.ys) != n:
            continue
        if not _regular(block, st):
            continue
        # The first bottleneck whose `G` qualifies, alone: each `G` has as
        # many roots as `y` has preimages, and one that answers where
        # another is NaN (its check fooled by a turn between grid points)
        # would answer one of several.
        way = next(
            (
                (k, x_of)
                for k in _candidates(block)
                if (x_of := _x_of(walker, block, k))
            ),
            None,
        )
        if way is None:
            for i in block.indices:
                if i in st.reasons:
                    st.refuse(i, NO_BOTTLENECK)
            continue
        known = [env[v] for v in block.known]
        ys = [env[v] for v in block.ys]
        x, ildj = _solve_through(block, way, ys, known)
        return block, x, ildj if st.options.want_ildj else 0.0, BOTTLENECK_SOLVE
    return None


def _regular(block: bl.Block, st: Any) -> bool:
    """Whether the block's Jacobian is regular at one of the sequential
    method's two pseudo-random points (its known operands as that method
    measures them, `_sequential._probe_values`): its smallest singular value
    above `sqrt(eps)` times its largest. A map singular at both (a softmax,
    which adds the same number to every element without changing its
    result) is not injective near them: its `G` is flat, and the refusal
    that says why stands."""
    try:
        known = sq._probe_values(block, st)
    except Exception:  # noqa: BLE001 - not this method
        return False
    if known is None:
        return False
    n = _size(block.x)
    dtype = np.dtype(block.x.aval.dtype)
    flat = sq.flat_results(block)

    def singular_values(u: Any, *kn: Any) -> Any:
        return jnp.linalg.svd(jax.jacfwd(flat)(u, *kn), compute_uv=False)

    points = np.stack(sq._points(n, dtype))  # (NumPy: not a value of the trace)
    try:
        with jax.ensure_compile_time_eval():
            batched = jax.vmap(singular_values, in_axes=(0, *([None] * len(known))))
            sv = np.asarray(jax.jit(batched)(points, *known), np.float64)
    except Exception:  # noqa: BLE001 - not this method
        return False
    eps = float(jnp.finfo(dtype).eps)
    top = sv.max(axis=1)
    regular = np.isfinite(sv).all(axis=1) & (sv.min(axis=1) > np.sqrt(eps) * top)
    return bool(np.any(regular & (top > 0)))


def _solve_through(
    block: bl.Block,
    way: tuple[int, Any],
    ys: Sequence[Any],
    known: Sequence[Any],
) -> tuple[Any, Any]:
    """The block's unknown through its bottleneck `way` (equation `k`,
    `x(s, ys, *known)`), and its ildj: NaN unless `G` has one root on the
    solver's grid and the answer maps back."""
    flat = sq.flat_results(block)
    dtype = block.x.aval.dtype
    y = jnp.concatenate([jnp.ravel(v).astype(dtype) for v in ys])
    splits = np.cumsum([_size(v) for v in block.ys])[:-1]
    y_shapes = [v.aval.shape for v in block.ys]
    y_dtypes = [v.aval.dtype for v in block.ys]

    def unflat(y_flat: Any) -> list[Any]:
        parts = jnp.split(y_flat, splits) if len(splits) else [y_flat]
        return [
            jnp.reshape(p, sh).astype(dt)
            for p, sh, dt in zip(parts, y_shapes, y_dtypes, strict=True)
        ]

    k, x_of = way
    s_var = block.eqns[k].outvars[0]
    s_shape, s_dtype = s_var.aval.shape, s_var.aval.dtype

    def gap(s: Any, y_flat: Any, *kn: Any) -> Any:
        # G(s) = phi(x(s, y)) - s, on `s` raveled to a scalar.
        x = x_of(jnp.reshape(s, s_shape).astype(s_dtype), unflat(y_flat), *kn)
        phi = block.run(x, kn)[s_var]
        return jnp.reshape(phi, ()).astype(s.dtype) - s

    def inner(y_flat: Any, *kn: Any) -> Any:
        zero = jnp.zeros((), jnp.result_type(y_flat))
        # (Turns of `G` between grid points, found by enclosing its slope.)
        turns = bl.scalar_turns(gap, jnp.result_type(y_flat), (y_flat, *kn))
        s = _solve.solver(gap, uniform=False, turns=turns)(zero, y_flat, *kn)
        x = x_of(jnp.reshape(s, s_shape).astype(s_dtype), unflat(y_flat), *kn)
        return jnp.ravel(x).astype(dtype)

    rows = np.arange(_size(block.x))
    return sq.implicit_solve(flat, rows, inner, block.x.aval.shape, y, known)
