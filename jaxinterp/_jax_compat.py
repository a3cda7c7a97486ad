"""Everything that depends on JAX internals or on the JAX version, in one place.

jaxinterp supports the JAX releases declared in `pyproject.toml` (0.7 to 0.12,
`SUPPORTED_JAX` below). What moves between them, and where it is read:

* primitive identity and names: `pjit` became `jit` (0.7); `call_p` and
  `closed_call_p` are one primitive named `eval_jaxpr` from 0.12
  (`core_call_p` is `None` there);
* higher-order params: `scan` replaced `num_consts`/`num_carry` by the
  flat-tree descriptors `ft_in`/`ft_out` in 0.11 (`scan_params`);
  `shard_map` renamed `check_rep` to `check_vma` and `manual_axes` to
  `newly_manual_axes` (`shard_map_params`); `jit` gained `ctx_mesh` and
  layouts (`jit_params`);
* `Jaxpr` and `ClosedJaxpr` are one class from 0.11 (`open_jaxpr`,
  `jaxpr_consts`, `make_closed_jaxpr`, `as_closed`);
* `DropVar` and `jaxprs_in_params` join `jax.extend.core` in 0.8;
* `Primitive.get_bind_params` returns `(subfuns, params)` up to 0.7
  (`bind_eqn`).

Each reader returns a small named tuple, so the rest of the package never
indexes `eqn.params` of a higher-order primitive (a test greps for it).
`HIGHER_ORDER_PARAMS` lists, per higher-order primitive, every param the
readers either read or knowingly pass over; `tests/test_jax_versions.py`
walks the installed JAX's constructs and fails, naming the primitive and the
param, when a release adds or renames one.

The module is long on purpose: it is the one place that may import
`jax._src`, so a reader can audit every use of private JAX in one file.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.extend.core as jex_core
import jax.extend.core.primitives as jex_prims
import numpy as np
from jax.extend import source_info_util

JAX_VERSION_STR: str = jax.__version__
JAX_VERSION: tuple[int, ...] = tuple(
    int(part) for part in jax.__version__.split(".")[:3] if part.isdigit()
)

# The supported range, `[low, high)`, as in `pyproject.toml` (a test keeps the
# two equal). The upper bound is one minor release past the newest tested.
SUPPORTED_JAX: tuple[tuple[int, ...], tuple[int, ...]] = ((0, 7, 0), (0, 13, 0))


def _dotted(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


def unsupported_jax_message(version: Sequence[int] = JAX_VERSION) -> str | None:
    """The warning for a JAX release outside `SUPPORTED_JAX`, or `None`."""
    low, high = SUPPORTED_JAX
    if low <= tuple(version) < high:
        return None
    return (
        f"jaxinterp supports JAX >= {_dotted(low)}, < {_dotted(high)}; "
        f"JAX {_dotted(version)} is installed. Higher-order primitives change "
        "between JAX releases, so walks may fail or rebuild constructs "
        "differently. Install a supported JAX, or check for a newer jaxinterp."
    )


class UnsupportedJaxWarning(UserWarning):
    """Warned once on import when the installed JAX is outside the supported range.

    The range is `jaxinterp.SUPPORTED_JAX`, as declared in `pyproject.toml`.
    Silence it with `warnings.filterwarnings("ignore",
    category=jaxinterp.UnsupportedJaxWarning)` before importing jaxinterp.
    """


_warned_version = False


def warn_if_unsupported(version: Sequence[int] = JAX_VERSION) -> bool:
    """Warn once per process when `version` is outside `SUPPORTED_JAX`.

    Returns whether a warning was issued by this call.
    """
    global _warned_version
    message = unsupported_jax_message(version)
    if message is None or _warned_version:
        return False
    _warned_version = True
    import warnings

    warnings.warn(message, UnsupportedJaxWarning, stacklevel=3)
    return True


ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Var = jex_core.Var
Primitive = jex_core.Primitive
# `jax.core` keeps `ShapedArray` and `Tracer` public in every supported release
# (0.11 removed other deprecated `jax.core` names); read them here only.
ShapedArray = jax.core.ShapedArray
Tracer = jax.core.Tracer


def _private_attr(module_name: str, attr: str) -> Any:
    """Fetch a name JAX does not export (yet); `None` if it is absent."""
    try:
        module = __import__(module_name, fromlist=[attr])
    except ImportError:
        return None
    return getattr(module, attr, None)


# `jax.extend.core` exports `DropVar` and `jaxprs_in_params` from JAX 0.8 on.
DropVar = getattr(jex_core, "DropVar", None) or _private_attr(
    "jax._src.core", "DropVar"
)
jaxprs_in_params = getattr(jex_core, "jaxprs_in_params", None) or _private_attr(
    "jax._src.core", "jaxprs_in_params"
)


def _first_attr(*candidates: tuple[Any, str]) -> Any:
    for module, name in candidates:
        value = getattr(module, name, None)
        if value is not None:
            return value
    return None


def _private_primitive(module_name: str, attr: str) -> Any:
    """Fetch a primitive JAX does not export (yet); `None` if it is absent.

    Used for `remat_p` before `jax.extend` exported it (JAX < 0.8),
    `shard_map_p` and `xla_pmap_p`, which `jax.extend` does not export in any
    supported release.
    """
    return _private_attr(module_name, attr)


jit_p = _first_attr((jex_prims, "jit_p"), (jex_prims, "pjit_p"))
closed_call_p = jex_prims.closed_call_p
# JAX 0.12 merges `call_p` and `closed_call_p` into one primitive, `eval_jaxpr`
# (jax-ml/jax#39593); before, `call_p` (`core_call`) carries an open Jaxpr.
# `None` when there is no separate `core_call` primitive.
core_call_p = jex_prims.call_p if jex_prims.call_p is not closed_call_p else None
cond_p = jex_prims.cond_p
scan_p = jex_prims.scan_p
while_p = jex_prims.while_p
custom_jvp_call_p = jex_prims.custom_jvp_call_p
custom_vjp_call_p = jex_prims.custom_vjp_call_p
remat_p = getattr(jex_prims, "remat_p", None) or _private_primitive(
    "jax._src.ad_checkpoint", "remat_p"
)
shard_map_p = _private_primitive("jax._src.shard_map", "shard_map_p")
pmap_p = _private_primitive("jax._src.interpreters.pxla", "xla_pmap_p")


# --------------------------------------------------------------------------
# ClosedJaxpr access (0.12 merges ClosedJaxpr into Jaxpr).


def open_jaxpr(jaxpr: Any) -> Any:
    """Return the `Jaxpr` inside a `ClosedJaxpr` (or `jaxpr` itself)."""
    return getattr(jaxpr, "jaxpr", jaxpr)


def jaxpr_consts(jaxpr: Any) -> Sequence[Any]:
    """Return the consts of a `ClosedJaxpr`, or `()` for an open `Jaxpr`."""
    return getattr(jaxpr, "consts", ())


def make_closed_jaxpr(jaxpr: Any, consts: Sequence[Any]) -> Any:
    """Build a `ClosedJaxpr` from an open jaxpr and its consts."""
    return ClosedJaxpr(jaxpr, list(consts))


# From JAX 0.11 a `Jaxpr` carries its consts: its constvars are the leading
# inputs it holds values for.
_JAXPR_CARRIES_CONSTS = hasattr(Jaxpr, "consts")


def replace_with_consts(
    jaxpr: Any, constvars: Sequence[Any], consts: Sequence[Any], **changes: Any
) -> Any:
    """`jaxpr.replace(constvars=constvars, **changes)`, with the values of
    those constvars where a `Jaxpr` carries them (JAX 0.11 on: replacing its
    constvars alone would make them inputs)."""
    if _JAXPR_CARRIES_CONSTS:
        changes["consts"] = list(consts)
    return jaxpr.replace(constvars=list(constvars), **changes)


def as_closed(jaxpr: Any) -> Any:
    """`jaxpr` as a `ClosedJaxpr`: a closed one as it is, an open one with no consts.

    From JAX 0.11 every `Jaxpr` is closed (it carries its own `consts`), so
    wrapping it again would drop them.
    """
    if isinstance(jaxpr, ClosedJaxpr):
        return jaxpr
    return ClosedJaxpr(jaxpr, [])


# --------------------------------------------------------------------------
# Values.


# JAX's concrete array class (`jax.Array` is an abstract base that tracers also
# register with). Used only for fast type checks; `None` if it moves.
_ArrayImpl = _private_attr("jax._src.array", "ArrayImpl")
_SingleDeviceSharding = jax.sharding.SingleDeviceSharding


def array_impl_type() -> Any:
    """JAX's concrete array class, for fast type checks (`type(x) is ...`);
    `None` if it moved (every such check then fails, taking the general
    path)."""
    return _ArrayImpl


def aval_of(value: Any) -> Any:
    """Return the abstract value of an array, tracer or Python scalar.

    The same as `jax.typeof`, with a shortcut for arrays on one device, whose
    type carries no sharding: their `aval`.
    """
    if type(value) is _ArrayImpl and type(value.sharding) is _SingleDeviceSharding:
        return value.aval
    return jax.typeof(value)


def _avals_stage_as_they_are() -> bool:
    """Whether `jax.make_jaxpr` takes abstract values as arguments, keeping
    every attribute (weak type, sharding, varying manual axes, memory space).

    True from JAX 0.7 to 0.12 (checked); probed once, so a release that stops
    accepting them falls back to `jax.ShapeDtypeStruct`s.
    """
    global _avals_stage
    if _avals_stage is None:
        probe = ShapedArray((2,), np.dtype("float32"), weak_type=True)
        try:
            staged = jax.make_jaxpr(lambda v: v)(probe)
            _avals_stage = list(staged.in_avals) == [probe]
        except Exception:  # pragma: no cover - a release refusing avals
            _avals_stage = False
    return _avals_stage


_avals_stage: bool | None = None


def staging_spec(aval: Any) -> Any:
    """What to pass `jax.make_jaxpr` to stage an argument of type `aval`.

    The argument's Jaxpr variable then has `aval` itself as `jax.make_jaxpr`
    gives it for a value of that type: dtype, shape and weak type, and
    also the sharding of an array on a mesh with explicit axes
    (`float32[8@a,4@b]`), the varying manual axes of a value inside a
    `shard_map` body (`float32[2]{V:d}`, `vma`), and its memory space.
    The aval itself where JAX takes it (`_avals_stage_as_they_are`);
    otherwise a `jax.ShapeDtypeStruct` with the attributes it accepts.
    """
    if _avals_stage_as_they_are() or is_ref_aval(aval):
        return aval
    options: dict[str, Any] = {"weak_type": aval.weak_type}
    sharding = getattr(aval, "sharding", None)
    if sharding is not None:
        options["sharding"] = sharding
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:  # JAX >= 0.10
        options["manual_axis_type"] = mat
    elif getattr(aval, "vma", None):
        options["vma"] = aval.vma
    try:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, **options)
    except TypeError:  # pragma: no cover - a keyword this release lacks
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def is_tracer(value: Any) -> bool:
    """Whether `value` is a JAX tracer (a value of some ongoing trace)."""
    return isinstance(value, Tracer)


def bind_eqn(prim: Any, invals: Sequence[Any], params: dict[str, Any]) -> list[Any]:
    """Bind `prim` as `jax.core.eval_jaxpr` does, always returning a list.

    `Primitive.get_bind_params` returns `(subfuns, params)` up to JAX 0.7 and
    just `params` from 0.8 on.
    """
    bound = prim.get_bind_params(params)
    if isinstance(bound, dict):
        out = prim.bind(*invals, **bound)
    else:
        subfuns, bind_params = bound
        out = prim.bind(*subfuns, *invals, **bind_params)
    return list(out) if prim.multiple_results else [out]


def is_eager() -> bool:
    """Whether no transformation is tracing: the ambient trace is JAX's eval trace.

    `jax._src.core.trace_ctx` (JAX >= 0.4.36) has no public equivalent; if it is
    missing, report "not eager" so callers take the plain `bind` path.
    """
    if _trace_ctx is None:  # pragma: no cover - other JAX layouts
        return False
    return type(_trace_ctx.trace) is _EvalTrace


_trace_ctx = _private_attr("jax._src.core", "trace_ctx")
_EvalTrace = _private_attr("jax._src.core", "EvalTrace")

# The effects of `jax.debug.print` and `jax.debug.callback` (unordered and
# ordered): their classes have no public name.
_DEBUG_EFFECTS = tuple(
    c
    for c in (
        _private_attr("jax._src.debugging", "DebugEffect"),
        _private_attr("jax._src.debugging", "OrderedDebugEffect"),
    )
    if c is not None
)


def debug_effects_only(effects: Any) -> bool:
    """Whether `effects` (an equation's) are all those of debug prints and
    callbacks (`jax.debug.print`, `jax.debug.callback`), and there is one."""
    return (
        bool(effects)
        and bool(_DEBUG_EFFECTS)
        and all(isinstance(e, _DEBUG_EFFECTS) for e in effects)
    )


_compiling_impl: dict[Any, bool] = {}


def dispatches_by_compiling(prim: Any) -> bool:
    """Whether `prim`'s eager `impl` is JAX's compile-and-run dispatch.

    True for JAX's own primitives (`impl` is `partial(apply_primitive, prim)`
    in `jax._src.dispatch`, unchanged from 0.4 to 0.10); false for users'
    primitives with a Python `impl`, which may have no lowering at all.
    """
    known = _compiling_impl.get(prim)
    if known is None:
        try:
            from jax._src import dispatch

            impl = prim.impl
            known = bool(
                isinstance(impl, functools.partial)
                and impl.func is dispatch.apply_primitive
            )
        except (ImportError, AttributeError):  # pragma: no cover
            known = False
        _compiling_impl[prim] = known
    return known


_xla_primitive_callable = _private_attr("jax._src.dispatch", "xla_primitive_callable")
_disable_jit_state = _private_attr("jax._src.config", "disable_jit")
if not hasattr(_disable_jit_state, "swap_local"):  # pragma: no cover
    _disable_jit_state = None


def primitive_callable(prim: Any, params: dict[str, Any]) -> Any:
    """JAX's own cached `jax.jit` of `prim` alone with `params`, as a function
    returning a list of results, or `None`.

    It is what eager `bind` of one of JAX's primitives calls
    (`jax._src.dispatch.apply_primitive`, no public equivalent): calling it
    directly shares JAX's compilation cache, so a primitive the program
    already ran eagerly is not compiled again. `None` where the primitive
    does not dispatch by compiling, its params are unhashable, or this JAX
    lacks the function.
    """
    if _xla_primitive_callable is None or not dispatches_by_compiling(prim):
        return None
    try:
        jitted = _xla_primitive_callable(prim, **params)
    except TypeError:  # unhashable params
        return None
    state = _disable_jit_state
    if state is None:  # pragma: no cover - other JAX layouts
        if prim.multiple_results:
            return jitted
        return lambda *args: [jitted(*args)]
    # As `apply_primitive`: `jit` keys its executables by the thread's
    # explicitly set `disable_jit`, so a call made otherwise would compile
    # again what eager `bind` compiled.
    swap, restore = state.swap_local, state.set_local
    several = prim.multiple_results

    def call(*args: Any) -> Any:
        prev = swap(False)
        try:
            out = jitted(*args)
        finally:
            restore(prev)
        return out if several else [out]

    return call


# Concrete operands: arrays, and the NumPy or Python values of literals.
_eager_types = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def is_concrete(value: Any) -> bool:
    """Whether `value` is a concrete operand: an array or scalar, not a tracer."""
    return type(value) is _ArrayImpl or (
        isinstance(value, _eager_types) and not isinstance(value, jax.core.Tracer)
    )


def all_concrete(values: Sequence[Any]) -> bool:
    """Whether every value is a concrete operand (see `is_concrete`)."""
    for x in values:
        if type(x) is not _ArrayImpl and not is_concrete(x):
            return False
    return True


def _eqn_context_builder() -> Any:
    """A function returning the current `JaxprEqnContext`, or `None` if unknown.

    JAX >= 0.8 interns the context (`JaxprEqnContext()` reads the config; equal
    contexts are the same object); 0.7 builds it from explicit fields and
    compares by value. `eqn.ctx` has no public equivalent.
    """
    try:
        from jax._src import core as _core

        context_cls: Any = _core.JaxprEqnContext
        try:
            context_cls()
            return context_cls
        except TypeError:
            from jax._src import config, xla_metadata_lib

            compute_on: Any = __import__("jax._src.compute_on", fromlist=["_"])

            def build() -> Any:
                return context_cls(
                    compute_on.current_compute_type(),
                    config.threefry_partitionable.value,
                    xla_metadata_lib.current_xla_metadata(),
                )

            build()
            return build
    except Exception:  # pragma: no cover - other JAX layouts
        return lambda: None


_build_eqn_context = _eqn_context_builder()


def ambient_eqn_context() -> Any:
    """The equation context JAX would record now (`None` if unknown).

    An equation whose `ctx` is the same (`same_eqn_context`) runs the same
    without entering its context.
    """
    return _build_eqn_context()


def same_eqn_context(a: Any, b: Any) -> bool:
    """Whether two equation contexts are the same (identical or equal)."""
    return a is b or (a is not None and a == b)


_BatchTracer = _private_attr("jax._src.interpreters.batching", "BatchTracer")
# `JVPTracer` has no public name (`jax.interpreters.ad` re-exports it only on
# some releases).
_JVPTracer = _private_attr("jax._src.interpreters.ad", "JVPTracer")


def is_jvp_tracer(value: Any) -> bool:
    """Whether `value` is being differentiated in forward mode by the
    innermost trace (`jax.jvp`, `jax.jacfwd`; `False` where JAX lacks the
    class)."""
    return _JVPTracer is not None and isinstance(value, _JVPTracer)


def vmap_levels(value: Any) -> list[tuple[int, int]] | None:
    """The `jax.vmap` levels `value` is batched in, innermost first.

    Each level is `(id of its trace, batch axis)`: the value's shape as a
    staged Jaxpr sees it is the per-example shape with each level's axis
    inserted in turn. `[]` for an unbatched value; `None` when a level's
    batch axis is not a plain axis. `BatchTracer` has no public equivalent.
    """
    levels: list[tuple[int, int]] = []
    while _BatchTracer is not None and isinstance(value, _BatchTracer):
        dim = value.batch_dim
        if type(dim) is not int:
            return None
        levels.append((id(getattr(value, "_trace", None)), dim))
        value = value.val
    return levels


def eqn_contexts(eqn: Any) -> tuple[Any, Any]:
    """The two context managers `jax.core.eval_jaxpr` enters around each bind.

    The first makes anything traced inside cite the equation's user source
    line and name stack; the second restores the equation's context
    (`compute_on`, XLA metadata...). `eqn.ctx` is not part of `jax.extend`.
    """
    info = eqn.source_info
    name_stack = source_info_util.current_name_stack()
    if info.name_stack:  # adding an empty stack would only copy the current one
        name_stack = name_stack + info.name_stack
    return (
        source_info_util.user_context(info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    )


# --------------------------------------------------------------------------
# Higher-order primitive params.


class ParamCoverage(NamedTuple):
    """What jaxinterp does with each param of one higher-order primitive.

    `read`: params a reader below reads (in some supported release).
    `passed_over`: params it knowingly leaves alone, with the reason in the
    comment beside the entry. A param in neither set is new to jaxinterp.
    """

    read: frozenset[str]
    passed_over: frozenset[str]


def _coverage(read: str, passed_over: str = "") -> ParamCoverage:
    return ParamCoverage(frozenset(read.split()), frozenset(passed_over.split()))


# Keyed by primitive name, over every supported release.
HIGHER_ORDER_PARAMS: dict[str, ParamCoverage] = {
    # `ctx_mesh` is the mesh in context, which the rebuilt `jax.jit` traces
    # under as well; layouts are not rebuilt (jaxinterp's sharding work).
    "jit": _coverage(
        "jaxpr name inline keep_unused donated_invars in_shardings out_shardings "
        "compiler_options_kvs",
        "ctx_mesh in_layouts out_layouts",
    ),
    "cond": _coverage("branches"),
    # `lax.scan` derives `linear` and `_split_transpose` (gone in 0.10) and
    # the `ft_in`/`ft_out` forwarding descriptors (0.11) itself.
    "scan": _coverage(
        "jaxpr length reverse unroll num_consts num_carry ft_in",
        "ft_out linear _split_transpose",
    ),
    "while": _coverage("cond_jaxpr cond_nconsts body_jaxpr body_nconsts"),
    # `differentiated` is set by JAX's own autodiff, never by a user.
    "checkpoint": _coverage("jaxpr prevent_cse policy", "differentiated"),
    # Custom-derivative calls are re-bound with only the body swapped: their
    # rules (`jvp_jaxpr_fun`, `fwd_jaxpr_thunk`, `bwd`...) are kept as they are.
    "custom_jvp_call": _coverage(
        "call_jaxpr num_consts", "jvp_jaxpr_fun symbolic_zeros"
    ),
    "custom_vjp_call": _coverage(
        "call_jaxpr num_consts", "fwd_jaxpr_thunk bwd out_trees symbolic_zeros"
    ),
    "closed_call": _coverage("call_jaxpr"),
    "core_call": _coverage("call_jaxpr"),
    "eval_jaxpr": _coverage("call_jaxpr"),  # JAX >= 0.12: `call_p` and `closed_call_p`
    "custom_linear_solve": _coverage("const_lengths jaxprs"),
    # JAX >= 0.11 hijax primitives: `_prim` holds the body (`hijax_params`).
    "call_hi_primitive": _coverage("_prim"),
    "shard_map": _coverage(
        "jaxpr mesh in_specs out_specs check_vma check_rep newly_manual_axes "
        "manual_axes auto"
    ),
    # `jax.pmap` before JAX 0.10 (`pmap_params`).
    "xla_pmap": _coverage(
        "call_jaxpr axis_name axis_size in_axes out_axes devices backend name "
        "donated_invars global_axis_size is_explicit_global_axis_size"
    ),
}
# `checkpoint` is named `remat2` (its historical name) in every supported release.
HIGHER_ORDER_PARAMS["remat2"] = HIGHER_ORDER_PARAMS["checkpoint"]

# Primitives whose params hold a Jaxpr that is not a body to walk: it describes
# the scalar combiner of a reduction or scatter, which runs inside the
# primitive. Walkers re-bind these like first-order primitives.
FIRST_ORDER_WITH_JAXPRS: frozenset[str] = frozenset(
    """scatter scatter-add scatter_add scatter-sub scatter_sub scatter-mul
    scatter_mul scatter-min scatter_min scatter-max scatter_max reduce
    reduce_window select_and_scatter""".split()
)

# Higher-order primitives walkers re-bind as they are under every policy, with
# the reason (none: `xla_pmap`, what `jax.pmap` stages before JAX 0.10, is
# walked and rebuilt like the other constructs).
REBOUND_HIGHER_ORDER: dict[str, str] = {}


# Higher-order primitives whose bodies are not visible as Jaxpr params: JAX's
# "hijax" user-defined primitives (`jax_custom_jvp3`, `jax_custom_vjp3`,
# `jax_remat3`, `jax_scan3`, future defaults from JAX 0.11) keep theirs inside
# a primitive object (see "Hijax primitives" below, and the walker's handler).
OPAQUE_BODY_PRIMITIVES: frozenset[str] = frozenset({"call_hi_primitive"})

_hop_memo: dict[Any, bool] = {}


def is_unhandled_higher_order(eqn: Any) -> bool:
    """Whether `eqn`'s primitive carries sub-Jaxprs no walker knows how to enter.

    False for primitives listed in `FIRST_ORDER_WITH_JAXPRS` and
    `REBOUND_HIGHER_ORDER`. Decided once per primitive, from the first
    equation seen.
    """
    prim = eqn.primitive
    known = _hop_memo.get(prim)
    if known is None:
        name = prim.name
        known = name in OPAQUE_BODY_PRIMITIVES or (
            name not in FIRST_ORDER_WITH_JAXPRS
            and name not in REBOUND_HIGHER_ORDER
            and any(True for _ in jaxprs_in_params(eqn.params))
        )
        _hop_memo[prim] = known
    return known


def params_of(eqn_or_params: Any) -> dict[str, Any]:
    """The params of an equation, or `eqn_or_params` itself if it is a dict."""
    params = getattr(eqn_or_params, "params", eqn_or_params)
    if not isinstance(params, dict):
        raise TypeError(
            "expected a `JaxprEqn` or its `params` dict, got "
            f"{type(eqn_or_params).__name__}"
        )
    return params


class JitParams(NamedTuple):
    jaxpr: Any  # ClosedJaxpr
    name: str
    inline: bool
    keep_unused: bool
    donated: tuple[bool, ...]
    # Per flat input / output: a `jax.sharding.Sharding`, or JAX's private
    # "unspecified" marker, which `jax.jit` accepts back as it is.
    in_shardings: tuple[Any, ...]
    out_shardings: tuple[Any, ...]
    compiler_options: tuple[tuple[str, Any], ...]


def jit_params(params: Any) -> JitParams:
    """Return the params of a `jit` equation, the same in every supported JAX.

    Args:
        params: a `jit` equation, or its `params` dict.

    Returns:
        A named tuple: `jaxpr` (the body, a `ClosedJaxpr`), `name`, `inline`,
        `keep_unused`, `donated` (one flag per input), `in_shardings`,
        `out_shardings` and `compiler_options`.
    """
    params = params_of(params)
    jaxpr = params["jaxpr"]
    n_in = len(open_jaxpr(jaxpr).invars)
    return JitParams(
        jaxpr=jaxpr,
        name=params.get("name", "jit"),
        inline=bool(params.get("inline", False)),
        keep_unused=bool(params.get("keep_unused", False)),
        donated=tuple(params.get("donated_invars", (False,) * n_in)),
        in_shardings=tuple(params.get("in_shardings", ())),
        out_shardings=tuple(params.get("out_shardings", ())),
        compiler_options=tuple(params.get("compiler_options_kvs", ())),
    )


def jit_options(p: JitParams) -> dict[str, Any]:
    """The `jax.jit` keyword arguments that rebuild the shardings of a `jit`.

    Only set when the original `jit` specified a sharding: unspecified entries
    are passed back as JAX's own marker (accepted from JAX 0.7 to 0.10).
    """
    options: dict[str, Any] = {}
    if any(isinstance(s, jax.sharding.Sharding) for s in p.in_shardings):
        options["in_shardings"] = p.in_shardings
    if any(isinstance(s, jax.sharding.Sharding) for s in p.out_shardings):
        options["out_shardings"] = p.out_shardings
    if p.compiler_options:
        options["compiler_options"] = dict(p.compiler_options)
    return options


def cond_branches(params: Any) -> tuple[Any, ...]:
    """Return the branches of a `cond` equation as `ClosedJaxpr`s, index 0 first.

    Args:
        params: a `cond` equation, or its `params` dict. Its first operand is
            the branch index; the others are every branch's operands.
    """
    return tuple(params_of(params)["branches"])


def cond_platform_branch(params: Any) -> int | None:
    """The branch a platform-dependent `cond` (`lax.platform_dependent`, as
    `jnp.diagonal` stages on JAX >= 0.9) takes on the default backend, or
    `None` for an ordinary `cond`.

    Args:
        params: a `cond` equation, or its `params` dict.
    """
    platforms = params_of(params).get("branches_platforms")
    if not platforms:
        return None
    backend = jax.default_backend()
    default = None
    for k, names in enumerate(platforms):
        if names is None:
            default = k
        elif backend in names:
            return k
    return default


class ScanParams(NamedTuple):
    jaxpr: Any  # ClosedJaxpr: (consts, carry, xs) -> (carry, ys)
    num_consts: int
    num_carry: int
    length: int
    reverse: bool
    unroll: int | bool


def scan_params(params: Any) -> ScanParams:
    """Return the params of a `scan` equation, the same in every supported JAX.

    JAX 0.11 replaced `num_consts` and `num_carry` by flat-tree descriptors;
    this reads either.

    Args:
        params: a `scan` equation, or its `params` dict.

    Returns:
        A named tuple: `jaxpr` (the body, a `ClosedJaxpr` taking
        `(*consts, *carry, *xs)` and returning `(*carry, *ys)`),
        `num_consts`, `num_carry`, `length`, `reverse` and `unroll`. The
        equation's operands are `(*consts, *carry, *xs)` and its results
        `(*carry, *ys)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda x: jax.lax.scan(lambda c, a: (c + a, c * a), 0.0, x)
        >>> (eqn,) = jax.make_jaxpr(f)(jnp.ones(3)).jaxpr.eqns
        >>> p = scan_params(eqn)
        >>> p.num_consts, p.num_carry, p.length
        (0, 1, 3)
    """
    params = params_of(params)
    ft_in = params.get("ft_in")
    if ft_in is not None:
        # JAX >= 0.11: flat-tree descriptors (consts, carry, xs) replace the
        # counts. Each part's `len` is its number of flat operands.
        consts, carry, _ = ft_in.unpack()
        num_consts, num_carry = len(consts), len(carry)
    else:
        num_consts, num_carry = params["num_consts"], params["num_carry"]
    return ScanParams(
        jaxpr=params["jaxpr"],
        num_consts=num_consts,
        num_carry=num_carry,
        length=params["length"],
        reverse=bool(params["reverse"]),
        unroll=params.get("unroll", 1),
    )


class WhileParams(NamedTuple):
    cond_jaxpr: Any
    cond_nconsts: int
    body_jaxpr: Any
    body_nconsts: int


def while_params(params: Any) -> WhileParams:
    """Return the params of a `while` equation, the same in every supported JAX.

    Args:
        params: a `while` equation, or its `params` dict.

    Returns:
        A named tuple: `cond_jaxpr`, `cond_nconsts`, `body_jaxpr`,
        `body_nconsts`. The equation's operands are
        `(*cond_consts, *body_consts, *carry)`.
    """
    params = params_of(params)
    return WhileParams(
        cond_jaxpr=params["cond_jaxpr"],
        cond_nconsts=params["cond_nconsts"],
        body_jaxpr=params["body_jaxpr"],
        body_nconsts=params["body_nconsts"],
    )


class RematParams(NamedTuple):
    jaxpr: Any  # ClosedJaxpr (no consts before JAX 0.11)
    prevent_cse: bool
    policy: Any


def remat_params(params: Any) -> RematParams:
    """The params of a `checkpoint` equation (or its params dict)."""
    params = params_of(params)
    return RematParams(
        jaxpr=as_closed(params["jaxpr"]),
        prevent_cse=bool(params.get("prevent_cse", True)),
        policy=params.get("policy"),
    )


def call_jaxpr(params: Any) -> Any:
    """The body of `closed_call`, `core_call`, `custom_jvp_call`, `custom_vjp_call`.

    A `ClosedJaxpr`: `core_call`'s open Jaxpr (before JAX 0.12) is closed
    with no consts.
    """
    return as_closed(params_of(params)["call_jaxpr"])


def call_name(params: Any) -> str:
    """The Python name of the function a call-like primitive wraps, or `""`.

    Read from the body's `debug_info.func_src_info` ("name at file:line"),
    present from JAX 0.4.36 on.
    """
    body = params_of(params).get("call_jaxpr")
    info = getattr(open_jaxpr(body), "debug_info", None) if body is not None else None
    src = getattr(info, "func_src_info", None) or getattr(info, "func_name", None)
    return src.split(" ", 1)[0] if isinstance(src, str) else ""


def custom_call_num_consts(params: Any) -> int:
    return int(params_of(params).get("num_consts", 0))


def replace_call_jaxpr(params: dict[str, Any], new_jaxpr: Any) -> dict[str, Any]:
    """Return `params` with the body swapped for `new_jaxpr` (a `ClosedJaxpr`)."""
    return {**params, "call_jaxpr": new_jaxpr}


linear_solve_p = _first_attr(
    (jex_prims, "linear_solve_p"), (jex_prims, "custom_linear_solve_p")
) or _private_primitive("jax._src.lax.control_flow.solves", "linear_solve_p")


class LinearSolveParams(NamedTuple):
    # Per role (`matvec`, `vecmat`, `solve`, `transpose_solve`): how many of
    # the leading operands are that role's consts, and its `ClosedJaxpr` (or
    # `None`). The right-hand sides follow the consts.
    roles: tuple[str, ...]
    const_lengths: tuple[int, ...]
    jaxprs: tuple[Any, ...]


def linear_solve_params(params: Any) -> LinearSolveParams:
    """The params of a `custom_linear_solve` equation (or its params dict)."""
    params = params_of(params)
    lengths, jaxprs = params["const_lengths"], params["jaxprs"]
    return LinearSolveParams(
        roles=tuple(lengths._fields),
        const_lengths=tuple(lengths),
        jaxprs=tuple(jaxprs),
    )


def replace_linear_solve_jaxprs(
    params: dict[str, Any], new_jaxprs: Sequence[Any]
) -> dict[str, Any]:
    """Return `params` with the per-role Jaxprs replaced (same roles, same order)."""
    jaxprs = params["jaxprs"]
    return {**params, "jaxprs": type(jaxprs)(*new_jaxprs)}


class ShardMapParams(NamedTuple):
    jaxpr: Any  # ClosedJaxpr (no consts before JAX 0.11)
    mesh: Any
    in_specs: tuple[Any, ...]
    out_specs: tuple[Any, ...]
    check: bool
    axis_names: frozenset[Any]


def shard_map_params(params: Any) -> ShardMapParams:
    """The params of a `shard_map` equation (or its params dict)."""
    params = params_of(params)
    mesh = params["mesh"]
    check = params.get("check_vma", params.get("check_rep", True))
    # `manual_axes` (0.7 to 0.10) is renamed `newly_manual_axes` in 0.11.
    axis_names = params.get("newly_manual_axes", params.get("manual_axes"))
    if axis_names is None:
        auto = params.get("auto", frozenset())
        axis_names = frozenset(mesh.axis_names) - frozenset(auto)
    return ShardMapParams(
        jaxpr=as_closed(params["jaxpr"]),
        mesh=mesh,
        in_specs=tuple(params["in_specs"]),
        out_specs=tuple(params["out_specs"]),
        check=bool(check),
        axis_names=frozenset(axis_names),
    )


def shard_map(
    fn: Any, p: ShardMapParams
) -> Any:  # pragma: no cover - exercised in multi-device tests
    """Rebuild a `shard_map` around `fn` with the params of an existing one."""
    return jax.shard_map(
        fn,
        mesh=p.mesh,
        in_specs=p.in_specs,
        out_specs=p.out_specs,
        check_vma=p.check,
        axis_names=set(p.axis_names),
    )


def varying_axes(aval: Any) -> frozenset[Any]:
    """The manual mesh axes a value of type `aval` varies over (inside a
    `shard_map` body; empty elsewhere).

    `aval.vma` up to JAX 0.9; `aval.manual_axis_type.varying` from 0.10.
    """
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()))
    return frozenset(getattr(aval, "vma", None) or ())


def in_manual_body() -> bool:
    """Whether tracing is inside a `shard_map` body: the ambient abstract mesh
    has manual axes. Values there, constants included, belong to a shard, so
    they cannot be computed eagerly (`jax.ensure_compile_time_eval`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and bool(getattr(mesh, "manual_axes", ()))


def vary_like(values: Any, like: Any) -> Any:
    """`values` (a pytree of arrays) made to vary over the manual mesh axes
    the array `like` varies over: see `vary_over`."""
    return vary_over(values, varying_axes(jax.typeof(like)))


def vary_over(values: Any, axes: frozenset[Any]) -> Any:
    """`values` (a pytree of arrays) made to vary over the manual mesh axes
    `axes` too, inside a `shard_map` body with `check_vma=True`: the carry
    of a loop that starts invariant and comes back varying is a type error,
    and so is an equation replayed with operands varying unlike the Jaxpr's.
    With no axes (outside a body, or `check_vma=False`) the values are
    returned as they are.

    `lax.pvary` up to JAX 0.9, `lax.pcast(..., to="varying")` from 0.10.
    """
    if not axes:
        return values

    def one(value: Any) -> Any:
        missing = tuple(sorted(axes - varying_axes(jax.typeof(value)), key=str))
        if not missing:
            return value
        pcast = getattr(jax.lax, "pcast", None)
        if pcast is not None:
            return pcast(value, missing, to="varying")
        pvary = getattr(jax.lax, "pvary")  # noqa: B009 - absent from JAX 0.10
        return pvary(value, missing)

    return jax.tree.map(one, values)


def varies_over_manual_axes(eqn: Any) -> bool:
    """Whether a result of `eqn` varies over manual mesh axes: it is computed
    per shard in a `shard_map` body, so no concrete value outside one can
    stand for it.

    Also true of an equation that names mapped axes (`axis_index`, `psum`,
    ... : an `axis_name` or `axes` param holding names, not dimensions): with
    `check_vma=False` (and in `jax.pmap`'s bodies) no type says it varies, but
    outside its `shard_map` the axis is unbound.
    """
    if any(varying_axes(v.aval) for v in eqn.outvars):
        return True
    return bool(named_axes(eqn))


def named_axes(eqn: Any) -> tuple[Any, ...]:
    """The mapped axis names an equation's `axis_name` or `axes` param holds
    (`psum`, `axis_index`, `all_gather`, ...); none for a reduction's integer
    `axes`."""
    params = eqn.params
    names = params.get("axis_name", params.get("axes", ()))
    names = names if isinstance(names, tuple | list) else (names,)
    return tuple(
        n for n in names if n is not None and not isinstance(n, int | np.integer)
    )


def has_explicit_axes(sharding: Any) -> bool:
    """Whether `sharding` is a `NamedSharding` on a mesh with an Explicit axis
    (`jax.sharding.AxisType.Explicit`): arrays placed with it carry the
    sharding in their type (`float32[8@a,4@b]`)."""
    mesh = getattr(sharding, "mesh", None)
    axis_types = getattr(mesh, "axis_types", None) or ()
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    return explicit is not None and any(t == explicit for t in axis_types)


def take_at(table: Any, index: Any) -> Any:
    """`table[index]`: a small table (a constant, not sharded) read at traced
    indices. On a mesh with Explicit axes JAX asks such a gather for the
    sharding of its result (`.at[...].get(out_sharding=)`), which is the
    indices' own."""
    sharding = getattr(jax.typeof(index), "sharding", None)
    if sharding is not None and has_explicit_axes(sharding):
        return table.at[index].get(out_sharding=sharding)
    return table[index]


def place_as(value: Any, sharding: Any) -> Any:
    """`value` placed with `sharding` inside a traced function.

    On a mesh with Explicit axes the sharding is part of the type, so the
    value is resharded (`jax.sharding.reshard`, JAX >= 0.7); otherwise it is
    returned as it is, for a `jax.jit`'s `out_shardings` to place.
    """
    reshard = getattr(jax.sharding, "reshard", None)
    if reshard is None or not has_explicit_axes(sharding):
        return value
    if jax.typeof(value).sharding.spec == sharding.spec:
        return value
    return reshard(value, sharding)


class PmapParams(NamedTuple):
    jaxpr: Any  # ClosedJaxpr: the per-device body, with no consts
    axis_name: Any
    axis_size: int  # this process's devices
    in_axes: tuple[int | None, ...]
    out_axes: tuple[int | None, ...]
    devices: Any
    backend: str | None
    name: str
    donated: tuple[bool, ...]
    # The size over every process, and whether the user gave it (`jax.pmap`'s
    # `axis_size`); otherwise `jax.pmap` derives it from the operands.
    global_axis_size: int
    explicit_axis_size: bool


def pmap_params(params: Any) -> PmapParams:
    """The params of an `xla_pmap` equation (what `jax.pmap` stages before
    JAX 0.10; later releases stage a `jit` of a `shard_map`)."""
    params = params_of(params)
    axis_size = int(params["axis_size"])
    in_axes = tuple(params["in_axes"])
    devices = params.get("devices")
    return PmapParams(
        jaxpr=as_closed(params["call_jaxpr"]),
        axis_name=params["axis_name"],
        axis_size=axis_size,
        in_axes=in_axes,
        out_axes=tuple(params["out_axes"]),
        devices=None if devices is None else tuple(devices),
        backend=params.get("backend"),
        name=str(params.get("name", "pmap")),
        donated=tuple(params.get("donated_invars", (False,) * len(in_axes))),
        global_axis_size=int(params.get("global_axis_size", axis_size)),
        explicit_axis_size=bool(params.get("is_explicit_global_axis_size", False)),
    )


def pmap(
    fn: Any,
    p: PmapParams,
    in_axes: Any,
    out_axes: Any,
    donate_argnums: tuple[int, ...] = (),
) -> Any:
    """A `jax.pmap` of `fn` on the devices and axis of an `xla_pmap` equation.

    `axis_size` is passed on only where the user gave it, as the global size:
    otherwise `jax.pmap` derives it from the operands, over every process.
    """
    return jax.pmap(
        fn,
        axis_name=p.axis_name,
        in_axes=in_axes,
        out_axes=out_axes,
        devices=p.devices,
        backend=p.backend,
        axis_size=p.global_axis_size if p.explicit_axis_size else None,
        donate_argnums=donate_argnums,
    )


# --------------------------------------------------------------------------
# Hijax primitives (JAX >= 0.11).
#
# With `jax_custom_jvp3`, `jax_custom_vjp3`, `jax_remat3` or `jax_scan3` on
# (future defaults, checked on JAX 0.11 and 0.12.0.1), `custom_jvp`,
# `custom_vjp`, `checkpoint` and `scan` stage one `call_hi_primitive` equation
# whose only param, `_prim`, is a `jax._src.hijax.HiPrim` object: the body and
# the derivative rules are its attributes, and `_prim.expand(*args)` gives the
# ordinary-JAX meaning. None of this is in `jax.extend`, so every access to
# those objects is here. The four classes jaxinterp rebuilds:
#
# * `CustomJVPTraced(traced, jvp_rule, in_avals, symbolic_zeros)`: operands
#   `(consts, *args)`, body `traced.jaxpr` (a `jax.stages.Traced`);
# * `CustomVJPTraced(traced, fwd, bwd, in_avals, symbolic_zeros, opt_remat,
#   with_logs, remat_rules, bwd_accums, generic_batching)`: operands
#   `(consts, fwd_consts, *args)`, body `traced.jaxpr` on `(consts, *args)`;
# * `RematTraced(jaxpr, policy, prevent_cse)`: body `jaxpr` on the operands;
# * `Scan3(extensives, length, jaxpr, reverse, unroll)`: operands one list
#   `xs`; `jaxpr` runs once per iteration on the operands, sliced at the
#   iteration where `extensives` says so; carries are mutable references.

call_hi_primitive_p = _private_attr("jax._src.hijax", "call_hi_primitive_p")
_HiPrim = _private_attr("jax._src.hijax", "HiPrim")
_CustomJVPTraced = _private_attr("jax._src.hijax", "CustomJVPTraced")
_CustomVJPTraced = _private_attr("jax._src.hijax", "CustomVJPTraced")
_RematTraced = _private_attr("jax._src.ad_checkpoint", "RematTraced")
_Scan3 = _private_attr("jax._src.lax.control_flow.loops", "Scan3")

# The kind of each hijax class jaxinterp rebuilds, and the primitive of the
# construct it replaces (so that policies keyed by `"scan"` or
# `"custom_jvp_call"` keep applying when the flags flip).
_HI_KINDS: dict[Any, tuple[str, str]] = {
    cls: kind
    for cls, kind in (
        (_CustomJVPTraced, ("custom_jvp", custom_jvp_call_p.name)),
        (_CustomVJPTraced, ("custom_vjp", custom_vjp_call_p.name)),
        (_RematTraced, ("checkpoint", remat_p.name)),  # `remat2` to JAX 0.12
        (_Scan3, ("scan", scan_p.name)),
    )
    if cls is not None
}


class HijaxParams(NamedTuple):
    """What a `call_hi_primitive` equation computes, read from its `_prim`."""

    kind: str  # "custom_jvp", "custom_vjp", "checkpoint", "scan" or "other"
    name: str  # the class of the hijax primitive, e.g. "RematTraced"
    # The body as a Jaxpr (with its consts), or `None` for "other": then
    # `expand_hi_primitive` traces the primitive's `expand`.
    body: Any
    # Which operands the body takes, in order (`None`: all of them).
    keep: tuple[bool, ...] | None
    # For "scan": the trip count and which operands are sliced per iteration.
    length: int
    extensives: tuple[bool, ...]
    # The name of the construct it replaces, for per-primitive policies.
    replaces: str
    prim: Any  # the `HiPrim` object itself
    # For "custom_jvp"/"custom_vjp": the wrapped function's name, and how
    # many leading operands are its closed-over consts.
    fun_name: str = ""
    n_consts: int = 0


def hijax_params(params: Any) -> HijaxParams:
    """Return what a `call_hi_primitive` equation (JAX >= 0.11) computes.

    Under JAX's opt-in flags `jax_custom_jvp3`, `jax_custom_vjp3`,
    `jax_remat3` and `jax_scan3`, `custom_jvp`, `custom_vjp`, `checkpoint`
    and `scan` stage as `call_hi_primitive` equations, whose body is not a
    Jaxpr param but an attribute of a primitive object.

    Args:
        params: a `call_hi_primitive` equation, or its `params` dict.

    Returns:
        A named tuple: `kind` (`"custom_jvp"`, `"custom_vjp"`,
        `"checkpoint"`, `"scan"`, or `"other"` for a user-defined hijax
        primitive), `name` (its class name), `body` (the Jaxpr it runs, or
        `None` for `"other"`), `keep` (which operands the body takes, `None`
        for all), `length` and `extensives` (for `"scan"`: the trip count,
        and which operands are sliced per iteration; the body runs once per
        iteration), `replaces` (the primitive name of the construct it
        replaces, or `name`) and `prim` (the primitive object).
    """
    prim = params_of(params)["_prim"]
    cls = type(prim)
    kind, replaces = _HI_KINDS.get(cls, ("other", cls.__name__))
    body: Any = None
    keep: tuple[bool, ...] | None = None
    length, extensives = 0, ()
    fun_name, n_consts = "", 0
    if kind in ("custom_jvp", "custom_vjp"):
        body = prim.traced.jaxpr
        fun_name = str(prim.traced.fun_name)
        n_consts = prim.in_tree.children()[0].num_leaves
        if kind == "custom_vjp":  # drop the `fwd_consts`, used by `fwd` only
            sizes = [child.num_leaves for child in prim.in_tree.children()]
            keep = tuple(i != 1 for i, n in enumerate(sizes) for _ in range(n))
    elif kind == "checkpoint":
        body = prim.jaxpr
    elif kind == "scan":
        body = prim.jaxpr
        length, extensives = int(prim.length), tuple(prim.extensives)
    return HijaxParams(
        kind,
        cls.__name__,
        body,
        keep,
        length,
        extensives,
        replaces,
        prim,
        fun_name,
        n_consts,
    )


def custom_jvp_body(eqn: Any) -> Any | None:
    """The body of a `custom_jvp` equation, JAX's hijax flags on or off (a
    `ClosedJaxpr` taking the equation's operands): `custom_jvp_call`'s
    `call_jaxpr`, or the traced function of a `call_hi_primitive` standing
    for one (`jax_custom_jvp3`); `None` for any other equation."""
    if eqn.primitive is custom_jvp_call_p:
        return call_jaxpr(eqn.params)
    if call_hi_primitive_p is not None and eqn.primitive is call_hi_primitive_p:
        hi = hijax_params(eqn)
        if hi.kind == "custom_jvp" and hi.keep is None:
            return as_closed(hi.body)
    return None


def expand_hi_primitive(prim: Any) -> Any:
    """Trace a hijax primitive's `expand` (its ordinary-JAX meaning) to a Jaxpr.

    The Jaxpr takes the equation's flat operands and returns its flat
    results. Raises `NotImplementedError` when the primitive has no `expand`.
    """
    from jax._src import tree_util as _tree_util

    in_tree, out_tree = prim.in_tree, prim.out_tree

    def expanded(*flat: Any) -> list[Any]:
        out = prim.expand(*_tree_util.tree_unflatten(in_tree, list(flat)))
        return list(_tree_util.tree_leaves_checked(out_tree, out))

    expanded.__name__ = expanded.__qualname__ = type(prim).__name__
    return jax.make_jaxpr(expanded)(*prim.in_avals_flat)


def sub_jaxprs(eqn: Any, *, expand: bool = True) -> list[Any]:
    """Return the open Jaxprs that `eqn` runs: the bodies, branches and
    rules held in its params, and the body of a hijax `call_hi_primitive`.

    Under JAX's hijax flags (JAX >= 0.11) the body of a `custom_jvp`,
    `custom_vjp`, `checkpoint` or `scan` is not a param but an attribute of
    the primitive object, so searching `params` alone misses it. A user's
    hijax primitive contributes its traced `expand` (with `expand=True`), or
    nothing when it has none.
    """
    found = [open_jaxpr(j) for j in jaxprs_in_params(params_of(eqn))]
    if eqn.primitive is call_hi_primitive_p:
        hi = hijax_params(eqn)
        body = hi.body
        if body is None and expand:
            try:
                body = expand_hi_primitive(hi.prim)
            except (NotImplementedError, TypeError):
                body = None
        if body is not None:
            found.append(open_jaxpr(body))
    return found


def construct_name(eqn: Any) -> str:
    """The name of `eqn`'s primitive, or, for a hijax `call_hi_primitive`, of
    the primitive of the construct it stands for (`scan`, `remat2`,
    `custom_jvp_call`, `custom_vjp_call`, or the class of a user's hijax
    primitive): how tables and reports name it, flags on or off."""
    if eqn.primitive is call_hi_primitive_p:
        return hijax_params(eqn).replaces
    return eqn.primitive.name


def iter_eqns(jaxpr: Any, *, expand: bool = True) -> Iterator[Any]:
    """Yield every equation of `jaxpr` (open or closed), then recursively
    those of the Jaxprs each one runs (`sub_jaxprs`, with `expand`)."""
    stack = [open_jaxpr(jaxpr)]
    while stack:
        for eqn in stack.pop().eqns:
            yield eqn
            stack.extend(sub_jaxprs(eqn, expand=expand))


def hoist_consts(jaxpr: Any) -> tuple[Any, list[Any]]:
    """Split a Jaxpr with consts into one taking them as leading inputs, and them.

    Hijax bodies (`RematTraced.jaxpr`, `Scan3.jaxpr`) take no consts, as in
    `jax._src.interpreters.partial_eval.separate_consts` (JAX 0.11, 0.12).
    """
    consts = list(jaxpr_consts(jaxpr))
    if not consts:
        return jaxpr, []
    return jaxpr.with_consts(()), consts


def rebuild_hi_primitive(h: HijaxParams, body: Any, n_hoisted: int = 0) -> Any:
    """A hijax primitive like `h.prim` with a new body, keeping its rules.

    `body`: for "custom_jvp"/"custom_vjp" a `jax.stages.Traced` taking the
    same arguments as the old one; for "checkpoint" and "scan" a Jaxpr
    without consts (see `hoist_consts`), whose first `n_hoisted` inputs are
    hoisted consts, passed as new leading operands.
    """
    prim = h.prim
    cls = type(prim)
    if h.kind == "custom_jvp":
        return cls(body, prim.jvp_rule, prim.in_avals, prim.symbolic_zeros)
    if h.kind == "custom_vjp":
        return cls(
            body,
            prim.fwd,
            prim.bwd,
            prim.in_avals,
            prim.symbolic_zeros,
            prim.opt_remat,
            prim.with_logs,
            prim.remat_rules,
            prim.bwd_accums,
            prim.generic_batching,
        )
    added = n_hoisted
    if h.kind == "checkpoint":
        cse = prim.prevent_cse
        if not isinstance(cse, bool):
            cse = (False,) * added + tuple(cse)
        return cls(body, prim.policy, cse)
    if h.kind == "scan":
        extensives = [False] * added + list(prim.extensives)
        return cls(extensives, prim.length, body, prim.reverse, prim.unroll)
    raise AssertionError(f"cannot rebuild hijax primitive {h.name}")


def traced_in_tree(traced: Any) -> Any:
    """The argument treedef `((args), {kwargs})` of a `jax.stages.Traced`.

    `Traced._in_tree` (JAX 0.11, 0.12) has no public equivalent.
    """
    return traced._in_tree


def bind_hi_primitive(prim: Any, invals: Sequence[Any]) -> list[Any]:
    """Apply a hijax primitive object to flat operands."""
    return list(call_hi_primitive_p.bind(*invals, _prim=prim))


def is_ref_aval(aval: Any) -> bool:
    """Whether `aval` is the type of a mutable reference (`jax.new_ref`)."""
    return _AbstractRef is not None and isinstance(aval, _AbstractRef)


_AbstractRef = _private_attr("jax._src.state.types", "AbstractRef")


# The config states that change how a function stages (JAX >= 0.11): JAX keys
# its own jit caches on them (`include_in_jit_key`), so staging caches must
# too. The states' `.value` is read directly: `jax.config.jax_scan3` goes
# through a slower attribute lookup, and this runs on every transformed call.
_STAGING_FLAG_STATES = tuple(
    state
    for state in (
        _private_attr("jax._src.config", name)
        for name in ("custom_jvp3", "custom_vjp3", "remat3", "scan3")
    )
    if state is not None
)


def staging_flags() -> tuple[bool, ...]:
    """The values of JAX's flags that change how functions stage (hijax flags)."""
    return tuple([bool(state.value) for state in _STAGING_FLAG_STATES])


def classic_scan() -> Any:
    """A context in which `lax.scan` stages the classic `scan` primitive.

    Turns `jax_scan3` off inside (`jax._src.config.scan3` is a context manager
    in JAX 0.11 and 0.12); a no-op context on releases without the flag.
    """
    import contextlib

    state = _private_attr("jax._src.config", "scan3")
    return contextlib.nullcontext() if state is None else state(False)


# Scan3's `expand` (its meaning, JAX 0.11 to 0.12.0.1) ignores `reverse`
# (a TODO there): it always runs forwards.
SCAN3_HONOURS_REVERSE = False


def hi_transformable(prim: Any) -> bool:
    """Whether JAX can differentiate (reverse mode) and batch the hijax
    primitive object `prim`: its class overrides `HiPrim.vjp_fwd` (or sets
    `vjp_from_jvp`/`vjp_from_lin`) and `HiPrim.batch`.

    `Scan3` has neither in JAX 0.11 to 0.12.0.1 (`jax.grad` and `jax.vmap`
    of a scan under `jax_scan3` fail in plain JAX); a capability check, so
    that a release adding them is used as it is.
    """
    if _HiPrim is None:
        return False
    cls = type(prim)
    grads = cls.vjp_fwd is not _HiPrim.vjp_fwd
    batches = cls.batch is not _HiPrim.batch
    return grads and batches


# Reference primitives, by name (JAX >= 0.8; `jax.ref` is their public API).
REF_PRIMITIVES: frozenset[str] = frozenset(
    {"new_ref", "empty_ref", "free_ref", "freeze", "get", "swap", "addupdate"}
)


def discharge_ref_eqn(
    eqn: Any, ref_value: Any, rest: Sequence[Any]
) -> tuple[Any, list[Any]]:
    """Apply a `get`, `swap` or `addupdate` equation to a reference's value.

    Returns the reference's new value (`None` if unchanged) and the
    equation's results, by JAX's own state-discharge rules
    (`jax._src.state.discharge`, JAX 0.8 to 0.12), which understand the
    indexers an equation may carry (`ref[1:3]`, `ref.at[i]`).
    """
    from jax._src.state import discharge

    ctx = discharge.DischargeContext(  # type: ignore[attr-defined]
        [v.aval for v in eqn.invars],
        [v.aval for v in eqn.outvars],
        [True] + [False] * (len(eqn.invars) - 1),
        False,
    )
    rule = discharge._discharge_rules[eqn.primitive]
    new_invals, outs = rule(ctx, ref_value, *rest, **eqn.params)
    return new_invals[0], list(outs) if eqn.primitive.multiple_results else [outs]


def touches_ref(eqn: Any) -> bool:
    """Whether an equation takes or returns a mutable reference.

    Some do without declaring an effect (`free_ref`; a hijax `Scan3` writing
    its carry), so walkers that reorder or fuse equations must check this
    too. `jax.ref.AbstractRef` is public from JAX 0.8; read here with the
    other reference helpers.
    """
    if _AbstractRef is None:
        return False
    for v in eqn.invars:
        if isinstance(v.aval, _AbstractRef):
            return True
    return any(isinstance(v.aval, _AbstractRef) for v in eqn.outvars)


# --------------------------------------------------------------------------
# Dead-code elimination and recursion depth.


def dce_closed_jaxpr(closed: Any) -> Any:
    """Drop equations whose results are unused (keeps effectful ones).

    `jax._src.interpreters.partial_eval.dce_jaxpr` has had the same
    signature from JAX 0.4.14 to 0.10; `jax.extend` does not export it.
    """
    from jax._src.interpreters import partial_eval as pe

    jaxpr = open_jaxpr(closed)
    new_jaxpr, used_inputs = pe.dce_jaxpr(
        jaxpr, [True] * len(jaxpr.outvars), instantiate=True
    )
    if all(used_inputs):
        return make_closed_jaxpr(new_jaxpr, jaxpr_consts(closed))
    # Inputs stay in the signature: put the unused ones back as invars.
    return make_closed_jaxpr(
        new_jaxpr.replace(invars=list(jaxpr.invars)), jaxpr_consts(closed)
    )


# Importing jaxinterp with a JAX outside the supported range warns, once.
warn_if_unsupported()


def dot_general_dimensions(eqn: Any) -> Any:
    """A `dot_general` equation's `((lhs_contract, rhs_contract), (lhs_batch,
    rhs_batch))` (the same name and layout in every JAX of the range)."""
    return params_of(eqn)["dimension_numbers"]


def transpose_permutation(eqn: Any) -> tuple[int, ...]:
    """A `transpose` equation's permutation: result axis `k` is operand axis
    `perm[k]`."""
    return tuple(params_of(eqn)["permutation"])


def squeeze_dimensions(eqn: Any) -> tuple[int, ...]:
    """A `squeeze` equation's removed axes of its operand, non-negative."""
    rank = len(eqn.invars[0].aval.shape)
    return tuple(sorted(int(k) % rank for k in params_of(eqn)["dimensions"]))


class TriangularSolveParams(NamedTuple):
    left_side: bool
    lower: bool
    transpose_a: bool
    conjugate_a: bool
    unit_diagonal: bool


def triangular_solve_params(eqn: Any) -> TriangularSolveParams:
    """A `triangular_solve` equation's flags (the same names in every JAX of
    the range)."""
    p = params_of(eqn)
    return TriangularSolveParams(
        bool(p["left_side"]),
        bool(p["lower"]),
        bool(p["transpose_a"]),
        bool(p["conjugate_a"]),
        bool(p["unit_diagonal"]),
    )


@functools.lru_cache(maxsize=256)
def _broadcast_params(have: tuple[int, ...], dtype: Any, shape: tuple[int, ...]) -> Any:
    """`broadcast_in_dim`'s parameters for `have -> shape` (same rank), as
    `lax.broadcast_in_dim` stages them: the set of parameters has changed
    across releases (`sharding` came in 0.4.36)."""
    staged = jax.make_jaxpr(
        lambda v: jax.lax.broadcast_in_dim(v, shape, tuple(range(len(shape))))
    )(jax.ShapeDtypeStruct(have, dtype))
    (eqn,) = staged.jaxpr.eqns
    return eqn.primitive, dict(eqn.params)


def broadcast_eqn(like: Any, operand: Any, shape: tuple[int, ...]) -> Any:
    """A `broadcast_in_dim` equation widening `operand` (an atom of the same
    rank as `shape`) to `shape`, with `like`'s source line and context (the
    equation that broadcast it implicitly)."""
    aval = operand.aval
    prim, params = _broadcast_params(tuple(aval.shape), aval.dtype, tuple(shape))
    out = Var(aval.update(shape=tuple(shape)))
    return like.replace(
        invars=[operand], outvars=[out], primitive=prim, params=dict(params)
    )
