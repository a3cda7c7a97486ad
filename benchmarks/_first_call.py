"""First calls of `jaxinterp.evaluate(f)` against `jax.core.eval_jaxpr`.

Each figure is measured in fresh processes, one per call timed, prepared
alike: build the model, call `f` once eagerly (so JAX has compiled `f`'s
operations, as in a program that ran `f` before), then time one call of
either

* `jaxinterp.evaluate(f)(...)`, staging included, or
* `jax.core.eval_jaxpr(jax.make_jaxpr(f)(...))` on the flat arguments,
  staging included.

The models are written in plain JAX (no Flax): a CNN train step
(convolution, ReLU, average pooling, dense layer, softmax cross-entropy,
`jax.value_and_grad`, SGD update) and a transformer block (layer norm,
multi-head attention, MLP) with its gradient. `f` is not jitted: its first
eager call dispatches op by op, as a Flax train step before `jax.jit`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def _cnn() -> tuple[Any, tuple[Any, ...]]:
    keys = jax.random.split(jax.random.key(0), 4)
    params = {
        "conv": jax.random.normal(keys[0], (3, 3, 1, 8)) * 0.3,
        "dense": jax.random.normal(keys[1], (8 * 7 * 7, 10)) * 0.05,
        "bias": jnp.zeros((10,)),
    }
    images = jax.random.normal(keys[2], (16, 14, 14, 1))
    labels = jax.random.randint(keys[3], (16,), 0, 10)

    def loss(params: Any, images: Any, labels: Any) -> Any:
        h = lax.conv_general_dilated(
            images,
            params["conv"],
            window_strides=(1, 1),
            padding="SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        h = jax.nn.relu(h)
        h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = h.reshape(h.shape[0], -1) / 4.0
        logits = h @ params["dense"] + params["bias"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    def train_step(params: Any, images: Any, labels: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, images, labels)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
        return new, value

    return train_step, (params, images, labels)


def _transformer() -> tuple[Any, tuple[Any, ...]]:
    d, heads, seq = 32, 4, 16
    keys = jax.random.split(jax.random.key(1), 6)
    params = {
        "qkv": jax.random.normal(keys[0], (d, 3 * d)) / d**0.5,
        "out": jax.random.normal(keys[1], (d, d)) / d**0.5,
        "up": jax.random.normal(keys[2], (d, 4 * d)) / d**0.5,
        "down": jax.random.normal(keys[3], (4 * d, d)) / (4 * d) ** 0.5,
        "scale": jnp.ones((d,)),
    }
    x = jax.random.normal(keys[4], (seq, d))

    def norm(x: Any, scale: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * lax.rsqrt(var + 1e-5) * scale

    def block(params: Any, x: Any) -> Any:
        h = norm(x, params["scale"])
        q, k, v = jnp.split(h @ params["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(seq, heads, d // heads).transpose(1, 0, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / (d // heads) ** 0.5, axis=-1)
        o = (att @ v).transpose(1, 0, 2).reshape(seq, d) @ params["out"]
        x = x + o
        h = norm(x, params["scale"])
        return x + jax.nn.gelu(h @ params["up"]) @ params["down"]

    def step(params: Any, x: Any) -> Any:
        return jax.value_and_grad(lambda p, x: jnp.sum(block(p, x) ** 2))(params, x)

    return step, (params, x)


MODELS = {"cnn train step": _cnn, "transformer block": _transformer}
METHODS = ("evaluate", "eval_jaxpr")


def child(model: str, method: str) -> None:
    """In a fresh process: prepare, then print the seconds of one first call."""
    import jaxinterp

    fn, args = MODELS[model]()
    jax.block_until_ready(fn(*args))  # `f` ran before: its operations compiled
    start = time.perf_counter()
    if method == "evaluate":
        out = jaxinterp.evaluate(fn)(*args)
    else:
        closed = jax.make_jaxpr(fn)(*args)
        flat = jax.tree_util.tree_leaves(args)
        out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat)
    jax.block_until_ready(out)
    print(time.perf_counter() - start)


def first_call_seconds(model: str, method: str) -> float:
    """The first call's seconds, measured in a fresh process."""
    result = subprocess.run(
        [sys.executable, __file__, model, method],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(result.stdout.strip().splitlines()[-1])


def measure(model: str, repeats: int) -> tuple[float, float]:
    """Median first-call seconds of `evaluate` and of `eval_jaxpr`, alternated."""
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(repeats):
        for method in METHODS:
            times[method].append(first_call_seconds(model, method))
    return statistics.median(times["evaluate"]), statistics.median(times["eval_jaxpr"])


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
