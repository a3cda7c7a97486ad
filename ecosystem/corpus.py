"""Small programs built with flax (nnx and linen), equinox, optax, diffrax, numpyro.

Each program is a function `build() -> (fn, args)`: `fn` takes and returns
pytrees of arrays (modules, models and other static things are closed over)
and `args` is a tuple of deterministic inputs made from fixed PRNG keys.
`PROGRAMS` lists them in order; `ecosystem/check.py` runs jaxinterp on each.

A program marked `reverse=False` goes through a `lax.while_loop` that JAX
cannot differentiate in reverse mode (a line search, NUTS's tree building):
the checker differentiates it in forward mode (`jax.jvp`) instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

PyTree = Any  # a pytree of arrays


@dataclasses.dataclass(frozen=True)
class Program:
    """One corpus entry: a name, its library and how to build it."""

    name: str
    library: str
    build: Callable[[], tuple[Callable[..., PyTree], tuple[Any, ...]]]
    reverse: bool = True  # whether `jax.grad` of `fn` works
    doc: str = ""


PROGRAMS: list[Program] = []


def program(library: str, *, reverse: bool = True):
    """Register `build` as a corpus program named after the function."""

    def register(build):
        doc = (build.__doc__ or "").strip().splitlines()[0]
        PROGRAMS.append(Program(build.__name__, library, build, reverse, doc))
        return build

    return register


def _keys(seed: int, n: int) -> list[jax.Array]:
    return list(jax.random.split(jax.random.PRNGKey(seed), n))


def _regression_data(seed: int, n: int, d_in: int, d_out: int):
    kx, kw = _keys(seed, 2)
    x = jax.random.normal(kx, (n, d_in))
    y = jnp.tanh(x @ jax.random.normal(kw, (d_in, d_out)))
    return x, y


# ---------------------------------------------------------------------------
# flax.nnx


def _fresh(state: PyTree) -> PyTree:
    """New `nnx.Variable` objects holding the same arrays.

    `nnx.merge` reuses the state's Variables, so a module that updates itself
    (optimizer, BatchNorm statistics, RNG counts) would mutate `fn`'s
    arguments; merging a copy keeps `fn` pure.
    """
    return jax.tree.map(lambda x: x, state)


@program("flax.nnx")
def nnx_mlp_train_step():
    """nnx MLP with dropout, loss + jax.grad over nnx.State, optax adamw update."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.l1 = nnx.Linear(4, 16, rngs=rngs)
            self.drop = nnx.Dropout(0.25, rngs=rngs)
            self.l2 = nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(nnx.gelu(self.l1(x))))

    model = MLP(nnx.Rngs(params=0, dropout=1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-2, weight_decay=1e-3)
    opt_state = tx.init(params)
    x, y = _regression_data(2, 8, 4, 2)

    def loss_fn(params, rest, x, y):
        m = nnx.merge(graphdef, _fresh(params), _fresh(rest))
        loss = jnp.mean((m(x) - y) ** 2)
        return loss, nnx.state(m, nnx.Not(nnx.Param))

    def fn(params, rest, opt_state, x, y):
        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, rest, x, y
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), rest, opt_state

    return fn, (params, rest, opt_state, x, y)


@program("flax.nnx")
def nnx_cnn_optimizer_step():
    """nnx CNN with BatchNorm, nnx.Optimizer, nnx.value_and_grad inside nnx.jit."""
    import optax
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.conv = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
            self.bn = nnx.BatchNorm(4, rngs=rngs)
            self.head = nnx.Linear(4 * 4 * 4, 3, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.bn(self.conv(x)))
            h = nnx.avg_pool(h, window_shape=(2, 2), strides=(2, 2))
            return self.head(h.reshape(h.shape[0], -1))

    model = CNN(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.05, momentum=0.9), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    kx, ky = _keys(3, 2)
    x = jax.random.normal(kx, (4, 8, 8, 1))
    labels = jax.random.randint(ky, (4,), 0, 3)

    @nnx.jit
    def train_step(model, optimizer, x, labels):
        def loss_fn(model):
            logits = model(x)
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, labels
            ).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def fn(state, x, labels):
        model, optimizer = nnx.merge(graphdef, _fresh(state))
        loss = train_step(model, optimizer, x, labels)
        return loss, nnx.state((model, optimizer))

    return fn, (state, x, labels)


