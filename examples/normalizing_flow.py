"""A 2-D RealNVP normalizing flow whose density comes from `jaxinterp.inverse_and_ildj`.

The flow is written once, in the generative direction: `flow(z1, z2, params)`
maps Gaussian noise to data through affine coupling layers, each scaling and
shifting one coordinate by amounts computed from the other, then a monotone
rational-quadratic spline on each coordinate (Durkan et al., 2019), written
with `jnp.where` over its bins and no inverse of its own. The density needs
the other direction, `log p(x) = log N(flow⁻¹(x)) + log|det ∂flow⁻¹/∂x|`, and
`jaxinterp.inverse_and_ildj` derives both from the Jaxpr: the conditioning
coordinate is known from the output, so each layer's scale and shift are
computed forwards and the affine map is undone backwards; the spline uses
its input many times and picks its bin by comparisons, so `inverse` inverts
it as a piecewise-rational block: between the knots (and the clips'
thresholds) it is a quotient of quadratics, whose root in the bin of `y` is
the answer (`explain_inverse` says `piecewise by intervals`). The inverse
composes with `jax.vmap`, `jax.grad` and `jax.jit`, so training is plain
gradient ascent on the log-likelihood (with Adam) of a two-moons data set.

Run: python examples/normalizing_flow.py (writes examples/output/normalizing_flow.png)
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import norm

import jaxinterp


def two_moons(n: int, rng: np.random.Generator, noise: float = 0.08) -> jax.Array:
    """`n` points on two interleaved half circles, standardised."""
    t = rng.uniform(0.0, np.pi, n)
    upper = rng.random(n) < 0.5
    x = np.where(upper, np.cos(t), 1.0 - np.cos(t))
    y = np.where(upper, np.sin(t), 0.5 - np.sin(t))
    pts = np.stack([x, y], axis=1) + noise * rng.normal(size=(n, 2))
    return jnp.asarray((pts - pts.mean(0)) / pts.std(0), jnp.float32)


BINS, BOUND = 4, 3.0
_IDENTITY_SLOPE = float(np.log(np.expm1(1.0)))  # softplus of it is 1


def init(rng: np.random.Generator, layers: int = 6, hidden: int = 32) -> dict:
    def normal(scale, *shape):
        return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)

    couplings = [
        {"w1": normal(1.0, hidden), "b1": normal(1.0, hidden),
         "ws": normal(0.01, hidden), "bs": normal(0.0),
         "wt": normal(0.01, hidden), "bt": normal(0.0)}
        for _ in range(layers)
    ]  # fmt: skip
    # Splines that start as the identity: equal bins, unit slopes.
    spline = {
        "w": jnp.zeros(BINS),
        "h": jnp.zeros(BINS),
        "d": jnp.full(BINS - 1, _IDENTITY_SLOPE, jnp.float32),
    }
    return {"couplings": couplings, "splines": [spline, dict(spline)]}


def coupling(cond, x, p):
    """Scale and shift `x` by amounts computed from `cond` (a small MLP)."""
    h = jnp.tanh(cond * p["w1"] + p["b1"])
    log_scale = 2.0 * jnp.tanh(h @ p["ws"] + p["bs"])  # bounded in (-2, 2)
    return x * jnp.exp(log_scale) + h @ p["wt"] + p["bt"]


def spline(x, p):
    """A monotone rational-quadratic spline on [-BOUND, BOUND], the identity
    outside: bin widths and heights from a softmax, knot slopes from a
    softplus. Each bin's formula is evaluated on its clipped position and the
    bins are chosen with `jnp.where`, as spline libraries write it."""
    widths = jax.nn.softmax(p["w"]) * 2 * BOUND
    heights = jax.nn.softmax(p["h"]) * 2 * BOUND
    knots_x = jnp.concatenate([jnp.array([-BOUND]), -BOUND + jnp.cumsum(widths)])
    knots_y = jnp.concatenate([jnp.array([-BOUND]), -BOUND + jnp.cumsum(heights)])
    slopes = jnp.concatenate([jnp.ones(1), jax.nn.softplus(p["d"]), jnp.ones(1)])
    inside = (x > -BOUND) & (x < BOUND)
    out = x
    for k in range(BINS):
        xi = jnp.clip((x - knots_x[k]) / widths[k], 0.0, 1.0)
        s = heights[k] / widths[k]
        mix = xi * (1 - xi)
        num = heights[k] * (s * xi**2 + slopes[k] * mix)
        den = s + (slopes[k + 1] + slopes[k] - 2 * s) * mix
        out = jnp.where(inside & (x >= knots_x[k]), knots_y[k] + num / den, out)
    return out


def flow(z1, z2, params):
    """Noise (two scalars) to a data point; the layers alternate coordinates."""
    for i, p in enumerate(params["couplings"]):
        if i % 2 == 0:
            z2 = coupling(z1, z2, p)
        else:
            z1 = coupling(z2, z1, p)
    s1, s2 = params["splines"]
    return spline(z1, s1), spline(z2, s2)


inverse_flow = jaxinterp.inverse_and_ildj(flow, argnums=(0, 1))


def log_density(params, x):
    """log p(x) for one point `x` of shape (2,)."""
    (z1, z2), ildj = inverse_flow((x[0], x[1]), params)
    return norm.logpdf(z1) + norm.logpdf(z2) + ildj


batch_log_density = jax.jit(jax.vmap(log_density, in_axes=(None, 0)))


@jax.jit
def sample(params, noise):
    return jnp.stack(jax.vmap(flow, in_axes=(0, 0, None))(*noise.T, params), axis=1)


@jax.jit
def train_step(params, opt, data, lr):
    """One Adam step on the negative mean log-likelihood."""
    loss, grads = jax.value_and_grad(lambda p: -batch_log_density(p, data).mean())(
        params
    )
    m, v, t = opt
    t = t + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)

    def update(p, m, v):
        return p - lr * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)

    return jax.tree.map(update, params, m, v), (m, v, t), loss  # fmt: skip


def train(params, data, steps: int, lr: float = 5e-3):
    zeros = jax.tree.map(jnp.zeros_like, params)
    opt = (zeros, zeros, jnp.zeros((), jnp.int32))
    for _ in range(steps):
        params, opt, _ = train_step(params, opt, data, lr)
    return params


def density_grid(params, lim: float = 4.0, n: int = 128, chunk: int = 1024):
    """exp(log p) on an n x n grid over [-lim, lim]^2, and the cell area.

    Evaluated `chunk` points at a time: the data's batch size, so the
    compiled `batch_log_density` is reused.
    """
    axis = jnp.linspace(-lim, lim, n)
    xx, yy = jnp.meshgrid(axis, axis)
    pts = jnp.stack([xx.ravel(), yy.ravel()], axis=1).reshape(-1, chunk, 2)
    logp = jnp.concatenate([batch_log_density(params, c) for c in pts])
    return jnp.exp(logp).reshape(n, n), (axis[1] - axis[0]) ** 2


def plot(data, dens, samples, lim, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    panels = [("data", data), ("learned density", None), ("samples", samples)]
    for ax, (title, pts) in zip(axes, panels, strict=True):
        if pts is None:
            ax.imshow(dens, origin="lower", extent=(-lim, lim, -lim, lim))
        else:
            ax.scatter(pts[:, 0], pts[:, 1], s=2, alpha=0.5)
        ax.set(title=title, xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal")
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


OUTPUT = Path(__file__).resolve().parent / "output" / "normalizing_flow.png"


def main(steps: int = 1000, out: Path | None = OUTPUT, n: int = 1024):
    rng = np.random.default_rng(0)
    data, params = two_moons(n, rng), init(rng)
    before = float(batch_log_density(params, data).mean())
    params = train(params, data, steps)
    after = float(batch_log_density(params, data).mean())
    dens, cell = density_grid(params, chunk=n)
    mass = float(dens.sum() * cell)
    print(f"mean log-likelihood {before:.3f} -> {after:.3f} after {steps} steps; "
          f"density integrates to {mass:.4f} on [-4, 4]^2")  # fmt: skip
    if out is not None:
        out.parent.mkdir(exist_ok=True)
        noise = jnp.asarray(rng.normal(size=(n, 2)), jnp.float32)
        plot(data, dens, sample(params, noise), 4.0, out)
        print(f"saved {out}")
    return {"before": before, "after": after, "mass": mass, "params": params}


if __name__ == "__main__":
    main()
