"""`jaxinterp demo`: a guided tour, one function per section.

Each section prints its own output and shares the small model of `_model`.
Add a section by appending `(title, function)` to `SECTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _model() -> tuple[Callable[..., Any], dict[str, Any], Any]:
    """A two-layer scan with pytrees in and out, its params and an input."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def model(params: dict[str, Any], x: Any) -> dict[str, Any]:
        def layer(h: Any, w: Any) -> tuple[Any, Any]:
            return jnp.tanh(h @ w), jnp.sum(h)

        h, sums = lax.scan(layer, x, params["w"])
        return {"out": jax.nn.softplus(h) + params["b"], "sums": sums}

    params = {"w": jnp.eye(3)[None].repeat(2, 0) * 0.5, "b": jnp.ones(3)}
    return model, params, jnp.arange(3.0)


def stage_section() -> None:
    """Stage a function into a Jaxpr."""
    import jaxinterp

    model, params, x = _model()
    print(jaxinterp.stage(model, params, x).closed_jaxpr)


def evaluate_section() -> None:
    """Run the function through the identity interpreter."""
    import jax.numpy as jnp

    import jaxinterp

    model, params, x = _model()
    got = jaxinterp.evaluate(model)(params, x)
    want = model(params, x)
    print("evaluate(model) ->", got["out"])
    print("model          ->", want["out"])
    print("bit-identical:", bool(jnp.all(got["out"] == want["out"])))


def compose_section() -> None:
    """Compose the interpreter with `jax.jit` and `jax.grad`."""
    import jax
    import jax.numpy as jnp

    import jaxinterp

    model, params, x = _model()

    def loss(p: dict[str, Any], x: Any) -> Any:
        return jnp.sum(jaxinterp.evaluate(model)(p, x)["out"])

    print("d loss / d b =", jax.jit(jax.grad(loss))(params, x)["b"])


def count_section() -> None:
    """Count equations and FLOPs by walking the Jaxpr on abstract values."""
    import jaxinterp
    from jaxinterp._count import count_staged

    model, params, x = _model()
    print("(`jaxinterp count MODULE:FUNCTION --args ...` prints this for your code)")
    print(count_staged(jaxinterp.stage(model, params, x)).table())


def substitute_section() -> None:
    """Swap `tanh` for a rational approximation everywhere, scan bodies included."""
    import jax.numpy as jnp
    from jax import lax

    import jaxinterp

    class PadeTanh(jaxinterp.EvalInterpreter):
        name = "pade_tanh"
        rules = jaxinterp.RuleRegistry("pade_tanh", parent=jaxinterp.eval_rules)

    @PadeTanh.rules.register(lax.tanh_p)
    def _tanh_pade_tanh(x: Any, **params: Any) -> list[Any]:
        x = jnp.clip(x, -3.0, 3.0)
        return [x * (27.0 + x * x) / (27.0 + 9.0 * x * x)]

    model, params, x = _model()
    got = PadeTanh().transform(model)(params, x)["out"]
    want = model(params, x)["out"]
    print("Pade tanh ->", got)
    print("exact     ->", want)
    print(f"max abs difference: {float(jnp.max(jnp.abs(got - want))):.2e}")


SECTIONS: list[tuple[str, Callable[[], None]]] = [
    ("stage: a function with pytrees in and out, a scan inside", stage_section),
    ("evaluate: the same function through the interpreter", evaluate_section),
    ("it composes: jit(grad(evaluate(f)))", compose_section),
    ("count: equations and FLOPs, scan bodies times their length", count_section),
    (
        "substitute: tanh -> a rational approximation, inside the scan",
        substitute_section,
    ),
]


def run_demo() -> None:
    """Print every section of the tour in order."""
    for i, (title, section) in enumerate(SECTIONS, start=1):
        print(f"== {i}. {title} ==")
        section()
