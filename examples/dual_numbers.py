"""Forward-mode AD as an interpreter whose values are dual numbers.

A `Dual` is a pytree (a `register_dataclass` dataclass) of a primal and a
tangent array. Only first-order primitives get a rule, and one rule serves
them all: `jax.jvp` of the primitive's own bind. Control flow and calls need
nothing: under the default `recursive` policy the walker rebuilds `jit`,
`cond`, `scan`, `while_loop` and `checkpoint` around dual numbers (JAX's
constructs take pytrees). At a `custom_jvp` call (`jax.nn.relu`) the
interpreter chooses the library's own derivative rule (`custom_derivative`);
it walks the primal body of a `custom_vjp` call, whose rule runs backwards
only. Where a loop carry starts as a plain array (an
accumulator `jnp.zeros(3)`) and becomes a dual number in the body, the walker
asks `lift` for a dual number with a zero tangent, as JAX's own `jvp` of a
loop does.

Run: python examples/dual_numbers.py
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxinterp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Dual:
    """A value and its directional derivative."""

    primal: jax.Array
    tangent: jax.Array


def zero_tangent(value):
    """The zero tangent of a value that does not depend on the input."""
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.inexact):
        return jnp.zeros_like(value)
    return np.zeros(value.shape, jax.dtypes.float0)  # integers have no tangent


class DualInterpreter(jaxinterp.Interpreter):
    """Pushes dual numbers through every first-order primitive."""

    name = "dual"

    def default_rule(self, eqn, invals):
        if not any(isinstance(v, Dual) for v in invals):
            return super().default_rule(eqn, invals)  # nothing to differentiate
        prim, params = eqn.primitive, eqn.params
        primals = [v.primal if isinstance(v, Dual) else v for v in invals]
        tangents = [v.tangent if isinstance(v, Dual) else zero_tangent(v)
                    for v in invals]  # fmt: skip
        out, t_out = jax.jvp(lambda *a: prim.bind(*a, **params), primals, tangents)
        if not prim.multiple_results:
            out, t_out = [out], [t_out]
        return [Dual(o, t) if jnp.issubdtype(o.dtype, jnp.inexact) else o
                for o, t in zip(out, t_out, strict=True)]  # fmt: skip

    def lift(self, value, like):
        return Dual(value, jnp.zeros_like(value))

    def custom_derivative(self, eqn, invals, kind):
        if kind != "custom_jvp":
            return None  # walk the primal body
        primals = [v.primal if isinstance(v, Dual) else v for v in invals]
        tangents = [v.tangent if isinstance(v, Dual) else zero_tangent(v)
                    for v in invals]  # fmt: skip
        # Re-bound on arrays under `jax.jvp`, the call applies its own rule.
        outs, t_outs = jax.jvp(lambda *p: self.default_rule(eqn, list(p)),
                               primals, tangents)  # fmt: skip
        return [Dual(o, t) for o, t in zip(outs, t_outs, strict=True)]


def dual_jvp(fn, x, t):
    """`jax.jvp(fn, (x,), (t,))` for a function of one array, by dual numbers."""
    staged = jaxinterp.stage(fn, jax.ShapeDtypeStruct(x.shape, x.dtype))
    (out,) = DualInterpreter().run(staged, [Dual(x, t)])
    return out.primal, out.tangent


def model(x):
    """A bit of everything: `jit`, `while_loop`, `scan`, `cond` and `custom_jvp`."""
    step = jax.jit(lambda s: (s[0] + 1, s[1] * 0.5 + jnp.tanh(x)))
    _, acc = lax.while_loop(lambda s: s[0] < 4, step, (0, jnp.zeros(x.shape)))
    acc, _ = lax.scan(lambda c, a: (c * 0.9 + jnp.sin(a), None), acc, x)
    acc = lax.cond(acc.sum() > 0, jnp.sin, jnp.cos, acc)
    return jax.nn.relu(acc) * x  # relu is a custom_jvp function


def main():
    x, t = jnp.array([0.3, -0.8, 1.2]), jnp.array([1.0, 0.5, -2.0])
    got, want = dual_jvp(model, x, t), jax.jvp(model, (x,), (t,))
    print("dual numbers:", got[1])
    print("jax.jvp:     ", want[1])
    print("jitted:      ", jax.jit(lambda x, t: dual_jvp(model, x, t))(x, t)[1])


if __name__ == "__main__":
    main()
