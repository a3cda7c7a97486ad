"""Differential fuzzing of `jaxinterp.inverse`: random programs and a classifier.

A *program* is a straight-line Python function of one to three unknown arrays
and up to two known parameters, built statement by statement on a concrete
sample so every operation sees values inside its domain (`log` positives,
`atanh` values in (-1, 1), no overflow in `exp`). Each statement stages one
of the primitives `jaxinterp.inverse_rules` knows (through the `jnp`/`lax`
call users write), possibly wrapped in `jax.jit`, `jax.checkpoint`,
`custom_jvp`, `custom_vjp`, `lax.cond`, `lax.switch`, `lax.scan`,
`lax.fori_loop`, `lax.while_loop` or `jax.vmap`. Many programs are
deliberately not invertible (lossy operations, dropped outputs, copies).

`classify` runs `inverse_and_ildj(f, argnums=...)(y, *known)` eagerly and sorts
the outcome into

* `correct`: the result has the inputs' structure, no NaN, round-trips
  (`f(x_rec) == y`), every returned element influences some output (its
  column of `jacfwd(f)` is nonzero), `x_rec == x` when `f` is injective on the
  sample, and the ildj equals `-slogdet(jacfwd(f))` for square maps; and
  `jax.jit`, `jax.vmap` over a batch of outputs, `inverse` alone and `ildj`
  alone agree with it;
* `refused`: `NotInvertibleError` or `MissingRuleError` (and every variant
  refuses too);
* `wrong`: anything else returned, `Outcome.check` says which check failed;
* `crash`: any other exception (`RuleError` wrapping a `TypeError`, ...).

Programs render to source code (`Program.source`), so a failure comes with a
standalone reproducer (`Program.reproducer`), and `shrink` deletes statements,
outputs, wrappers and arguments while the failure persists.

The module is imported by `test_inverse_fuzz.py` (bounded, default suite) and
`fuzz_inverse_main.py` (long runs). It draws its choices through a `Chooser`,
backed by Hypothesis (`programs()`) or by `random.Random` (`generate`).
"""

from __future__ import annotations

import dataclasses
import random
import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from helpers import flags_off
from hypothesis import strategies as st
from jax import lax
from jax.flatten_util import ravel_pytree

import jaxinterp
from jaxinterp import _jax_compat as compat

__all__ = [
    "Chooser",
    "DrawChooser",
    "Outcome",
    "Program",
    "RandomChooser",
    "Stmt",
    "check_inverse",
    "classify",
    "generate",
    "op_names",
    "programs",
    "root_cause",
    "shrink",
]

# ---------------------------------------------------------------------------
# Choices: one interface over Hypothesis' `draw` and `random.Random`.


class Chooser:
    """Where a generator gets its choices from (subclasses give `integer`)."""

    def integer(self, lo: int, hi: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def boolean(self, p_true: float = 0.5) -> bool:
        """True with probability about `p_true` (shrinks towards False)."""
        return self.integer(0, 99) >= round(100 * (1 - p_true))

    def choice(self, seq: Sequence[Any]) -> Any:
        """An element of `seq` (shrinks towards the first)."""
        return seq[self.integer(0, len(seq) - 1)]


class RandomChooser(Chooser):
    """Choices from a seeded `random.Random`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DrawChooser(Chooser):
    """Choices from a Hypothesis `draw`, so failing programs shrink."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))


# ---------------------------------------------------------------------------
# Programs.

# Arguments and values are float32 (or int32 in integer programs); these
# shapes keep every array small, so Jacobians stay cheap and XLA compilations
# are shared between programs.
SHAPES: list[tuple[int, ...]] = [(3,), (2, 3), (4,), (), (3, 3), (1, 3), (2, 1, 2)]


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One statement `outs = expr(ins)`, maybe wrapped in a JAX construct.

    Attributes:
        op: the generator's name for the operation (used in root causes).
        ins: the operand variables, `{0}`, `{1}`... in `expr`.
        outs: the result variables (set when the statement is added).
        expr: a Python expression over `{k}` placeholders, `jnp`, `lax`, `jax`.
        nout: how many results `expr` returns (a tuple when more than one).
        guard: `guard(operand values) -> bool`, the domain the statement needs.
        branchy: `branchy(operand values) -> bool`, true when the operation is
            not injective on these values (a principal branch, a lossy cast).
        elementwise: the expression works row by row (for `vmap`/`scan` rows).
        wrapper: `plain`, `jit`, `checkpoint`, `custom_jvp`, `custom_vjp`,
            `cond`, `switch`, `scan`, `fori`, `while`, `scan_rows`, `vmap`.
        reps: how often a loop wrapper applies `expr` to its first operand.
        branch: the branch a `cond`/`switch` takes on the sample.
        pred: the rendered predicate or index, `{p}` standing for `pred_in`.
        pred_in: the known variable the predicate reads, if any.
        mapped: which operands a row wrapper maps (the others are scalars).
        keep: operands that remain outputs-to-be (conditioners), generation only.
    """

    op: str
    ins: tuple[str, ...]
    expr: str
    outs: tuple[str, ...] = ()
    nout: int = 1
    guard: Callable[[list[Any]], bool] | None = None
    branchy: Callable[[list[Any]], bool] | None = None
    elementwise: bool = False
    wrapper: str = "plain"
    reps: int = 1
    branch: int = 0
    pred: str = ""
    pred_in: str = ""
    keep: tuple[int, ...] = ()
    mapped: tuple[bool, ...] = ()  # per operand: mapped by `vmap`/`scan_rows`
    family: str = ""  # the generator op that drew it (see `op_names`)


@dataclasses.dataclass(frozen=True)
class Program:
    """A random function, its sample arguments and which ones are unknown."""

    arg_names: tuple[str, ...]
    unknown: tuple[str, ...]
    samples: tuple[tuple[str, Any], ...]  # (name, np.ndarray) per argument
    stmts: tuple[Stmt, ...]
    outputs: tuple[str, ...]
    single: bool = False  # return the one output bare, not in a tuple
    example_args: bool = True  # pass `example_args=` to the inverse

    @property
    def argnums(self) -> tuple[int, ...]:
        return tuple(self.arg_names.index(n) for n in self.unknown)

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(n for n in self.arg_names if n not in self.unknown)

    def sample(self, name: str) -> Any:
        return dict(self.samples)[name]

    def ops(self) -> list[str]:
        """The op names and non-plain wrappers of the statements."""
        names = [s.op for s in self.stmts]
        names += [f"wrap:{s.wrapper}" for s in self.stmts if s.wrapper != "plain"]
        return names

    def families(self) -> list[str]:
        """The generator ops (`op_names`) the statements come from."""
        return [s.family for s in self.stmts]

    def branchy(self) -> bool:
        """Whether a statement is not injective on the sample (a principal
        branch taken outside its branch, a lossy cast)."""
        return any(s.branchy is not None and _stmt_branchy(self, s) for s in self.stmts)

    def source(self, wrapped: bool = True, name: str = "f") -> str:
        """The program as a Python function definition."""
        lines = [f"def {name}({', '.join(self.arg_names)}):"]
        for i, s in enumerate(self.stmts):
            for line in _render(s, i, wrapped):
                lines.append("    " + line)
        if self.single:
            lines.append(f"    return {self.outputs[0]}")
        else:
            trail = "," if len(self.outputs) == 1 else ""
            lines.append(f"    return ({', '.join(self.outputs)}{trail})")
        return "\n".join(lines) + "\n"

    def build(self, wrapped: bool = True) -> Callable[..., Any]:
        """The program as a function (`wrapped=False`: no JAX constructs)."""
        ns = _namespace()
        exec(compile(self.source(wrapped), "<fuzz program>", "exec"), ns)  # noqa: S102
        return ns["f"]

    def args(self, samples: dict[str, Any] | None = None) -> list[Any]:
        samples = samples or dict(self.samples)
        return [jnp.asarray(samples[n]) for n in self.arg_names]

    def call_source(self) -> str:
        """How the reproducer calls `inverse_and_ildj`."""
        argnums = self.argnums
        spell = str(argnums[0]) if len(argnums) == 1 else str(argnums)
        extra = ""
        if self.example_args:
            trail = "," if len(self.unknown) == 1 else ""
            extra = f", example_args=({', '.join(self.unknown)}{trail})"
        known = "".join(", " + n for n in self.known)
        return (
            f"x_rec, ildj = jaxinterp.inverse_and_ildj(f, argnums={spell}{extra})"
            f"(y{known})"
        )

    def reproducer(self, comment: str = "") -> str:
        """A standalone script that runs the inverse on this program."""
        head = [
            "import jax, jax.numpy as jnp, numpy as np",
            "from jax import lax",
            "import jaxinterp",
            "",
        ]
        body = [self.source(wrapped=True)]
        for n in self.arg_names:
            body.append(f"{n} = {_literal(self.sample(n))}")
        body.append(f"y = f({', '.join(self.arg_names)})")
        body.append(self.call_source())
        unknown = ", ".join(self.unknown)
        body.append(f"print(x_rec, ildj)  # the unknowns were: {unknown}")
        text = "\n".join(head + body) + "\n"
        if comment:
            text = textwrap.indent(comment.strip(), "# ") + "\n" + text
        return text


def _namespace() -> dict[str, Any]:
    return {"jax": jax, "jnp": jnp, "lax": lax, "np": np}


def _sub(expr: str, names: Sequence[str]) -> str:
    return expr.format(*names)


def _render(s: Stmt, i: int, wrapped: bool) -> list[str]:
    lhs = ", ".join(s.outs) + ("," if len(s.outs) == 1 and s.nout > 1 else "")
    args = list(s.ins)
    params = [f"a{k}" for k in range(len(args))]
    pred = s.pred.replace("{p}", s.pred_in) if s.pred else ""
    expr = _sub(s.expr, args)
    alts = [expr, f"({expr}) + 1", f"-({expr})"]
    w = s.wrapper
    if not wrapped or w == "plain":
        if w in ("cond", "switch"):
            return [f"{lhs} = {alts[s.branch]}"]
        if w in ("scan", "fori", "while") and s.reps > 1:
            t = s.outs[0]
            lines = [f"{t} = {args[0]}"]
            for _ in range(s.reps):
                lines.append(f"{t} = {_sub(s.expr, [t, *args[1:]])}")
            return lines
        return [f"{lhs} = {expr}"]
    lam_body = _sub(s.expr, params)
    lam = f"lambda {', '.join(params)}: {lam_body}"
    call = ", ".join(args)
    if w in ("jit", "checkpoint"):
        return [f"{lhs} = jax.{w}({lam})({call})"]
    if w in ("custom_jvp", "custom_vjp"):
        g, h = f"_g{i}", f"_h{i}"
        lines = [f"def {g}({', '.join(params)}):", f"    return {lam_body}"]
        lines.append(f"{h} = jax.{w}({g})")
        if w == "custom_jvp":
            lines.append(f"{h}.defjvp(lambda p, t: jax.jvp({g}, p, t))")
        else:
            lines.append(
                f"{h}.defvjp(lambda *a: ({g}(*a), a), "
                f"lambda r, ct: jax.vjp({g}, *r)[1](ct))"
            )
        return [*lines, f"{lhs} = {h}({call})"]
    if w == "cond":
        alt = f"lambda {', '.join(params)}: ({lam_body}) + 1"
        return [f"{lhs} = lax.cond({pred}, {lam}, {alt}, {call})"]
    if w == "switch":
        ps = ", ".join(params)
        branches = f"[{lam}, lambda {ps}: ({lam_body}) + 1, lambda {ps}: -({lam_body})]"
        return [f"{lhs} = lax.switch({pred}, {branches}, {call})"]
    rest = args[1:]
    if w == "scan":
        body = _sub(s.expr, ["c", *rest])
        return [
            f"{lhs} = lax.scan(lambda c, _: ({body}, None), {args[0]}, None, "
            f"length={s.reps})[0]"
        ]
    if w == "fori":
        body = _sub(s.expr, ["c", *rest])
        return [f"{lhs} = lax.fori_loop(0, {s.reps}, lambda i, c: {body}, {args[0]})"]
    if w == "while":
        body = _sub(s.expr, ["s[1]", *rest])
        return [
            f"{lhs} = lax.while_loop(lambda s: s[0] < {s.reps}, "
            f"lambda s: (s[0] + 1, {body}), (0, {args[0]}))[1]"
        ]
    mapped = s.mapped or (True,) * len(args)
    if w == "scan_rows":
        names, xs = [], []
        for k, a in enumerate(args):
            if mapped[k]:
                names.append(f"r[{len(xs)}]")
                xs.append(a)
            else:
                names.append(a)
        body = _sub(s.expr, names)
        return [f"{lhs} = lax.scan(lambda c, r: (c, {body}), 0, ({', '.join(xs)},))[1]"]
    if w == "vmap":
        axes = ", ".join("0" if m else "None" for m in mapped)
        return [f"{lhs} = jax.vmap({lam}, in_axes=({axes},))({call})"]
    raise ValueError(f"unknown wrapper {w}")


def _literal(a: Any) -> str:
    a = np.asarray(a)
    if a.dtype == np.bool_:
        body = repr(a.tolist())
        return f"jnp.array({body})"
    if np.issubdtype(a.dtype, np.integer):
        if a.ndim == 0:
            return f"jnp.int32({int(a)})"
        return f"jnp.array({a.tolist()!r}, jnp.int32)"
    flat = [np.format_float_positional(np.float32(v), unique=True) for v in a.ravel()]
    flat = [v + "0" if v.endswith(".") else v for v in flat]
    if a.ndim == 0:
        return f"jnp.float32({flat[0]})"
    nested = _nest(flat, a.shape)
    return f"jnp.array({nested}, jnp.float32)"


def _nest(flat: list[str], shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return "[" + ", ".join(flat) + "]"
    step = len(flat) // shape[0] if shape[0] else 0
    parts = [_nest(flat[k * step : (k + 1) * step], shape[1:]) for k in range(shape[0])]
    return "[" + ", ".join(parts) + "]"


def _lit(v: float) -> str:
    """A float literal with two decimals."""
    text = repr(round(float(v), 2))
    return text if text != "-0.0" else "0.0"


def _array_lit(a: Any) -> str:
    a = np.asarray(a)
    if a.ndim == 0:
        if a.dtype == np.bool_:
            return repr(bool(a))
        if np.issubdtype(a.dtype, np.integer):
            return repr(int(a))
        return _lit(float(a))
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
        return f"jnp.array({a.tolist()!r})"
    return f"jnp.array({_nest([_lit(v) for v in a.ravel()], a.shape)})"


# ---------------------------------------------------------------------------
# Evaluating statements on concrete values (what `validate` and the
# generator use: the plain program, statement by statement, with guards).


def _eval(expr: str, operands: Sequence[Any], nout: int) -> list[Any]:
    ns = _namespace()
    names = []
    for k, v in enumerate(operands):
        ns[f"_o{k}"] = jnp.asarray(v)
        names.append(f"_o{k}")
    # Op by op: the compiled primitives are shared by all programs, where
    # `jnp`'s jitted helpers and loops would compile for each new program.
    with jax.disable_jit():
        out = eval(expr.format(*names), ns)  # noqa: S307 - our own generated code
    outs = list(out) if nout > 1 else [out]
    if len(outs) != nout:
        raise ValueError("wrong number of results")
    return [jnp.asarray(o) for o in outs]


def _finite_ok(v: Any) -> bool:
    a = np.asarray(v)
    if a.dtype == np.bool_:
        return False
    if np.issubdtype(a.dtype, np.integer):
        return bool(np.all(np.abs(a.astype(np.int64)) < 10**6))
    a = a.astype(np.float64)
    return bool(np.all(np.isfinite(a)) and np.all(np.abs(a) < 1e4))


def _run_stmt(s: Stmt, vals: list[Any]) -> list[Any] | None:
    """The plain value of one statement, or `None` if a guard fails."""
    try:
        others = vals[1:]
        cur = list(vals)
        outs: list[Any] = []
        for _ in range(s.reps if s.wrapper in ("scan", "fori", "while") else 1):
            if s.guard is not None and not s.guard([np.asarray(v) for v in cur]):
                return None
            outs = _eval(s.expr, cur, s.nout)
            cur = [outs[0], *others]
        if s.wrapper in ("cond", "switch") and s.branch:
            outs = [o + 1 if s.branch == 1 else -o for o in outs]
    except Exception:
        return None
    if not all(_finite_ok(o) for o in outs):
        return None
    return outs


def validate(prog: Program, samples: dict[str, Any] | None = None) -> bool:
    """Whether every statement's guard holds and every value is finite."""
    env = dict(samples or dict(prog.samples))
    env = {k: jnp.asarray(v) for k, v in env.items()}
    for s in prog.stmts:
        if any(n not in env for n in s.ins) or (s.pred_in and s.pred_in not in env):
            return False
        outs = _run_stmt(s, [env[n] for n in s.ins])
        if outs is None:
            return False
        env.update(zip(s.outs, outs, strict=True))
    return all(n in env for n in prog.outputs) and bool(prog.outputs)


# ---------------------------------------------------------------------------
# The generator.


@dataclasses.dataclass
class _Val:
    name: str
    value: Any  # a concrete jax array
    known: bool

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def is_float(self) -> bool:
        return bool(jnp.issubdtype(self.value.dtype, jnp.floating))

    @property
    def np(self) -> Any:
        return np.asarray(self.value).astype(np.float64)


class _Gen:
    """Generation state: the values so far and helpers for op draws."""

    def __init__(self, ch: Chooser, int_mode: bool) -> None:
        self.ch = ch
        self.int_mode = int_mode
        self.vals: dict[str, _Val] = {}
        self.consumed: set[str] = set()
        self.stmts: list[Stmt] = []
        self.counter = 0

    def fresh(self) -> str:
        name = f"v{self.counter}"
        self.counter += 1
        return name

    def pick(
        self,
        pred: Callable[[_Val], bool] = lambda v: True,
        *,
        known: bool | None = False,
        dtype: str = "main",
    ) -> _Val | None:
        """A value (most recent first) that satisfies `pred`."""
        cands = []
        for v in reversed(list(self.vals.values())):
            if known is not None and v.known != known:
                continue
            want_float = not self.int_mode if dtype == "main" else dtype == "float"
            if v.is_float != want_float:
                continue
            if pred(v):
                cands.append(v)
        if not cands:
            return None
        if len(cands) == 1 or not self.ch.boolean(0.4):
            return cands[0]
        return self.ch.choice(cands)

    def operand(self, pred: Callable[[_Val], bool] = lambda v: True) -> _Val | None:
        """Mostly an unknown-derived value, sometimes a known one."""
        if self.ch.boolean(0.1):
            v = self.pick(pred, known=True)
            if v is not None:
                return v
        return self.pick(pred)

    def known_for(
        self, shape: tuple[int, ...], pred: Callable[[Any], bool] = lambda a: True
    ) -> _Val | None:
        """A known value of shape `()` or `shape` with `pred(values)`."""
        return self.pick(
            lambda v: (v.shape == () or v.shape == shape) and pred(v.np), known=True
        )

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.ch.integer(0, 2**31 - 1))


