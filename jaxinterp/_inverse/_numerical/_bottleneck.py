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
its equations (`_signs.continuous`), so a radial flow, whose `G` divides by a
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

from ... import _jax_compat as compat
from ..._errors import NotInvertibleError
from .. import _blocks as bl
from . import _block_numeric as numeric, _sequential as sq, _signs as signs, _solve

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
    if not signs.continuous(whole):
        return None
    return _as_fun(staged)


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
        turns = numeric.scalar_turns(gap, jnp.result_type(y_flat), (y_flat, *kn))
        s = _solve.solver(gap, uniform=False, turns=turns)(zero, y_flat, *kn)
        x = x_of(jnp.reshape(s, s_shape).astype(s_dtype), unflat(y_flat), *kn)
        return jnp.ravel(x).astype(dtype)

    rows = np.arange(_size(block.x))
    return sq.implicit_solve(flat, rows, inner, block.x.aval.shape, y, known)