@program("flax.nnx")
def nnx_lstm_scan():
    """nnx.RNN over an LSTMCell (nnx.scan inside) with nnx.remat'd readout."""
    from flax import nnx

    class Seq(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.rnn = nnx.RNN(nnx.LSTMCell(3, 8, rngs=rngs))
            self.out = nnx.Linear(8, 1, rngs=rngs)

        def __call__(self, xs):
            hs = self.rnn(xs)
            readout = nnx.remat(lambda m, h: jnp.tanh(m(h)))
            return readout(self.out, hs)

    graphdef, state = nnx.split(Seq(nnx.Rngs(4)))
    xs = jax.random.normal(jax.random.PRNGKey(5), (2, 6, 3))

    def fn(state, xs):
        return nnx.merge(graphdef, _fresh(state))(xs)

    return fn, (state, xs)


@program("flax.nnx")
def nnx_attention_block():
    """nnx pre-norm transformer block: MultiHeadAttention with a causal mask."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.ln1 = nnx.LayerNorm(16, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=2, in_features=16, decode=False, rngs=rngs
            )
            self.ln2 = nnx.LayerNorm(16, rngs=rngs)
            self.ff = nnx.Sequential(
                nnx.Linear(16, 32, rngs=rngs), nnx.silu, nnx.Linear(32, 16, rngs=rngs)
            )

        def __call__(self, x):
            mask = nnx.make_causal_mask(x[..., 0])
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.ff(self.ln2(x))

    graphdef, state = nnx.split(Block(nnx.Rngs(6)))
    x = jax.random.normal(jax.random.PRNGKey(7), (2, 5, 16))

    def fn(state, x):
        return nnx.merge(graphdef, _fresh(state))(x)

    return fn, (state, x)


# ---------------------------------------------------------------------------
# flax.linen


@program("flax.linen")
def linen_scan_remat_transformer():
    """linen: nn.scan over nn.remat'd attention blocks (the check differentiates)."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(h, h)
            h = nn.Dense(16)(nn.LayerNorm()(x))
            return x + nn.Dense(8)(nn.gelu(h)), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            blocks = nn.scan(
                nn.remat(Block),
                variable_axes={"params": 0},
                split_rngs={"params": True},
                length=3,
            )
            x, _ = blocks()(x, None)
            return nn.Dense(1)(x.mean(axis=1))

    model = Model()
    x = jax.random.normal(jax.random.PRNGKey(8), (2, 4, 8))
    params = model.init(jax.random.PRNGKey(9), x)["params"]
    y = jnp.array([[0.5], [-0.5]])

    def fn(params, x, y):
        pred = model.apply({"params": params}, x)
        return jnp.mean((pred - y) ** 2), pred

    return fn, (params, x, y)


@program("flax.linen")
def linen_cnn_batchnorm_dropout():
    """linen CNN, BatchNorm (mutable batch_stats) and Dropout, optax sgd step."""
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
            x = nn.Dropout(0.2, deterministic=not train)(x.reshape(x.shape[0], -1))
            return nn.Dense(3)(x)

    model = CNN()
    kx, ky, kinit, kdrop = _keys(10, 4)
    x = jax.random.normal(kx, (4, 8, 8, 2))
    labels = jax.random.randint(ky, (4,), 0, 3)
    variables = model.init(kinit, x, train=False)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    opt_state = tx.init(variables["params"])

    def fn(params, batch_stats, opt_state, x, labels, key):
        def loss(p):
            logits, new = model.apply(
                {"params": p, "batch_stats": batch_stats},
                x,
                train=True,
                rngs={"dropout": key},
                mutable=["batch_stats"],
            )
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            return ce.mean(), new["batch_stats"]

        (value, batch_stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), batch_stats, opt_state

    return fn, (
        variables["params"],
        variables["batch_stats"],
        opt_state,
        x,
        labels,
        kdrop,
    )


@program("flax.linen")
def linen_rnn_gru():
    """linen nn.RNN over a GRUCell (nn.scan inside), with sequence lengths."""
    import flax.linen as nn

    model = nn.RNN(nn.GRUCell(features=6))
    xs = jax.random.normal(jax.random.PRNGKey(11), (3, 5, 2))
    lengths = jnp.array([5, 3, 4])
    params = model.init(jax.random.PRNGKey(12), xs)

    def fn(params, xs, lengths):
        return model.apply(params, xs, seq_lengths=lengths)

    return fn, (params, xs, lengths)


# ---------------------------------------------------------------------------
# equinox


@program("equinox")
def eqx_mlp_filter_jit_adam():
    """equinox MLP: eqx.filter_jit train step with filter_value_and_grad and adam."""
    import equinox as eqx
    import optax

    # A smooth activation: with relu, dead units have exactly zero gradients and
    # the derivative of adam's update there is ~1/eps, which is rounding noise.
    model = eqx.nn.MLP(
        3, 2, width_size=16, depth=2, activation=jnp.tanh, key=jax.random.PRNGKey(13)
    )
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    x, y = _regression_data(14, 8, 3, 2)

    @eqx.filter_jit
    def step(model, opt_state, x, y):
        @eqx.filter_value_and_grad
        def loss(model):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        value, grads = loss(model)
        updates, opt_state = tx.update(grads, opt_state, model)
        return value, eqx.apply_updates(model, updates), opt_state

    def fn(params, opt_state, x, y):
        value, model, opt_state = step(eqx.combine(params, static), opt_state, x, y)
        return value, eqx.filter(model, eqx.is_inexact_array), opt_state

    return fn, (params, opt_state, x, y)


@program("equinox")
def eqx_conv_norm_vmap():
    """equinox Conv2d + GroupNorm + MaxPool2d + Linear under jax.vmap."""
    import equinox as eqx

    k1, k2 = _keys(15, 2)

    class Net(eqx.Module):
        conv: eqx.nn.Conv2d
        norm: eqx.nn.GroupNorm
        pool: eqx.nn.MaxPool2d
        head: eqx.nn.Linear

        def __init__(self):
            self.conv = eqx.nn.Conv2d(2, 4, 3, padding=1, key=k1)
            self.norm = eqx.nn.GroupNorm(2, 4)
            self.pool = eqx.nn.MaxPool2d(2, 2)
            self.head = eqx.nn.Linear(4 * 3 * 3, 2, key=k2)

        def __call__(self, x):
            h = self.pool(jax.nn.swish(self.norm(self.conv(x))))
            return jax.nn.log_softmax(self.head(h.ravel()))

    params, static = eqx.partition(Net(), eqx.is_array)
    x = jax.random.normal(jax.random.PRNGKey(16), (3, 2, 6, 6))

    def fn(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    return fn, (params, x)


@program("equinox")
def eqx_internal_while_loops():
    """eqx.internal.while_loop, checkpointed and bounded kinds (Newton iterations)."""
    import equinox.internal as eqxi

    def newton(a, kind):
        def cond(c):
            i, x = c
            return (i < 20) & (jnp.max(jnp.abs(x * x - a)) > 1e-6)

        def body(c):
            i, x = c
            return i + 1, x - (x * x - a) / (2 * x)

        init = (jnp.array(0), jnp.ones_like(a))
        return eqxi.while_loop(cond, body, init, max_steps=20, kind=kind)

    def fn(a):
        steps_c, root_c = newton(a, "checkpointed")
        steps_b, root_b = newton(a + 1.0, "bounded")
        return {"checkpointed": root_c, "bounded": root_b, "steps": steps_c + steps_b}

    return fn, (jnp.array([2.0, 3.0, 10.0]),)


@program("equinox")
def eqx_gru_scan_checkpoint():
    """equinox GRUCell driven by lax.scan, body under eqx.filter_checkpoint."""
    import equinox as eqx

    cell = eqx.nn.GRUCell(2, 5, key=jax.random.PRNGKey(17))
    params, static = eqx.partition(cell, eqx.is_array)
    xs = jax.random.normal(jax.random.PRNGKey(18), (7, 2))

    def fn(params, xs):
        cell = eqx.combine(params, static)

        @eqx.filter_checkpoint
        def step(h, x):
            h = cell(x, h)
            return h, jnp.sum(h**2)

        h, energies = lax.scan(step, jnp.zeros(5), xs)
        return h, energies

    return fn, (params, xs)


# ---------------------------------------------------------------------------
# optax


@program("optax")
def optax_chain_scan():
    """optax chain (clip, adam, weight decay, cosine schedule) for 5 scanned steps."""
    import optax

    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, 2, 5)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(b1=0.9, b2=0.99),
        optax.add_decayed_weights(1e-4),
        optax.scale_by_learning_rate(schedule),
    )
    params = {"a": jnp.array([-1.2, 0.8]), "b": jnp.array(0.5)}
    opt_state = tx.init(params)

    def rosenbrock(p):
        x, y = p["a"]
        return (1 - x) ** 2 + 100 * (y - x**2) ** 2 + optax.l2_loss(p["b"])

    def fn(params, opt_state):
        def step(carry, _):
            params, opt_state = carry
            value, grads = jax.value_and_grad(rosenbrock)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), value

        return lax.scan(step, (params, opt_state), length=5)

    return fn, (params, opt_state)