# An op draw returns a `Stmt` (without `outs`) or `None` if not applicable.
_Draw = Callable[[_Gen], Stmt | None]


@dataclasses.dataclass(frozen=True)
class _Op:
    name: str
    draw: _Draw
    weight: int
    prims: tuple[str, ...]  # primitives it is meant to stage
    kind: str = "float"  # "float", "int" or "any": the programs it fits


_OPS: dict[str, _Op] = {}


def _op(name: str, prims: Sequence[str], weight: int = 2, kind: str = "float"):
    def deco(fn: _Draw) -> _Draw:
        _OPS[name] = _Op(name, fn, weight, tuple(prims), kind)
        return fn

    return deco


def _amax(a: Any) -> float:
    return float(np.max(np.abs(a))) if np.size(a) else 0.0


def _amin(a: Any) -> float:
    return float(np.min(np.abs(a))) if np.size(a) else 1.0


def _lo(a: Any) -> float:
    return float(np.min(a)) if np.size(a) else 0.0


def _hi(a: Any) -> float:
    return float(np.max(a)) if np.size(a) else 0.0


# Unary maps: (name, expression, guard, branchy, primitives, weight).
_UNARY: list[tuple[str, str, Callable[[Any], bool], Any, tuple[str, ...], int]] = [
    ("neg", "-{0}", lambda a: True, None, ("neg",), 2),
    ("exp", "jnp.exp({0})", lambda a: _hi(a) < 3 and _lo(a) > -6, None, ("exp",), 3),
    ("log", "jnp.log({0})", lambda a: _lo(a) > 0.05, None, ("log",), 3),
    ("log1p", "jnp.log1p({0})", lambda a: _lo(a) > -0.8, None, ("log1p",), 1),
    (
        "expm1",
        "jnp.expm1({0})",
        lambda a: -3 < _lo(a) and _hi(a) < 3,
        None,
        ("expm1",),
        1,
    ),
    ("tanh", "jnp.tanh({0})", lambda a: _amax(a) < 2.5, None, ("tanh",), 3),
    ("atanh", "jnp.arctanh({0})", lambda a: _amax(a) < 0.95, None, ("atanh",), 2),
    ("sinh", "jnp.sinh({0})", lambda a: _amax(a) < 3, None, ("sinh",), 1),
    ("asinh", "jnp.arcsinh({0})", lambda a: _amax(a) < 100, None, ("asinh",), 2),
    (
        "cosh",
        "jnp.cosh({0})",
        lambda a: 0.15 < _amin(a) and _amax(a) < 3,
        lambda a: _lo(a) < 0,
        ("cosh",),
        1,
    ),
    (
        "acosh",
        "jnp.arccosh({0})",
        lambda a: _lo(a) > 1.1 and _hi(a) < 100,
        None,
        ("acosh",),
        1,
    ),
    ("sin", "jnp.sin({0})", lambda a: _amax(a) < 1.3, None, ("sin",), 1),
    ("cos", "jnp.cos({0})", lambda a: 0.2 < _lo(a) and _hi(a) < 2.9, None, ("cos",), 1),
    ("tan", "jnp.tan({0})", lambda a: _amax(a) < 1.2, None, ("tan",), 1),
    ("asin", "jnp.arcsin({0})", lambda a: _amax(a) < 0.95, None, ("asin",), 1),
    ("acos", "jnp.arccos({0})", lambda a: _amax(a) < 0.95, None, ("acos",), 1),
    ("atan", "jnp.arctan({0})", lambda a: _amax(a) < 20, None, ("atan",), 1),
    ("sigmoid", "jax.nn.sigmoid({0})", lambda a: _amax(a) < 6, None, ("logistic",), 2),
    (
        "softplus",
        "jax.nn.softplus({0})",
        lambda a: _amax(a) < 6,
        None,
        ("custom_jvp_call", "jit"),
        2,
    ),
    ("sqrt", "jnp.sqrt({0})", lambda a: _lo(a) > 0.05, None, ("sqrt",), 2),
    ("rsqrt", "lax.rsqrt({0})", lambda a: _lo(a) > 0.1, None, ("rsqrt",), 1),
    ("cbrt", "jnp.cbrt({0})", lambda a: _amin(a) > 0.02, None, ("cbrt",), 1),
    (
        "square",
        "jnp.square({0})",
        lambda a: 0.1 < _amin(a) and _amax(a) < 5,
        lambda a: _lo(a) < 0,
        ("square",),
        2,
    ),
    ("exp2", "jnp.exp2({0})", lambda a: _amax(a) < 4, None, ("exp2",), 1),
    ("erf", "lax.erf({0})", lambda a: _amax(a) < 1.5, None, ("erf",), 1),
    ("erfc", "lax.erfc({0})", lambda a: _amax(a) < 1.5, None, ("erfc",), 1),
    ("erf_inv", "lax.erf_inv({0})", lambda a: _amax(a) < 0.9, None, ("erf_inv",), 1),
    ("reciprocal", "1.0 / {0}", lambda a: _amin(a) > 0.2, None, ("div",), 1),
    (
        "lossy_cast",
        "{0}.astype(jnp.bfloat16).astype(jnp.float32)",
        lambda a: True,
        lambda a: True,
        ("convert_element_type",),
        1,
    ),
    (
        "reduce_precision",
        "lax.reduce_precision({0}, 8, 7)",
        lambda a: True,
        lambda a: True,
        ("reduce_precision",),
        1,
    ),
    ("copy", "jnp.copy({0})", lambda a: True, None, ("copy",), 1),
    (
        "opt_barrier",
        "lax.optimization_barrier({0})",
        lambda a: True,
        None,
        ("optimization_barrier",),
        1,
    ),
    ("device_put", "jax.device_put({0})", lambda a: True, None, ("device_put",), 1),
    # Its Jacobian is zero, so `check_inverse` confirms influence by perturbing.
    (
        "stop_gradient",
        "lax.stop_gradient({0})",
        lambda a: True,
        None,
        ("stop_gradient",),
        1,
    ),
    # `abs`: its principal branch x >= 0, like `square`.
    ("abs", "jnp.abs({0})", lambda a: True, lambda a: _lo(a) < 0, ("abs",), 1),
    # Not invertible: the inverse must refuse when the operand is needed.
    ("floor", "jnp.floor({0})", lambda a: True, None, ("floor",), 1),
    ("round", "jnp.round({0})", lambda a: True, None, ("round",), 1),
    ("ceil", "jnp.ceil({0})", lambda a: True, None, ("ceil",), 1),
    ("sign", "jnp.sign({0})", lambda a: True, None, ("sign",), 1),
    (
        "is_finite_where",
        "jnp.where(jnp.isfinite({0}), {0}, 0.0)",
        lambda a: True,
        None,
        ("is_finite", "select_n"),
        1,
    ),
]


def _make_unary(name, expr, guard, branchy, prims, weight):
    def draw(g: _Gen) -> Stmt | None:
        v = g.operand(lambda v: guard(v.np))
        if v is None:
            return None
        return Stmt(
            name,
            (v.name,),
            expr,
            guard=lambda vs: guard(vs[0].astype(np.float64)),
            branchy=(lambda vs: branchy(vs[0])) if branchy else None,
            elementwise=True,
        )

    _op(name, prims, weight)(draw)


for _row in _UNARY:
    _make_unary(*_row)


@_op("integer_pow", ["integer_pow"], 3)
def _integer_pow(g: _Gen) -> Stmt | None:
    n = g.ch.choice([2, 3, -1, 4, 5, -2, -3])
    v = g.operand(lambda v: 0.3 < _amin(v.np) and _amax(v.np) < 2.5)
    if v is None:
        return None
    return Stmt(
        "integer_pow",
        (v.name,),
        f"{{0}} ** {n}",
        guard=lambda vs: 0.3 < _amin(vs[0]) and _amax(vs[0]) < 2.5,
        branchy=(lambda vs: _lo(vs[0]) < 0) if n % 2 == 0 else None,
        elementwise=True,
    )


def _known_side(
    g: _Gen, shape: tuple[int, ...], lo: float, hi: float, min_abs: float = 0.0
) -> tuple[str, _Val | None, Any]:
    """A known operand: a literal scalar, a known value or a constant array.

    Returns (text, value or None, concrete value); the text is `{1}` for a
    known value."""
    kind = g.ch.integer(0, 2)
    if kind == 1:
        k = g.known_for(
            shape, lambda a: lo <= _lo(a) and _hi(a) <= hi and _amin(a) >= min_abs
        )
        if k is not None:
            return "{1}", k, k.np
    rng = g.rng()
    if kind == 2 and shape:
        a = rng.uniform(lo, hi, shape)
        a = np.where(np.abs(a) < min_abs, np.sign(a + 1e-9) * min_abs + a, a)
        a = np.clip(np.round(a, 2), lo, hi)
        if _amin(a) < min_abs:
            a = np.full(shape, max(min_abs, lo) if lo > -min_abs else hi)
        if g.ch.boolean(0.3):
            # Sizes of 1 (and maybe fewer leading axes) that `lax` broadcasts
            # implicitly: a row, a column, a per-feature parameter.
            a = a[
                tuple(slice(0, 1) if g.ch.boolean(0.5) else slice(None) for _ in shape)
            ]
            while a.ndim and a.shape[0] == 1 and g.ch.boolean(0.5):
                a = a[0]
        return _array_lit(a), None, a
    c = float(rng.uniform(lo, hi))
    if abs(c) < min_abs:
        c = min_abs if hi >= min_abs else -min_abs
    c = round(c, 2)
    return _lit(c), None, np.float64(c)


def _binary_known(
    name: str,
    templates: Sequence[tuple[str, Callable[[Any, Any], bool]]],
    lo: float,
    hi: float,
    min_abs: float,
    prims: Sequence[str],
    weight: int,
    elementwise: bool = True,
) -> None:
    """`templates`: (expression over {0}=unknown and K, guard(a, k)), maybe
    with a third element `branchy(a, k)`: whether the map is not injective on
    these values (a clamp that saturates)."""

    def draw(g: _Gen) -> Stmt | None:
        tmpl, guard, *rest = g.ch.choice(list(templates))
        branchy = rest[0] if rest else None
        v = g.operand(lambda v: True)
        if v is None:
            return None
        text, kval, kconc = _known_side(g, v.shape, lo, hi, min_abs)
        if not guard(v.np, kconc):
            return None
        expr = tmpl.replace("K", text)
        ins = (v.name,) if kval is None else (v.name, kval.name)

        def with_k(check: Callable[[Any, Any], bool]) -> Callable[[Any], bool]:
            if kval is None:
                const = kconc
                return lambda vs: check(vs[0].astype(np.float64), const)
            return lambda vs: check(vs[0].astype(np.float64), vs[1].astype(np.float64))

        # An array literal has the whole shape: no row-by-row wrappers then.
        rowwise = elementwise and (kval is not None or np.ndim(kconc) == 0)
        return Stmt(
            name,
            ins,
            expr,
            guard=with_k(guard),
            branchy=with_k(branchy) if branchy else None,
            elementwise=rowwise,
        )

    _op(name, prims, weight)(draw)


_T = lambda a, k: True  # noqa: E731
_binary_known("add_known", [("{0} + K", _T), ("K + {0}", _T)], -2, 2, 0, ["add"], 4)
_binary_known("sub_known", [("{0} - K", _T), ("K - {0}", _T)], -2, 2, 0, ["sub"], 3)
_binary_known(
    "mul_known", [("{0} * K", _T), ("K * {0}", _T)], -1.6, 1.6, 0.3, ["mul"], 4
)
_binary_known(
    "div_known",
    [("{0} / K", _T), ("K / {0}", lambda a, k: _amin(a) > 0.2)],
    -1.6,
    1.6,
    0.3,
    ["div"],
    3,
)
_binary_known(
    "pow_known_exponent",
    [("{0} ** K", lambda a, k: _lo(a) > 0.2 and _hi(a) < 20)],
    0.5,
    1.8,
    0.5,
    ["pow"],
    2,
)
_binary_known(
    "pow_known_base",
    [("K ** {0}", lambda a, k: _amax(a) < 4 and _amin(np.log(np.abs(k))) > 0.15)],
    0.3,
    2.5,
    0.3,
    ["pow"],
    2,
)
_binary_known(
    "atan2_known",
    [
        ("jnp.arctan2({0}, K)", lambda a, k: np.all(np.abs(a) < 20 * np.abs(k))),
        ("jnp.arctan2(K, {0})", lambda a, k: _amin(a) > 0.1),
    ],
    -1.6,
    1.6,
    0.4,
    ["atan2"],
    1,
)
_binary_known(
    "logaddexp_known",
    [("jnp.logaddexp({0}, K)", lambda a, k: _lo(a - k) > -2.5)],
    -1.5,
    1.5,
    0,
    ["custom_jvp_call"],
    2,
)
# Clamps are inverted on their unsaturated range (a bound for a result at a
# bound): not injective where they saturate.
_binary_known(
    "max_known",
    [
        ("jnp.maximum({0}, K)", _T, lambda a, k: bool(np.any(a <= k))),
        ("jnp.minimum(K, {0})", _T, lambda a, k: bool(np.any(a >= k))),
    ],
    -1,
    1,
    0,
    ["max", "min"],
    1,
)
_binary_known(
    "clip",
    [
        ("jnp.clip({0}, -10.0, 10.0)", _T, lambda a, k: bool(np.any(np.abs(a) >= 10))),
        ("jnp.clip({0}, K, None)", _T, lambda a, k: bool(np.any(a <= k))),
    ],
    -1,
    1,
    0,
    ["clamp", "max"],
    1,
)
_binary_known("rem_known", [("{0} % K", lambda a, k: True)], 0.5, 2, 0.5, ["rem"], 1)


def _same_shape(v: _Val) -> Callable[[_Val], bool]:
    return lambda u: u.shape == v.shape


_BINARY_UNKNOWN = {
    "add": ("{0} + {1}", lambda a, b: True),
    "sub": ("{0} - {1}", lambda a, b: True),
    "mul": ("{0} * {1}", lambda a, b: _amin(b) > 0.3 and _amax(a * b) < 1e3),
    "div": ("{0} / {1}", lambda a, b: _amin(b) > 0.3),
}


@_op("binary_unknown", ["add", "sub", "mul", "div"], 5)
def _binary_unknown(g: _Gen) -> Stmt | None:
    """Both operands unknown; the second is often left as an output too
    (a conditioner), so the first can be solved for."""
    which = g.ch.choice(sorted(_BINARY_UNKNOWN))
    expr, guard = _BINARY_UNKNOWN[which]
    a = g.pick()
    if a is None:
        return None
    b = g.pick(lambda u: (u.shape == a.shape or u.shape == ()) and guard(a.np, u.np))
    if b is None:
        return None
    keep = (1,) if g.ch.boolean(0.6) else ()
    return Stmt(
        f"{which}_unknown",
        (a.name, b.name),
        expr,
        guard=lambda vs: guard(vs[0].astype(np.float64), vs[1].astype(np.float64)),
        elementwise=True,
        keep=keep,
    )


