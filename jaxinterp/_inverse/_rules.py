"""The `inverse` rule table and builders for common rule shapes.

An inverse rule receives an `InverseContext` (the equation's operand and
result avals, whether the ildj is wanted), the equation's output values (all
known), then its operands with `None` for each unknown one, then the params:

    rule(ctx, outvals, *invals, **params) -> (solved, ildj) | None

It returns `None` when it cannot solve for the unknown operands given what is
known (the engine retries when more becomes known), or raises
`NotInvertibleError` when the primitive can never be inverted that way. On
success `solved` has one entry per operand (known ones may be passed back as
they were) and `ildj` is the scalar log-determinant of the Jacobian of the map
from the outputs to the unknown operands, or `None` to let the engine compute it
with `jax.jacfwd` and `slogdet` (exact but slow: give it when you can).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._custom_types import InverseRule
from .._errors import NotInvertibleError
from .._registry import RuleRegistry
from . import _ildj
from ._ildj import total
from ._rounding import agree, largest


class InverseContext:
    """What an inverse rule is told about the equation it inverts, besides values.

    Attributes:
        want_ildj: whether the ildj is wanted (`inverse` alone does not need
            it: a rule may return `0.0` then, and skip computing it).
        solvers: whether elementwise blocks without a formula may be solved
            numerically (`inverse(..., solvers=False)` turns it off); rules
            that invert a body with the engine pass it on.
        result_branches: internal to jaxinterp's call-like rules: per result,
            the interval a value chosen on a principal branch lies in, else
            `None` (empty when no result depends on such a choice).
    """

    __slots__ = ("_in", "_out", "result_branches", "solvers", "want_ildj")

    def __init__(
        self,
        in_avals: Sequence[Any] = (),
        out_avals: Sequence[Any] = (),
        *,
        want_ildj: bool = True,
        result_branches: Sequence[Any] = (),
        solvers: bool = True,
    ) -> None:
        self._in = in_avals
        self._out = out_avals
        self.want_ildj = want_ildj
        self.solvers = solvers
        self.result_branches = tuple(result_branches)

    @classmethod
    def of(
        cls,
        eqn: compat.JaxprEqn,
        *,
        want_ildj: bool = True,
        result_branches: Sequence[Any] = (),
        solvers: bool = True,
    ) -> InverseContext:
        """The context for inverting `eqn` (its avals are read when asked)."""
        ctx = cls.__new__(cls)
        ctx._in = _Avals(eqn.invars)
        ctx._out = _Avals(eqn.outvars)
        ctx.want_ildj = want_ildj
        ctx.solvers = solvers
        ctx.result_branches = tuple(result_branches)
        return ctx

    @property
    def in_avals(self) -> tuple[Any, ...]:
        """The operands' abstract values (empty if not known)."""
        return tuple(self._in)

    @property
    def out_avals(self) -> tuple[Any, ...]:
        """The results' abstract values (empty if not known)."""
        return tuple(self._out)

    def operand_aval(self, index: int) -> Any | None:
        """The aval of operand `index`, or `None` if the context lacks it."""
        if not 0 <= index < len(self._in):
            return None
        return self._in[index]

    def __repr__(self) -> str:
        avals = ", ".join(a.str_short() for a in self.in_avals)
        return f"InverseContext(in_avals=({avals}), want_ildj={self.want_ildj})"


class _Avals(Sequence[Any]):
    """The avals of a list of variables, read on access."""

    __slots__ = ("_vars",)

    def __init__(self, variables: Sequence[Any]) -> None:
        self._vars = variables

    def __len__(self) -> int:
        return len(self._vars)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(v.aval for v in self._vars[index])
        return self._vars[index].aval