@program("optax", reverse=False)
def optax_lbfgs_linesearch():
    """optax.lbfgs with zoom line search (while loops, conds) for 3 steps."""
    import optax

    def f(x):
        return jnp.sum((x - jnp.arange(3.0)) ** 2 * jnp.array([1.0, 4.0, 9.0]))

    tx = optax.lbfgs()
    x0 = jnp.array([1.0, -1.0, 0.5])
    opt_state = tx.init(x0)
    value_and_grad = optax.value_and_grad_from_state(f)

    def fn(x, opt_state):
        for _ in range(3):
            value, grad = value_and_grad(x, state=opt_state)
            updates, opt_state = tx.update(
                grad, opt_state, x, value=value, grad=grad, value_fn=f
            )
            x = optax.apply_updates(x, updates)
        return x, opt_state

    return fn, (x0, opt_state)


# ---------------------------------------------------------------------------
# diffrax


def _lotka_volterra(t, y, theta):
    prey, predator = y
    a, b, c, d = theta
    return jnp.stack(
        [a * prey - b * prey * predator, d * prey * predator - c * predator]
    )


@program("diffrax")
def diffrax_tsit5_fixed_steps():
    """diffrax Tsit5 with a constant step size, SaveAt(ts=...) (Lotka-Volterra)."""
    import diffrax

    term = diffrax.ODETerm(_lotka_volterra)
    ts = jnp.linspace(0.0, 2.0, 5)

    def fn(y0, theta):
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            t0=0.0,
            t1=2.0,
            dt0=0.1,
            y0=y0,
            args=theta,
            saveat=diffrax.SaveAt(ts=ts),
        )
        return sol.ys

    return fn, (jnp.array([1.0, 0.5]), jnp.array([1.1, 0.4, 0.4, 0.1]))