@_op("coupling", ["split", "tanh", "exp", "mul", "add", "concatenate"], 2)
def _coupling(g: _Gen) -> Stmt | None:
    """An affine coupling layer: split, transform one half conditioned on the
    other, concatenate."""
    v = g.pick(lambda v: len(v.shape) >= 1 and v.shape[0] >= 2 and _amax(v.np) < 20)
    if v is None:
        return None
    n = v.shape[0]
    h = n // 2 if n % 2 == 0 else 1
    expr = (
        "(lambda u, w: jnp.concatenate([u, w * jnp.exp(jnp.tanh(u)) + u]))"
        f"(*jnp.split({{0}}, [{h}]))"
    )
    return Stmt("coupling", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 20)


@_op("masked_coupling", ["select_n", "mul", "tanh", "exp", "add"], 2)
def _masked_coupling(g: _Gen) -> Stmt | None:
    """A masked coupling (RealNVP, distrax `MaskedCoupling`): the elements off
    a constant mask transformed, conditioned on those on it (`x * mask`)."""
    v = g.pick(lambda v: len(v.shape) >= 1 and v.np.size >= 2 and _amax(v.np) < 20)
    if v is None:
        return None
    m = _mask(g, v.shape, "partial")
    mask = _array_lit(m)
    shift = _lit(g.rng().uniform(-1, 1))
    expr = (
        f"(lambda x, m: jnp.where(m, x, x * jnp.exp(jnp.tanh(jnp.sum(x * m) + {shift}))"
        f" + jnp.sin(x * m).sum()))({{0}}, {mask})"
    )
    return Stmt("masked_coupling", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 20)


@_op("masked_diagonal", ["select_n", "exp"], 1)
def _masked_diagonal(g: _Gen) -> Stmt | None:
    """A map applied on the diagonal only (`TransformDiagonal`): `where(eye,
    exp(x), x)` on the last two axes."""
    v = g.pick(
        lambda v: len(v.shape) >= 2 and v.shape[-1] == v.shape[-2] and _amax(v.np) < 20
    )
    if v is None:
        return None
    n = v.shape[-1]
    expr = f"jnp.where(jnp.eye({n}, dtype=bool), jnp.exp({{0}}), {{0}})"
    return Stmt("masked_diagonal", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 20)


def _mask(g: _Gen, shape: tuple[int, ...], kind: str) -> Any:
    rng = g.rng()
    if kind == "full":
        return np.ones(shape, bool)
    if kind == "none":
        return np.zeros(shape, bool)
    m = rng.random(shape) < 0.5
    if m.size > 1 and (m.all() or not m.any()):
        m.flat[0] = not m.flat[0]
    return m


def _other_operand(g: _Gen, v: _Val, allow_unknown: bool = True) -> tuple[str, Any]:
    """Text for the other case of a select: `{1}` (a value) or a literal."""
    kind = g.ch.integer(0, 2)
    if kind == 1:
        k = g.known_for(v.shape)
        if k is not None:
            return "{1}", k
    if kind == 2 and allow_unknown:
        u = g.pick(lambda u: u.shape == v.shape and u.name != v.name)
        if u is not None:
            return "{1}", u
    return _lit(g.rng().uniform(-4, 4)), None


def _where_op(name: str, mask_kind: str, weight: int) -> None:
    @_op(name, ["select_n"], weight)
    def draw(g: _Gen) -> Stmt | None:
        v = g.operand()
        if v is None:
            return None
        m = _mask(g, v.shape, mask_kind)
        mask = _array_lit(m) if v.shape else repr(bool(m))
        other, o = _other_operand(g, v)
        if g.ch.boolean():
            expr = f"jnp.where({mask}, {{0}}, {other})"
        else:
            flipped = _array_lit(~m) if v.shape else repr(not bool(m))
            expr = f"jnp.where({flipped}, {other}, {{0}})"
        ins = (v.name,) if o is None else (v.name, o.name)
        return Stmt(name, ins, expr, keep=(1,) if o is not None else ())


_where_op("where_const_full", "full", 2)
_where_op("where_const_partial", "partial", 3)


@_op("where_known_pred", ["select_n", "gt"], 3)
def _where_known_pred(g: _Gen) -> Stmt | None:
    """`jnp.where(p > c, x, other)` with `p` known: all, none or some of `x`."""
    v = g.pick()
    if v is None:
        return None
    k = g.known_for(v.shape)
    if k is None:
        return None
    vals = np.sort(np.ravel(k.np))
    t = g.ch.integer(0, 2)
    thr = (
        vals[0] - 0.5
        if t == 0
        else (vals[-1] + 0.5 if t == 2 else (vals[0] + vals[-1]) / 2)
    )
    if t == 1 and vals[0] == vals[-1]:
        thr = vals[0] - 0.5
    other, o = _other_operand(g, v, allow_unknown=False)
    if o is not None:
        expr = f"jnp.where({{1}} > {_lit(thr)}, {{0}}, jnp.exp({{1}}))"
        ins = (v.name, k.name)
    else:
        expr = f"jnp.where({{1}} > {_lit(thr)}, {{0}}, {other})"
        ins = (v.name, k.name)
    return Stmt("where_known_pred", ins, expr)


