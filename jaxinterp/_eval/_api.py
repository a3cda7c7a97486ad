"""`evaluate` and `eval_closed_jaxpr`: the identity transformation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from .. import _jax_compat as compat, _recursion
from .._custom_types import PyTree
from .._errors import StagingError, describe_aval, describe_value, describe_values
from .._interpreter import Interpreter
from .._registry import RuleRegistry
from ._rules import eval_rules


class EvalInterpreter(Interpreter):
    """The identity interpreter: walks every equation, rebuilding nested ones.

    Under `jax.jit` its results equal the function's own, bit for bit: both
    compile the same equations. Called eagerly, it runs the equations one by
    one, as JAX runs an eager function, and the results are the same bit for
    bit except where JAX compiles a unit eagerly that the Jaxpr inlines: a
    function wrapped in `jax.jit(..., inline=True)`, as many of `jax.numpy`'s
    are (`jnp.mean`: `reduce_sum`, then `div`), is compiled as one program
    when the function is called eagerly, and XLA's rewrites of it (a division
    by a constant done as a multiplication) can move a result by an ulp.
    It is the natural base class for an interpreter that changes a few
    primitives.
    """

    name: ClassVar[str] = "evaluate"
    rules: ClassVar[RuleRegistry[Any] | None] = eval_rules


def evaluate(
    fn: Callable[..., Any], *, static_argnums: int | Sequence[int] = ()
) -> Callable[..., PyTree]:
    """Return a function that evaluates `fn` through the Jaxpr interpreter.

    The result has `fn`'s signature and gives `fn`'s results; higher-order
    primitives are walked recursively and rebuilt (a `jit` stays a `jit`).

    Args:
        fn: the function to evaluate.
        static_argnums: positional arguments to treat as static.

    Returns:
        The interpreted function.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda x: jnp.sin(x) ** 2
        >>> bool(evaluate(f)(0.3) == f(0.3))
        True
        >>> float(jax.grad(evaluate(f))(0.3)) == float(jax.grad(f)(0.3))
        True
    """
    return EvalInterpreter().transform(fn, static_argnums=static_argnums)


def eval_closed_jaxpr(closed_jaxpr: compat.ClosedJaxpr, *args: Any) -> list[Any]:
    """Evaluate a `ClosedJaxpr` on flat arguments with the walker.

    Unlike `Interpreter.eval_jaxpr(jaxpr, consts, *args)`, which mirrors
    `jax.core.eval_jaxpr` and takes an open Jaxpr and its consts, this takes
    the closed Jaxpr `jax.make_jaxpr` returns.

    Args:
        closed_jaxpr: the Jaxpr, as returned by `jax.make_jaxpr`.
        *args: one value per input variable.

    Returns:
        The list of output values.

    Raises:
        StagingError: if the number, shapes or dtypes of `args` differ from
            the Jaxpr's inputs.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> closed = jax.make_jaxpr(lambda x, y: x * y + 1.0)(2.0, 3.0)
        >>> eval_closed_jaxpr(closed, 2.0, 3.0)
        [Array(7., dtype=float32, weak_type=True)]
    """
    jaxpr = compat.open_jaxpr(closed_jaxpr)
    invars = jaxpr.invars
    if len(args) != len(invars):
        expected = ", ".join(describe_aval(v.aval) for v in invars) or "none"
        raise StagingError(
            f"`eval_closed_jaxpr` got {len(args)} arguments ({describe_values(args)}) "
            f"for a Jaxpr with {len(invars)} inputs ({expected})."
        )
    for i, (var, arg) in enumerate(zip(invars, args, strict=True)):
        got = compat.aval_of(arg)
        if got.shape != var.aval.shape or got.dtype != var.aval.dtype:
            raise StagingError(
                f"`eval_closed_jaxpr` input {i} expects {describe_aval(var.aval)}, got "
                f"{describe_value(arg)}."
            )
    with _recursion.recursion_limit(_recursion.DEEP_RECURSION_LIMIT):
        return _SHARED.eval_closed(closed_jaxpr, *args)


# `eval_closed_jaxpr` shares one interpreter, so the `jit`s it rebuilds inside a Jaxpr
# stay cached (compiled once) across calls.
_SHARED = EvalInterpreter()