@program("diffrax")
def diffrax_tsit5_adaptive_pid():
    """diffrax Tsit5 with a PIDController, SaveAt(t1, ts) and step statistics."""
    import diffrax

    term = diffrax.ODETerm(_lotka_volterra)
    saveat = diffrax.SaveAt(t1=True, ts=jnp.array([0.5, 1.0, 1.5]))
    controller = diffrax.PIDController(rtol=1e-5, atol=1e-7, pcoeff=0.3, icoeff=0.4)

    def fn(y0, theta):
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            t0=0.0,
            t1=2.0,
            dt0=0.05,
            y0=y0,
            args=theta,
            saveat=saveat,
            stepsize_controller=controller,
            max_steps=256,
        )
        return {"ys": sol.ys, "num_steps": sol.stats["num_steps"]}

    return fn, (jnp.array([1.0, 0.5]), jnp.array([1.1, 0.4, 0.4, 0.1]))


@program("diffrax")
def diffrax_kvaerno_stiff():
    """diffrax implicit Kvaerno3 (Newton root-find, lineax LU) on a stiff system."""
    import diffrax

    def vector_field(t, y, k):
        return jnp.stack([-k[0] * y[0] + y[1], k[0] * y[0] - k[1] * y[1]])

    term = diffrax.ODETerm(vector_field)
    controller = diffrax.PIDController(rtol=1e-4, atol=1e-6)

    def fn(y0, k):
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Kvaerno3(),
            t0=0.0,
            t1=1.0,
            dt0=0.01,
            y0=y0,
            args=k,
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=controller,
            max_steps=128,
        )
        return sol.ys

    return fn, (jnp.array([1.0, 0.0]), jnp.array([50.0, 2.0]))