@_op("select_n3", ["select_n"], 1)
def _select_n3(g: _Gen) -> Stmt | None:
    """`lax.select_n` with three cases and a constant int32 index array."""
    v = g.pick(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    u = g.pick(lambda u: u.shape == v.shape and u.name != v.name)
    rng = g.rng()
    which = g.ch.integer(0, 2)
    idx = np.full(v.shape, which) if g.ch.boolean() else rng.integers(0, 3, v.shape)
    ins = (v.name,) if u is None else (v.name, u.name)
    second = "{1}" if u is not None else "0.5"
    cases = ["{0}", second, f"jnp.full({v.shape!r}, 1.5)"]
    expr = f"lax.select_n(jnp.array({idx.astype(int).tolist()!r}), {', '.join(cases)})"
    return Stmt("select_n3", ins, expr, keep=(1,) if u is not None else ())


# --- structural ------------------------------------------------------------


def _factorizations(n: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [(n,), (1, n), (n, 1)]
    for d in range(2, n):
        if n % d == 0:
            out.append((d, n // d))
    return out


@_op("reshape", ["reshape"], 2, kind="any")
def _reshape(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: int(np.prod(v.shape)) >= 1)
    if v is None:
        return None
    n = int(np.prod(v.shape))
    shapes = [s for s in _factorizations(n) if s != v.shape]
    if not shapes:
        return None
    s = g.ch.choice(shapes)
    if g.ch.boolean(0.3) and len(v.shape) >= 2:
        return Stmt("reshape", (v.name,), "jnp.ravel({0})")
    return Stmt("reshape", (v.name,), f"{{0}}.reshape({s!r})")


@_op("expand_squeeze", ["broadcast_in_dim", "squeeze", "reshape"], 2, kind="any")
def _expand_squeeze(g: _Gen) -> Stmt | None:
    v = g.operand()
    if v is None:
        return None
    ones = [d for d, n in enumerate(v.shape) if n == 1]
    if ones and g.ch.boolean():
        return Stmt(
            "squeeze", (v.name,), f"jnp.squeeze({{0}}, axis={g.ch.choice(ones)})"
        )
    ax = g.ch.integer(0, len(v.shape))
    return Stmt("expand_dims", (v.name,), f"jnp.expand_dims({{0}}, {ax})")


@_op("broadcast_copy", ["broadcast_in_dim"], 1, kind="any")
def _broadcast_copy(g: _Gen) -> Stmt | None:
    """Copies: not invertible by the rules (though injective)."""
    v = g.operand()
    if v is None:
        return None
    return Stmt(
        "broadcast_copy", (v.name,), f"jnp.broadcast_to({{0}}, (2,) + {v.shape!r})"
    )


@_op("transpose", ["transpose"], 2, kind="any")
def _transpose(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 2)
    if v is None:
        return None
    perms = [p for p in _perms(len(v.shape)) if p != tuple(range(len(v.shape)))]
    return Stmt("transpose", (v.name,), f"jnp.transpose({{0}}, {g.ch.choice(perms)!r})")


def _perms(n: int) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.permutations(range(n)))


@_op("rev", ["rev"], 2, kind="any")
def _rev(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    if g.ch.boolean(0.3):
        return Stmt("rev", (v.name,), "{0}[::-1]")
    ax = g.ch.integer(0, len(v.shape) - 1)
    return Stmt("rev", (v.name,), f"jnp.flip({{0}}, axis={ax})")


@_op("concatenate", ["concatenate"], 3, kind="any")
def _concatenate(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    ax = g.ch.integer(0, len(v.shape) - 1)

    def fits(u: _Val) -> bool:
        return (
            u.name != v.name
            and len(u.shape) == len(v.shape)
            and all(
                a == b
                for d, (a, b) in enumerate(zip(u.shape, v.shape, strict=True))
                if d != ax
            )
        )

    choice = g.ch.integer(0, 2)
    u = g.pick(fits, known=(choice == 1)) if choice < 2 else None
    if u is not None:
        pair = ["{0}", "{1}"]
        ins = (v.name, u.name)
    else:
        shape = list(v.shape)
        shape[ax] = g.ch.integer(1, 2)
        dt = "jnp.int32" if g.int_mode else "jnp.float32"
        pair = ["{0}", f"jnp.full({tuple(shape)!r}, 2, {dt})"]
        ins = (v.name,)
    if g.ch.boolean():
        pair.reverse()
    keep = (1,) if len(ins) == 2 and g.ch.boolean(0.3) else ()
    return Stmt(
        "concatenate",
        ins,
        f"jnp.concatenate([{', '.join(pair)}], axis={ax})",
        keep=keep,
    )


@_op("stack", ["stack", "concatenate", "broadcast_in_dim"], 1, kind="any")
def _stack(g: _Gen) -> Stmt | None:
    v = g.operand()
    if v is None:
        return None
    u = g.pick(lambda u: u.shape == v.shape and u.name != v.name)
    if u is None:
        return None
    ax = g.ch.integer(0, len(v.shape))
    return Stmt("stack", (v.name, u.name), f"jnp.stack([{{0}}, {{1}}], axis={ax})")


@_op("slice", ["slice", "squeeze"], 3, kind="any")
def _slice(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
    if v is None:
        return None
    axes = [d for d, n in enumerate(v.shape) if n >= 2]
    ax = g.ch.choice(axes)
    n = v.shape[ax]
    kind = g.ch.integer(0, 3)
    if kind == 0:
        lo = g.ch.integer(0, n - 1)
        hi = g.ch.integer(lo + 1, n)
        sl = f"{lo}:{hi}"
    elif kind == 1:
        sl = f"{g.ch.integer(0, 1)}::2"
    elif kind == 2 and ax == 0:
        return Stmt("index", (v.name,), f"{{0}}[{g.ch.integer(-n, n - 1)}]")
    else:
        lo = g.ch.integer(0, n - 1)
        starts = [0] * len(v.shape)
        limits = list(v.shape)
        starts[ax] = lo
        return Stmt(
            "slice",
            (v.name,),
            f"lax.slice({{0}}, {tuple(starts)!r}, {tuple(limits)!r})",
        )
    index = ", ".join([":"] * ax + [sl])
    return Stmt("slice", (v.name,), f"{{0}}[{index}]")


@_op("split", ["split"], 3, kind="any")
def _split(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
    if v is None:
        return None
    axes = [d for d, n in enumerate(v.shape) if n >= 2]
    ax = g.ch.choice(axes)
    n = v.shape[ax]
    if n >= 3 and g.ch.boolean(0.3):
        return Stmt("split", (v.name,), f"jnp.split({{0}}, [1, 2], axis={ax})", nout=3)
    k = g.ch.integer(1, n - 1)
    return Stmt("split", (v.name,), f"jnp.split({{0}}, [{k}], axis={ax})", nout=2)


@_op("unstack", ["unstack", "split", "squeeze"], 1, kind="any")
def _unstack(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1 and 2 <= v.shape[0] <= 3)
    if v is None:
        return None
    return Stmt("unstack", (v.name,), "jnp.unstack({0})", nout=v.shape[0])


@_op("dynamic_slice", ["dynamic_slice"], 2, kind="any")
def _dynamic_slice(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    sizes = tuple(g.ch.integer(1, n) if n else 0 for n in v.shape)
    starts = [g.ch.integer(-1, n) for n in v.shape]  # clamped when out of range
    k = g.pick(lambda u: u.shape == (), known=True) if g.ch.boolean(0.25) else None
    if k is not None:
        # A start index computed from a known parameter (traced when staged).
        s0 = f"jnp.int32({{1}} > {_lit(float(k.np) - 0.5)})"
        text = ", ".join([s0] + [str(s) for s in starts[1:]]) + ","
        return Stmt(
            "dynamic_slice_known_start",
            (v.name, k.name),
            f"lax.dynamic_slice({{0}}, ({text}), {sizes!r})",
        )
    if g.ch.boolean(0.3):
        ax = g.ch.integer(0, len(v.shape) - 1)
        i = g.ch.integer(0, v.shape[ax] - 1) if v.shape[ax] else 0
        return Stmt(
            "dynamic_index",
            (v.name,),
            f"lax.dynamic_index_in_dim({{0}}, {i}, axis={ax}, keepdims=False)",
        )
    text = ", ".join(str(s) for s in starts) + ","
    return Stmt(
        "dynamic_slice", (v.name,), f"lax.dynamic_slice({{0}}, ({text}), {sizes!r})"
    )


@_op("dynamic_update_slice", ["dynamic_update_slice"], 2, kind="any")
def _dynamic_update_slice(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None

    def fits(u: _Val) -> bool:
        return (
            u.name != v.name
            and len(u.shape) == len(v.shape)
            and all(a <= b for a, b in zip(u.shape, v.shape, strict=True))
        )

    u = g.pick(fits, known=None if g.ch.boolean(0.5) else False)
    if u is not None:
        up_shape = u.shape
        ins = (v.name, u.name)
        upd = "{1}"
    else:
        up_shape = tuple(g.ch.integer(1, n) if n else 0 for n in v.shape)
        ins = (v.name,)
        dt = "jnp.int32" if g.int_mode else "jnp.float32"
        upd = f"jnp.full({up_shape!r}, 3, {dt})"
    starts = ", ".join(
        str(g.ch.integer(0, n - m + 1)) for n, m in zip(v.shape, up_shape, strict=True)
    )
    keep = (1,) if len(ins) == 2 and g.ch.boolean(0.3) else ()
    return Stmt(
        "dynamic_update_slice",
        ins,
        f"lax.dynamic_update_slice({{0}}, {upd}, ({starts},))",
        keep=keep,
    )


@_op("pad", ["pad"], 3, kind="any")
def _pad(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    kind = g.ch.integer(0, 2)
    if kind == 0:
        pads = tuple((g.ch.integer(0, 2), g.ch.integer(0, 2)) for _ in v.shape)
        value = g.ch.choice(["", ", constant_values=1.5", "K"])
        if value == "K":
            k = g.pick(lambda u: u.shape == (), known=True)
            if k is not None:
                return Stmt(
                    "pad",
                    (v.name, k.name),
                    f"jnp.pad({{0}}, {pads!r}, constant_values={{1}})",
                )
            value = ""
        if g.int_mode:
            value = ""
        return Stmt("pad", (v.name,), f"jnp.pad({{0}}, {pads!r}{value})")
    # lax.pad with negative (cropping) and interior padding.
    config = []
    for n in v.shape:
        lo = g.ch.integer(-1, 2) if n > 1 else g.ch.integer(0, 1)
        hi = g.ch.integer(-1, 2) if n > 1 else g.ch.integer(0, 1)
        interior = g.ch.integer(0, 1) if kind == 2 else 0
        config.append((lo, hi, interior))
    zero = "jnp.int32(0)" if g.int_mode else "jnp.float32(0.5)"
    return Stmt(
        "lax_pad" if kind == 1 else "lax_pad_interior",
        (v.name,),
        f"lax.pad({{0}}, {zero}, {config!r})",
    )


def _take_indices(g: _Gen, n: int, kind: str) -> list[int] | None:
    rng = g.rng()
    if kind == "perm":
        return [int(i) for i in rng.permutation(n)]
    if kind == "subset":
        if n < 2:
            return None
        k = g.ch.integer(1, n - 1)
        return [int(i) for i in rng.choice(n, k, replace=False)]
    if kind == "repeat":  # every index, one twice
        perm = [int(i) for i in rng.permutation(n)]
        return perm + [perm[g.ch.integer(0, n - 1)]]
    if kind == "repeat_missing":  # some index twice, another missing
        if n < 2:
            return None
        perm = [int(i) for i in rng.permutation(n)]
        perm[-1] = perm[0]
        return [int(i) for i in rng.permutation(perm)]
    if kind == "negative":  # a permutation spelled with negative indices
        return [
            int(i) - n if rng.random() < 0.5 else int(i) for i in rng.permutation(n)
        ]
    raise ValueError(kind)


def _take_op(kind: str, weight: int) -> None:
    @_op(f"take_{kind}", ["gather"], weight, kind="any")
    def draw(g: _Gen) -> Stmt | None:
        v = g.operand(lambda v: len(v.shape) >= 1 and max(v.shape) >= 1)
        if v is None:
            return None
        ax = g.ch.integer(0, len(v.shape) - 1)
        idx = _take_indices(g, v.shape[ax], kind)
        if idx is None:
            return None
        spelled = f"jnp.array({idx!r})"
        if ax == 0 and g.ch.boolean(0.4):
            return Stmt(f"take_{kind}", (v.name,), f"{{0}}[{spelled}]")
        return Stmt(f"take_{kind}", (v.name,), f"jnp.take({{0}}, {spelled}, axis={ax})")


@_op("take_known_indices", ["gather"], 2, kind="any")
def _take_known_indices(g: _Gen) -> Stmt | None:
    """Indices computed from a known parameter: concrete on the sample but
    traced when `inverse` stages the program."""
    v = g.operand(lambda v: len(v.shape) >= 1 and v.shape[0] >= 2)
    if v is None:
        return None
    k = g.pick(lambda u: u.shape == (), known=True)
    if k is None:
        return None
    kind = g.ch.choice(["perm", "repeat_missing", "subset"])
    idx = _take_indices(g, v.shape[0], kind)
    if idx is None:
        return None
    expr = f"jnp.take({{0}}, jnp.array({idx!r}) * jnp.int32({{1}} < 100.0), axis=0)"
    return Stmt(f"take_known_indices_{kind}", (v.name, k.name), expr)


_take_op("perm", 3)
_take_op("subset", 2)
_take_op("repeat", 1)
_take_op("repeat_missing", 2)
_take_op("negative", 1)


def _scatter_op(name: str, prim: str, method: str, fill: str) -> None:
    @_op(name, [prim], 2, kind="any")
    def draw(g: _Gen) -> Stmt | None:
        """The operand copied into a larger array along axis 0 at distinct
        positions (sometimes one repeated: refused)."""
        v = g.operand(lambda v: len(v.shape) >= 1 and 1 <= v.shape[0] <= 6)
        if v is None:
            return None
        n = v.shape[0]
        total = n + g.ch.integer(0, 2)
        rng = g.rng()
        idx = [int(i) for i in rng.choice(total, n, replace=False)]
        if n >= 2 and g.ch.boolean(0.2):
            idx[-1] = idx[0]
        shape = (total, *v.shape[1:])
        expr = f"jnp.full({shape!r}, {fill}).at[jnp.array({idx!r})].{method}({{0}})"
        return Stmt(name, (v.name,), expr)


_scatter_op("scatter_into", "scatter", "set", "0.0")
_scatter_op("scatter_add_into", "scatter-add", "add", "0.5")


@_op("gather_points", ["gather"], 1, kind="any")
def _gather_points(g: _Gen) -> Stmt | None:
    """`x[i, j]` gathers single elements, here every one once: inverted by
    point pieces (see `_inverse/_scattered.py`)."""
    v = g.operand(lambda v: len(v.shape) == 2)
    if v is None:
        return None
    n, m = v.shape
    rows = [i % n for i in range(n * m)]
    cols = [i // n % m for i in range(n * m)]
    return Stmt(
        "gather_points", (v.name,), f"{{0}}[jnp.array({rows}), jnp.array({cols})]"
    )


@_op("cumsum", ["cumsum"], 2, kind="any")
def _cumsum(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    ax = g.ch.integer(0, len(v.shape) - 1)
    if g.ch.boolean():
        return Stmt("cumsum", (v.name,), f"lax.cumsum({{0}}, axis={ax}, reverse=True)")
    return Stmt("cumsum", (v.name,), f"jnp.cumsum({{0}}, axis={ax})")


@_op("cumprod", ["cumprod"], 1)
def _cumprod(g: _Gen) -> Stmt | None:
    def ok(a: Any) -> bool:
        return 0.3 < _amin(a) and _amax(a) < 3

    v = g.operand(lambda v: len(v.shape) >= 1 and ok(v.np))
    if v is None:
        return None
    ax = g.ch.integer(0, len(v.shape) - 1)
    rev = g.ch.boolean()
    return Stmt(
        "cumprod",
        (v.name,),
        f"lax.cumprod({{0}}, axis={ax}, reverse={rev})",
        guard=lambda vs: ok(vs[0]),
    )


@_op("cumlogsumexp", ["cumlogsumexp"], 1)
def _cumlogsumexp(g: _Gen) -> Stmt | None:
    def ok(a: Any) -> bool:
        return _amax(a) < 2

    v = g.operand(lambda v: len(v.shape) >= 1 and ok(v.np) and max(v.shape) <= 4)
    if v is None:
        return None
    ax = g.ch.integer(0, len(v.shape) - 1)
    rev = g.ch.boolean()
    return Stmt(
        "cumlogsumexp",
        (v.name,),
        f"lax.cumlogsumexp({{0}}, axis={ax}, reverse={rev})",
        guard=lambda vs: ok(vs[0]),
    )


@_op(
    "lossy_reduce",
    [
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "cummax",
        "cummin",
        "sort",
        "argmax",
        "argmin",
        "top_k",
    ],
    2,
)
def _lossy_reduce(g: _Gen) -> Stmt | None:
    """Reductions and sorts: the inverse must refuse unless other outputs
    determine the operand."""
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    ax = g.ch.integer(0, len(v.shape) - 1)
    expr = g.ch.choice(
        [
            f"jnp.sum({{0}}, axis={ax})",
            f"jnp.max({{0}}, axis={ax})",
            f"lax.cummax({{0}}, axis={ax})",
            f"jnp.sort({{0}}, axis={ax})",
            f"jnp.prod({{0}}, axis={ax})",
            f"{{0}} + jnp.argmax({{0}}, axis={ax}, keepdims=True)",
            f"jnp.min({{0}}, axis={ax})",
            f"{{0}} - jnp.argmin({{0}}, axis={ax}, keepdims=True)",
            f"lax.cummin({{0}}, axis={ax})",
            "lax.top_k({0}, 1)[0]",
            "{0} * jnp.all({0} > -100.0)",
            "{0} * jnp.any({0} > -100.0)",
            f"{{0}} * lax.reduce_xor({{0}} > 0.0, ({ax},))",
        ]
    )
    return Stmt("lossy_reduce", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 10)


@_op("compare_select", ["eq", "ne", "lt", "le", "gt", "ge", "select_n"], 1)
def _compare_select(g: _Gen) -> Stmt | None:
    """A select whose predicate depends on the unknown (not solvable by the
    rules, though this map happens to be injective)."""
    v = g.operand()
    if v is None:
        return None
    cmp = g.ch.choice(["==", "!=", "<", "<=", ">", ">="])
    expr = f"{{0}} + jnp.where({{0}} {cmp} 0.25, 5.0, -5.0)"
    return Stmt("compare_select", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 4)


@_op("complex_part", ["convert_element_type", "mul", "real", "imag"], 1)
def _complex_part(g: _Gen) -> Stmt | None:
    """A detour through complex numbers that keeps one part (a linear block)."""
    v = g.operand()
    if v is None:
        return None
    part = g.ch.choice(["jnp.real", "jnp.imag"])
    return Stmt("complex_part", (v.name,), f"{part}({{0}} * (1.0 + 0.5j))")


@_op("fourier", ["fft", "mul"], 1, kind="any")
def _fourier(g: _Gen) -> Stmt | None:
    """A filter in the frequency domain: `fft` steps in a linear block."""
    v = g.operand(lambda v: len(v.shape) >= 1 and v.shape[-1] >= 1)
    if v is None:
        return None
    n = v.shape[-1]
    if g.ch.choice([True, False]):
        expr = f"jnp.fft.irfft(jnp.fft.rfft({{0}}) * (1.5 + 0.5j), n={n})"
    else:
        expr = "jnp.real(jnp.fft.ifft(jnp.fft.fft({0}) * (2.0 - 1.0j)))"
    return Stmt("fourier", (v.name,), expr)


@_op("tile", ["tile"], 1, kind="any")
def _tile(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    reps = tuple(g.ch.choice([1, 1, 2]) for _ in v.shape)
    return Stmt("tile", (v.name,), f"jnp.tile({{0}}, {reps!r})")


# --- linear maps -----------------------------------------------------------


def _matrix(g: _Gen, n: int, m: int | None = None) -> Any:
    """A well-conditioned constant matrix (`n x m`, square by default)."""
    rng = g.rng()
    m = n if m is None else m
    a = rng.uniform(-0.4, 0.4, (n, m))
    if m == n:
        a += np.diag(rng.choice([-1, 1], n) * rng.uniform(1.0, 1.6, n))
    return np.round(a, 2)


@_op("matmul", ["dot_general"], 4)
def _matmul(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: len(v.shape) >= 1)
    if v is None:
        return None
    form = g.ch.integer(0, 4)
    if form == 0:  # x @ M over the last axis
        m = _array_lit(_matrix(g, v.shape[-1]))
        return Stmt("matmul", (v.name,), f"{{0}} @ {m}")
    if form == 1:  # M @ x over the first axis
        m = _array_lit(_matrix(g, v.shape[0]))
        return Stmt("matmul", (v.name,), f"jnp.matmul({m}, {{0}})")
    if form == 2:  # einsum, scaled by a known scalar
        k = g.pick(lambda u: u.shape == () and _amin(u.np) > 0.3, known=True)
        m = _array_lit(_matrix(g, v.shape[-1]))
        if k is None:
            return Stmt("matmul", (v.name,), f"jnp.einsum('ij,...j->...i', {m}, {{0}})")
        return Stmt(
            "matmul_known_scale",
            (v.name, k.name),
            f"jnp.einsum('ij,...j->...i', {m} * {{1}}, {{0}})",
        )
    if form == 3 and len(v.shape) == 2:  # a batch of matrices
        b, n = v.shape
        ms = np.stack([_matrix(g, n) for _ in range(b)])
        return Stmt(
            "matmul_batched",
            (v.name,),
            f"jnp.einsum('bij,bj->bi', {_array_lit(ms)}, {{0}})",
        )
    # Not square: more or fewer outputs than inputs (refused).
    n = v.shape[-1]
    m = _array_lit(_matrix(g, n, n + g.ch.choice([-1, 1]) if n > 1 else 2))
    return Stmt("matmul_nonsquare", (v.name,), f"{{0}} @ {m}")


def _lower(g: _Gen, n: int, unit: bool) -> Any:
    rng = g.rng()
    a = np.tril(np.round(rng.uniform(-0.5, 0.5, (n, n)), 2))
    d = np.round(rng.choice([-1, 1], n) * rng.uniform(0.8, 1.6, n), 2)
    np.fill_diagonal(a, 1.0 if unit else d)
    # The other triangle is garbage the solve must ignore.
    return a + np.triu(np.round(rng.uniform(-3, 3, (n, n)), 2), 1)


@_op("triangular_solve", ["triangular_solve"], 2)
def _triangular_solve(g: _Gen) -> Stmt | None:
    v = g.operand(lambda v: 1 <= len(v.shape) <= 2 and v.shape[0] >= 1)
    if v is None:
        return None
    unit = g.ch.boolean(0.3)
    if g.ch.boolean(0.6) or len(v.shape) == 1:
        n = v.shape[0]
        lower = g.ch.boolean()
        a = _lower(g, n, unit)
        if not lower:
            a = a.T
        trans = g.ch.integer(0, 1)
        return Stmt(
            "solve_triangular",
            (v.name,),
            f"jax.scipy.linalg.solve_triangular({_array_lit(a)}, {{0}}, lower={lower}, "
            f"trans={trans}, unit_diagonal={unit})",
        )
    n = v.shape[-1]
    a = _lower(g, n, unit)
    ta = g.ch.boolean()
    return Stmt(
        "triangular_solve_right",
        (v.name,),
        f"lax.linalg.triangular_solve({_array_lit(a)}, {{0}}, left_side=False, "
        f"lower=True, transpose_a={ta}, unit_diagonal={unit})",
    )


@_op("linalg_solve", ["custom_linear_solve"], 1)
def _linalg_solve(g: _Gen) -> Stmt | None:
    """A general solve: no inverse rule (refused)."""
    v = g.operand(lambda v: len(v.shape) == 1)
    if v is None:
        return None
    return Stmt(
        "linalg_solve",
        (v.name,),
        f"jnp.linalg.solve({_array_lit(_matrix(g, v.shape[0]))}, {{0}})",
    )


# --- loops written out -----------------------------------------------------


@_op("scan_known_xs", ["scan"], 2)
def _scan_known_xs(g: _Gen) -> Stmt | None:
    """A carry updated with known per-step factors."""
    v = g.operand(lambda v: _amax(v.np) < 5)
    if v is None:
        return None
    qs = np.round(g.rng().uniform(0.7, 1.3, g.ch.integer(1, 3)), 2)
    return Stmt(
        "scan_known_xs",
        (v.name,),
        f"lax.scan(lambda c, q: (c * q + 0.25, None), {{0}}, {_array_lit(qs)})[0]",
        guard=lambda vs: _amax(vs[0]) < 5,
    )


@_op("scan_recurrence", ["scan"], 2)
def _scan_recurrence(g: _Gen) -> Stmt | None:
    """A recurrence over rows: `c' = 0.5 c + r`, `y = c + r`; returns the
    final carry and the outputs, or the outputs only."""
    v = g.operand(lambda v: len(v.shape) >= 1 and v.shape[0] >= 1)
    if v is None:
        return None
    both = g.ch.boolean(0.6)
    expr = "lax.scan(lambda c, r: (0.5 * c + r, c + r), jnp.zeros_like({0}[0]), {0})"
    if both:
        return Stmt("scan_recurrence", (v.name,), expr, nout=2)
    return Stmt("scan_recurrence_ys", (v.name,), expr + "[1]")


@_op("fori_affine", ["scan", "while"], 1)
def _fori_affine(g: _Gen) -> Stmt | None:
    """A loop whose body reads the loop index (a known carry)."""
    v = g.operand(lambda v: _amax(v.np) < 5)
    if v is None:
        return None
    n = g.ch.integer(1, 3)
    if g.ch.boolean():
        expr = f"lax.fori_loop(0, {n}, lambda i, c: c * 0.9 + 0.1 * i, {{0}})"
    else:
        expr = (
            f"lax.while_loop(lambda s: s[0] < {n}, lambda s: (s[0] + 1, "
            "s[1] * 1.1 - s[0]), (0, {0}))[1]"
        )
    return Stmt("loop_affine", (v.name,), expr, guard=lambda vs: _amax(vs[0]) < 5)


# --- integer programs ------------------------------------------------------


def _int_op(name: str, expr: str, prims: Sequence[str], weight: int = 2, guard=None):
    def draw(g: _Gen) -> Stmt | None:
        v = g.operand(lambda v: guard is None or guard(v.np))
        if v is None:
            return None
        return Stmt(
            name,
            (v.name,),
            expr,
            elementwise=True,
            guard=(lambda vs: guard(vs[0])) if guard else None,
        )

    _op(name, prims, weight, kind="int")(draw)


_int_op("int_not", "~{0}", ["not"])
_int_op("int_xor", "{0} ^ 5", ["xor"])
_int_op("int_add", "{0} + 7", ["add"])
_int_op("int_sub", "3 - {0}", ["sub"])
_int_op("int_neg", "-{0}", ["neg"])
_int_op("int_mul", "{0} * 3", ["mul"], guard=lambda a: _amax(a) < 10**5)
_int_op("int_and", "{0} & 6", ["and"], 1)
_int_op("int_or", "{0} | 6", ["or"], 1)
_int_op("int_shift", "{0} << 1", ["shift_left"], 1, guard=lambda a: _amax(a) < 10**5)
_int_op("int_shift_right", "{0} >> 1", ["shift_right_arithmetic"], 1)
_int_op(
    "int_shift_right_logical",
    "lax.shift_right_logical({0}, 1)",
    ["shift_right_logical"],
    1,
)
_int_op("int_rem", "lax.rem({0}, 5)", ["rem"], 1)
_int_op("int_popcount", "lax.population_count({0})", ["population_count"], 1)
_int_op("int_clz", "lax.clz({0})", ["clz"], 1)
_int_op(
    "int_to_float_and_back",
    "{0}.astype(jnp.float32).astype(jnp.int32)",
    ["convert_element_type"],
    1,
)


@_op("int_binary_unknown", ["add", "sub", "xor"], 2, kind="int")
def _int_binary_unknown(g: _Gen) -> Stmt | None:
    a = g.pick()
    if a is None:
        return None
    b = g.pick(lambda u: u.shape == a.shape or u.shape == ())
    if b is None:
        return None
    op = g.ch.choice(["+", "-", "^"])
    return Stmt(
        "int_binary_unknown",
        (a.name, b.name),
        f"{{0}} {op} {{1}}",
        elementwise=True,
        keep=(1,) if g.ch.boolean(0.6) else (),
    )


# --- blocks solved as a whole ----------------------------------------------
# Elementwise maps using the unknown several times: linear-fractional ones
# (a formula), monotone ones (the numerical solve), maps that turn (inverted
# where `y` has one preimage: the guard keeps the sample there), piecewise
# maps with jumps (comparisons, `floor`, one-hot bins), and linear chains
# from a value known in pieces. Constants are literals, so the maps that
# turn are checked at trace time (a known argument would make every element
# where the map turns NaN).

# (expression over {0} and a constant C, guard(values, C), C's range)
_BlockRow = tuple[str, Callable[[Any, float], bool], tuple[float, float]]

_FRACTIONAL: list[_BlockRow] = [
    ("({0} - C) / ({0} + 2.5)", lambda a, c: _amin(a + 2.5) > 0.3, (-2, 2)),
    ("{0} / (C - {0})", lambda a, c: _amin(c - a) > 0.3, (2.2, 4)),
    ("{0} * (1.0 / ({0} + C))", lambda a, c: _amin(a + c) > 0.3, (2.2, 4)),
    ("(2.0 * {0} + C) / ({0} * 0.5 - 3.0)", lambda a, c: _amin(a - 6) > 0.6, (-2, 2)),
    ("({0} + {0} * C) / ({0} + 4.0)", lambda a, c: _amin(a + 4) > 0.3, (0.3, 2)),
    (
        "1.0 - C / ({0} + 3.0) + {0} / ({0} + 3.0)",
        lambda a, c: _amin(a + 3) > 0.3,
        (0.5, 2),
    ),
    (
        "jax.jit(lambda u: (u + C) / (u - 4.0))({0}) * 2.0",
        lambda a, c: _amin(a - 4) > 0.3,
        (0.5, 2),
    ),
    # The logarithm of such a map, and maps linear-fractional in `e^x` or
    # `e^-x` (softplus's inverse, a sigmoid).
    (
        "jnp.log({0} + C) - jnp.log1p(-{0})",
        lambda a, c: _amin(a + c) > 0.05 and _hi(a) < 0.95,
        (0.5, 2),
    ),
    (
        "{0} + jnp.log(-jnp.expm1(-{0})) + C",
        lambda a, c: _lo(a) > 0.05 and _hi(a) < 15,
        (-1, 1),
    ),
    ("jnp.exp({0}) / (C + jnp.exp({0}))", lambda a, c: _amax(a) < 10, (0.5, 2)),
    ("{0} - jnp.log1p(C * jnp.exp({0}))", lambda a, c: _amax(a) < 10, (0.5, 2)),
]
_MONOTONE: list[_BlockRow] = [
    ("{0} + jnp.sin({0}) * C", lambda a, c: _amax(a) < 50, (0.1, 0.9)),
    ("{0} * jnp.exp({0} * {0} * C)", lambda a, c: _amax(a) < 3, (0.05, 0.3)),
    ("{0} / (C + jnp.abs({0}))", lambda a, c: True, (0.5, 2)),
    ("{0} + C * jnp.tanh(2.0 * {0})", lambda a, c: True, (0.1, 1)),
    ("jnp.sinh({0}) + C * {0}", lambda a, c: _amax(a) < 6, (0.2, 2)),
    ("{0} ** 3 + C * {0}", lambda a, c: _amax(a) < 10, (0.2, 2)),
    # Falls to 0 where `x**2` overflows (split there, not a turn); `y = 0`
    # has a second preimage past it, so samples stay off 0.
    (
        "{0} / jnp.sqrt(C + {0} * {0})",
        lambda a, c: _amax(a) < 50 and _amin(np.abs(a)) > 1e-3,
        (0.5, 2),
    ),
    (
        "jnp.log({0}) - jnp.log1p(-{0}) + C * {0}",
        lambda a, c: 0.02 < _lo(a) and _hi(a) < 0.98,
        (0, 1),
    ),
]
_TURNING: list[_BlockRow] = [
    # Turns at -1 (value -1/e): each y >= 0 has one preimage.
    (
        "{0} * jnp.exp({0} * C)",
        lambda a, c: _lo(a) > 0.05 and _hi(a) * c < 5,
        (0.5, 1.5),
    ),
    # Turns at +-sqrt(C/3): values beyond the turning values have one.
    (
        "{0} ** 3 - C * {0}",
        lambda a, c: _amin(a) > 1.5 * np.sqrt(c) and _amax(a) < 10,
        (0.2, 1.5),
    ),
    # Shifted Gompertz CDF: turns for x < 0, increasing onto (0, 1) for x > 0.
    (
        "(1 - jnp.exp(-{0})) * jnp.exp(-C * jnp.exp(-{0}))",
        lambda a, c: 0.05 < _lo(a) and _hi(a) < 8,
        (0.3, 1.5),
    ),
    # Turns at 1 (value 1/e): each y <= 0 has one preimage.
    ("{0} * jnp.exp(-{0}) * C", lambda a, c: _hi(a) < -0.05 and _lo(a) > -6, (0.5, 2)),
]


def _frac(a: Any, c: float) -> Any:
    return np.mod(a, c)


_JUMPS: list[_BlockRow] = [
    # Jumps up at C: injective.
    (
        "jnp.where({0} > C, {0} * 2.0 + 0.5, {0})",
        lambda a, c: _amax(a - c) > 1e-3,
        (-1, 1),
    ),
    # x*x above 1, 2x below: (1, 2] taken twice, so x in about (0.5, 1.42].
    (
        "jnp.where({0} > 1.0, {0} * {0}, C * 2.0 * {0})",
        lambda a, c: not np.any((a > 0.45 / c) & (a < 1.45)),
        (0.9, 1.1),
    ),
    ("{0} + C * jnp.floor({0})", lambda a, c: _amax(a) < 30, (0.1, 1)),
    # Drops by 0.3 at multiples of C: the 0.3 before and after taken twice.
    (
        "{0} - 0.3 * jnp.floor({0} / C)",
        lambda a, c: (
            bool(np.all((_frac(a, c) > 0.35) & (_frac(a, c) < c - 0.35)))
            and _amax(a) < 20
        ),
        (2, 3),
    ),
    (
        "{0} + 0.25 * jnp.sum({0}[..., None] > jnp.array([-1.0, 0.0, C]), axis=-1)",
        lambda a, c: True,
        (0.5, 1.5),
    ),
    (
        "jnp.where({0} > 0, {0}, C * {0}) + {0} / (1 + jnp.abs({0}))",
        lambda a, c: True,
        (0.1, 0.5),
    ),
    # A corner into a flat stretch (`x <= 0`), sampled where it is injective.
    (
        "jax.nn.relu({0}) + jax.nn.relu({0}) ** 2 + C",
        lambda a, c: _lo(a) > 0.05,
        (-1, 1),
    ),
    (
        "{0} - C * jnp.sign({0} - 2.0)",
        lambda a, c: bool(np.all(np.abs(a - 2.0) > c + 0.05)),
        (0.1, 0.5),
    ),
    # Drops by 0.05 inside a window `|x - C| < 0.0416` of a smoothly turning
    # comparison, which can lie between two grid points: the
    # values within 0.056 either way of its left edge are taken twice.
    (
        "jnp.where(jnp.exp(-400.0 * ({0} - C) ** 2) > 0.5, {0} - 0.05, {0})"
        " + 0.1 * jnp.sin({0})",
        lambda a, c: bool(np.all(np.abs(a - (c - 0.0416)) > 0.07)),
        (-1, 1),
    ),
    # A `cond` and a `switch` on each element (`lax.map`: a `scan` whose
    # body chooses by the unknown), unfolded into piecewise maps.
    (
        "lax.map(lambda u: lax.cond(u > C, lambda v: v * 2.0 + 0.5, lambda v: v,"
        " u), jnp.ravel({0})).reshape(jnp.shape({0}))",
        lambda a, c: True,
        (-1, 1),
    ),
    (
        "lax.map(lambda u: lax.switch(jnp.clip(jnp.floor(u + 1.0), 0, 2)"
        ".astype(jnp.int32), [lambda v: v, lambda v: v * (1.0 + C),"
        " lambda v: v * 2.0 + C], u), jnp.ravel({0})).reshape(jnp.shape({0}))",
        lambda a, c: True,
        (0.1, 1),
    ),
    # Piecewise quadratics through clips (inverted interval by interval),
    # and a spline-like chain of `where`s over four bins.
    ("{0} + C * jnp.clip({0}, 0.0, 1.0) ** 2", lambda a, c: True, (0.1, 2)),
    ("{0} - C * jnp.clip({0}, -1.0, 1.0) ** 2", lambda a, c: True, (0.1, 0.45)),
    (
        "jnp.where({0} < -1.0, {0}, jnp.where({0} < 0.0, {0} + C * ({0} + 1.0)"
        " * {0}, jnp.where({0} < 1.0, {0} + C * {0} * {0}, {0} * (1.0 + C))))",
        lambda a, c: True,
        (0.1, 0.45),
    ),
    # Per-element: clips along an extra axis of knots, summed;
    # a bin picked by one-hot masks, and the position in it clipped.
    (
        "{0} + C * jnp.sum(jnp.clip({0}[..., None] - jnp.array([-1.0, 0.0, 1.5]),"
        " 0.0, 1.0) ** 2, axis=-1)",
        lambda a, c: True,
        (0.1, 2),
    ),
    (
        "{0} + C * (lambda t: t * (1.0 - t))(jnp.clip({0} - jnp.sum((({0}[..., None]"
        " >= jnp.array([-1.0, 0.0])) & ({0}[..., None] < jnp.array([0.0, 1.0])))"
        " * jnp.array([-1.0, 0.0]), axis=-1), 0.0, 1.0))",
        lambda a, c: True,
        (0.1, 0.9),
    ),
]


def _block_op(
    name: str,
    rows: list[_BlockRow],
    prims: Sequence[str],
    weight: int,
    elementwise: bool = True,
):
    def draw(g: _Gen) -> Stmt | None:
        expr, guard, (lo, hi) = g.ch.choice(rows)
        c = round(float(g.rng().uniform(lo, hi)), 2)
        v = g.operand(lambda v: guard(v.np, c))
        if v is None:
            return None
        return Stmt(
            name,
            (v.name,),
            expr.replace("C", _lit(c)),
            guard=lambda vs: bool(guard(vs[0].astype(np.float64), c)),
            elementwise=elementwise,
        )

    _op(name, prims, weight)(draw)


# Poles and holes on the solver's grid. `x - C / x` takes
# every value on each side of 0, and so does `x - C * 1e-30 / x`, which
# equals `x` at every grid point and reaches +-1e8 next to 0: both are NaN
# wherever they are accepted. `expm1(C x) / x` is not finite at 0 only
# and rises through it: solved.
_POLES: list[_BlockRow] = [
    ("{0} - C / {0}", lambda a, c: _amin(np.abs(a)) > 0.05, (0.2, 2)),
    ("{0} - C * 1e-30 / {0}", lambda a, c: _amin(np.abs(a)) > 0.05, (0.5, 2)),
    (
        "jnp.expm1(C * {0}) / {0}",
        lambda a, c: _amin(np.abs(a)) > 0.05 and _amax(np.abs(a)) * c < 8,
        (0.5, 2),
    ),
]


# Folds between the solver's grid points: `x - 0.02 C tanh(100
# (x - 0.3))` turns twice within 0.02 of 0.3 when `C > 0.5`, unseen by the
# grid's values; `x**3 - 0.01 C x` turns at `+-sqrt(C / 300)`. Each `y` in a
# fold has three preimages: NaN (or refused); outside it, solved. The
# same family with `C < 0.5` is monotone: solved everywhere.
_FOLDS: list[_BlockRow] = [
    ("{0} - C * 0.02 * jnp.tanh(100.0 * ({0} - 0.3))", lambda a, c: True, (0.6, 3)),
    ("{0} - C * 0.02 * jnp.tanh(100.0 * ({0} - 0.3))", lambda a, c: True, (0.1, 0.45)),
    ("{0} ** 3 - C * 0.01 * {0}", lambda a, c: True, (0.5, 2)),
]


@_op("block_folds_known", ["tanh", "sub"], 1)
def _block_folds_known(g: _Gen) -> Stmt | None:
    """The tanh fold of `_FOLDS` centred on a known value: the
    programs pass their known values as arguments, so the fold is found when
    the program runs (`jit` and the `vmap` variants included)."""
    v = g.operand()
    if v is None:
        return None
    k = g.known_for(v.shape)
    if k is None:
        return None
    lo, hi = g.ch.choice([(0.6, 3.0), (0.1, 0.45)])
    c = _lit(round(float(g.rng().uniform(lo, hi)), 2))
    expr = f"{{0}} - {c} * 0.02 * jnp.tanh(100.0 * ({{0}} - {{1}}))"
    return Stmt("block_folds_known", (v.name, k.name), expr, elementwise=True)


_block_op("block_fractional", _FRACTIONAL, ["div", "add", "mul"], 1)
_block_op("block_folds", _FOLDS, ["tanh", "sub", "integer_pow"], 1)
_block_op("block_poles", _POLES, ["div", "sub", "expm1"], 1)
_block_op("block_monotone", _MONOTONE, ["sin", "exp", "abs", "tanh"], 1)
_block_op("block_turning", _TURNING, ["exp", "integer_pow"], 1)
_block_op("block_jumps", _JUMPS, ["select_n", "gt", "floor", "sign"], 1)


# A `cond` / `switch` whose index is computed from the whole unknown (its
# sum): solved once per branch. Each branch's image is apart
# from the others' (sums below, between and above), and the sample's sum
# is kept off the switching values.
_WHOLE_INDEX: list[_BlockRow] = [
    (
        "lax.cond(jnp.sum({0}) > C, lambda v: v * 2.0 + 0.5, lambda v: v - 3.0, {0})",
        lambda a, c: abs(float(np.sum(a)) - c) > 0.05,
        (-1, 1),
    ),
    (
        "lax.switch(jnp.clip(jnp.floor(jnp.sum({0}) * 0.5 + 1.0), 0, 2)"
        ".astype(jnp.int32), [lambda v: v - 8.0, lambda v: v * (1.0 + C),"
        " lambda v: v * 2.0 + 8.0], {0})",
        lambda a, c: min(abs(float(np.sum(a)) - t) for t in (-2.0, 0.0)) > 0.05,
        (0.1, 1),
    ),
]


# (Not elementwise: the index reads the whole operand.)
_block_op("cond_of_a_sum", _WHOLE_INDEX, ["cond", "reduce_sum"], 1, elementwise=False)

# Through one number computed from the whole unknown (a planar map, a map
# onto a ball), solved by one scalar equation whose `G` must be
# continuous; the pole `x - C * 1e-30 / sum(x)` takes every value twice.
_BOTTLENECK: list[_BlockRow] = [
    ("{0} + C * jnp.tanh(jnp.sum({0}))", lambda a, c: True, (0.1, 0.9)),
    (
        "{0} / (1.0 + C * jnp.sqrt(jnp.sum({0} * {0})))",
        lambda a, c: True,
        (0.2, 1.5),
    ),
    (
        "{0} - C * 1e-30 / jnp.sum({0})",
        lambda a, c: abs(float(np.sum(a))) > 0.05,
        (0.5, 2),
    ),
]
_block_op(
    "bottleneck", _BOTTLENECK, ["tanh", "reduce_sum", "sqrt"], 1, elementwise=False
)


@_op("partly_known_chain", ["slice", "reduce_sum", "mul"], 1)
def _partly_known_chain(g: _Gen) -> Stmt | None:
    """`(x[..., 1:], sum(c * x))`: the sum solved for the element left."""
    v = g.pick(lambda v: len(v.shape) >= 1 and v.shape[-1] >= 2)
    if v is None:
        return None
    rng = g.rng()
    c = np.round(rng.uniform(0.5, 1.5, v.shape[-1]) * rng.choice([-1, 1]), 2)
    if g.ch.boolean():
        expr = f"({{0}}[..., 1:], jnp.sum({{0}} * {_array_lit(c)}, axis=-1))"
    else:
        last = f"{{0}}[..., -1] * {_lit(c[0])}"
        expr = f"({{0}}[..., :-1], {last} + jnp.sum({{0}}[..., :-1], axis=-1))"
    return Stmt("partly_known_chain", (v.name,), expr, nout=2)


def _diag_ok(a: Any) -> bool:
    """A factor's diagonal away from 0 (`y` well conditioned) and entries
    small enough for `exp`."""
    a = np.asarray(a, np.float64)
    return bool(np.min(np.abs(np.diagonal(a))) > 0.25 and _amax(a) < 4)


def _negative_diagonal(vs: list[Any]) -> bool:
    """`L @ L.T` of `L = tril(z)`: the inverse takes the factor with a
    positive diagonal, so a negative one on the sample is another branch."""
    return bool(np.any(np.diagonal(np.asarray(vs[0])) < 0))


@_op("gram_factor", ["dot_general", "select_n", "transpose"], 1)
def _gram_factor(g: _Gen) -> Stmt | None:
    """`L @ L.T` of a factor lower triangular by construction (`_gram.py`),
    written the ways users write it, also on a batch (3-D: two members
    holding the factor twice, or a batch of one, which `jnp.matmul`
    squeezes)."""
    v = g.pick(lambda v: len(v.shape) == 2 and v.shape[0] == v.shape[1] >= 2)
    if v is None:
        return None
    n = v.shape[0]
    tri = f"jnp.tri({n}, dtype=bool)"
    eye = f"jnp.eye({n}, dtype=bool)"
    gram = "(lambda L: L @ L.T)"
    rng = g.rng()
    lower = np.tril(np.round(rng.uniform(-0.8, 0.8, (n, n)), 2), -1)
    known = _array_lit(lower + np.diag(np.round(rng.uniform(0.6, 1.5, n), 2)))
    branchy: Callable[[list[Any]], bool] | None = _negative_diagonal
    guard = lambda vs: _diag_ok(vs[0])  # noqa: E731
    form = g.ch.integer(0, 9)
    if form == 0:
        expr = f"{gram}(jnp.tril({{0}}))"
    elif form == 1:
        einsum = "(lambda L: jnp.einsum('ik,jk->ij', L, L))"
        expr = f"{einsum}(jnp.where({tri}, {{0}}, 0.0))"
    elif form == 2:  # `triu` of the transpose, as `U.T @ U`
        expr = "(lambda U: U.T @ U)(jnp.triu({0}.T))"
    elif form in (3, 4):  # a positive diagonal by construction
        pos = "jnp.exp" if form == 3 else "jax.nn.softplus"
        expr = f"{gram}(jnp.where({eye}, {pos}({{0}}), jnp.tril({{0}})))"
        branchy, guard = None, lambda vs: _amax(vs[0]) < 3
    elif form == 5:  # scaled by a known scalar
        expr = f"{gram}({_lit(rng.uniform(0.5, 2.0))} * jnp.tril({{0}}))"
    elif form == 6:  # a known diagonal, unknowns below it
        expr = f"{gram}(jnp.where(jnp.tri({n}, k=-1, dtype=bool), {{0}}, {known}))"
        branchy, guard = None, lambda vs: _amax(vs[0]) < 4
    elif form == 7:  # plus a known matrix
        expr = f"(lambda L: L @ L.T + {known})(jnp.tril({{0}}))"
    elif form == 8:  # a batch of two holding the factor twice
        expr = (
            "(lambda L: L @ jnp.swapaxes(L, -1, -2))"
            "(jnp.tril(jnp.stack([{0}, 2.0 * {0}])))"
        )
    else:  # a batch of one
        expr = "(lambda L: jnp.matmul(L, jnp.swapaxes(L, -1, -2)))(jnp.tril({0}[None]))"
    return Stmt("gram_factor", (v.name,), expr, guard=guard, branchy=branchy)


@_op("discard_projection", ["select_n", "mul"], 1)
def _discard_projection(g: _Gen) -> Stmt | None:
    """A step that discards some elements (`tril`, `where` with a constant
    mask against a constant): completed with what it uses in their place;
    `x * mask` reads them (NaN * 0), and a mask or a case known only at run
    time leaves them undetermined (NaN, refused with `strict`)."""
    v = g.pick(lambda v: len(v.shape) >= 1 and v.np.size >= 2)
    if v is None:
        return None
    m = _mask(g, v.shape, "partial")
    mask = _array_lit(m)
    rng = g.rng()
    form = g.ch.integer(0, 5)
    if form == 0 and len(v.shape) == 2:
        k = g.ch.integer(-1, 1)
        side = g.ch.choice(["tril", "triu"])
        return Stmt("discard_projection", (v.name,), f"jnp.{side}({{0}}, {k})")
    if form == 1:
        other = _array_lit(np.round(rng.uniform(-2, 2, v.shape), 2))
        return Stmt(
            "discard_projection", (v.name,), f"jnp.where({mask}, {{0}}, {other})"
        )
    if form == 2:
        return Stmt("discard_projection", (v.name,), f"{{0}} * {mask}.astype(float)")
    if form in (3, 4):
        k = g.known_for(v.shape)
        if k is not None:
            expr = (
                f"jnp.where({mask}, {{0}}, {{1}})"
                if form == 3
                else "jnp.where({1} > 1.0, {0}, 0.5)"
            )
            return Stmt("discard_projection", (v.name, k.name), expr, keep=(1,))
    c = _lit(rng.uniform(-2, 2))
    return Stmt("discard_projection", (v.name,), f"jnp.where({mask}, {{0}}, {c})")


def op_names(kind: str | None = None) -> list[str]:
    """The generator's op names (for `exclude=`), optionally of one kind."""
    return [n for n, op in _OPS.items() if kind is None or op.kind == kind]


def op_primitives() -> dict[str, tuple[str, ...]]:
    """The primitives each op is meant to stage."""
    return {n: op.prims for n, op in _OPS.items()}


# --- wrappers --------------------------------------------------------------

_LOOPS = ("scan", "fori", "while")


def _wrap(
    g: _Gen, s: Stmt, vals: list[Any], outs: list[Any], loops: bool = True
) -> tuple[Stmt, list[Any]]:
    """Maybe wrap `s` in a JAX construct; return it and its (new) values."""
    if g.ch.boolean(0.55):
        return s, outs
    no_bool = all(o.dtype != jnp.bool_ for o in outs)
    floats = all(jnp.issubdtype(jnp.asarray(v).dtype, jnp.floating) for v in vals)
    options: list[str] = []
    if no_bool:
        options += ["jit", "checkpoint"]
        if floats and all(jnp.issubdtype(o.dtype, jnp.floating) for o in outs):
            options += ["custom_jvp", "custom_vjp"]
        if s.nout == 1:
            options += ["cond", "switch"]
    first_unknown = not g.vals[s.ins[0]].known
    if (
        s.nout == 1
        and loops
        and first_unknown
        and outs[0].shape == jnp.shape(vals[0])
        and outs[0].dtype == jnp.asarray(vals[0]).dtype
    ):
        options += list(_LOOPS)
    if s.elementwise and s.nout == 1 and jnp.ndim(vals[0]) >= 1:
        shape = jnp.shape(vals[0])
        if all(jnp.shape(v) in (shape, ()) for v in vals) and outs[0].shape == shape:
            options += ["vmap", "scan_rows"]
    if not options:
        return s, outs
    w = g.ch.choice(options)
    if w in _LOOPS:
        reps = g.ch.integer(1, 3)
        cur, others = list(vals), vals[1:]
        done = 0
        new = outs
        for r in range(reps):
            step = _run_stmt(dataclasses.replace(s, wrapper="plain"), cur)
            if step is None:
                break
            new, done = step, r + 1
            cur = [step[0], *others]
        return dataclasses.replace(s, wrapper=w, reps=max(done, 1)), new
    if w in ("vmap", "scan_rows"):
        shape = jnp.shape(vals[0])
        mapped = tuple(jnp.shape(v) == shape for v in vals)
        return dataclasses.replace(s, wrapper=w, mapped=mapped), outs
    if w in ("cond", "switch"):
        n_branches = 2 if w == "cond" else 3
        branch = g.ch.integer(0, n_branches - 1)
        k = g.pick(lambda u: True, known=True) if g.ch.boolean(0.6) else None
        if k is not None:
            total = float(np.sum(k.np))
            if w == "cond":
                thr = total - 0.5 if branch == 0 else total + 0.5
                pred = f"jnp.sum({{p}}) > {_lit(thr)}"
            else:
                other = (branch + 1) % 3
                thr = _lit(total - 0.5)
                pred = f"jnp.where(jnp.sum({{p}}) > {thr}, {branch}, {other})"
            pred_in = k.name
        else:
            pred = repr(branch == 0) if w == "cond" else repr(branch)
            pred_in = ""
        new = dataclasses.replace(
            s, wrapper=w, branch=branch, pred=pred, pred_in=pred_in
        )
        res = _run_stmt(new, vals)
        if res is None:
            return s, outs
        return new, res
    return dataclasses.replace(s, wrapper=w), outs


# --- the generator -----------------------------------------------------------


def generate(
    ch: Chooser,
    *,
    max_stmts: int = 12,
    exclude: Sequence[str] = (),
    int_programs: bool = True,
    injective: bool = False,
) -> Program:
    """Draw a random program (see the module docstring).

    Args:
        ch: where the choices come from.
        max_stmts: at most this many statements (at least one).
        exclude: op names (see `op_names`) not to use.
        int_programs: allow programs over int32 unknowns.
        injective: only use non-injective operations (principal branches,
            lossy casts) where they are injective on the sample.
    """
    int_mode = int_programs and ch.integer(0, 9) == 0
    g = _Gen(ch, int_mode)
    rng = g.rng()
    n_unknown = ch.integer(1, 3)
    n_known = ch.integer(0, 2)
    shapes = [ch.choice(SHAPES) for _ in range(n_unknown)]
    samples: dict[str, Any] = {}
    for k, shape in enumerate(shapes):
        if int_mode:
            a = rng.integers(-50, 50, shape).astype(np.int32)
        else:
            a = rng.uniform(0.3, 1.8, shape) * rng.choice([-1.0, 1.0], shape)
            a = a.astype(np.float32)
        samples[f"x{k}"] = a
    for k in range(n_known):
        shape = () if ch.boolean(0.6) else ch.choice(shapes)
        if int_mode:
            a = rng.integers(1, 6, shape).astype(np.int32)
        else:
            a = rng.uniform(0.6, 1.4, shape).astype(np.float32)
        samples[f"p{k}"] = a
    names = list(samples)
    order: list[str] = []
    while names:  # a random argument order
        order.append(names.pop(ch.integer(0, len(names) - 1)))
    for n in order:
        g.vals[n] = _Val(n, jnp.asarray(samples[n]), n.startswith("p"))

    kinds = {"any", "int" if int_mode else "float"}
    menu: list[str] = []
    for name, op in _OPS.items():
        if op.kind in kinds and name not in exclude:
            menu += [name] * op.weight
    n_stmts = ch.integer(1, max_stmts)
    for _ in range(n_stmts):
        for _attempt in range(6):
            op = ch.choice(menu)
            spec = _OPS[op].draw(g)
            if spec is None or spec.op in exclude:
                continue
            vals = [g.vals[n].value for n in spec.ins]
            outs = _run_stmt(spec, vals)
            if outs is None:
                continue
            # Loops would apply a principal branch to values not checked here.
            loops = True
            if injective and spec.branchy is not None:
                if spec.branchy([np.asarray(v) for v in vals]):
                    continue
                loops = False
            spec, outs = _wrap(g, spec, vals, outs, loops)
            spec = dataclasses.replace(spec, family=op)
            names_out = tuple(g.fresh() for _ in outs)
            spec = dataclasses.replace(spec, outs=names_out)
            known = all(g.vals[n].known for n in spec.ins)
            for n, o in zip(names_out, outs, strict=True):
                g.vals[n] = _Val(n, o, known)
            for k, n in enumerate(spec.ins):
                if k not in spec.keep:
                    g.consumed.add(n)
            g.stmts.append(spec)
            break

    frontier = [
        v.name for v in g.vals.values() if not v.known and v.name not in g.consumed
    ]
    r = ch.integer(0, 9)
    outputs = list(frontier)
    if r == 7 and len(outputs) > 1:  # lose one
        outputs.pop(ch.integer(0, len(outputs) - 1))
    elif r == 8:  # say something twice
        extra = [
            v.name for v in g.vals.values() if v.name not in outputs and not v.known
        ]
        if extra:
            outputs.append(ch.choice(extra))
    elif r == 9:  # a known output
        extra = [v.name for v in g.vals.values() if v.known]
        if extra:
            outputs.append(ch.choice(extra))
    if not outputs:
        outputs = [list(g.vals)[-1]]
    outputs = outputs[:5]
    single = len(outputs) == 1 and ch.boolean()
    prog = Program(
        arg_names=tuple(order),
        unknown=tuple(n for n in order if n.startswith("x")),
        samples=tuple((n, samples[n]) for n in order),
        stmts=tuple(g.stmts),
        outputs=tuple(outputs),
        single=single,
        example_args=True,
    )
    if _mirrors(prog) and ch.boolean(0.3):
        prog = dataclasses.replace(prog, example_args=False)
    prog = _prune(prog)
    if not prog.example_args and not _mirrors(prog):
        # Pruning changed what the program returns.
        prog = dataclasses.replace(prog, example_args=True)
    return prog


def _mirrors(prog: Program) -> bool:
    """Whether `y` has the unknowns' structure (so `example_args` can go)."""
    xs = [np.asarray(prog.sample(n)) for n in prog.unknown]
    try:
        with jax.disable_jit():
            y = prog.build(wrapped=False)(*prog.args())
    except Exception:
        return False
    leaves, tree = jtu.tree_flatten(y)
    if len(xs) == 1:
        want = jtu.tree_structure(0)
    else:
        want = jtu.tree_structure(tuple(range(len(xs))))
    return tree == want and all(
        jnp.shape(a) == b.shape and jnp.result_type(a) == b.dtype
        for a, b in zip(leaves, xs, strict=True)
    )


def _prune(prog: Program) -> Program:
    """Drop statements nothing reads (dead code)."""
    live = set(prog.outputs)
    keep = []
    for s in reversed(prog.stmts):
        if any(o in live for o in s.outs):
            keep.append(s)
            live.update(s.ins)
            if s.pred_in:
                live.add(s.pred_in)
    return dataclasses.replace(prog, stmts=tuple(reversed(keep)))


@st.composite
def programs(
    draw: st.DrawFn,
    max_stmts: int = 12,
    exclude: Sequence[str] = (),
    int_programs: bool = True,
    injective: bool = False,
    seeded: bool = False,
) -> Program:
    """Hypothesis strategy for random programs (see `generate`).

    By default every choice is a Hypothesis draw, so a failing program
    shrinks. With `seeded`, Hypothesis draws one seed and `random.Random`
    makes the choices: successive examples differ more (better for a small
    `max_examples`), and `shrink` minimizes a failure instead.
    """
    ch: Chooser
    if seeded:
        ch = RandomChooser(draw(st.integers(0, 2**32 - 1)))
    else:
        ch = DrawChooser(draw)
    return generate(
        ch,
        max_stmts=max_stmts,
        exclude=exclude,
        int_programs=int_programs,
        injective=injective,
    )


# ---------------------------------------------------------------------------
# Classification.


@dataclasses.dataclass
class Outcome:
    """How the inverse did on one program.

    `kind` is `correct`, `refused`, `wrong`, `crash` or `invalid` (the program
    itself did not evaluate cleanly: a generator problem, not counted);
    `check` names the failed check, `prim` the primitive an error names.
    """

    kind: str
    check: str = ""
    detail: str = ""
    prim: str = ""

    def __str__(self) -> str:
        bits = [self.kind] + [b for b in (self.check, self.prim) if b]
        return "/".join(bits) + (f": {self.detail}" if self.detail else "")


REFUSALS = (jaxinterp.NotInvertibleError, jaxinterp.MissingRuleError)

_PRIM_RE = re.compile(r"at primitive `([^`]+)`")


def _error_prim(err: BaseException) -> str:
    found = _PRIM_RE.findall(str(err))
    return found[-1] if found else ""


def flags_off_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, run with JAX's hijax future flags off (`helpers.flags_off`): the
    references (round trips, Jacobians, batches) are plain JAX's classic
    constructs, which JAX 0.12.0.1 can batch and differentiate."""

    def run(*args: Any) -> Any:
        return flags_off(fn, *args)

    return run


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    cause = err.__cause__
    if cause is not None:
        text += f" [cause {type(cause).__name__}: {str(cause).splitlines()[0][:160]}]"
    return text.splitlines()[0][:400]


def _attempt(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        # (Waited for: an error of the compiled program, such as an XLA
        # runtime check, is raised when its result is ready.)
        return "ok", jax.block_until_ready(fn())
    except REFUSALS as err:
        return "refused", err
    except Exception as err:  # noqa: BLE001 - classifying every failure
        return "crash", err


def _leaves(t: Any) -> list[Any]:
    return [np.asarray(v) for v in jtu.tree_leaves(t)]


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return False
    for u, v in zip(la, lb, strict=True):
        if u.shape != v.shape:
            return False
        u64, v64 = u.astype(np.float64), v.astype(np.float64)
        if not np.array_equal(np.isnan(u64), np.isnan(v64)):
            return False
        scale = 1.0 + np.max(np.abs(v64[np.isfinite(v64)]), initial=0.0)
        with np.errstate(invalid="ignore"):  # inf - inf: equal infinities pass
            near = np.abs(u64 - v64) <= atol * scale + rtol * np.abs(v64)
        ok = np.isnan(u64) | (u64 == v64) | near
        if not np.all(ok):
            return False
    return True


def _max_err(a: Any, b: Any) -> float:
    errs = [
        float(
            np.max(
                np.abs(
                    np.where(u == v, 0.0, u.astype(np.float64) - v.astype(np.float64))
                ),
                initial=0.0,
            )
        )
        for u, v in zip(_leaves(a), _leaves(b), strict=True)
        if u.shape == v.shape
    ]
    return max(errs, default=0.0)


def check_inverse(
    f: Callable[..., Any],
    args: Sequence[Any],
    argnums: Sequence[int],
    *,
    reference: Callable[..., Any] | None = None,
    injective: bool = True,
    example_args: bool = True,
    variants: bool = True,
    batch_args: Sequence[Any] | None = None,
) -> Outcome:
    """Classify `inverse_and_ildj(f, argnums)` at `f(*args)` (see the module
    docstring).

    Args:
        f: the function.
        args: all its arguments; those at `argnums` are the unknowns.
        argnums: the unknown positions.
        reference: `f` without JAX constructs (for Jacobians and round trips).
        injective: whether `f` is injective near the sample, so the inverse
            must give back exactly `args` (false for principal branches).
        example_args: pass `example_args=` (else `y` must mirror the unknowns).
        variants: also check `jit`, `vmap`, `inverse` and `ildj`.
        batch_args: a second sample for the `vmap` variant.
    """
    reference = flags_off_fn(reference or f)
    argnums = tuple(argnums)
    args = [jnp.asarray(a) for a in args]
    xs = [args[i] for i in argnums]
    known = [a for i, a in enumerate(args) if i not in argnums]
    try:
        # Op by op: the compiled primitives are shared by all programs.
        with jax.disable_jit():
            y_ref = reference(*args)
            # (Plain JAX 0.12.0.1 computes some programs wrongly under its
            # hijax flags, e.g. a `Scan3` inside a `custom_jvp`: `y` is the
            # program's meaning, with the flags off; `inverse` still stages
            # `f` under them.)
            y = flags_off(f, *args)
    except Exception as err:  # noqa: BLE001
        return Outcome("invalid", "evaluate", _first_line(err))
    if jtu.tree_structure(y) != jtu.tree_structure(y_ref):
        return Outcome("invalid", "wrapped_differs", "structure")
    if not all(np.all(np.isfinite(v.astype(np.float64))) for v in _leaves(y)):
        return Outcome("invalid", "nonfinite_y")
    if not _close(y, y_ref, 1e-4, 1e-4):
        return Outcome(
            "invalid", "wrapped_differs", f"max err {_max_err(y, y_ref):.3g}"
        )
    spelled = argnums[0] if len(argnums) == 1 else argnums
    kw = {"example_args": tuple(xs)} if example_args else {}

    def make(transform: Callable[..., Any]) -> Callable[..., Any]:
        return transform(f, argnums=spelled, **kw)

    inv = make(jaxinterp.inverse_and_ildj)
    status, res = _attempt(lambda: inv(y, *known))
    if status == "crash" and _attempt(lambda: jax.jit(f)(*args))[0] == "crash":
        # Plain JAX fails to compile or run the program itself (found with
        # `--seed 1717`, program 93: XLA's CPU FFT thunk rejects the layout
        # its own compiler chose, under `jax.jit` of the forward program).
        return Outcome("invalid", "plain_jit_fails", _first_line(res))
    if status == "crash":
        return Outcome(
            "crash", f"crash:{type(res).__name__}", _first_line(res), _error_prim(res)
        )
    if status == "refused":
        if variants:
            return _check_refusing_variants(make, y, known, argnums, batch_args, args)
        return Outcome(
            "refused", type(res).__name__, _first_line(res), _error_prim(res)
        )
    inverse_only = make(jaxinterp.inverse)
    got = _check_result(
        res,
        xs,
        known,
        argnums,
        y,
        reference,
        injective,
        inverse_x=lambda y_: inverse_only(y_, *known),
    )
    if (got.kind, got.check) == ("wrong", "nan"):
        # NaN for elements the outputs leave undetermined at run time is
        # documented; it is acceptable only if `strict=True` raises for it.
        strict = transform_strict(f, spelled, kw)
        status, err = _attempt(lambda: strict(y, *known))
        if status == "refused" and "(strict)" in str(err):
            return Outcome("refused", "strict", _first_line(err), _error_prim(err))
        return got
    if got.kind == "correct" and variants:
        got = _check_variants(make, inv, res, y, known, argnums, batch_args, reference)
    if got.kind != "correct":
        return got
    return _check_moved_y(inv, y, known, argnums, reference)


def _coarsest_eps(f: Callable[..., Any], args: Sequence[Any]) -> float:
    """The largest epsilon among the floating dtypes of the values `f`
    computes (its Jaxpr's, nested ones included)."""
    eps = 0.0

    def visit(jaxpr: Any) -> None:
        nonlocal eps
        for eqn in jaxpr.eqns:
            for v in eqn.outvars:
                dtype = getattr(v.aval, "dtype", None)
                if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                    eps = max(eps, float(jnp.finfo(dtype).eps))
            for sub in compat.sub_jaxprs(eqn):
                visit(sub)

    visit(jax.make_jaxpr(f)(*args).jaxpr)
    return eps


def _check_moved_y(
    inv: Callable[..., Any],
    y: Any,
    known: Sequence[Any],
    argnums: Sequence[int],
    reference: Callable[..., Any],
) -> Outcome:
    """`y` with one floating element moved (by 5% and `0.05`), which may
    leave the image: the inverse must give NaN (somewhere), refuse, or
    return an `x` that `f` maps to the moved `y`; never a number that does
    not round-trip (the documented promise for a `y` off the image)."""
    leaves, tree = jtu.tree_flatten(y)
    floating = [
        k
        for k, v in enumerate(leaves)
        if jnp.issubdtype(jnp.result_type(v), jnp.floating) and np.size(v)
    ]
    if not floating:
        return Outcome("correct")
    rng = np.random.default_rng(sum(np.size(v) for v in leaves))
    k = floating[int(rng.integers(len(floating)))]
    leaf = np.array(leaves[k])
    flat = leaf.reshape(-1)
    i = int(rng.integers(flat.size))
    flat[i] = flat[i] * 1.05 + 0.05
    moved = tree.unflatten([*leaves[:k], jnp.asarray(leaf), *leaves[k + 1 :]])
    status, res = _attempt(lambda: inv(moved, *known))
    if status == "crash":
        return Outcome(
            "crash", f"crash:{type(res).__name__}", _first_line(res), _error_prim(res)
        )
    if status == "refused":
        return Outcome("correct")
    x_rec, ildj = res
    rec = jtu.tree_leaves(x_rec)
    if any(np.any(np.isnan(np.asarray(v, np.float64))) for v in [*rec, ildj]):
        return Outcome("correct")
    try:
        with jax.disable_jit():
            y_rec = reference(*_merge(argnums, rec, known))
    except Exception as err:  # noqa: BLE001
        return Outcome("wrong", "moved_y", f"f(x_rec) raised {_first_line(err)}")
    # A program that rounds through bfloat16 or float16 is checked within a
    # few of their epsilons (`jaxinterp` allows that much rounding there).
    tol = max(2e-3, 4 * _coarsest_eps(reference, _merge(argnums, rec, known)))
    if not _close(y_rec, moved, tol, tol):
        return Outcome(
            "wrong",
            "moved_y",
            f"element {i} of output {k} moved to {flat[i]:.6g}: x_rec="
            f"{_short(_leaves(rec))}, |f(x_rec) - y| = {_max_err(y_rec, moved):.3g}",
        )
    return Outcome("correct")


def transform_strict(
    f: Callable[..., Any], argnums: Any, kw: dict[str, Any]
) -> Callable[..., Any]:
    return jaxinterp.inverse_and_ildj(f, argnums=argnums, strict=True, **kw)


def _merge(argnums: Sequence[int], xs: Sequence[Any], known: Sequence[Any]) -> list:
    out, xi, ki = [], iter(xs), iter(known)
    for i in range(len(xs) + len(known)):
        out.append(next(xi) if i in argnums else next(ki))
    return out


def _check_result(
    res: Any,
    xs: list[Any],
    known: list[Any],
    argnums: tuple[int, ...],
    y: Any,
    reference: Callable[..., Any],
    injective: bool,
    inverse_x: Callable[[Any], Any] | None = None,
) -> Outcome:
    if not (isinstance(res, tuple) and len(res) == 2):
        return Outcome("wrong", "structure", f"returned {type(res).__name__}")
    x_rec, ildj = res
    want_tree = jtu.tree_structure(xs[0] if len(xs) == 1 else tuple(xs))
    if jtu.tree_structure(x_rec) != want_tree:
        return Outcome("wrong", "structure", f"{jtu.tree_structure(x_rec)}")
    rec = jtu.tree_leaves(x_rec)
    for r, x in zip(rec, xs, strict=True):
        if jnp.shape(r) != x.shape or jnp.result_type(r) != x.dtype:
            return Outcome(
                "wrong",
                "structure",
                f"got {jnp.result_type(r)}{list(jnp.shape(r))}, "
                f"want {x.dtype}{list(x.shape)}",
            )
    if np.ndim(ildj) != 0:
        return Outcome("wrong", "structure", f"ildj of shape {np.shape(ildj)}")
    rec_np = [np.asarray(r).astype(np.float64) for r in rec]
    bad = [k for k, r in enumerate(rec_np) if not np.all(np.isfinite(r))]
    if bad:
        k = bad[0]
        where = np.argwhere(~np.isfinite(rec_np[k])).tolist()[:4]
        return Outcome(
            "wrong", "nan", f"unknown {k} is {rec_np[k].tolist()} (bad at {where})"
        )
    try:
        with jax.disable_jit():
            y_rec = reference(*_merge(argnums, rec, known))
    except Exception as err:  # noqa: BLE001
        return Outcome("wrong", "roundtrip", f"f(x_rec) raised {_first_line(err)}")
    is_float = all(jnp.issubdtype(x.dtype, jnp.floating) for x in xs)
    # Which returned elements influence an output.
    flat_x, unravel = ravel_pytree(list(rec))
    n_in = flat_x.size

    def flat_f(fx: Any) -> Any:
        out = reference(*_merge(argnums, unravel(fx), known))
        leaves = [jnp.ravel(v).astype(fx.dtype) for v in jtu.tree_leaves(out)]
        return jnp.concatenate(leaves) if leaves else jnp.zeros((0,), fx.dtype)

    jac = None
    if is_float:  # one compilation, rather than one per batched primitive
        jac = np.asarray(jax.jit(jax.jacfwd(flat_f))(flat_x)).astype(np.float64)
        n_out = jac.shape[0]
        influence = np.any(jac != 0, axis=0) if n_out else np.zeros(n_in, bool)
    else:
        with jax.disable_jit():
            base = np.asarray(flat_f(flat_x))
            eye = jnp.eye(n_in, dtype=flat_x.dtype)
            bumped = np.asarray(jax.vmap(flat_f)(flat_x[None] + eye))
        influence = np.any(bumped != base[None], axis=1)
        n_out = base.size
    if is_float and not np.all(influence):
        # A zero column may be a zero derivative (`stop_gradient`): perturb.
        # Two sizes: small stays inside domains, large survives rounding
        # (`reduce_precision` keeps 8 bits).
        cols = np.flatnonzero(~influence)
        base = np.asarray(flat_f(flat_x))
        for rel in (1e-3, 5e-2):
            step = rel * (1 + np.abs(np.asarray(flat_x)[cols]))
            bumps = np.zeros((len(cols), n_in), np.float32)
            bumps[np.arange(len(cols)), cols] = step
            with jax.disable_jit():
                moved = jax.vmap(flat_f)(flat_x[None] + jnp.asarray(bumps))
            influence[cols] |= np.any(np.asarray(moved) != base[None], axis=1)
    # Elements no output depends on may come back only as constants of the
    # inverse: what a step that discards them uses in their place
    # (`_gram.fill_step`). Their rows of `dx/dy` are then identically zero.
    chart = None
    if not np.all(influence) or (jac is not None and n_out > n_in):
        chart = _inverse_chart(inverse_x, y) if jac is not None else None
    if not np.all(influence) and (
        np.any(chart[0][~influence])
        if chart is not None
        else _moves_with_y(inverse_x, reference, argnums, known, rec, influence)
    ):
        cols = np.flatnonzero(~influence).tolist()
        return Outcome(
            "wrong",
            "influence",
            f"returned elements {cols[:6]} of the flattened unknowns that no output "
            f"depends on (x_rec={_short(rec_np)})",
        )
    if not _close(y_rec, y, 2e-3, 2e-3):
        return Outcome(
            "wrong", "roundtrip", f"|f(x_rec) - y| = {_max_err(y_rec, y):.3g}"
        )
    if chart is not None and jac is not None:
        # More results than unknowns, or elements completed: the ildj in the
        # coordinates the inverse reads (`_ildj.whole_map`).
        want = _chart_ildj(jac, *chart)
        got_ildj = float(ildj)
        if want is not None and not np.isfinite(got_ildj):
            return Outcome("wrong", "ildj_nan", f"ildj {got_ildj}, want {want:.5g}")
        if (
            want is not None
            and abs(got_ildj - want) > 1e-2 * (1 + abs(want))
            and not (not injective and _at_kink(flat_f, flat_x, want, chart))
        ):
            return Outcome(
                "wrong", "ildj_chart", f"ildj {got_ildj:.5g}, want {want:.5g}"
            )
    full_rank = True
    if jac is not None and n_out >= n_in and n_in:
        sv = np.linalg.svd(jac, compute_uv=False)
        full_rank = bool(sv[-1] > 1e-5 * max(sv[0], 1e-30))
    if injective and full_rank and not _close(rec, xs, 5e-3, 5e-3):
        return Outcome(
            "wrong",
            "preimage",
            f"x_rec={_short(rec_np)} but x={_short([np.asarray(x) for x in xs])}",
        )
    if jac is not None and n_out == n_in and n_in and chart is None:
        sign, logdet = np.linalg.slogdet(jac)
        if sign != 0:
            want = -logdet
            got = float(ildj)
            if not np.isfinite(got):
                return Outcome("wrong", "ildj_nan", f"ildj {got}, want {want:.5g}")
            if abs(got - want) > 1e-2 * (1 + abs(want)) and not (
                not injective and _kink_ildj(flat_f, flat_x, got)
            ):
                return Outcome("wrong", "ildj", f"ildj {got:.5g}, want {want:.5g}")
    return Outcome("correct")


def _inverse_chart(
    inverse_x: Callable[[Any], Any] | None, y: Any
) -> tuple[np.ndarray, np.ndarray] | None:
    """Which elements of `x` the inverse varies (rows of `dx/dy` not
    identically zero) and which real coordinates of `y` it reads (columns),
    by forward mode through `inverse`; `None` where that cannot be formed
    (no inverse given, integer results, no forward mode through it)."""
    if inverse_x is None or not all(
        jnp.issubdtype(jnp.result_type(v), jnp.inexact) for v in _leaves(y)
    ):
        return None
    flat_y, unravel = ravel_pytree(y)
    if jnp.issubdtype(flat_y.dtype, jnp.complexfloating):
        return None

    def x_of(fy: Any) -> Any:
        return ravel_pytree(inverse_x(unravel(fy)))[0]

    try:
        d = np.asarray(jax.jit(jax.jacfwd(x_of))(flat_y)).astype(np.float64)
    except Exception:  # noqa: BLE001 - no forward mode: cannot judge
        return None
    if d.ndim != 2 or not np.all(np.isfinite(d)):
        return None
    nonzero = d != 0
    return np.any(nonzero, axis=1), np.any(nonzero, axis=0)


def _moves_with_y(
    inverse_x: Callable[[Any], Any] | None,
    reference: Callable[..., Any],
    argnums: tuple[int, ...],
    known: list[Any],
    rec: list[Any],
    influence: np.ndarray,
) -> bool:
    """Where `dx/dy` cannot be formed (a `custom_vjp` has no forward mode):
    whether the elements no output depends on move when `y` does, along the
    image (`y = f(x_rec + dx)`, `dx` on the other elements). Constants of the
    inverse stay put; `True` also where that cannot be told."""
    if inverse_x is None:
        return True
    flat_x, unravel = ravel_pytree(list(rec))
    rng = np.random.default_rng(0)
    sign = rng.choice([-1.0, 1.0], influence.shape)
    step = 1e-2 * (1 + np.abs(np.asarray(flat_x))) * sign
    moved = flat_x + jnp.asarray(np.where(influence, step, 0.0), flat_x.dtype)
    try:
        with jax.disable_jit():
            y2 = reference(*_merge(argnums, unravel(moved), known))
        again = np.asarray(ravel_pytree(inverse_x(y2))[0])
    except Exception:  # noqa: BLE001 - cannot tell
        return True
    here = np.asarray(flat_x)[~influence]
    return not np.array_equal(again[~influence], here)


def _chart_ildj(jac: np.ndarray, varied: np.ndarray, read: np.ndarray) -> float | None:
    """The documented ildj of a map with more results than unknowns, or with
    elements completed, from the map's own Jacobian `jac` (`m x n`): only
    the `varied` elements count; `-log|det J[read, varied]|` when the inverse
    reads as many coordinates, else the area formula. `None` where `J` is
    singular there (nothing to compare)."""
    cols = jac[:, varied]
    if varied.sum() == 0:
        return 0.0
    if read.sum() == varied.sum():
        sign, logdet = np.linalg.slogdet(cols[read])
        return None if sign == 0 else float(-logdet)
    sign, logdet = np.linalg.slogdet(cols.T @ cols)
    return None if sign <= 0 else float(-0.5 * logdet)


def _at_kink(
    flat_f: Callable[[Any], Any],
    flat_x: Any,
    want: float,
    chart: tuple[np.ndarray, np.ndarray],
) -> bool:
    """Whether the chart ildj (`_chart_ildj`) of a map that is not injective
    changes just beside `x_rec`: a kink (a clamp's result at its bound), where
    the map has no derivative and the ildj no convention to judge by (the
    inverse's forward mode takes JAX's slope at a tie)."""
    step = 1e-4 * (1 + jnp.abs(flat_x))
    for side in (1.0, -1.0):
        jac = np.asarray(jax.jit(jax.jacfwd(flat_f))(flat_x + side * step))
        beside = _chart_ildj(jac.astype(np.float64), *chart)
        if beside is None or abs(beside - want) > 1e-2 * (1 + abs(want)):
            return True
    return False


def _kink_ildj(flat_f: Callable[[Any], Any], flat_x: Any, got: float) -> bool:
    """Whether `got` is an ildj of a map that is not injective, at a point
    where its derivative depends on a convention (a clamp's result at its
    bound: JAX gives `maximum` slope 1/2 at a tie, the inverse the identity's
    0): it matches the log-det just beside `x_rec`, on either side, or the
    map is flat on both sides (no log-det to match)."""
    step = 1e-4 * (1 + jnp.abs(flat_x))
    singular = 0
    for side in (1.0, -1.0):
        jac = np.asarray(jax.jit(jax.jacfwd(flat_f))(flat_x + side * step))
        sign, logdet = np.linalg.slogdet(jac.astype(np.float64))
        if sign == 0:
            singular += 1
        elif abs(got + logdet) <= 1e-2 * (1 + abs(logdet)):
            return True
    return singular == 2


def _short(arrays: Sequence[Any]) -> str:
    return "; ".join(np.array2string(np.asarray(a), precision=4) for a in arrays)[:300]


def _check_variants(make, inv, res, y, known, argnums, batch_args, f) -> Outcome:
    """`jax.jit`, `jax.vmap`, `inverse` and `ildj` must agree with eager
    `inverse_and_ildj`. All four run in one `jax.jit` (one compilation); when
    that fails, each runs alone to say which."""
    x_rec, ildj = res
    tol = dict(rtol=1e-4, atol=1e-4)
    y2 = y
    if batch_args is not None:
        try:
            with jax.disable_jit():
                y2 = f(*batch_args)
        except Exception:  # noqa: BLE001
            y2 = y
    status, want2 = _attempt(lambda: inv(y2, *known))
    if status != "ok":
        y2, want2 = y, res
    yb = jtu.tree_map(lambda a, b: jnp.stack([a, b]), y, y2)
    axes = (0,) + (None,) * len(known)
    inverse_only, ildj_only = make(jaxinterp.inverse), make(jaxinterp.ildj)
    runs = {
        "jit": lambda y, yb, k: inv(y, *k),
        "vmap": lambda y, yb, k: jax.vmap(inv, in_axes=axes)(yb, *k),
        "inverse": lambda y, yb, k: inverse_only(y, *k),
        "ildj": lambda y, yb, k: ildj_only(y, *k),
    }
    wants = {
        "jit": (x_rec, ildj),
        "vmap": jtu.tree_map(lambda a, b: jnp.stack([a, b]), (x_rec, ildj), want2),
        "inverse": x_rec,
        "ildj": ildj,
    }
    status, got = _attempt(
        lambda: jax.jit(lambda y, yb, k: {n: r(y, yb, k) for n, r in runs.items()})(
            y, yb, known
        )
    )
    if status == "ok":
        for name in runs:
            bad = _variant_mismatch(name, "ok", got[name], wants[name], tol)
            if bad:
                return bad
        return Outcome("correct")
    for name, run in runs.items():
        status, got = _attempt(lambda run=run: jax.jit(run)(y, yb, known))
        bad = _variant_mismatch(name, status, got, wants[name], tol)
        if bad:
            return bad
    # Each alone passes, together they fail: report the joint failure.
    return _variant_mismatch("joint", status, got, None, tol) or Outcome(
        "crash", "crash_joint", "variants fail only together"
    )


def _variant_mismatch(name, status, got, want, tol) -> Outcome | None:
    if status == "crash":
        return Outcome(
            "crash",
            f"crash_{name}:{type(got).__name__}",
            _first_line(got),
            _error_prim(got),
        )
    if status == "refused":
        return Outcome(
            "wrong", f"variant_{name}", f"refused: {_first_line(got)}", _error_prim(got)
        )
    if jtu.tree_structure(got) != jtu.tree_structure(want) or not _close(
        got, want, **tol
    ):
        return Outcome(
            "wrong",
            f"variant_{name}",
            f"differs from eager by {_max_err(got, want):.3g}",
        )
    return None


def _check_refusing_variants(make, y, known, argnums, batch_args, args) -> Outcome:
    base = None
    inv = make(jaxinterp.inverse_and_ildj)
    checks = [
        ("jit", lambda: jax.jit(inv)(y, *known)),
        (
            "vmap",
            lambda: jax.jit(jax.vmap(inv, in_axes=(0,) + (None,) * len(known)))(
                jtu.tree_map(lambda a: jnp.stack([a, a]), y), *known
            ),
        ),
        ("inverse", lambda: make(jaxinterp.inverse)(y, *known)),
        ("ildj", lambda: make(jaxinterp.ildj)(y, *known)),
    ]
    for name, fn in checks:
        status, got = _attempt(fn)
        if status == "crash":
            return Outcome(
                "crash",
                f"crash_{name}:{type(got).__name__}",
                _first_line(got),
                _error_prim(got),
            )
        if status == "ok":
            return Outcome(
                "wrong",
                f"variant_{name}",
                "returned a value where eager `inverse_and_ildj` refused",
            )
        base = base or got
    return Outcome("refused", type(base).__name__, _first_line(base), _error_prim(base))


def classify(prog: Program, *, variants: bool = True) -> Outcome:
    """Classify the inverse of a generated program (see `check_inverse`)."""
    if not validate(prog):
        return Outcome("invalid", "guard")
    f = prog.build(wrapped=True)
    ref = prog.build(wrapped=False)
    injective = not prog.branchy()
    batch = _second_sample(prog) if variants else None
    return check_inverse(
        f,
        prog.args(),
        prog.argnums,
        reference=ref,
        injective=injective,
        example_args=prog.example_args,
        variants=variants,
        batch_args=batch,
    )


def _stmt_branchy(prog: Program, target: Stmt) -> bool:
    env = {k: jnp.asarray(v) for k, v in prog.samples}
    for s in prog.stmts:
        vals = [env[n] for n in s.ins]
        if s is target:
            cur = list(vals)
            for _ in range(s.reps if s.wrapper in _LOOPS else 1):
                if s.branchy([np.asarray(v) for v in cur]):
                    return True
                cur = [_eval(s.expr, cur, s.nout)[0], *vals[1:]]
            return False
        outs = _run_stmt(s, vals)
        if outs is None:
            return True
        env.update(zip(s.outs, outs, strict=True))
    return False


def _second_sample(prog: Program) -> list[Any] | None:
    """Arguments near the sample (unknowns nudged) for the `vmap` variant."""
    rng = np.random.default_rng(len(prog.stmts))
    samples = dict(prog.samples)
    for n in prog.unknown:
        a = np.asarray(samples[n])
        if np.issubdtype(a.dtype, np.integer):
            samples[n] = a + 1
        else:
            samples[n] = (a * (1 + 0.01 * rng.uniform(-1, 1, a.shape))).astype(a.dtype)
    if not validate(prog, samples):
        return None
    return prog.args(samples)


# ---------------------------------------------------------------------------
# Shrinking and root causes.


def _without_stmt(prog: Program, i: int) -> Program | None:
    """Delete statement `i`, reading its first operand where its results were
    read (when shapes agree)."""
    s = prog.stmts[i]
    env = _values(prog)
    if env is None:
        return None
    src = s.ins[0] if s.ins else None
    subst: dict[str, str] = {}
    for o in s.outs:
        if (
            src is not None
            and env[o].shape == env[src].shape
            and env[o].dtype == env[src].dtype
        ):
            subst[o] = src
    rest = list(prog.stmts[:i]) + list(prog.stmts[i + 1 :])
    new_stmts = []
    for t in rest:
        if any(n in s.outs and n not in subst for n in (*t.ins, t.pred_in)):
            return None
        new_stmts.append(
            dataclasses.replace(
                t,
                ins=tuple(subst.get(n, n) for n in t.ins),
                pred_in=subst.get(t.pred_in, t.pred_in),
            )
        )
    outputs = []
    for o in prog.outputs:
        o = subst.get(o, o)
        if o in s.outs:
            continue
        if o not in outputs:
            outputs.append(o)
    if not outputs:
        return None
    return dataclasses.replace(
        prog,
        stmts=tuple(new_stmts),
        outputs=tuple(outputs),
        single=prog.single and len(outputs) == 1,
    )


def _values(prog: Program) -> dict[str, Any] | None:
    env = {k: jnp.asarray(v) for k, v in prog.samples}
    for s in prog.stmts:
        if any(n not in env for n in s.ins):
            return None
        outs = _run_stmt(s, [env[n] for n in s.ins])
        if outs is None:
            return None
        env.update(zip(s.outs, outs, strict=True))
    return env


def _promote(prog: Program, i: int) -> Program | None:
    """Cut the program at statement `i`: its results become arguments (unknown
    if they depend on an unknown), with their sample values."""
    env = _values(prog)
    if env is None:
        return None
    unknown = set(prog.unknown)
    for s in prog.stmts[: i + 1]:
        if any(n in unknown for n in s.ins):
            unknown.update(s.outs)
    s = prog.stmts[i]
    new_args = [o for o in s.outs if o not in prog.arg_names]
    samples = [*prog.samples, *((o, np.asarray(env[o])) for o in new_args)]
    return _cleanup(
        dataclasses.replace(
            prog,
            arg_names=(*prog.arg_names, *new_args),
            unknown=(*prog.unknown, *(o for o in new_args if o in unknown)),
            samples=tuple(samples),
            stmts=prog.stmts[:i] + prog.stmts[i + 1 :],
        )
    )


def _drop_unused_args(prog: Program) -> Program | None:
    used = set(prog.outputs)
    for s in prog.stmts:
        used.update(s.ins)
        if s.pred_in:
            used.add(s.pred_in)
    drop = [n for n in prog.arg_names if n not in used and n not in prog.unknown]
    if not drop:
        return None
    keep = tuple(n for n in prog.arg_names if n not in drop)
    return dataclasses.replace(
        prog,
        arg_names=keep,
        samples=tuple((n, v) for n, v in prog.samples if n in keep),
    )


def _drop_unknown(prog: Program, name: str) -> Program | None:
    """Turn an unknown argument that nothing reads into nothing at all."""
    used = set(prog.outputs) | {n for s in prog.stmts for n in (*s.ins, s.pred_in)}
    if name in used or len(prog.unknown) == 1:
        return None
    return dataclasses.replace(
        prog,
        arg_names=tuple(n for n in prog.arg_names if n != name),
        unknown=tuple(n for n in prog.unknown if n != name),
        samples=tuple((n, v) for n, v in prog.samples if n != name),
    )


def _rounded(prog: Program) -> Program | None:
    samples = []
    changed = False
    for n, v in prog.samples:
        a = np.asarray(v)
        if np.issubdtype(a.dtype, np.floating):
            r = np.round(a, 2).astype(a.dtype)
            r = np.where(r == 0, np.float32(0.1), r).astype(a.dtype)
            changed = changed or not np.array_equal(r, a)
            samples.append((n, r))
        else:
            samples.append((n, a))
    return dataclasses.replace(prog, samples=tuple(samples)) if changed else None


def _cleanup(prog: Program | None) -> Program | None:
    """Remove dead statements and the arguments nothing reads."""
    if prog is None:
        return None
    prog = _prune(prog)
    used = set(prog.outputs) | {n for s in prog.stmts for n in (*s.ins, s.pred_in)}
    keep = tuple(n for n in prog.arg_names if n in used)
    unknown = tuple(n for n in prog.unknown if n in used)
    if not unknown:
        return None
    return dataclasses.replace(
        prog,
        arg_names=keep,
        unknown=unknown,
        samples=tuple((n, v) for n, v in prog.samples if n in keep),
    )


def _candidates(prog: Program):
    if len(prog.outputs) > 1:
        for k in range(len(prog.outputs)):
            outs = prog.outputs[:k] + prog.outputs[k + 1 :]
            yield _cleanup(dataclasses.replace(prog, outputs=outs))
    for i in range(len(prog.stmts) - 1, -1, -1):
        yield _cleanup(_without_stmt(prog, i))
    for i in range(len(prog.stmts)):
        yield _promote(prog, i)
    for i, s in enumerate(prog.stmts):
        if s.wrapper != "plain":
            plain = dataclasses.replace(
                s, wrapper="plain", reps=1, branch=0, pred="", pred_in="", mapped=()
            )
            stmts = prog.stmts[:i] + (plain,) + prog.stmts[i + 1 :]
            yield dataclasses.replace(prog, stmts=stmts)
    yield _drop_unused_args(prog)
    for n in prog.unknown:
        yield _drop_unknown(prog, n)
    if not prog.example_args:
        yield dataclasses.replace(prog, example_args=True)
    if prog.single:
        yield dataclasses.replace(prog, single=False)
    yield _rounded(prog)


def shrink(
    prog: Program,
    outcome: Outcome,
    *,
    budget: int = 150,
    same: Callable[[Outcome, Outcome], bool] | None = None,
) -> tuple[Program, Outcome]:
    """A smaller program failing the same way (same kind and check).

    Tries at most `budget` candidates; variants are only re-checked when the
    failure is in a variant.
    """
    variants = "variant" in outcome.check or outcome.check.startswith("crash_")

    def default_same(a: Outcome, b: Outcome) -> bool:
        return (
            a.kind == b.kind
            and a.check == b.check
            and (a.kind != "crash" or a.prim == b.prim)
        )

    same = same or default_same
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in _candidates(prog):
            if cand is None or not validate(cand):
                continue
            tries += 1
            got = classify(cand, variants=variants)
            if same(got, outcome):
                prog, outcome = cand, got
                improved = True
                break
            if tries >= budget:
                break
    return prog, outcome


def root_cause(prog: Program, outcome: Outcome) -> tuple[str, ...]:
    """A key for deduplicating failures of a shrunk program: kind, check and
    what is involved: the primitive an error names; `branch` when a statement
    is not injective on the sample (the inverse took a principal branch or
    undid a lossy cast); otherwise the ops of the program."""
    if outcome.kind == "crash" and outcome.prim:
        return (outcome.kind, outcome.check, outcome.prim)
    if outcome.kind == "wrong" and prog.branchy():
        return (outcome.kind, outcome.check, "branch")
    return (outcome.kind, outcome.check, *sorted(set(prog.ops())))


def primitives_of(prog: Program) -> set[str]:
    """The primitives the program stages (nested ones included)."""
    f = prog.build(wrapped=True)
    closed = jax.make_jaxpr(f)(*prog.args())
    names: set[str] = set()
    stack = [closed.jaxpr]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None and hasattr(inner, "eqns"):
                        stack.append(inner)
                    elif hasattr(sub, "eqns"):
                        stack.append(sub)
    return names


def rule_primitives() -> list[str]:
    """Names of every primitive with an inverse rule (`RuleRegistry` iterates
    over its primitives, parents included)."""
    return sorted(p.name for p in jaxinterp.inverse_rules)


def describe(prog: Program, outcome: Outcome) -> str:
    """A report of one failure: the outcome and a reproducer."""
    comment = f"{outcome}\nops: {', '.join(prog.ops())}"
    return prog.reproducer(comment)


def percent(n: int, total: int) -> str:
    return f"{100 * n / max(total, 1):.1f}%"
