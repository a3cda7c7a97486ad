"""`inverse`, `inverse_and_ildj` and `ildj`: the public inversion API."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.extend import core as jex_core

from .. import _caches, _jax_compat as compat, _recursion
from .._custom_types import PyTree
from .._errors import NotInvertibleError
from .._interpreter import Interpreter
from .._state import functionalize
from .._trace import (
    Staged,
    check_callable,
    normalize_argnums,
    spec_of,
    stage_flat,
)
from . import _gram, _ildj
from ._engine import InverseWalker

# Signatures remembered by each inverse function for its fast path.
_SIGNATURES_PER_FUNCTION = 64

__all__ = ["ildj", "inverse", "inverse_and_ildj"]


def _spec(x: Any) -> jax.ShapeDtypeStruct:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    return spec_of(compat.aval_of(x))


def _describe(tree: Any, leaves: Sequence[Any]) -> str:
    specs = [_spec(x) for x in leaves]
    text = ", ".join(f"{s.dtype}[{','.join(map(str, s.shape))}]" for s in specs)
    return f"{tree} with leaves ({text})"


@dataclasses.dataclass(frozen=True)
class _Compiled:
    """The cached inverse of one staged signature, for one mode."""

    closed: compat.ClosedJaxpr  # (*y, *known) -> ((*x, ildj) | (*x) | (ildj,), *counts)
    x_trees: tuple[Any, ...]
    n_x: int
    # `strict` mode: one message per NaN count appended to the outputs.
    nan_messages: tuple[str, ...] = ()

    def runner(self) -> tuple[Any, Callable[..., list[Any]]]:
        return self.closed, _jitted(self.closed)


_jit_cache = _caches.Cache(1024, weak=True)


def _jitted(closed: compat.ClosedJaxpr) -> Callable[..., list[Any]]:
    fn = _jit_cache.get(closed)
    if fn is None:
        fn = jex_core.jaxpr_as_fun(closed)
        if not _pmap_across_processes(closed):
            fn = jax.jit(fn)
        _jit_cache.put(closed, fn)
    return fn


def _pmap_across_processes(closed: compat.ClosedJaxpr) -> bool:
    """Whether `closed` runs an `xla_pmap` (`jax.pmap` before JAX 0.10) in a
    multi-process program, which JAX cannot run inside `jax.jit`: such an
    inverse runs equation by equation instead."""
    if compat.pmap_p is None or jax.process_count() == 1:
        return False
    return any(eqn.primitive is compat.pmap_p for eqn in closed.jaxpr.eqns)


# Per staged function, its compiled inverses by signature and mode.
_compiled_cache = _caches.Cache(1024, weak=True)
_compiled_lock = threading.Lock()


def _num_positional(fn: Callable[..., Any]) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    count = 0
    for param in sig.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if param.default is param.empty:
                count += 1
    return max(count, 1)


class _InverseFunction:
    """The callable `inverse` returns: `(y, *known_args) -> x`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        argnums: int | Sequence[int] | None,
        example_args: Sequence[Any] | None,
        mode: str,
        strict: bool = False,
        solvers: bool = True,
    ) -> None:
        transform = {"x": "inverse", "both": "inverse_and_ildj", "ildj": "ildj"}[mode]
        check_callable(fn, transform)
        self.fn = fn
        self.transform = transform
        self.argnums = (
            None
            if argnums is None
            else ((argnums,) if isinstance(argnums, int) else tuple(argnums))
        )
        if example_args is not None and not isinstance(example_args, (tuple, list)):
            raise TypeError(
                f"`{transform}`: `example_args` must be a tuple of the unknown "
                f"arguments, got {type(example_args).__name__}."
            )
        self.example_args = None if example_args is None else tuple(example_args)
        self.mode = mode
        self.strict = bool(strict)
        self.solvers = bool(solvers)
        name = getattr(fn, "__name__", "fn")
        self.__name__ = f"{transform}_{name}"
        self.__qualname__ = self.__name__
        self.__doc__ = f"The {transform} of `{name}` (see `jaxinterp.{transform}`)."
        self.__wrapped__ = fn
        self._signatures = _caches.Cache(_SIGNATURES_PER_FUNCTION, register=False)

    def __repr__(self) -> str:
        return f"<{self.transform} of {self.fn!r}>"

    # The signature seen by `inspect` (and by `inverse(inverse(f))`).
    __signature__ = inspect.Signature(
        [
            inspect.Parameter("y", inspect.Parameter.POSITIONAL_ONLY),
            inspect.Parameter("known_args", inspect.Parameter.VAR_POSITIONAL),
        ]
    )

    def _positions(self, n_known: int) -> tuple[tuple[int, ...], int]:
        if self.argnums is None:
            if n_known:
                raise TypeError(
                    f"`{self.transform}` without `argnums` takes only the output "
                    f"`y`, got {n_known} more positional arguments. Pass "
                    "`argnums=` to say which arguments are unknown."
                )
            n = (
                len(self.example_args)
                if self.example_args is not None
                else _num_positional(self.fn)
            )
            return tuple(range(n)), n
        n_total = len(self.argnums) + n_known
        what = f"`{self.transform}`: argnums"
        return normalize_argnums(self.argnums, n_total, what=what), n_total

    def _unknown_specs(self, y: Any, n_unknown: int) -> tuple[Any, ...]:
        if self.example_args is not None:
            if len(self.example_args) != n_unknown:
                raise TypeError(
                    f"`{self.transform}`: `example_args` has "
                    f"{len(self.example_args)} entries for {n_unknown} unknown "
                    "arguments."
                )
            return tuple(jtu.tree_map(_spec, a) for a in self.example_args)
        if n_unknown == 1:
            return (jtu.tree_map(_spec, y),)
        if not isinstance(y, (tuple, list)) or len(y) != n_unknown:
            raise TypeError(
                f"`{self.transform}` assumes the {n_unknown} unknown arguments "
                f"mirror `y`, so `y` must be a tuple of {n_unknown} entries; got "
                f"{type(y).__name__}. Pass `example_args=` with the unknown "
                "arguments (arrays or `jax.ShapeDtypeStruct`s)."
            )
        return tuple(jtu.tree_map(_spec, yi) for yi in y)

    def __call__(self, y: Any, *known_args: Any) -> Any:
        y_leaves, y_tree = jtu.tree_flatten(y)
        known_leaves, known_tree = jtu.tree_flatten(known_args)
        args = [*y_leaves, *known_leaves]
        # Repeated calls with one signature skip staging: keyed by the pytree
        # structures and the abstract values of `y` and the known arguments.
        key = (y_tree, known_tree, *(compat.aval_of(a) for a in args))
        compiled = self._signatures.get(key)
        if compiled is None:
            # The engine's analyses compute on NumPy values where they can
            # (enclosures, grids): overflow and NaN there are expected, and
            # answered, not the caller's to be warned of.
            with np.errstate(all="ignore"):
                compiled = self._prepare(y, y_leaves, y_tree, known_args)
            if not any(
                compat.is_tracer(c) for c in compat.jaxpr_consts(compiled.closed)
            ):
                self._signatures.put(key, compiled)
        closed, jitted = compiled.runner()
        if any(compat.is_tracer(a) for a in args):
            outs = jex_core.jaxpr_as_fun(closed)(*args)
        else:
            outs = jitted(*args)
        if compiled.nan_messages:
            n_checks = len(compiled.nan_messages)
            _raise_undetermined(outs[-n_checks:], compiled.nan_messages, self.transform)
            outs = outs[:-n_checks]
        if self.mode == "ildj":
            return outs[0]
        xs_flat = outs[: compiled.n_x]
        xs, start = [], 0
        for tree in compiled.x_trees:
            xs.append(
                jtu.tree_unflatten(tree, xs_flat[start : start + tree.num_leaves])
            )
            start += tree.num_leaves
        x = xs[0] if len(xs) == 1 else tuple(xs)
        return x if self.mode == "x" else (x, outs[compiled.n_x])

    def _prepare(
        self, y: Any, y_leaves: list[Any], y_tree: Any, known_args: tuple[Any, ...]
    ) -> _Compiled:
        """Stage `fn` for this signature and build (or fetch) its inverse Jaxpr."""
        unknown, n_total = self._positions(len(known_args))
        specs = self._unknown_specs(y, len(unknown))
        known_it, spec_it = iter(known_args), iter(specs)
        full = [
            next(spec_it) if i in unknown else next(known_it) for i in range(n_total)
        ]
        try:
            staged, _ = stage_flat(self.fn, full, {}, ())
        except Exception as err:
            if self.example_args is not None:
                raise
            # (Traced on values shaped like `y`: say so, the likely cause.)
            name = getattr(self.fn, "__name__", "the function")
            first = str(err).splitlines()[0] if str(err) else ""
            raise TypeError(
                f"`{self.transform}` assumed the unknown arguments of `{name}` "
                f"mirror `y` ({_describe(y_tree, y_leaves)}), and `{name}` "
                f"fails on them ({type(err).__name__}: {first}). Pass "
                "`example_args=` with the unknown arguments (arrays or "
                "`jax.ShapeDtypeStruct`s) when they differ from `y`."
            ) from err
        self._check_output(staged, y_tree, y_leaves)
        mask: list[bool] = []
        for i, arg in enumerate(full):
            mask.extend([i in unknown] * len(jtu.tree_leaves(arg)))
        return _compile(
            staged, tuple(mask), specs, y_leaves, self.mode, self.strict, self.solvers
        )

    def _check_output(self, staged: Staged, y_tree: Any, y_leaves: list[Any]) -> None:
        same = (
            staged.out_tree == y_tree
            and all(
                a.shape == jax.numpy.shape(y) and a.dtype == jax.numpy.result_type(y)
                for a, y in zip(staged.out_avals, y_leaves, strict=True)
            )
            if staged.out_tree == y_tree
            else False
        )
        if same:
            return
        expected = ", ".join(a.str_short() for a in staged.out_avals)
        received = _describe(y_tree, y_leaves)
        if self.example_args is None:
            raise TypeError(
                f"`{self.transform}` assumed the unknown arguments of "
                f"`{staged.fn_name}` mirror `y` ({received}), but `{staged.fn_name}` "
                f"traced on them returns {staged.out_tree} with leaves ({expected}) "
                "instead. Pass `example_args=` with the unknown arguments (arrays "
                "or `jax.ShapeDtypeStruct`s) when they differ from `y`."
            )
        raise TypeError(
            f"`{self.transform}` of `{staged.fn_name}` expects `y` of structure "
            f"{staged.out_tree} with leaves ({expected}), the output of "
            f"`{staged.fn_name}` for `example_args`; got {received}."
        )