# ---------------------------------------------------------------------------
# numpyro


def _numpyro_model(x, group, y=None):
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(2.0))
    with numpyro.plate("groups", 3):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    slope = numpyro.sample("slope", dist.StudentT(4.0, 0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.LogNormal(-1.0, 0.5))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(theta[group] + slope * x, sigma), obs=y)


def _numpyro_data():
    kx, kg, ky = _keys(20, 3)
    x = jax.random.normal(kx, (12,))
    group = jax.random.randint(kg, (12,), 0, 3)
    y = (
        0.7 * x
        + jnp.array([-1.0, 0.0, 1.0])[group]
        + 0.3 * jax.random.normal(ky, (12,))
    )
    return x, group, y


@program("numpyro")
def numpyro_log_density():
    """numpyro log_density and potential_energy (biject_to transforms) of models."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.util import log_density, potential_energy

    x, group, y = _numpyro_data()

    def mixture(obs):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
        locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([3]).to_event(1))
        rate = numpyro.sample("rate", dist.Gamma(2.0, 2.0))
        p = numpyro.sample("p", dist.Beta(2.0, 3.0))
        mix = dist.MixtureSameFamily(dist.Categorical(probs=w), dist.Normal(locs, 1.0))
        with numpyro.plate("obs", obs.shape[0]):
            numpyro.sample("o", mix, obs=obs)
            numpyro.sample("e", dist.Exponential(rate), obs=jnp.abs(obs))
        scale = dist.transforms.AffineTransform(0.0, 2.0)
        flow = dist.TransformedDistribution(dist.Normal(0.0, 1.0), [scale])
        numpyro.sample("f", flow, obs=obs[0])
        numpyro.sample("b", dist.Bernoulli(p), obs=(obs > 0).astype(jnp.float32))

    constrained = {
        "mu": jnp.array(0.3),
        "tau": jnp.array(1.2),
        "theta": jnp.array([-0.9, 0.1, 1.1]),
        "slope": jnp.array(0.6),
        "sigma": jnp.array(0.4),
    }
    unconstrained = {
        "w": jnp.array([0.2, -0.3]),
        "locs": jnp.array([-2.0, 0.0, 2.0]),
        "rate": jnp.array(0.1),
        "p": jnp.array(-0.2),
    }

    def fn(constrained, unconstrained, y):
        logp, _ = log_density(_numpyro_model, (x, group), {"y": y}, constrained)
        energy = potential_energy(mixture, (y,), {}, unconstrained)
        return logp, energy

    return fn, (constrained, unconstrained, y)


@program("numpyro", reverse=False)
def numpyro_nuts_step():
    """One numpyro NUTS transition (tree building in while loops) from an init."""
    from numpyro.infer import NUTS

    x, group, y = _numpyro_data()
    kernel = NUTS(_numpyro_model, max_tree_depth=4)
    state = kernel.init(
        jax.random.PRNGKey(21), 5, None, model_args=(x, group), model_kwargs={"y": y}
    )

    def fn(state):
        return kernel.sample(state, (x, group), {"y": y})

    return fn, (state,)


@program("numpyro")
def numpyro_svi_step():
    """numpyro SVI update: AutoNormal guide, Trace_ELBO, optax adam via numpyro."""
    import optax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal
    from numpyro.optim import optax_to_numpyro

    x, group, y = _numpyro_data()
    guide = AutoNormal(_numpyro_model)
    svi = SVI(_numpyro_model, guide, optax_to_numpyro(optax.adam(0.05)), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(22), x, group, y=y)

    def fn(state):
        return svi.update(state, x, group, y=y)

    return fn, (state,)
