"""The `jaxinterp` command line: `demo` (a guided tour)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _demo() -> int:
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jaxinterp

    def model(params, x):
        def layer(h, w):
            return jnp.tanh(h @ w), jnp.sum(h)

        h, sums = lax.scan(layer, x, params["w"])
        return {"out": jax.nn.softplus(h) + params["b"], "sums": sums}

    params = {"w": jnp.eye(3)[None].repeat(2, 0) * 0.5, "b": jnp.ones(3)}
    x = jnp.arange(3.0)
    print("== 1. stage: a function with pytrees in and out, a scan inside ==")
    staged = jaxinterp.stage(model, params, x)
    print(staged.closed_jaxpr)
    print("== 2. evaluate: the same function through the interpreter ==")
    got = jaxinterp.evaluate(model)(params, x)
    want = model(params, x)
    print("evaluate(model) ->", got["out"])
    print("model          ->", want["out"])
    print("bit-identical:", bool(jnp.all(got["out"] == want["out"])))
    print("== 3. it composes: jit(grad(evaluate(f))) ==")
    loss = lambda p, x: jnp.sum(jaxinterp.evaluate(model)(p, x)["out"])  # noqa: E731
    g = jax.jit(jax.grad(loss))(params, x)
    print("d loss / d b =", g["b"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="jaxinterp",
        description="Write JAX function transformations as Jaxpr interpreters.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="a short guided tour of jaxinterp")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo()
    parser.error(f"unknown command {args.command!r}")
    return 2