def _nan_where_lost(xs: Sequence[Any], ildj: Any) -> Any:
    """`ildj`, NaN if an element of `xs` has no preimage (is NaN): the
    log-det is undefined there."""
    lost = [
        jnp.any(jnp.isnan(x))
        for x in xs
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    if not lost:
        return ildj
    return jnp.where(functools.reduce(jnp.logical_or, lost), jnp.nan, ildj)


def _trace(
    inverse_flat: Callable[..., list[Any]],
    staged: Staged,
    mask: tuple[bool, ...],
    y_leaves: list[Any],
) -> Any:
    """The closed Jaxpr of `inverse_flat` of `y`'s leaves and the known
    inputs."""
    known_specs = [
        spec_of(a) for a, m in zip(staged.in_avals, mask, strict=True) if not m
    ]
    in_specs = [*(_spec(y) for y in y_leaves), *known_specs]
    # The inverse's own loops are classic `scan`s (`Scan3` ignores `reverse`
    # in JAX 0.12.0.1, and has no transpose or batching rule).
    with (
        _recursion.recursion_limit(_recursion.DEEP_RECURSION_LIMIT),
        compat.classic_scan(),
    ):
        return jax.make_jaxpr(inverse_flat)(*in_specs)


def _compile(
    staged: Staged,
    mask: tuple[bool, ...],
    specs: tuple[Any, ...],
    y_leaves: list[Any],
    mode: str,
    strict: bool = False,
    solvers: bool = True,
) -> _Compiled:
    """Trace the engine into the inverse Jaxpr for `mode` (cached per signature).

    `mode` is `"x"` (the unknown inputs), `"ildj"` or `"both"`. Without an
    ildj the rules are told not to compute one; dead code is removed either way.
    With `strict`, the Jaxpr also returns, per backward step that may give
    NaN, how many elements it did.
    """
    key = (mask, tuple(_spec(y) for y in y_leaves), mode, strict, solvers)
    with _compiled_lock:
        per_staged = _compiled_cache.get(staged)
        if per_staged is None:
            per_staged = _compiled_cache.put(staged, {})
        if key in per_staged:
            return per_staged[key]
    walker = InverseWalker()
    # Mutable references (and `scan` under `jax_scan3`) made pure first.
    jaxpr, consts = functionalize(staged.jaxpr, staged.consts)
    n_y = len(y_leaves)
    messages: list[str] = []

    def inverse_flat(*args: Any) -> list[Any]:
        ys, known = args[:n_y], iter(args[n_y:])
        invals = [None if m else next(known) for m in mask]
        sol = walker.solve(
            jaxpr,
            consts,
            invals,
            list(ys),
            nan_checks=strict,
            want_ildj=mode != "x",
            solvers=solvers,
            complete=True,
        )
        xs = [v for v, m in zip(sol.invals, mask, strict=True) if m]
        messages[:] = [message for _, message in sol.nan_checks]
        counts = [count for count, _ in sol.nan_checks]
        if mode == "x":
            return [*xs, *counts]
        ildj = sol.ildj
        # More results than unknowns: in the coordinates the inverse reads.
        whole = _ildj.whole_map(
            lambda unknown: forward(unknown, invals),
            lambda ys_: inverse_x(ys_, args[n_y:]),
            xs,
            ys,
            staged.out_avals,
            staged.fn_name,
            completed=_gram.COMPLETED in sol.methods.values(),
        )
        if whole is not None:
            # (Not NaN where the steps' ildj is: with more results than
            # unknowns, a step may solve a value the program also computes
            # from others, and an element it leaves undetermined (`0 / 0`,
            # excused by the agreement checks) makes its term NaN. A `y` off
            # the image makes `x` NaN, below.)
            ildj = whole
        ildj = _nan_where_lost(xs, ildj)
        if mode == "ildj":
            return [ildj, *counts]
        return [*xs, ildj, *counts]

    # The map forwards, for its Jacobian: a `custom_vjp` (no forward mode)
    # runs its primal body, whose derivative is the map's.
    primal_walker = Interpreter(policies={compat.custom_vjp_call_p: "inline"})

    def forward(unknown: list[Any], invals: list[Any]) -> list[Any]:
        it = iter(unknown)
        args = [next(it) if m else v for v, m in zip(invals, mask, strict=True)]
        return primal_walker.eval_jaxpr(jaxpr, consts, *args)

    def inverse_x(ys: list[Any], known: Sequence[Any]) -> list[Any]:
        """The unknowns from `ys` alone (no ildj), as a function to
        differentiate; a `custom_vjp` on the way runs its primal body."""
        cx = _compile(staged, mask, specs, y_leaves, "x", solvers=solvers)
        return primal_walker.eval_jaxpr(cx.closed.jaxpr, cx.closed.consts, *ys, *known)[
            : cx.n_x
        ]

    closed = _trace(inverse_flat, staged, mask, y_leaves)
    compiled = _Compiled(
        closed=compat.dce_closed_jaxpr(closed),
        x_trees=tuple(jtu.tree_structure(s) for s in specs),
        n_x=sum(mask),
        nan_messages=tuple(messages),
    )
    with _compiled_lock:
        per_staged[key] = compiled
    return compiled


def _raise_undetermined(
    counts: Sequence[Any], messages: Sequence[str], transform: str
) -> None:
    """`strict` mode: raise if a step returned NaN for elements the outputs do
    not determine; under a trace, a `checkify` check (run the function under
    `jax.experimental.checkify.checkify` to get it)."""
    from jax.experimental import checkify

    for count, message in zip(counts, messages, strict=True):
        text = f"`{transform}` (strict): {message}."
        if compat.is_tracer(count):
            checkify.check(count == 0, text, count=count)
        elif int(count):
            raise NotInvertibleError(text.format(count=int(count)))


def inverse(
    fn: Callable[..., Any],
    argnums: int | Sequence[int] | None = None,
    *,
    example_args: Sequence[Any] | None = None,
    strict: bool = False,
    solvers: bool = True,
) -> Callable[..., PyTree]:
    """Return a function that computes the inverse of `fn`.

    `inverse(fn)(fn(x))` recovers `x`. The inverse takes exactly what `fn`
    returned (any pytree) and returns `fn`'s positional argument: a single
    value if `fn` takes one, a tuple if several. With `argnums`, only those
    arguments are unknown and the inverse takes the others after `y`:
    `inverse(fn, argnums=0)(y, *known_args)`.

    The inverse is found by a dataflow analysis of `fn`'s Jaxpr (rules in
    `inverse_rules`), traced once per signature into a Jaxpr without dead
    code, cached; it composes with `jax.jit`, `jax.vmap`, `jax.grad`, `jax.jvp`.

    Args:
        fn: a function built from invertible primitives.
        argnums: the positions of the unknown arguments; all by default.
        example_args: the unknown arguments as arrays or
            `jax.ShapeDtypeStruct`s (a tuple), needed when they do not mirror
            `y`'s structure, shapes and dtypes.
        strict: raise `NotInvertibleError`, instead of returning NaN,
            where the outputs leave an input element undetermined (see
            "Undetermined elements" below) and where two outputs that
            constrain one value disagree (`y` off the image of
            `lambda x: (x, jnp.exp(x))`). A result outside an inverse
            formula's domain still gives NaN (`inverse(jnp.exp,
            strict=True)(-1.0)`).
        solvers: allow the numerical solver for elementwise blocks that no
            formula inverts (see below); `False` keeps to exact formulas and
            raises `NotInvertibleError` where none exists.

    Returns:
        The inverse function `(y, *known_args) -> x`.

    Raises:
        NotInvertibleError: if an input cannot be recovered from the outputs
            (raised when the inverse is first called for a signature); with
            `strict=True`, also when a call's values leave elements
            undetermined.
        TypeError: if `y` does not match what `fn` returns.

    Undetermined elements:
        Whether the outputs determine every input element can depend on
        values known only at run time: a `jnp.where` whose predicate comes
        from a known argument drops the unknown elements it does not select;
        a known factor, divisor or exponent may be zero; `gather` indices may
        not permute the axis. When those values are constants of `fn`, the
        inverse refuses up front, naming the elements. When they are traced,
        exactly those elements come back as NaN (float dtypes; integer
        inverses of this kind are refused). With `strict=True` the call raises
        `NotInvertibleError` instead, naming the primitive and the line (under
        `jax.jit` or `jax.vmap`, a `jax.experimental.checkify` check).

        Elements that a `jnp.where` with a constant mask discards, and that
        nothing else reads, come back as the value it uses in their place
        (a preimage, chosen: `explain_inverse` marks the step "discarded
        elements completed"); with `strict=True` they are refused. The
        triangle a triangular solve does not read (a factor triangular by
        construction) comes back as zeros either way.

    Principal branches:
        A map that is not injective (`x**2`, `cosh`, `sin`) is inverted on its
        principal branch (`sqrt`, `acosh >= 0`, `asin`) when nothing else
        determines its operand; a chosen branch that another output also
        constrains, or that an earlier map may not produce, is refused.

    Clamps:
        `jnp.clip`, `jnp.maximum(x, c)`, `jnp.minimum(x, c)` and `lax.clamp`
        with known bounds invert as the identity inside the bounds, a bound
        as itself (a principal branch), beyond as NaN; their ildj is 0.

    Blocks:
        When no single equation can be solved, a region of equations is
        solved at once: an elementwise function `y = g(x)` of one unknown
        used several times (softsign `x / (1 + |x|)`, a formula chosen by a
        predicate of the unknown), piecewise by formulas where it can, else
        numerically (with `solvers=True`: one preimage, so a second output
        that also constrains `x` is refused, as for a principal branch);
        a linear block; a triangular map solved level by level
        (autoregressive flows, stick-breaking), and others. An element with
        no preimage, or with two, comes back as NaN; every answer is checked
        by mapping it back. `explain_inverse` names the method per
        equation; the docs' "Inverse methods" page describes each.

    Example:
        >>> f = lambda x: jnp.exp(jnp.tanh(x))
        >>> print(f"{jaxinterp.inverse(f)(f(0.5)):.4f}")
        0.5000
        >>> affine = lambda x, scale, shift: x * jnp.exp(scale) + shift
        >>> y = affine(jnp.arange(3.0), 0.5, 1.0)
        >>> jaxinterp.inverse(affine, argnums=0)(y, 0.5, 1.0).round(4)
        Array([0., 1., 2.], dtype=float32)
    """
    return _InverseFunction(fn, argnums, example_args, "x", strict, solvers)


def inverse_and_ildj(
    fn: Callable[..., Any],
    argnums: int | Sequence[int] | None = None,
    *,
    example_args: Sequence[Any] | None = None,
    strict: bool = False,
    solvers: bool = True,
) -> Callable[..., tuple[PyTree, Any]]:
    """Return a function computing the inverse of `fn` and its log-det-Jacobian.

    The returned function gives `(x, ildj)` where
    `ildj = log|det ∂fn⁻¹(y)/∂y|` over all elements of the unknown inputs (a
    scalar; per example under `jax.vmap`). Keywords as for `inverse`.

    Example:
        >>> f = lambda x: 2.0 * x
        >>> x, ildj = jaxinterp.inverse_and_ildj(f)(jnp.ones(3))
        >>> print(f"{ildj:.4f}")
        -2.0794
    """
    return _InverseFunction(fn, argnums, example_args, "both", strict, solvers)


def ildj(
    fn: Callable[..., Any],
    argnums: int | Sequence[int] | None = None,
    *,
    example_args: Sequence[Any] | None = None,
    strict: bool = False,
    solvers: bool = True,
) -> Callable[..., Any]:
    """Return a function computing only the inverse log-det-Jacobian of `fn`.

    Same keywords as `inverse`; the computation of `x` itself is dropped where
    the ildj does not need it.

    Example:
        >>> print(f"{jaxinterp.ildj(jnp.exp)(jnp.array([1.0, 2.0])):.4f}")
        -0.6931
    """
    return _InverseFunction(fn, argnums, example_args, "ildj", strict, solvers)
