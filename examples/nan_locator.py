"""Find the first equation that produced a NaN or an infinity, with its source line.

`NonFiniteLocator` runs a function normally (each equation re-binds its
primitive) and, after every equation with floating-point results, checks them
with `jax.debug.callback`. The callback fires when the values exist: at once
when running eagerly, at run time under `jax.jit` and in every iteration of a
`scan` body (the interpreter rebuilds `jit`s and `scan`s around its own walk,
so the checks are compiled into them). Ordered callbacks keep reports in
execution order, so the first report is where the trouble started.

Run: python examples/nan_locator.py
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import source_info_util

import jaxinterp


@dataclasses.dataclass(frozen=True)
class Report:
    """Where a non-finite value appeared."""

    primitive: str
    kind: str  # "nan", "inf" or "nan+inf"
    in_shapes: tuple[str, ...]
    out_shapes: tuple[str, ...]
    where: str  # the user's source line, as `file.py:42:8 (fn)`

    def __str__(self) -> str:
        return (
            f"{self.kind} from `{self.primitive}` at {self.where}: "
            f"({', '.join(self.in_shapes)}) -> ({', '.join(self.out_shapes)})"
        )


# Mutable references (`jax.new_ref`; `scan` carries its state in them under
# JAX's `jax_scan3` flag) hold arrays but are not ones: their reads are checked.
_REF_TYPE = getattr(getattr(jax, "ref", None), "AbstractRef", ())


def _short(var) -> str:
    return var.aval.str_short(short_dtypes=True)


class NonFiniteLocator(jaxinterp.Interpreter):
    """Records a `Report` for each equation whose results are not all finite."""

    name = "locate_nonfinite"

    def __init__(self):
        super().__init__()
        self.reports: list[Report] = []

    @property
    def first(self) -> Report | None:
        """The first report, after waiting for pending callbacks."""
        jax.effects_barrier()
        return self.reports[0] if self.reports else None

    def process_eqn(self, eqn, invals):
        outvals = super().process_eqn(eqn, invals)  # jit/scan bodies: recursion
        if eqn.primitive in jaxinterp.higher_order_primitives():
            return outvals  # their inner equations were checked already
        floats = [
            x
            for x, var in zip(outvals, eqn.outvars, strict=True)
            if not isinstance(var.aval, _REF_TYPE)
            and jnp.issubdtype(x.dtype, jnp.inexact)
        ]
        if floats:
            has_nan = jnp.any(jnp.stack([jnp.isnan(x).any() for x in floats]))
            has_inf = jnp.any(jnp.stack([jnp.isinf(x).any() for x in floats]))
            where = source_info_util.summarize(eqn.source_info)
            info = (eqn.primitive.name, tuple(map(_short, eqn.invars)),
                    tuple(map(_short, eqn.outvars)), where)  # fmt: skip
            jax.debug.callback(self._record, info, has_nan, has_inf, ordered=True)
        return outvals

    def _record(self, info, has_nan, has_inf) -> None:
        if has_nan or has_inf:
            kind = "+".join(k for k, bad in (("nan", has_nan), ("inf", has_inf)) if bad)
            self.reports.append(Report(info[0], kind, *info[1:]))


def locate_nonfinite(fn, *args, jit: bool = False) -> tuple[object, Report | None]:
    """Run `fn(*args)`, under `jax.jit` if asked; return the result and first report."""
    locator = NonFiniteLocator()
    run = locator.transform(fn)
    out = (jax.jit(run) if jit else run)(*args)
    return out, locator.first


# ---------------------------------------------------------------------------
# A model with two hidden problems.


def normalize(x):
    return x / jnp.sum(x)  # 0 / 0 = nan when every weight is zero


def model(x, weights):
    def step(total, w):
        w = normalize(jnp.maximum(w, 0.0))
        return total + jnp.dot(w, x), w

    total, _ = lax.scan(step, 0.0, weights)
    return jnp.log(total)  # nan when total < 0


def main() -> None:
    x = jnp.array([1.0, -2.0, 3.0])
    fine = jnp.array([[1.0, 1.0, 1.0], [0.5, 0.0, 1.0]])
    bad_step = fine.at[1].set(-1.0)  # step 1: all weights clipped to 0
    for label, weights in [("fine", fine), ("bad scan step", bad_step)]:
        for jit in (False, True):
            out, first = locate_nonfinite(model, x, weights, jit=jit)
            mode = "jit  " if jit else "eager"
            print(f"{label:>14} {mode} -> {out}: {first or 'all finite'}")
    out, first = locate_nonfinite(model, -x, fine)
    print(f"{'negative x':>14} eager -> {out}: {first}")


if __name__ == "__main__":
    main()
