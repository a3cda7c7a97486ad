"""Tag intermediates with `sow`, collect them with `reap`, replace them with `plant`.

`sow_p` is a custom primitive: the identity, with an abstract evaluation rule,
an XLA lowering, a batching rule and a JVP rule, so functions that sow still
work under `jax.jit`, `jax.vmap` and `jax.grad`. `Harvest` is an interpreter
that treats `sow` specially: it records the value (`reap`) or returns a given
one instead (`plant`). `jit`s are walked in place (the `inline` policy), so
what was sown inside them is a value of the caller's trace; `scan` bodies are
walked by a nested `Harvest` inside a new `lax.scan` that returns what was
sown as extra per-step outputs (reap) or takes it as extra inputs (plant).
`cond` branches and `while` bodies are not harvested.

Run: python examples/harvest.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

import jaxinterp

sow_p = jex_core.Primitive("sow")
sow_p.def_impl(lambda x, *, name: x)
sow_p.def_abstract_eval(lambda aval, *, name: aval)
mlir.register_lowering(sow_p, lambda ctx, x, *, name: [x])
batching.primitive_batchers[sow_p] = lambda args, dims, *, name: (
    sow_p.bind(args[0], name=name),
    dims[0],
)
# The tangent passes through untouched: it needs no transpose rule.
ad.primitive_jvps[sow_p] = lambda primals, tangents, *, name: (
    sow_p.bind(primals[0], name=name),
    tangents[0],
)


def sow(value, *, name: str):
    """Tag `value` as `name`; the identity outside `reap` and `plant`."""
    return sow_p.bind(value, name=name)


def sown_names(jaxpr) -> set[str]:
    """Names sown in `jaxpr` and its sub-Jaxprs."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    names = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive is sow_p:
            names.add(eqn.params["name"])
        for sub in jaxinterp.sub_jaxprs(eqn):  # bodies, branches (hijax too)
            names |= sown_names(sub)
    return names


class Harvest(jaxinterp.Interpreter):
    """Records sown values in `reaped`, or returns the ones in `planted`."""

    name = "harvest"
    higher_order = "inline"  # jit bodies run in the caller's trace

    def __init__(self, planted=None):
        super().__init__(policies={"cond": "opaque", "while": "opaque"})
        self.planted, self.reaped = dict(planted or {}), {}

    def process_eqn(self, eqn, invals):
        if eqn.primitive is sow_p:
            name = eqn.params["name"]
            if name in self.reaped:
                raise ValueError(f"`{name}` was sown twice.")
            self.reaped[name] = self.planted.get(name, invals[0])
            return [self.reaped[name]]
        if eqn.primitive.name == "scan" and sown_names(
            jaxinterp.scan_params(eqn).jaxpr
        ):
            return self.harvest_scan(eqn, invals)
        if eqn.primitive.name == "call_hi_primitive":  # JAX's hijax flags
            hi = jaxinterp.hijax_params(eqn)
            if hi.kind == "scan" and sown_names(hi.body):
                return self.harvest_scan3(hi, invals)
        return super().process_eqn(eqn, invals)

    def harvest_scan(self, eqn, invals):
        p = jaxinterp.scan_params(eqn)  # the same on every JAX release
        n_consts, n_carry = p.num_consts, p.num_carry
        consts, init = invals[:n_consts], invals[n_consts : n_consts + n_carry]
        names = sown_names(p.jaxpr)
        planted = {n: v for n, v in self.planted.items() if n in names}  # per step

        def body(carry, xs_and_planted):
            xs, planted_step = xs_and_planted
            inner = Harvest(planted_step)
            outs = inner.eval_closed(p.jaxpr, *consts, *carry, *xs)
            return outs[:n_carry], (outs[n_carry:], inner.reaped)

        carry, (ys, reaped) = lax.scan(
            body, init, (invals[n_consts + n_carry :], planted),
            length=p.length, reverse=p.reverse,
        )  # fmt: skip
        for name, values in reaped.items():  # stacked: one entry per step
            if name in self.reaped:
                raise ValueError(f"`{name}` was sown twice.")
            self.reaped[name] = values
        return [*carry, *ys]

    def harvest_scan3(self, hi, invals):
        """`harvest_scan` for a scan staged under `jax_scan3`: its body runs once
        per step on the operands (sliced where `extensives` says), and reads
        and writes the loop's state in references, which the loop closes over.
        """
        names = sown_names(hi.body)
        planted = {n: v for n, v in self.planted.items() if n in names}  # per step
        xs = [v for v, ext in zip(invals, hi.extensives, strict=True) if ext]

        def body(_, xs_and_planted):
            xs_step, planted_step = xs_and_planted
            it = iter(xs_step)
            args = [next(it) if ext else v
                    for v, ext in zip(invals, hi.extensives, strict=True)]  # fmt: skip
            inner = Harvest(planted_step)
            return None, (inner.eval_closed(hi.body, *args), inner.reaped)

        _, (ys, reaped) = lax.scan(body, None, (xs, planted), length=hi.length)
        for name, values in reaped.items():
            if name in self.reaped:
                raise ValueError(f"`{name}` was sown twice.")
            self.reaped[name] = values
        return ys


def reap(fn):
    """Return `fn` returning `(result, {name: sown value})`; scans stack per step."""

    def reaped(*args, **kwargs):
        harvest = Harvest()
        out = harvest.transform(fn)(*args, **kwargs)
        return out, harvest.reaped

    return reaped


def plant(fn, values):
    """Return `fn` with the values sown under the names in `values` replaced."""
    return Harvest(values).transform(fn)


# ---------------------------------------------------------------------------


@jax.jit
def mlp(x, w):
    h = sow(jnp.tanh(x @ w), name="hidden")
    return jnp.sum(h**2)


def rnn(h, xs):
    def step(h, x):
        h = sow(jnp.tanh(h + x), name="state")
        return h, jnp.sum(h)

    return lax.scan(step, h, xs)


def main():
    x, w = jnp.ones((2, 3)), jnp.eye(3) * 0.5
    out, sown = reap(mlp)(x, w)
    print("mlp:", out, "hidden:", sown["hidden"].tolist())
    print("planted zeros:", plant(mlp, {"hidden": jnp.zeros((2, 3))})(x, w))
    (h, sums), sown = jax.jit(reap(rnn))(jnp.zeros(2), jnp.ones((4, 2)))
    print("rnn states per step:", sown["state"].shape, sown["state"][:, 0])
    per_example = jax.vmap(reap(mlp), in_axes=(0, None))(jnp.ones((5, 2, 3)), w)[1]
    print("vmap(reap):", per_example["hidden"].shape)
    print("grad through sow:", jax.grad(mlp, argnums=1)(x, w).diagonal())


if __name__ == "__main__":
    main()
