"""`BackwardWalker`: walks a Jaxpr from its outputs to its inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from . import _jax_compat as compat
from ._env import Env
from ._errors import RuleError, operands_detail, reraise

_Literal = compat.Literal
_DropVar = compat.DropVar


class BackwardWalker:
    """Walks a Jaxpr from its outputs to its inputs, equations in reverse.

    Subclasses implement `process_eqn_backward(eqn, outvals) -> list`, which
    returns one value per `eqn.invars` entry (`None` where the equation does
    not determine that input). It shares `Env` and the error machinery with
    `Interpreter`. `inverse` builds a richer dataflow walker on the same
    pieces.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax import lax
        >>> class Undo(BackwardWalker):
        ...     name = "undo"
        ...     def process_eqn_backward(self, eqn, outvals):
        ...         (y,) = outvals
        ...         return {"exp": [jnp.log(y)], "sin": [jnp.arcsin(y)]}[
        ...             eqn.primitive.name]
        >>> closed = stage(lambda x: jnp.exp(jnp.sin(x)), 0.5).closed_jaxpr
        >>> (x,) = Undo().eval_jaxpr_backward(closed.jaxpr, closed.consts,
        ...                                   jnp.exp(jnp.sin(0.5)))
        >>> print(f"{x:.4f}")
        0.5000
    """

    #: Name of the transformation, used in error messages.
    name: ClassVar[str] = "backward"

    def process_eqn_backward(
        self, eqn: compat.JaxprEqn, outvals: list[Any]
    ) -> list[Any]:
        """Return the equation's input values given its output values."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `process_eqn_backward`."
        )

    def eval_jaxpr_backward(
        self, jaxpr: compat.Jaxpr, consts: Sequence[Any], *outvals: Any
    ) -> list[Any]:
        """Walk `jaxpr` backwards from `outvals`; return the values of its invars.

        Equations whose outputs were not all reached are skipped.

        Raises:
            RuleError: if an input was not reached, or a rule failed.
        """
        env = Env()
        for v, val in zip(jaxpr.constvars, consts, strict=True):
            env[v] = val
        env.write_many(jaxpr.outvars, outvals)
        for eqn in reversed(jaxpr.eqns):
            if not all(env.known(v) for v in eqn.outvars if type(v) is not _DropVar):
                continue
            outs = [None if type(v) is _DropVar else env.read(v) for v in eqn.outvars]
            try:
                invals = self.process_eqn_backward(eqn, outs)
            except Exception as err:
                reraise(self.name, eqn, err, details=operands_detail(outs, "Outputs"))
            for var, val in zip(eqn.invars, invals, strict=True):
                if val is not None and type(var) is not _Literal and var not in env:
                    env[var] = val
        missing = [v for v in jaxpr.invars if v not in env]
        if missing:
            raise RuleError(
                f"`{self.name}` could not reach inputs "
                f"{', '.join(map(str, missing))} walking backwards."
            )
        return [env[v] for v in jaxpr.invars]
