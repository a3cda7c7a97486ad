"""The `jaxinterp` command line: `demo`, `explain` and `count`.

`explain` and `count` stage a user's function for abstract arguments given as
`--args "f32[3,4], i32[]"`. Bad input (an unknown module or function, a
malformed `--args`, a function that fails to trace) ends with one line on
stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# Exit statuses: 2 for malformed command lines (argparse's convention), 1 for
# input that parses but cannot be used (no such module, a failing trace).
USAGE_ERROR = 2
INPUT_ERROR = 1

DTYPES: dict[str, str] = {
    "bool": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "c128": "complex128",
}
_X64_DTYPES = {"i64", "u64", "f64", "c128"}
_SPEC = re.compile(r"^([a-z0-9]+)\[([0-9,\s]*)\]$")

_ARGS_HELP = (
    'abstract arguments, comma separated, e.g. "f32[3,4], i32[]": a dtype '
    f"({', '.join(DTYPES)}) and a shape in brackets; `[]` is a scalar"
)
_TARGET_HELP = (
    "the function, as MODULE:FUNCTION (an importable module, or a path to a "
    ".py file; FUNCTION may be dotted, e.g. model:Net.apply)"
)


class CliError(Exception):
    """Bad input: `main` prints the message on one line and exits with `status`."""

    def __init__(self, message: str, status: int = INPUT_ERROR) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------
# --args parsing.


def _split_top_level(text: str) -> list[str]:
    """Split `text` on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def parse_arg_specs(text: str) -> list[Any]:
    """Parse `"f32[3,4], i32[]"` into `jax.ShapeDtypeStruct`s.

    Raises:
        CliError: naming the item that does not parse.
    """
    import jax

    if not text.strip():
        return []
    specs = []
    for raw in _split_top_level(text):
        item = raw.strip()
        match = _SPEC.match(item)
        if match is None:
            raise CliError(
                f"--args: cannot parse {item!r}; expected a dtype and a shape "
                "such as 'f32[3,4]' or 'i32[]'.",
                USAGE_ERROR,
            )
        abbrev, dims = match.groups()
        if abbrev not in DTYPES:
            raise CliError(
                f"--args: unknown dtype {abbrev!r} in {item!r}; expected one of "
                f"{', '.join(DTYPES)}.",
                USAGE_ERROR,
            )
        if abbrev in _X64_DTYPES and not jax.config.read("jax_enable_x64"):
            raise CliError(
                f"--args: {item!r} needs 64-bit mode; set JAX_ENABLE_X64=1.",
                USAGE_ERROR,
            )
        parts = [d.strip() for d in dims.split(",")] if dims.strip() else []
        if not all(d.isdigit() for d in parts):
            raise CliError(
                f"--args: bad shape in {item!r}; write sizes separated by commas, "
                "as in 'f32[3,4]'.",
                USAGE_ERROR,
            )
        specs.append(jax.ShapeDtypeStruct(tuple(map(int, parts)), DTYPES[abbrev]))
    return specs


def format_specs(specs: Sequence[Any]) -> str:
    """Spell specs back as `f32[3,4], i32[]`."""
    names = {v: k for k, v in DTYPES.items()}
    return ", ".join(
        f"{names[str(s.dtype)]}[{','.join(map(str, s.shape))}]" for s in specs
    )


# ---------------------------------------------------------------------------
# MODULE:FUNCTION.


def split_target(target: str) -> tuple[str, str]:
    """Split `MODULE:FUNCTION`.

    Raises:
        CliError: if `target` is not spelled `MODULE:FUNCTION`.
    """
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(
            f"expected MODULE:FUNCTION, got {target!r} (e.g. mymodel:loss).",
            USAGE_ERROR,
        )
    return module_name, attr


