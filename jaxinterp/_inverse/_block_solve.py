"""Solving an elementwise or linear block exactly (see `_blocks.py`).

- **piecewise**: the block's discrete choices (`select_n` on a predicate of
  the unknown, `max`, `min`, `abs`) are its sites; for each combination of
  their cases (`_case_choices`, at most `bl.MAX_CASES`) the block with those
  cases fixed is inverted by formulas, and each element keeps the
  candidate whose predicates select the cases it was solved with
  (`solve_piecewise`);
- **linear**: a block linear in its unknowns is solved by an LU solve, or
  by least squares for more results than unknowns (`solve_linear`).

Every answer is checked by mapping it back (NaN where it does not give `y`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from . import _blocks as bl, _linear_parts as lp, _nonsquare, _rounding as rd
from ._elementwise_steps import derivative

_Literal = compat.Literal


_BOOLEAN: dict[str, Callable[..., bool]] = {
    "or": lambda a, b: a or b,
    "and": lambda a, b: a and b,
    "not": lambda a: not a,
}


def _derived_keys(block: bl.Block, keys: dict[Any, int]) -> dict[Any, Any]:
    """Keys that are a boolean function of other keys (`jnp.where(small |
    large, 1, x)` beside `jnp.where(small, ...)` and `jnp.where(large, ...)`):
    their equations, in program order. Their case follows from the others',
    so that no choice of cases is counted that no `x` can make (a constant
    case there would mark its value NaN)."""
    derived: dict[Any, Any] = {}
    for eqn in block.eqns:
        out = eqn.outvars[0]
        if (
            out in keys
            and keys[out] == 2
            and out.aval.dtype == jnp.bool_
            and eqn.primitive.name in _BOOLEAN
            and all(
                type(v) is not _Literal and (v in derived or keys.get(v) == 2)
                for v in eqn.invars
            )
        ):
            derived[out] = eqn
    return derived


def _case_choices(block: bl.Block) -> list[dict[Any, int]] | None:
    keys: dict[Any, int] = {}
    for site in block.sites.values():
        keys.setdefault(site.key, site.n_cases)
    derived = _derived_keys(block, keys)
    free = {k: n for k, n in keys.items() if k not in derived}
    count = 1
    for n in free.values():
        count *= n
    if count > bl.MAX_CASES:
        return None
    choices = []
    for combo in itertools.product(*(range(n) for n in free.values())):
        choice = dict(zip(free, combo, strict=True))
        for out, eqn in derived.items():
            value = _BOOLEAN[eqn.primitive.name](*(bool(choice[v]) for v in eqn.invars))
            choice[out] = int(value)
        choices.append(choice)
    return choices


def flattened(
    block: bl.Block, y: Any, known: Sequence[Any], compacts: Sequence[Any]
) -> tuple[Any, list[Any], list[Any], tuple[int, ...]] | None:
    """An elementwise block's result, known operands and their compact
    forms reshaped to one axis, and the shape to restore: where `y` has
    several axes, the block's equations replay at another shape
    (`bl.replays_at_any_shape`), each operand is a scalar, of `y`'s shape, or
    one value with an axis of size 1 for each of `y`'s, and the program runs
    on one device (no sharding to keep). XLA's CPU code vectorizes a fusion
    along its last axis, so a block on `(n, 5)` (a batch of small vectors)
    ran about 8 times slower than on `(5 n,)`: TFP's `Invert(Softplus())`
    at 10^4 elements, 0.89 against 0.11 ms. A reshape of the whole array is
    free. `None` where not done."""
    shape = tuple(jnp.shape(y))
    if len(shape) < 2 or tuple(block.x.aval.shape) != shape:
        return None
    if jax.device_count() > 1 or compat.in_manual_body():
        return None
    # (A compact form of one value keeps a size-1 axis per axis of `y`.)
    ones = (1,) * len(shape)
    values = [*known, *compacts]
    if not all(jnp.shape(k) in ((), shape, ones) for k in values):
        return None
    if not bl.replays_at_any_shape(block.eqns):
        return None

    def flat(v: Any) -> Any:
        # (Behind a barrier: else XLA moves the reshape past the block's
        # elementwise steps, and their fusion is on `y`'s shape again.)
        if not jnp.shape(v):
            return v
        size = (1,) if jnp.shape(v) == ones else (-1,)
        if not compat.is_tracer(v):
            # (A constant stays one, NumPy: the table of starts, the grid
            # and the folds are built from it while tracing.)
            return np.reshape(np.asarray(v), size)
        if jnp.shape(v) == ones:
            return jnp.reshape(v, size)
        return lax.optimization_barrier(jnp.reshape(v, size))

    return flat(y), [flat(k) for k in known], [flat(k) for k in compacts], shape


def solve_piecewise(
    block: bl.Block,
    y: Any,
    known: Sequence[Any],
    invert: Callable[[Any, Sequence[Any], Any], Any | None],
) -> Any | None:
    """`x` by inverting each case exactly (`invert(closed, invals, y)` runs
    the engine on a Jaxpr), or `None` if some case has no formula.

    `invert` gives the case's candidate, or `(candidate, flat)` where
    `flat` marks elements at which the case is constant at `y` (every point
    of its region a preimage: NaN there)."""
    choices = _case_choices(block)
    if not block.sites or choices is None:
        return None
    # (`y`'s shape, not the block's: `flattened`.)
    x_spec = jax.ShapeDtypeStruct(jnp.shape(y), block.x.aval.dtype)
    specs = [jax.ShapeDtypeStruct(jnp.shape(k), jnp.result_type(k)) for k in known]
    candidates = []
    flat = jnp.zeros(jnp.shape(y), bool)
    for choice in choices:

        def case(x: Any, *kn: Any, choice: dict[Any, int] = choice) -> Any:
            return block.run(x, kn, choice=choice)[block.y]

        # (Without the steps this case does not use: the predicates.)
        closed = compat.dce_closed_jaxpr(jax.make_jaxpr(case)(x_spec, *specs))
        x_c = invert(closed, [None, *known], y)
        if x_c is None:
            return None
        if isinstance(x_c, tuple):
            x_c, flat_c = x_c
            flat = flat | flat_c
        candidates.append(x_c)
    # Per candidate, how many sites pick its case at it (-1 if it is NaN).
    scores = [
        _agreeing(block, x_c, known, choice)
        for x_c, choice in zip(candidates, choices, strict=True)
    ]
    n_keys = len({site.key for site in block.sites.values()})
    oks = [score == n_keys for score in scores]
    dtype = jnp.result_type(y)
    x = jnp.full(jnp.shape(y), jnp.nan, dtype)
    found = jnp.zeros(jnp.shape(y), bool)
    for x_c, ok in reversed(list(zip(candidates, oks, strict=True))):
        x = jnp.where(ok, x_c, x)
        found = found | ok
    # Where cases meet (`|u|` at `u == 0`, a threshold `x < t`), a candidate
    # within rounding of the edge may pick the other case, and then no
    # candidate picks its own. There the candidate with the most sites
    # agreeing is kept; whether it is a preimage (within rounding: a jump of
    # the program that rounding hides), the check of the answer below
    # decides.
    # (With one site, that is the first candidate that is not NaN.)
    best_score = functools.reduce(jnp.maximum, scores)
    best = jnp.full(jnp.shape(y), jnp.nan, dtype)
    for x_c, score in reversed(list(zip(candidates, scores, strict=True))):
        if n_keys == 1:
            best = jnp.where(jnp.isnan(x_c), best, x_c)
        else:
            best = jnp.where(score == best_score, x_c, best)
    x = jnp.where(found, x, best)
    slope = derivative(block.g, x, known)
    tol = rd.one_preimage(x, y, slope)
    ambiguous = jnp.zeros(jnp.shape(y), bool)
    for x_c, ok in zip(candidates, oks, strict=True):
        ambiguous = ambiguous | (ok & ~(jnp.abs(x_c - x) <= tol))
    # The answer must be a preimage: the block maps it back to `y` (within
    # rounding). Checked once, on the candidate kept: a candidate of another
    # case that picks its own case but does not map back can only make the
    # answer NaN (ambiguous), never another number.
    back = maps_back(block, x, block.g(x, *known), y, known, slope)
    return jnp.where(~ambiguous & ~flat & back, x, jnp.nan)


def _agreeing(
    block: bl.Block, x: Any, known: Sequence[Any], choice: dict[Any, int]
) -> Any:
    """How many site keys pick their case of `choice` at `x` (int32; -1
    where `x` is NaN)."""
    selected: dict[Any, Any] = {}
    block.run(x, known, selected=selected)
    count = sum(
        bl.picks(name, ins, choice[key]).astype(jnp.int32)
        for key, (name, ins) in selected.items()
    )
    return jnp.where(jnp.isnan(x), -1, count)


def maps_back(
    block: bl.Block, x: Any, y_x: Any, y: Any, known: Sequence[Any], slope: Any = None
) -> Any:
    """Where `g(x) = y_x` is `y` within rounding (of `y`, and of `x` through
    `g'(x)`, `slope` if given)."""
    if slope is None:
        slope = derivative(block.g, x, known)
    return rd.maps_back(y_x, y, x, slope)


def solve_linear_elementwise(block: bl.Block, y: Any, known: Sequence[Any]) -> Any:
    """`x = (y - g(0)) / g'(0)` for an elementwise block linear in `x`: exact;
    NaN where the slope is 0."""
    zero = jnp.zeros(jnp.shape(y), jnp.result_type(y))
    offset = block.g(zero, *known)
    slope = derivative(block.g, zero, known)
    nan = jnp.asarray(jnp.nan, jnp.result_type(y))
    return jnp.where(slope == 0, nan, (y - offset) / jnp.where(slope == 0, 1, slope))


def solve_linear(
    block: bl.Block, ys: Sequence[Any], known: Sequence[Any]
) -> tuple[Any, Any, str]:
    """The unknowns (one value, or a list for several) and `-log|det J|`
    for a linear block `ys = J u + c`: an LU solve when `J` is square, least
    squares by a QR factorization when there are more results than unknowns
    (the results hold the unknowns redundantly, as a vector filled into a
    triangular matrix does; the ildj is then `-0.5 log det(J^T J)`, minus
    the log of the volume factor of the map onto its image: 0 when each
    unknown is copied to some results). NaN unless the
    residual is within rounding (`ys` outside the image, or `J` singular).
    Complex results count as their real and imaginary parts. A block that
    reads only the symmetric part of its one unknown matrix is solved on
    symmetric matrices (`lp.symmetric_basis`; method `bl.SYMMETRIC_SOLVE`)."""
    jac, offset = lp.linear_matrix(block, known)
    rhs = lp.flatten_values(block, ys) - offset
    slack = lp.value_scales(block, ys)
    basis = lp.symmetric_basis(block, jac)
    if basis is not None:
        reduced = jac @ basis
        lp.check_rank(block, reduced)
        v, ildj, ok = least_squares(reduced, rhs, slack)
        u = basis @ v
        parts = lp.place(block, jnp.where(jnp.all(ok), u, jnp.nan))
        return (parts if len(parts) > 1 else parts[0]), ildj, bl.SYMMETRIC_SOLVE
    lp.check_rank(block, jac)
    u, ildj, ok = least_squares(jac, rhs, slack)
    parts = lp.place(block, jnp.where(ok, u, jnp.nan))
    return (parts if len(parts) > 1 else parts[0]), ildj, bl.LINEAR_SOLVE


def least_squares(jac: Any, rhs: Any, slack: Any = 0.0) -> tuple[Any, Any, Any]:
    """`u` with `J u = rhs` (LU when square, else least squares), the ildj
    (`-log|det J|`, or `-0.5 log det(J^T J)`), and per unknown whether `J`
    has full column rank and the residual is within rounding (of `|J| |u| +
    |rhs|` and of `slack`, each row's rounding made before, see
    `lp.value_scales`) on every row of the unknown's part of the system
    (`_coupled`)."""
    m, n = jac.shape
    finfo = jnp.finfo(jnp.result_type(rhs))
    eps = finfo.eps
    full_rank: Any = True
    if m == n:
        if compat.is_tracer(jac):
            # Singular values: `J` must have full rank at this precision (else
            # the unknowns are not determined, and LU would return one
            # preimage among many). A concrete `J` was checked while tracing
            # (`lp.check_rank`). (A tall `J`: the QR's diagonal, below.)
            sv = jnp.linalg.svd(jac, compute_uv=False)
            full_rank = sv[-1] > n * eps * sv[0]
        u = jnp.linalg.solve(jac, rhs)
        ildj = -jnp.linalg.slogdet(jac)[1]
    else:
        u, ildj, full_rank = _nonsquare.least_squares(jac, rhs)
    scale = jnp.abs(jac) @ jnp.abs(u) + jnp.abs(rhs) + slack
    # (`16 tiny`: near the smallest normal number the bound itself is
    # subnormal, which XLA's CPU code flushes to 0, as it does the products.)
    bound = 8 * n * eps * scale + 16 * finfo.tiny
    rows_ok = jnp.abs(jac @ u - rhs) <= bound
    return u, ildj, full_rank & _coupled(jac, rows_ok)


def _coupled(jac: Any, rows_ok: Any) -> Any:
    """Per unknown, whether every row of its part of the system holds: the
    rows and unknowns linked by nonzero entries of a concrete `J` (a row off
    the image then makes NaN only the unknowns it is coupled to, as each
    element of `complex(a * c, a * d)` is its own system); for a traced `J`,
    every row."""
    n = jac.shape[1]
    if compat.is_tracer(jac):
        return jnp.broadcast_to(jnp.all(rows_ok), (n,))
    pattern = np.asarray(jac) != 0
    label = np.arange(n)
    big = n + 1
    while True:  # each unknown takes the least label its rows reach
        row_label = np.where(pattern, label[None, :], big).min(axis=1)
        got = np.minimum(label, np.where(pattern, row_label[:, None], big).min(axis=0))
        if (got == label).all():
            break
        label = got
    # A row with no unknown (a residual of known values) concerns them all.
    same = (row_label[None, :] == label[:, None]) | (row_label[None, :] == big)
    return jnp.all(jnp.where(same, rows_ok[None, :], True), axis=1)
