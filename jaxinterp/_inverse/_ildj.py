"""Inverse log-det-Jacobians: the forms the methods' ildjs take.

- `elementwise`: of an elementwise inverse, `sum(log|dx/dy|)` by one `jvp`;
- `of_slope`: of an elementwise map solved for `x`, `-sum(log|g'(x)|)`;
- `log_det`: `log|det J|` of a square Jacobian (NaN for one not square);
- `whole_map`: of a map with more results than unknowns, in the
  coordinates of `y` its inverse reads, or by the area formula.

Closed forms of particular maps (a Cholesky factor, an FFT) are with their
rules; `total` sums the terms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat

# An elementwise inverse: `y -> x`.
Solve = Callable[[Any], Any]

_reduce_sum = getattr(lax, "reduce_sum", None)


def total(t: Any) -> Any:
    """Sum all elements of `t` to a scalar (cheap to trace; scalars pass through)."""
    if isinstance(t, (int, float)) or np.ndim(t) == 0:
        return t
    if _reduce_sum is None:  # JAX releases without `lax.reduce_sum`
        return jnp.sum(t)
    return _reduce_sum(t, tuple(range(np.ndim(t))))


def sum_log_abs(d: Any) -> Any:
    """`sum(log|d|)` in at least float32, as a scalar."""
    d = jnp.asarray(d)
    if not jnp.issubdtype(d.dtype, jnp.inexact):
        d = d.astype(jnp.float32)
    return total(lax.log(lax.abs(d)))


def elementwise(inverse_fn: Solve, y: Any) -> Any:
    """`sum(log|d inverse_fn(y) / dy|)` for an elementwise `inverse_fn`, via `jvp`."""
    y = jnp.asarray(y)
    if not jnp.issubdtype(y.dtype, jnp.inexact):
        return jnp.zeros((), jnp.float32)
    _, dx = jax.jvp(inverse_fn, (y,), (jnp.ones_like(y),))
    return sum_log_abs(dx)


def of_slope(slope: Any) -> Any:
    """`-sum(log|g'(x)|)` of an elementwise map `g` with slope `g'(x)`."""
    return -sum_log_abs(slope)


def log_det(jac: Any) -> Any:
    """`log|det jac|` of a square Jacobian; NaN if `jac` is not square."""
    if jac.ndim != 2 or jac.shape[0] != jac.shape[1]:
        return jnp.full((), jnp.nan, jnp.float32)
    return jnp.linalg.slogdet(jac)[1]


# A whole map's area formula takes its dense Jacobian: at most this many real
# unknown coordinates, and this many Jacobian entries.
MAX_AREA_UNKNOWNS = 2048
MAX_AREA_ENTRIES = 1 << 24


def _real_size(aval: Any) -> int:
    """How many real coordinates a value of `aval` has (0 if not inexact)."""
    dtype = aval.dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
        return 0
    return int(np.prod(aval.shape)) * (
        2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1
    )


def whole_map(
    forward: Callable[[list[Any]], list[Any]],
    inverse: Callable[[list[Any]], list[Any]],
    xs: Sequence[Any],
    ys: Sequence[Any],
    out_avals: Sequence[Any],
    fn_name: str,
    completed: bool = False,
) -> Any | None:
    """The ildj of a map with more results than unknowns, in the coordinates
    of `y` that its inverse reads; `None` when the map is square (the
    backward steps' ildjs add up to it) and nothing was `completed`.

    With `completed`, some elements of `x` were taken as what a step uses in
    their place (`_gram.fill_step`): they are constants of the inverse, not
    coordinates, and only the elements of `x` that the inverse varies count
    (the rows of `dx/dy` not identically zero).

    A map onto a manifold has no Jacobian determinant, only one per choice
    of coordinates on its image. When the inverse reads exactly as many real
    coordinates `S` of `y` as `x` has (stick-breaking reads all but the last
    element of the simplex, a correlation Cholesky factor its strict lower
    triangle, `L @ L.T` its lower triangle), those are a chart of the image
    and the ildj is `log|det dx/dy_S|`: the libraries' log-det, the density's
    change of variables in the coordinates their distributions use. When it
    reads more (a least-squares solve, a normalized block reading every
    element), no such chart is singled out and the ildj is the area formula
    `-0.5 logdet(J^T J)`, `J` the whole map's Jacobian at `xs` (0 for a map
    that copies each unknown, an isometry such as a zero-sum embedding).

    `S` is read off `dx/dy` (by forward mode through `inverse`): the columns
    not identically zero. `dx/dy` has full row rank wherever the map is
    differentiable, so it has at least as many such columns as unknowns.
    Complex values count as their real and imaginary parts.

    Raises:
        NotInvertibleError: if the Jacobians are too large to form densely.
    """
    from .._errors import NotInvertibleError

    avals = [compat.aval_of(x) for x in xs]
    if not avals or any(not jnp.issubdtype(a.dtype, jnp.inexact) for a in avals):
        return None
    n = sum(_real_size(a) for a in avals)
    m = sum(_real_size(a) for a in out_avals)
    if m <= n and not completed:
        return None
    if n > MAX_AREA_UNKNOWNS or n * m > MAX_AREA_ENTRIES:
        shapes = ", ".join(str(a.str_short()) for a in avals)
        raise NotInvertibleError(
            f"`{fn_name}` maps {n} unknown real coordinates ({shapes}) to {m} "
            "results: its ildj needs the dense Jacobians of the map and of "
            f"its inverse, formed up to {MAX_AREA_UNKNOWNS} unknowns and "
            f"{MAX_AREA_ENTRIES} entries. Ask for `inverse` only, or map the "
            "inverse over independent rows with `jax.vmap`."
        )
    y_avals = [compat.aval_of(y) for y in ys]
    y_real = [i for i, a in enumerate(y_avals) if _real_size(a)]

    def x_of(v: Any) -> Any:
        parts = _split(v, [_real_size(y_avals[i]) for i in y_real])
        args = list(ys)
        for i, part in zip(y_real, parts, strict=True):
            args[i] = _from_real(part, y_avals[i])
        return _concat_real(inverse(args))

    inv_jac = jax.jacfwd(x_of)(_concat_real([ys[i] for i in y_real]))
    nonzero = inv_jac != 0
    varied = jnp.any(nonzero, axis=1)  # (elements of `x`, not constants)
    read = jnp.any(nonzero, axis=0)
    in_chart = jnp.sum(read) == jnp.sum(varied)
    dtype = jnp.finfo(avals[0].dtype).dtype
    # Constants of the inverse get a row of the identity below each matrix,
    # so they do not count.
    constant = jnp.diag((~varied).astype(dtype))

    def log_volume(tall: Any) -> Any:
        """`0.5 logdet(tall^T tall)` (a QR factorization, not the product)."""
        _, r = jnp.linalg.qr(jnp.concatenate([tall, constant]))
        return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(r)))).astype(dtype)

    def chart() -> Any:
        return log_volume(jnp.where(read[:, None] & varied[None, :], inv_jac.T, 0.0))

    def area() -> Any:
        def y_of(u: Any) -> Any:
            parts = _split(u, [_real_size(a) for a in avals])
            return _concat_real(
                forward([_from_real(p, a) for p, a in zip(parts, avals, strict=True)])
            )

        jac = jax.jacfwd(y_of)(_concat_real(xs))
        return -log_volume(jnp.where(varied[None, :], jac, 0.0))

    return lax.cond(in_chart, chart, area)


def _split(v: Any, sizes: Sequence[int]) -> list[Any]:
    return jnp.split(v, list(np.cumsum(sizes)[:-1])) if len(sizes) > 1 else [v]


def _concat_real(values: Sequence[Any]) -> Any:
    """The inexact `values` as one real vector (complex ones as their real
    and imaginary parts)."""
    return jnp.concatenate(
        [_to_real(v) for v in values if jnp.issubdtype(jnp.result_type(v), jnp.inexact)]
    )


def _to_real(x: Any) -> Any:
    """`x` flattened, a complex value as its real and imaginary parts."""
    x = jnp.ravel(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.concatenate([jnp.real(x), jnp.imag(x)])
    return x


def _from_real(u: Any, aval: Any) -> Any:
    """The inverse of `_to_real` for a value of type `aval`."""
    if jnp.issubdtype(aval.dtype, jnp.complexfloating):
        re, im = jnp.split(u, 2)
        u = lax.complex(re, im)
    return jnp.reshape(u.astype(aval.dtype), aval.shape)