def load_target(target: str) -> tuple[Callable[..., Any], str | None]:
    """Import `MODULE:FUNCTION`; return the function and the module's file.

    Raises:
        CliError: if the spelling is wrong, the module cannot be imported or
            has no such callable.
    """
    module_name, attr = split_target(target)
    try:
        module = _import(module_name)
    except Exception as err:
        detail = str(err).splitlines()[0] if str(err) else ""
        raise CliError(
            f"cannot import module {module_name!r} ({type(err).__name__}: {detail})."
        ) from err
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module {module_name!r} has no function {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(f"{target!r} is not callable (it is a {type(obj).__name__}).")
    return obj, getattr(module, "__file__", None)


def _import(name: str) -> Any:
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file {path}")
        mod_name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        return module
    # As `python -m` does, find modules in the working directory.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def stage_target(target: str, args_text: str) -> tuple[Any, Any, list[Any]]:
    """Load and stage `target` for `args_text`; return (fn, staged, specs).

    Raises:
        CliError: for bad input, or if tracing the function raises; the
            message shows the user's error and line.
    """
    import jaxinterp

    split_target(target)
    specs = parse_arg_specs(args_text)
    fn, filename = load_target(target)
    try:
        staged = jaxinterp.stage(fn, *specs)
    except Exception as err:
        where = _user_frame(err, filename)
        message = next((ln for ln in str(err).splitlines() if ln.strip()), "")
        raise CliError(
            f"tracing {target} on ({format_specs(specs)}) failed"
            f"{f' at {where}' if where else ''}: {type(err).__name__}: {message}"
        ) from err
    return fn, staged, specs


def _user_frame(err: BaseException, filename: str | None) -> str | None:
    """The deepest traceback frame in the user's file, as `file.py:12`."""
    if filename is None:
        return None
    target = os.path.abspath(filename)
    found = None
    for frame in traceback.extract_tb(err.__traceback__):
        if os.path.abspath(frame.filename) == target:
            found = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return found


# ---------------------------------------------------------------------------
# Commands.


def _explain(target: str, args_text: str, argnums: str | None = None) -> int:
    import jaxinterp
    from jaxinterp._jax_compat import construct_name
    from jaxinterp._registry import RuleRegistry, iter_eqns

    unknown = _parse_argnums(argnums)
    fn, staged, specs = stage_target(target, args_text)
    print(f"{target}({format_specs(specs)})\n")
    print("Jaxpr:")
    print(staged.closed_jaxpr)
    counts = Counter(construct_name(eqn) for eqn in iter_eqns(staged.closed_jaxpr))
    print(
        f"\nEquations per primitive ({sum(counts.values())} in all, "
        "nested Jaxprs included, each counted once):"
    )
    width = max((len(name) for name in counts), default=0)
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {name.ljust(width)}  {n}")

    print("\nPrimitives without a rule, per transformation:")
    handled = jaxinterp.higher_order_primitives()
    for attr in sorted(dir(jaxinterp)):
        registry = getattr(jaxinterp, attr)
        if not isinstance(registry, RuleRegistry):
            continue
        missing = registry.missing(staged.closed_jaxpr, handled=handled)
        print(f"  {registry.name} (jaxinterp.{attr}): {', '.join(missing) or 'none'}")
        note = _FALLBACKS.get(registry.name)
        if missing and note:
            print(f"    ({note})")

    explain_inverse = getattr(jaxinterp, "explain_inverse", None)
    if explain_inverse is not None:
        print("\nInverse:")
        try:
            report = explain_inverse(fn, *specs, argnums=unknown)
        except Exception as err:  # a report, not a failure of `explain`
            report = f"explain_inverse raised {type(err).__name__}: {err}"
        print(str(report).rstrip())
    return 0


def _parse_argnums(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(re.fullmatch(r"-?[0-9]+", p) for p in parts):
        raise CliError(
            f"--argnums: expected argument positions such as '0' or '0,2', "
            f"got {text!r}.",
            USAGE_ERROR,
        )
    return tuple(int(p) for p in parts)


# What a transformation does with a primitive it has no rule for.
_FALLBACKS = {
    "evaluate": "fine for `evaluate`, which re-binds primitives without a rule"
}


def _count(target: str, args_text: str) -> int:
    from jaxinterp._count import count_staged

    _, staged, specs = stage_target(target, args_text)
    print(f"{target}({format_specs(specs)})\n")
    print(count_staged(staged).table())
    return 0


def _demo() -> int:
    from ._demo import run_demo

    run_demo()
    return 0


# ---------------------------------------------------------------------------
# Argument parsing.


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line on stderr."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            USAGE_ERROR,
            f"{self.prog}: error: {message} (see `{self.prog} --help`).\n",
        )


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the `jaxinterp` command line."""
    parser = _Parser(
        prog="jaxinterp",
        description="Write JAX function transformations as Jaxpr interpreters.",
        epilog=(
            "Exit status: 0 on success, 2 for a malformed command line or "
            "--args, 1 when the module, the function or its tracing fails."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "demo",
        help="a short guided tour of jaxinterp",
        description="A guided tour: staging, evaluation, composition with JAX "
        "transformations, counting operations and substituting a primitive.",
    )
    for name, help_text, description in (
        (
            "explain",
            "print a function's Jaxpr and which transformations can handle it",
            "Stage MODULE:FUNCTION for the abstract --args; print its Jaxpr, its "
            "equations per primitive, the primitives each registered "
            "transformation has no rule for and, when available, why it can or "
            "cannot be inverted.",
        ),
        (
            "count",
            "count a function's operations and estimate its FLOPs",
            "Stage MODULE:FUNCTION for the abstract --args and print a table of "
            "equations, FLOPs and transcendental operations per primitive. Scan "
            "bodies count once per iteration, cond its most expensive branch, "
            "while loops one iteration.",
        ),
    ):
        cmd = sub.add_parser(name, help=help_text, description=description)
        cmd.add_argument("target", metavar="MODULE:FUNCTION", help=_TARGET_HELP)
        cmd.add_argument("--args", default="", metavar="SPECS", help=_ARGS_HELP)
        if name == "explain":
            cmd.add_argument(
                "--argnums",
                metavar="I,J",
                help="the unknown arguments for the inverse report (default: all)",
            )
    return parser


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": lambda ns: _demo(),
    "explain": lambda ns: _explain(ns.target, ns.args, ns.argnums),
    "count": lambda ns: _count(ns.target, ns.args),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default `sys.argv[1:]`); return its status."""
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error already printed
        return exit_.code if isinstance(exit_.code, int) else USAGE_ERROR
    try:
        return _COMMANDS[ns.command](ns)
    except CliError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return err.status
