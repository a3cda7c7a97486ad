"""Maps through a scalar bottleneck, solved by one scalar equation.

A planar flow `y = x + u * tanh(w @ x + b)`, a radial flow `y = x + beta *
(x - c) / (alpha + |x - c|)` and a map onto a ball `y = x / (1 + |x|)` reach
their result from the unknown `x` along two paths: directly, and through one
number computed from the whole of `x` (`w @ x`, `|x - c|`, `|x|`). No
equation can be solved alone, and the map is neither elementwise, nor linear,
nor triangular (`_sequential.py`). With that number `s` known, though, the
rest is solved by the engine's formulas: `x = y - u * tanh(s + b)`. Then `s`
must be what that `x` gives:

    G(s) = phi(x(s, y)) - s = 0,

one equation in one unknown, which the elementwise solver solves
(`_solve.py`: bracketing and safeguarded Newton, NaN where `G` turns on the
solver's grid, checked for each `y`).

Why the answer is the only preimage: every preimage `x` of `y` gives a root
`s = phi(x)` of `G`, with `x(s, y) = x` (the formulas' solution is the only
`x` that gives `y` for that `s`); every root `s` gives a preimage `x(s, y)`.
So `y` has as many preimages as `G` has roots, and one where `G` is monotone.
The answer must also map back to `y` within rounding (`_sequential._checked`),
else NaN (`y` outside the image: a point outside the ball).

The block is the sequential method's (`_sequential.find_sequential`: the
blocked equations that reach one unknown), square (as many result elements
as unknown ones), tried when it is not triangular, and only if its Jacobian
is regular at one of that method's two pseudo-random points (`_regular`: a
softmax, singular everywhere, keeps its refusal, which says which freedom
it loses, rather than a `G` that is flat). The candidates for `s`
are its values of one element that depend on `x`, earliest first (at most
`MAX_CANDIDATES`): those for which the engine solves the rest by exact
methods (no numerical solve, no bottleneck within: `G` is evaluated many
times by the solver) are tried in turn. The ildj is `-log|det J|` with `J`
the block's Jacobian at the answer (`MAX_ELEMENTS` elements at most), and
derivatives come from the implicit function theorem on the whole block,
not from the iterations.
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
                bottlenecks=False,
            )
            if sol.pieces or sol.uncovered or sol.chose:
                # (A chosen branch: `x(s, y)` might not be the only `x`.)
                raise NotInvertibleError("not by formulas alone")
            return sol.invals[0]

        ys_specs = [_spec(v) for v in block.ys]
        staged = jax.make_jaxpr(x_of)(_spec(s), ys_specs, *known_specs)
    except NotInvertibleError:
        return None
    except Exception:  # noqa: BLE001 - not this method (a rule's own error)
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
    if not st.options.bottlenecks or compat.in_manual_body():
        return None
    env = st.env
    for block in sq.find_sequential(st):
        n = _size(block.x)
        if n > MAX_ELEMENTS or sum(_size(v) for v in block.ys) != n:
            continue
        if not _regular(block, st):
            continue
        ways = [
            (k, x_of) for k in _candidates(block) if (x_of := _x_of(walker, block, k))
        ]
        if not ways:
            continue
        known = [env[v] for v in block.known]
        ys = [env[v] for v in block.ys]
        x, ildj = _solve_through(block, ways, ys, known)
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
    ways: list[tuple[int, Any]],
    ys: Sequence[Any],
    known: Sequence[Any],
) -> tuple[Any, Any]:
    """The block's unknown through its bottlenecks `ways` (equation `k`,
    `x(s, ys, *known)`), and its ildj. Each bottleneck's `G` decides alone
    (NaN unless it has one root); the first that answers is taken, the next
    tried only where the earlier ones are NaN. (`G` of one bottleneck may
    turn where another's does not: a radial flow's `G` in `|x - c|` has a
    pole, its `G` in `beta / (alpha + |x - c|)` none.) NaN unless the answer
    maps back."""
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

    def through(k: int, x_of: Any, y_flat: Any, kn: Sequence[Any]) -> Any:
        s_var = block.eqns[k].outvars[0]
        s_shape, s_dtype = s_var.aval.shape, s_var.aval.dtype

        def gap(s: Any, y_flat: Any, *kn: Any) -> Any:
            # G(s) = phi(x(s, y)) - s, on `s` raveled to a scalar.
            x = x_of(jnp.reshape(s, s_shape).astype(s_dtype), unflat(y_flat), *kn)
            phi = block.run(x, kn)[s_var]
            return jnp.reshape(phi, ()).astype(s.dtype) - s

        zero = jnp.zeros((), jnp.result_type(y_flat))
        s = _solve.solver(gap, uniform=False)(zero, y_flat, *kn)
        x = x_of(jnp.reshape(s, s_shape).astype(s_dtype), unflat(y_flat), *kn)
        return jnp.ravel(x).astype(dtype)

    def inner(y_flat: Any, *kn: Any) -> Any:
        (k, x_of), *rest = ways
        x = through(k, x_of, y_flat, kn)
        for k, x_of in rest:
            x = jax.lax.cond(
                jnp.any(jnp.isnan(x)),
                lambda k=k, x_of=x_of: through(k, x_of, y_flat, kn),
                lambda x=x: x,
            )
        return x

    rows = np.arange(_size(block.x))
    return sq.implicit_solve(flat, rows, inner, block.x.aval.shape, y, known)
