"""Run a float32 function in bfloat16, keeping a few sensitive primitives in float32.

`MixedPrecision` casts the floating-point operands of every equation to the
low-precision dtype (bfloat16 by default), except for the primitives in
`keep` (reductions, `exp`, `log`...), whose operands are cast to float32. Dtype
params follow (`convert_element_type`'s `new_dtype`, `dot_general`'s
`preferred_element_type`). Values leaving a walked Jaxpr are stored in the low
dtype, so `scan` carries and `cond` branches keep one type; the function's
results are cast back to their original dtypes.

Run: python examples/mixed_precision.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxinterp

KEEP = frozenset({"reduce_sum", "reduce_max", "reduce_min", "exp", "log", "log1p"})
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
_DTYPE_PARAMS = ("new_dtype", "preferred_element_type")


def cast(x, dtype):
    """Cast a float32/bfloat16/float16 value to `dtype`; leave others alone."""
    if jnp.result_type(x) in _FLOATS and jnp.result_type(x) != dtype:
        return lax.convert_element_type(x, dtype)
    return x


class MixedPrecision(jaxinterp.Interpreter):
    """Computes in `low` precision except for the primitives named in `keep`."""

    name = "mixed_precision"
    # Its results are of the computing dtype, not the equation's.
    changes_dtypes = True

    def __init__(self, low=jnp.bfloat16, keep=KEEP):
        # Walk custom-derivative bodies in place, so JAX differentiates what runs.
        super().__init__(policies={"custom_jvp_call": "inline",
                                   "custom_vjp_call": "inline"})  # fmt: skip
        self.low, self.keep = jnp.dtype(low), frozenset(keep)
        self.log: list[tuple[str, tuple[str, ...]]] = []  # (primitive, out dtypes)

    def process_eqn(self, eqn, invals):
        prim = eqn.primitive
        if prim in jaxinterp.higher_order_primitives():
            return super().process_eqn(eqn, [cast(x, self.low) for x in invals])
        dtype = jnp.dtype(jnp.float32) if prim.name in self.keep else self.low
        invals = [cast(x, dtype) for x in invals]
        params = {k: dtype if k in _DTYPE_PARAMS and v in _FLOATS else v
                  for k, v in eqn.params.items()}  # fmt: skip
        outvals = super().process_eqn(eqn.replace(params=params), invals)
        self.log.append((prim.name, tuple(str(jnp.result_type(x)) for x in outvals)))
        return outvals

    def eval_jaxpr(self, jaxpr, consts, *args):
        return [cast(x, self.low) for x in super().eval_jaxpr(jaxpr, consts, *args)]

    def run(self, staged, flat_args):
        outs = super().run(staged, flat_args)  # cast back to the original dtypes
        return [cast(x, a.dtype) for x, a in zip(outs, staged.out_avals, strict=True)]


def mixed_precision(fn, low=jnp.bfloat16, keep=KEEP):
    """Return `fn` computed in `low` precision except for `keep` primitives."""
    return MixedPrecision(low, keep).transform(fn)


# ---------------------------------------------------------------------------
# A small attention model: two layers in a scan, a jitted layer norm.


@jax.jit
def layer_norm(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5)


def attention_model(params, x, labels):
    def layer(h, w):
        q, k, v = h @ w["q"], h @ w["k"], h @ w["v"]
        attn = jax.nn.softmax(q @ k.T / jnp.sqrt(q.shape[-1]), axis=-1)
        return layer_norm(h + attn @ v), None

    h, _ = lax.scan(layer, x, params["layers"])
    logits = h @ params["out"]
    logp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def init(seed=0, tokens=64, width=32, classes=10, depth=2):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    layers = {n: normal(depth, width, width) / width**0.5 for n in "qkv"}
    params = {"layers": layers, "out": normal(width, classes)}
    labels = jnp.asarray(rng.integers(0, classes, tokens), jnp.int32)
    return params, normal(tokens, width), labels


def main():
    args = init()
    exact = attention_model(*args)
    mp = MixedPrecision()
    got = mp.transform(attention_model)(*args)
    print(f"loss {got:.5f}, float32 {exact:.5f}: relative error "
          f"{abs(got - exact) / abs(exact):.1e}")  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        names = sorted({n for n, ds in mp.log if dtype in ds})
        print(f"computed in {dtype}: {', '.join(names)}")


if __name__ == "__main__":
    main()
