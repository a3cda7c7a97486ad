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


def inverse_section() -> None:
    """`inverse`, `ildj` and `explain_inverse` on a RealNVP coupling layer."""
    import jax
    import jax.numpy as jnp

    import jaxinterp

    def coupling(x, params):
        x1, x2 = x[:2], x[2:]
        h = jnp.tanh(x1 @ params["w"] + params["b"])
        log_scale, shift = jnp.tanh(h[:2]), h[2:]
        return jnp.concatenate([x1, x2 * jnp.exp(log_scale) + shift])

    key_w, key_x = jax.random.split(jax.random.key(0))
    params = {"w": 0.5 * jax.random.normal(key_w, (2, 4)), "b": jnp.zeros(4)}
    x = jax.random.normal(key_x, (4,))
    y = coupling(x, params)
    x_back, ildj = jaxinterp.inverse_and_ildj(coupling, argnums=0)(y, params)
    jac = jax.jacfwd(lambda y: jaxinterp.inverse(coupling, argnums=0)(y, params))(y)
    print("x                      ", x)
    print("inverse(coupling)(y)   ", x_back)
    print(f"ildj                    {float(ildj):.6f}")
    print(f"slogdet(jacfwd(inverse)) {float(jnp.linalg.slogdet(jac)[1]):.6f}")
    print(
        "d ildj / d b:",
        jax.grad(lambda p: jaxinterp.ildj(coupling, argnums=0)(y, p))(params)["b"],
    )
    print(jaxinterp.explain_inverse(coupling, x, params, argnums=0))
    print("the inverse Jaxpr (jit-ready, no dead code):")
    print(jax.make_jaxpr(jaxinterp.inverse(coupling, argnums=0))(y, params))


SECTIONS: list[tuple[str, Callable[[], None]]] = [
    ("stage: a function with pytrees in and out, a scan inside", stage_section),
    ("evaluate: the same function through the interpreter", evaluate_section),
    ("it composes: jit(grad(evaluate(f)))", compose_section),
    ("count: equations and FLOPs, scan bodies times their length", count_section),
    (
        "substitute: tanh -> a rational approximation, inside the scan",
        substitute_section,
    ),
    ("inverse: a coupling layer, its ildj and explain_inverse", inverse_section),
]


def run_demo() -> None:
    """Print every section of the tour in order."""
    for i, (title, section) in enumerate(SECTIONS, start=1):
        print(f"== {i}. {title} ==")
        section()