def _takes_context(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a rule of the current signature: first parameter `ctx`."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return bool(params) and params[0].name == "ctx"


class InverseRuleRegistry(RuleRegistry[InverseRule]):
    """The inverse rule table: `rule(ctx, outvals, *invals, **params)`.

    A rule whose first parameter is not named `ctx` has the signature of
    jaxinterp 0.1, `rule(outvals, *invals, **params)`, reading
    `operand_aval(k)` and `ildj_wanted()`: it is adapted, with a
    `DeprecationWarning` (that form is deprecated in 0.2.0, removed in 0.3.0).
    """

    def _adapt(self, fn: Any) -> Any:
        if _takes_context(fn):
            return fn
        warnings.warn(
            f"The inverse rule {getattr(fn, '__qualname__', fn)!r} has the old "
            "signature `rule(outvals, *invals, **params)`; inverse rules now take "
            "an `InverseContext` first, `rule(ctx, outvals, *invals, **params)`, "
            "and read `ctx.operand_aval(k)` and `ctx.want_ildj` instead of "
            "`operand_aval(k)` and `ildj_wanted()`. The old form is deprecated in "
            "0.2.0, removed in 0.3.0.",
            DeprecationWarning,
            stacklevel=4,
        )

        def legacy(
            ctx: InverseContext, outvals: Sequence[Any], *invals: Any, **params: Any
        ) -> Any:
            with _legacy_context(ctx):
                return fn(outvals, *invals, **params)

        legacy.__name__ = getattr(fn, "__name__", "rule")
        legacy.__wrapped__ = fn  # type: ignore[attr-defined]
        return legacy


inverse_rules: InverseRuleRegistry = InverseRuleRegistry(
    "inverse", qualname="jaxinterp.inverse_rules"
)
"""Inverse rules: `rule(ctx, outvals, *invals, **params) -> (solved, ildj) | None`."""

Solve = Callable[..., Any]


# jaxinterp 0.1's rule signature read the context from ContextVars; they are
# set only around rules of that form (see `InverseRuleRegistry`), for one
# release. Built-in rules read `ctx` (a test checks that none reads these).
_WANT_ILDJ: ContextVar[bool] = ContextVar("jaxinterp_want_ildj", default=True)


def ildj_wanted() -> bool:
    """Deprecated: rules read `ctx.want_ildj`. For rules of the old signature."""
    return _WANT_ILDJ.get()


@contextmanager
def _legacy_context(ctx: InverseContext) -> Iterator[None]:
    wanted = _WANT_ILDJ.set(ctx.want_ildj)
    avals = _AVALS.set(tuple(ctx.in_avals))
    try:
        yield
    finally:
        _AVALS.reset(avals)
        _WANT_ILDJ.reset(wanted)


def register_elementwise_inverse(
    prim: Any,
    inverse_fn: Solve,
    log_abs_dinv: Solve | None = None,
    *,
    registry: RuleRegistry[InverseRule] = inverse_rules,
    override: bool = False,
    pass_params: bool = False,
) -> InverseRule:
    """Register the inverse of a unary elementwise primitive.

    Args:
        prim: the primitive, `y = prim(x, **params)`.
        inverse_fn: `inverse_fn(y) -> x` (`inverse_fn(y, **params)` with
            `pass_params`).
        log_abs_dinv: `log_abs_dinv(y, x) -> log|dx/dy|` elementwise (with the
            params as keywords under `pass_params`); by default derived from
            `inverse_fn` with `jax.jvp`.
        registry: the registry to add the rule to.
        override: replace an existing rule.
        pass_params: pass the equation's params (such as `integer_pow`'s `y`)
            on to `inverse_fn` and `log_abs_dinv`.

    Returns:
        The registered rule.
    """

    def rule(
        ctx: InverseContext, outvals: Sequence[Any], x: Any, **eqn_params: Any
    ) -> Any:
        if x is not None:
            return None
        params = eqn_params if pass_params else {}
        (y,) = outvals
        if y is None:
            return None
        solved = inverse_fn(y, **params)
        if not ctx.want_ildj:
            ildj: Any = 0.0
        elif log_abs_dinv is None:
            ildj = _ildj.elementwise(lambda t: inverse_fn(t, **params), y)
        else:
            ildj = _broadcast_total(log_abs_dinv(y, solved, **params), y)
        return [solved], ildj

    rule.__name__ = f"_{prim.name}_inverse"
    return registry.register(prim, rule, override=override)


def register_binary_inverse(
    prim: Any,
    solve_lhs: Solve | None,
    solve_rhs: Solve | None,
    *,
    log_abs_dlhs: Solve | None = None,
    log_abs_drhs: Solve | None = None,
    registry: RuleRegistry[InverseRule] = inverse_rules,
    override: bool = False,
) -> InverseRule:
    """Register the inverse of an elementwise binary primitive with one side known.

    `y = prim(a, b)`: `solve_lhs(y, b) -> a` solves for an unknown `a` given a
    known `b`, and `solve_rhs(y, a) -> b` for an unknown `b`. Either may be
    `None` when that side cannot be solved for. The unknown side must have
    the output's shape (a broadcast scalar cannot be recovered). The ildj
    defaults to the `jvp` of the solve function with respect to `y`.

    Returns:
        The registered rule.
    """

    def rule(
        ctx: InverseContext, outvals: Sequence[Any], a: Any, b: Any, **params: Any
    ) -> Any:
        (y,) = outvals
        if y is None:
            return None
        if a is None and b is not None and solve_lhs is not None:
            solve, known, log_abs = solve_lhs, b, log_abs_dlhs
        elif b is None and a is not None and solve_rhs is not None:
            solve, known, log_abs = solve_rhs, a, log_abs_drhs
        else:
            return None
        if np.shape(known) != np.shape(y) and np.ndim(known) != 0:
            return None
        aval = ctx.operand_aval(0 if a is None else 1)
        if aval is not None and tuple(aval.shape) != tuple(np.shape(y)):
            return None  # a broadcast unknown cannot be recovered
        solved = solve(y, known)
        if np.shape(solved) != np.shape(y):
            return None
        if not ctx.want_ildj:
            ildj: Any = 0.0
        elif log_abs is None:
            ildj = _ildj.elementwise(lambda t: solve(t, known), y)
        else:
            ildj = _broadcast_total(log_abs(y, known, solved), y)
        return ([solved, b] if a is None else [a, solved]), ildj

    rule.__name__ = f"_{prim.name}_inverse"
    return registry.register(prim, rule, override=override)


def _broadcast_total(d: Any, like: Any) -> Any:
    """Sum of `d` broadcast to `like`'s shape (a scalar `d` counts once per element)."""
    if isinstance(d, (int, float)):
        return d * math.prod(np.shape(like)) if d else 0.0
    if np.ndim(d) == 0 and np.ndim(like) != 0:
        return d * math.prod(np.shape(like))
    return total(d)


# ---------------------------------------------------------------------------
# The core rules every other family builds on; more live in sibling modules.

register_elementwise_inverse(lax.neg_p, lax.neg, lambda y, x: jnp.zeros_like(y))
register_elementwise_inverse(lax.exp_p, lax.log, lambda y, x: -lax.log(y))
register_elementwise_inverse(lax.log_p, lax.exp, lambda y, x: y)
register_elementwise_inverse(
    lax.tanh_p, lax.atanh, lambda y, x: -lax.log1p(-lax.square(y))
)
register_binary_inverse(
    lax.add_p,
    lambda y, b: lax.sub(y, b),
    lambda y, a: lax.sub(y, a),
    log_abs_dlhs=lambda y, b, a: 0.0,
    log_abs_drhs=lambda y, a, b: 0.0,
)
register_binary_inverse(
    lax.sub_p,
    lambda y, b: lax.add(y, b),
    lambda y, a: lax.sub(a, y),
    log_abs_dlhs=lambda y, b, a: 0.0,
    log_abs_drhs=lambda y, a, b: 0.0,
)


def agree_piece(piece: Any, whole: Any) -> Any:
    """Whether a piece of a value agrees with the whole value known (within
    rounding of the value's largest element), as one boolean."""
    part = jnp.asarray(whole)[piece.index()]
    if isinstance(piece, MaskedPiece):
        part = jnp.ravel(part)
    shaped = jnp.reshape(part, jnp.shape(piece.value))
    return agree(piece.value, shaped, largest(whole))


def overlapping(shape: Sequence[int], pieces: Sequence[Any]) -> bool:
    """Whether `pieces` of a value of `shape` cover some element twice
    (static bookkeeping)."""
    count = np.zeros(tuple(int(d) for d in shape), np.int32)
    for p in pieces:
        count[p.index()] += 1
    return bool((count > 1).any())


def describe_elements(mask: np.ndarray, limit: int = 6) -> str:
    """`"(0,), (2,) and 3 more of (8,)"`: the positions where `mask` holds."""
    where = np.argwhere(mask)
    shown = ", ".join(str(tuple(map(int, e))) for e in where[:limit])
    more = f" and {len(where) - limit} more" if len(where) > limit else ""
    return f"{shown}{more} of {np.shape(mask)}"


def undetermined(solved: Any, known: Any, bad: Callable[[Any], Any], why: str) -> Any:
    """`solved`, except where `bad(known)` marks elements that the known
    operand `known` leaves undetermined.

    A concrete `known` (a constant of the program) with any such element
    raises `NotInvertibleError` naming them; a traced one (known only at run
    time) makes those elements NaN, never a plausible wrong value.
    """
    if not compat.is_tracer(known):
        flags = bad(np.asarray(known))
        mask = np.broadcast_to(np.asarray(flags, dtype=bool), np.shape(solved))
        if mask.any():
            raise NotInvertibleError(f"{why} (elements {describe_elements(mask)}).")
        return solved
    nan = jnp.asarray(jnp.nan, jnp.result_type(solved))
    return jnp.where(bad(known), nan, solved)


def _divide_back(y: Any, known: Any) -> Any:
    """`y / known`, the inverse of `x * known`, for inexact dtypes only; NaN
    (or an error, for a constant factor) where the factor is zero."""
    if not jnp.issubdtype(jnp.result_type(y), jnp.inexact):
        raise NotInvertibleError(
            f"`mul` of {jnp.result_type(y)} values is not inverted: integer "
            "products wrap around and are not divisible back in general."
        )
    return undetermined(
        lax.div(y, known),
        known,
        lambda k: k == 0,
        "`mul` by a known factor with zeros loses the other factor there",
    )


register_binary_inverse(
    lax.mul_p,
    _divide_back,
    _divide_back,
    log_abs_dlhs=lambda y, b, a: -lax.log(lax.abs(b)),
    log_abs_drhs=lambda y, a, b: -lax.log(lax.abs(a)),
)


# ---------------------------------------------------------------------------
# Many outputs from one input: rules for `slice`-like primitives return pieces
# of an operand; the engine collects them per variable and `assemble`s it once
# they cover it. Rules that need an unknown operand's shape or dtype read it
# from `ctx.operand_aval(k)`.

_AVALS: ContextVar[tuple[Any, ...] | None] = ContextVar(
    "jaxinterp_inverse_operand_avals", default=None
)


def operand_aval(index: int) -> Any | None:
    """Deprecated: rules read `ctx.operand_aval(index)`. For rules of the old
    signature: the aval of operand `index`, or `None` outside a rule."""
    avals = _AVALS.get()
    if avals is None or not 0 <= index < len(avals):
        return None
    return avals[index]


@dataclasses.dataclass(frozen=True)
class Piece:
    """The region `[start:limit:stride)` of operand `operand` equals `value`.

    Regions are static: `start`, `limit` and `stride` are tuples of ints, one
    per dimension of the operand (`stride=None` means all ones); `value` has
    the region's shape, `ceil((limit - start) / stride)` per dimension.
    """

    operand: int
    start: tuple[int, ...]
    limit: tuple[int, ...]
    value: Any
    stride: tuple[int, ...] | None = None

    def index(self) -> tuple[slice, ...]:
        """The region as a tuple of `slice`s."""
        stride = self.stride or (1,) * len(self.start)
        return tuple(
            slice(s, lim, st)
            for s, lim, st in zip(self.start, self.limit, stride, strict=True)
        )


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedPiece:
    """The elements of operand `operand` where the static boolean `mask`
    holds equal `value`, a 1-D array of them in row-major order.

    Masked pieces come from `select_n` with a concrete predicate and from the
    engine's steps on partly known values (see `_masked.py`); like `Piece`,
    their coverage is static bookkeeping.
    """

    operand: int
    mask: np.ndarray
    value: Any

    def __post_init__(self) -> None:
        if np.ndim(self.mask) == 0:  # a scalar: the value itself, unraveled
            object.__setattr__(self, "value", jnp.reshape(self.value, ()))

    def index(self) -> tuple[np.ndarray, ...]:
        """The masked elements as a tuple of integer index arrays (`()` for
        a scalar, whose mask is true)."""
        if np.ndim(self.mask) == 0:
            return ()
        return tuple(np.nonzero(self.mask))


@dataclasses.dataclass(frozen=True)
class PieceResult:
    """What a rule returns instead of `(solved, ildj)` when it only learns
    pieces of its operands: they contribute no ildj when they are copies,
    else the rule gives `ildj`, over the elements the pieces cover
    (`cholesky`: the lower triangle of its operand)."""

    pieces: Sequence[Piece | MaskedPiece]  # stored as a tuple
    ildj: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", tuple(self.pieces))


def assemble(shape: Sequence[int], dtype: Any, pieces: Sequence[Piece]) -> Any:
    """Build an array of `shape` and `dtype` from `pieces`, or `None` if they
    leave some element uncovered.

    Coverage is checked statically; where pieces overlap the later one wins.
    The result is built with `lax.concatenate` when the pieces tile one axis,
    otherwise with `lax.dynamic_update_slice` (and a scatter for strided
    pieces), so it stays traceable.
    """
    shape = tuple(int(d) for d in shape)
    covered = np.zeros(shape, bool)  # static bookkeeping on shapes, not values
    for p in pieces:
        covered[p.index()] = True
    if not covered.all():
        return None
    values = [lax.convert_element_type(jnp.asarray(p.value), dtype) for p in pieces]
    if any(isinstance(p, MaskedPiece) for p in pieces):
        return _gather_pieces(shape, pieces, values)
    strided = [p.stride is not None and any(s != 1 for s in p.stride) for p in pieces]
    for p, v, st in zip(pieces, values, strided, strict=True):
        if not st and tuple(p.start) == (0,) * len(shape) and v.shape == shape:
            return v
    tiles = _tile_axis(shape, pieces, strided)
    if tiles is not None:
        axis, order = tiles
        return lax.concatenate([values[k] for k in order], axis)
    out = lax.full(shape, 0, dtype)
    for p, v, st in zip(pieces, values, strided, strict=True):
        if st:
            out = out.at[p.index()].set(v)
        else:
            out = lax.dynamic_update_slice(out, v, tuple(p.start))
    return out


def _tile_axis(
    shape: tuple[int, ...], pieces: Sequence[Piece], strided: Sequence[bool]
) -> tuple[int, list[int]] | None:
    """`(axis, order)` if the unstrided pieces tile `shape` along one axis."""
    if any(strided) or not pieces or not shape:
        return None
    for axis in range(len(shape)):
        full = all(
            p.start[d] == 0 and p.limit[d] == shape[d]
            for p in pieces
            for d in range(len(shape))
            if d != axis
        )
        if not full:
            continue
        order = sorted(range(len(pieces)), key=lambda k: pieces[k].start[axis])
        pos = 0
        for k in order:
            if pieces[k].start[axis] != pos:
                return None
            pos = pieces[k].limit[axis]
        return (axis, order) if pos == shape[axis] else None
    return None


def _gather_pieces(
    shape: tuple[int, ...], pieces: Sequence[Any], values: Sequence[Any]
) -> Any:
    """The array the `pieces` (some masked) cover, as one gather from their
    concatenated elements (positions are static; a later piece wins)."""
    size = math.prod(shape)
    grid = np.arange(size).reshape(shape)
    source = np.zeros(size, np.int64)
    offset = 0
    flat_values = []
    for p, v in zip(pieces, values, strict=True):
        flat = grid[p.index()].ravel()
        source[flat] = offset + np.arange(flat.size)
        offset += flat.size
        flat_values.append(jnp.ravel(v))
    joined = flat_values[0] if len(flat_values) == 1 else jnp.concatenate(flat_values)
    if offset == size and np.array_equal(source, np.arange(size)):
        return jnp.reshape(joined, shape)
    return jnp.reshape(joined[source.astype(np.int32)], shape)
