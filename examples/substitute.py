"""Replace one primitive by a function of your own, everywhere inside a function.

`substitute(fn, {lax.exp_p: my_exp})` builds an `EvalInterpreter` whose rule
table extends `jaxinterp.eval_rules` with one rule per substituted primitive.
The rule receives the equation's operands and params, exactly as the
primitive would. Every other primitive is re-bound unchanged, and nested
Jaxprs (`jit`, `scan`, `cond`, `while`...) are walked recursively and rebuilt,
so the substitution reaches every call site. Custom-derivative functions
(`jax.nn.softplus`...) are walked in place, so `jax.grad` differentiates the
substitute rather than the original's derivative rule.

Run: python examples/substitute.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxinterp


def substitute(fn, replacements):
    """Return `fn` with each primitive in `replacements` computed by its function.

    Args:
        fn: the function to transform.
        replacements: a dict from primitive (`lax.exp_p`) to a function taking
            the primitive's operands positionally and its params as keywords
            and returning its (single) result.
    """
    registry = jaxinterp.RuleRegistry("substitute", parent=jaxinterp.eval_rules)
    for prim, replacement in replacements.items():
        registry.register(prim, lambda *args, _f=replacement, **p: [_f(*args, **p)])

    class Substitute(jaxinterp.EvalInterpreter):
        name = "substitute"
        rules = registry

    policies = {"custom_jvp_call": "inline", "custom_vjp_call": "inline"}
    return Substitute(policies=policies).transform(fn)


def poly_exp(x, **params):
    """exp(x) = 2**k * exp(r), |r| <= ln(2)/2, with a degree-5 Taylor polynomial."""
    k = jnp.round(x / jnp.log(2.0))
    r = x - k * jnp.log(2.0)
    p = 1 + r * (1 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r / 120))))
    return p * jnp.exp2(k)  # exp2 is its own primitive: no recursion


def bf16_dot(lhs, rhs, *, dimension_numbers, preferred_element_type=None, **params):
    """dot_general with bfloat16 operands, accumulated and returned in float32."""
    return lax.dot_general(
        lhs.astype(jnp.bfloat16),
        rhs.astype(jnp.bfloat16),
        dimension_numbers,
        preferred_element_type=jnp.float32,
    ).astype(preferred_element_type or lhs.dtype)


def model(params, xs):
    """exp and dot_general at the top level, inside a jit, a scan and a cond."""

    @jax.jit
    def cell(h, x):
        return jnp.tanh(h @ params["w"] + x) * jnp.exp(-jnp.abs(x))

    def step(h, x):
        h = cell(h, x)
        h = lax.cond(jnp.sum(h) > 0, lambda h: jnp.exp(h) - 1, lambda h: h, h)
        return h, jnp.sum(h)

    h, sums = lax.scan(step, jnp.zeros(xs.shape[1]), xs)
    return jax.nn.logsumexp(h @ params["out"]) + jnp.exp(sums).sum()


def count_primitive(fn, name, *args):
    """How many equations of primitive `name` the staged `fn` has, nested included
    (`iter_eqns` reaches the bodies of JAX's hijax equations too)."""
    closed = jax.make_jaxpr(fn)(*args)
    return sum(e.primitive.name == name for e in jaxinterp.iter_eqns(closed))


def main():
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    params, xs = {"w": normal(8, 8) / 3, "out": normal(8, 4)}, normal(6, 8)
    exact = model(params, xs)
    poly = substitute(model, {lax.exp_p: poly_exp})
    print(f"exp -> polynomial: {poly(params, xs):.6f} (exact {exact:.6f}); `exp` "
          f"equations: {count_primitive(model, 'exp', params, xs)} -> "
          f"{count_primitive(poly, 'exp', params, xs)}")  # fmt: skip
    low = substitute(model, {lax.dot_general_p: bf16_dot})(params, xs)
    print(f"dot_general -> bfloat16 matmul: {low:.6f} (exact {exact:.6f})")
    grad = jax.grad(substitute(model, {lax.exp_p: poly_exp}))(params, xs)
    print("grad through the substitute, |d/dw|:", float(jnp.abs(grad["w"]).sum()))


if __name__ == "__main__":
    main()
