"""Programs with mutable references, made pure for `inverse`.

The dataflow engine reasons about variables, each written once; a mutable
reference (`jax.new_ref`) is written many times, and a hijax `Scan3` (what
`lax.scan` stages under `jax_scan3`) updates its carry references without
returning them. Before solving, `functionalize` re-stages such a program with
each reference held as its current value: `get`, `swap` and `addupdate` read
and replace that value (through JAX's own state-discharge rules), `freeze`
reads it, and a `Scan3` becomes a classic `scan` carrying the references'
values, whose inverse rule runs the loop the other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import jax
from jax import lax

from . import _caches, _jax_compat as compat
from ._errors import JaxinterpError, NotInvertibleError, source_line
from ._interpreter import Interpreter
from ._trace import spec_of


class _Box:
    """A mutable reference's current value, during `functionalize`."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Functionalize(Interpreter):
    """Walks a program holding each mutable reference as a `_Box`."""

    name: ClassVar[str] = "inverse"
    cache_subcalls: ClassVar[bool] = False

    def process_eqn(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        prim = eqn.primitive
        name = prim.name
        if prim is compat.call_hi_primitive_p:
            h = compat.hijax_params(eqn)
            if h.kind == "scan":
                return self._scan3(eqn, h, invals)
        elif name in compat.REF_PRIMITIVES:
            return self._ref(eqn, invals)
        if any(type(v) is _Box for v in invals):
            raise NotInvertibleError(
                f"`inverse` cannot follow a mutable reference into `{name}`, "
                f"used at {source_line(eqn)}: only `get`, `swap`, `addupdate`, "
                "`freeze` and `scan` bodies may use a reference created by the "
                "function."
            )
        return super().process_eqn(eqn, invals)

    def _ref(self, eqn: compat.JaxprEqn, invals: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        if name == "new_ref":
            return [_Box(invals[0])]
        if name == "empty_ref":
            aval = eqn.outvars[0].aval.inner_aval  # type: ignore[attr-defined]
            return [_Box(lax.full(aval.shape, 0, aval.dtype))]
        box = invals[0]
        if type(box) is not _Box:
            raise NotInvertibleError(
                f"`inverse` cannot follow the mutable reference given to `{name}`, "
                f"used at {source_line(eqn)}: it was not created by the function "
                "(a reference argument or a captured one)."
            )
        if name == "free_ref":
            return []
        if name == "freeze":
            return [box.value]
        new, outs = compat.discharge_ref_eqn(eqn, box.value, invals[1:])
        if new is not None:
            box.value = new
        return outs

    def _scan3(
        self, eqn: compat.JaxprEqn, h: compat.HijaxParams, invals: list[Any]
    ) -> list[Any]:
        """A hijax `Scan3` as a classic `scan` carrying its references' values."""
        boxes = [v for v in invals if type(v) is _Box]
        if any(
            type(v) is _Box and ext for v, ext in zip(invals, h.extensives, strict=True)
        ):
            raise NotInvertibleError(
                f"`inverse` cannot invert the `scan` at {source_line(eqn)}: it "
                "slices a mutable reference per iteration."
            )
        xs = [
            v
            for v, ext in zip(invals, h.extensives, strict=True)
            if ext and type(v) is not _Box
        ]

        def step(carry: list[Any], x_t: list[Any]) -> tuple[list[Any], list[Any]]:
            c_it, x_it = iter(carry), iter(x_t)
            local: list[_Box] = []
            args = []
            for v, ext in zip(invals, h.extensives, strict=True):
                if type(v) is _Box:
                    local.append(_Box(next(c_it)))
                    args.append(local[-1])
                else:
                    args.append(next(x_it) if ext else v)
            ys = self.eval_closed(h.body, *args)
            return [b.value for b in local], ys

        reverse = bool(h.prim.reverse) and compat.SCAN3_HONOURS_REVERSE
        final, ys = lax.scan(
            step, [b.value for b in boxes], xs, length=h.length, reverse=reverse
        )
        for box, value in zip(boxes, final, strict=True):
            box.value = value
        return list(ys)


def _uses_state(jaxpr: compat.Jaxpr) -> bool:
    """Whether `jaxpr` (or a sub-Jaxpr) uses mutable references or a `Scan3`."""
    return any(
        eqn.primitive.name in compat.REF_PRIMITIVES
        or compat.touches_ref(eqn)
        or (
            eqn.primitive is compat.call_hi_primitive_p
            and compat.hijax_params(eqn).kind == "scan"
        )
        for eqn in compat.iter_eqns(jaxpr, expand=False)
    )


_cache = _caches.Cache(1024, weak=True)


def functionalize(
    jaxpr: compat.Jaxpr, consts: Sequence[Any]
) -> tuple[Any, Sequence[Any]]:
    """`jaxpr` (open, with `consts`) without mutable references, or as it is.

    Raises:
        NotInvertibleError: if a reference escapes what can be made pure.
    """
    if compat.call_hi_primitive_p is None or not _uses_state(jaxpr):
        return jaxpr, consts
    hit = _cache.get(jaxpr)
    if hit is not None:
        return hit
    walker = _Functionalize()

    def pure(*args: Any) -> list[Any]:
        return walker.eval_jaxpr(jaxpr, consts, *args)

    pure.__name__ = pure.__qualname__ = "functionalized"
    with compat.classic_scan():
        closed = jax.make_jaxpr(pure)(*[spec_of(v.aval) for v in jaxpr.invars])
    result = (compat.open_jaxpr(closed), compat.jaxpr_consts(closed))
    if not any(compat.is_tracer(c) for c in result[1]):
        _cache.put(jaxpr, result)
    return result


def _without_references(
    jaxpr: compat.Jaxpr, consts: Sequence[Any]
) -> tuple[Any, Sequence[Any]]:
    """`functionalize`, or `jaxpr` as it is when its references cannot be made
    pure. Under `jax_scan3` a `scan` keeps its carry in references."""
    try:
        return functionalize(jaxpr, consts)
    except JaxinterpError:
        return jaxpr, consts


Interpreter._without_references = staticmethod(_without_references)  # type: ignore[method-assign]
