"""Check that jaxinterp evaluates, jits, differentiates and counts the corpus.

Run mode (on the installed JAX and libraries):

    python ecosystem/check.py [--only SUBSTRING ...] [--out summary.json] [--jobs 2]

For every program of `ecosystem/corpus.py` it checks, on the same inputs:

* `eval`: `jaxinterp.evaluate(fn)(*args)` equals `fn(*args)`;
* `jit`: `jax.jit(jaxinterp.evaluate(fn))` equals `jax.jit(fn)`;
* `grad`: `jax.grad` of `S(fn)` equals `jax.grad` of `S(evaluate(fn))`, where
  `S` sums every floating output leaf and the gradient is taken with respect
  to every floating input leaf (both under `jax.jit`). Programs that JAX cannot
  differentiate in reverse mode (a `lax.while_loop` inside) get `jvp` instead:
  `jax.jvp` of the same scalar along fixed random tangents;
* `count`: a counting interpreter (an `EvalInterpreter` whose `process_eqn`
  tallies `eqn.primitive.name`), traced with
  `jax.make_jaxpr(counter.transform(fn))`, gives the same per-primitive counts
  as an independent recursive walk of `jax.make_jaxpr(fn)`;
* `count_eager`: the same counter run eagerly gives the same counts, and the
  same outputs as `fn`.

Counting convention: every equation of the top-level Jaxpr and of every
sub-Jaxpr in an equation's params (`jax.extend.core.jaxprs_in_params`)
counts once per occurrence: a `scan`/`while` body counts once, not once per
iteration; each `cond` branch counts once, taken or not; the body of every
`jit`, `checkpoint`, `custom_jvp_call`/`custom_vjp_call` counts once per call
site. Combiner Jaxprs of single operations (`scatter-add`'s `update_jaxpr`,
a generic `reduce`'s `jaxpr`) are not program code and are not descended
into. jaxinterp's walker matches this because the counter sets
`cache_subcalls = False` (no rebuilt `jit` or traced body is reused between
call sites) and the rebuilt `lax.switch`/`scan`/`while_loop` trace every
branch and body exactly once.

Values are compared bit for bit first; when they differ the check still
passes if they are close (`eval`/`jit`: rtol 1e-6, atol 1e-6; derivatives:
rtol 1e-5, atol 1e-5) and says `allclose` with the largest difference. An
`eval` that is only allclose also reports how jaxinterp compares with JAX's
own `jax.core.eval_jaxpr` of the same Jaxpr: a `jax.grad` run eagerly inside
`fn` can round differently from the same program staged.

Each program gets five checks (a program that fails to build gets one ERROR);
the closing line counts checks.

Compare mode:

    python ecosystem/check.py --compare A.json B.json

checks that every program passed every check in both summaries and that the
outputs agree within 1e-5 of each leaf's largest magnitude (plus atol 1e-6),
and the derivatives within 1e-3 of it: second derivatives through adam's
`m / (sqrt(v) + eps)` amplify the last-bit differences between JAX versions.
Per-primitive count differences are printed as information, not failures:
JAX's own `jnp` implementations change between versions.

Both modes end with a line `N passed, M failed` and exit non-zero on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import multiprocessing
import platform
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxinterp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

LIBRARIES = ["jax", "jaxlib", "flax", "equinox", "optax", "diffrax", "lineax",
             "optimistix", "numpyro", "numpy", "jaxinterp"]  # fmt: skip
VALUE_TOL = (1e-6, 1e-6)  # rtol, atol for eval and jit
DERIV_TOL = (1e-5, 1e-5)  # rtol, atol for grad and jvp
COMPARE_TOL = (1e-5, 1e-6)  # rtol, atol for outputs between two summaries
COMPARE_DERIV_TOL = (1e-3, 1e-6)  # derivatives: 2nd order through adam amplifies
MAX_STORED = 256  # leaves up to this size keep all their values in the JSON


# ---------------------------------------------------------------------------
# Pytree helpers.


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_numpy(x: Any) -> np.ndarray:
    if _is_key(x):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _is_float(x: Any) -> bool:
    return (
        hasattr(x, "dtype") and not _is_key(x) and jnp.issubdtype(x.dtype, jnp.inexact)
    )


def _leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def compare_trees(
    expected: Any, got: Any, rtol: float, atol: float
) -> tuple[bool, str]:
    """Compare two pytrees; return (ok, 'exact' / 'allclose, max diff ...' / why)."""
    exp_flat, exp_tree = jax.tree_util.tree_flatten(expected)
    got_flat, got_tree = jax.tree_util.tree_flatten(got)
    if exp_tree != got_tree:
        return False, f"pytree structure differs: {exp_tree} vs {got_tree}"
    exact, max_diff, worst = True, 0.0, ""
    paths = [p for p, _ in _leaves_with_paths(expected)]
    for path, e, g in zip(paths, exp_flat, got_flat, strict=True):
        e, g = _to_numpy(e), _to_numpy(g)
        if e.shape != g.shape or e.dtype != g.dtype:
            return False, f"leaf {path}: {e.dtype}{e.shape} vs {g.dtype}{g.shape}"
        if np.array_equal(e, g, equal_nan=e.dtype.kind in "fc"):
            continue
        exact = False
        if e.dtype.kind not in "fc":
            return False, f"leaf {path}: integer/bool values differ"
        e64, g64 = (
            e.astype(np.complex128 if e.dtype.kind == "c" else np.float64),
            g.astype(np.complex128 if e.dtype.kind == "c" else np.float64),
        )
        both_nan = np.isnan(e64) & np.isnan(g64)
        diff = np.where(both_nan, 0.0, np.abs(e64 - g64))
        if np.any(np.isnan(diff)):
            return False, f"leaf {path}: NaN in one result only"
        bound = atol + rtol * np.abs(np.where(both_nan, 0.0, e64))
        leaf_max = float(diff.max()) if diff.size else 0.0
        if leaf_max > max_diff:
            max_diff, worst = leaf_max, path
        if np.any(diff > bound):
            return False, f"leaf {path}: max abs diff {leaf_max:.3g} beyond tolerance"
    if exact:
        return True, "exact"
    return True, f"allclose, max abs diff {max_diff:.3g} at {worst}"


def summarize_tree(tree: Any) -> list[dict[str, Any]]:
    """JSON-able summary of each leaf: path, dtype, shape, sum, values if small."""
    out = []
    for path, leaf in _leaves_with_paths(tree):
        a = _to_numpy(leaf)
        entry: dict[str, Any] = {
            "path": path,
            "dtype": str(a.dtype) + ("(key)" if _is_key(leaf) else ""),
            "shape": list(a.shape),
        }
        if a.dtype.kind in "biuf":
            f = a.astype(np.float64)
            entry["sum"] = _json_float(f.sum())
            entry["abs_sum"] = _json_float(np.abs(f).sum())
            if a.size <= MAX_STORED:
                entry["values"] = [_json_float(v) for v in f.ravel()]
        out.append(entry)
    return out


def _json_float(v: Any) -> float | str:
    v = float(v)
    return v if math.isfinite(v) else str(v)


def tree_hash(tree: Any) -> str:
    """sha256 of the leaves' dtypes, shapes and bytes (bit-for-bit fingerprint)."""
    h = hashlib.sha256()
    for path, leaf in _leaves_with_paths(tree):
        a = np.ascontiguousarray(_to_numpy(leaf))
        h.update(f"{path}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------
# Counting.


# Higher-order primitives of these libraries that no jaxinterp handler enters,
# with the reason. A counting interpreter must say so (`opaque`), or jaxinterp
# refuses with `MissingRuleError`; the reference count does not descend either.
OPAQUE: dict[str, str] = {
    # lineax (through optimistix / diffrax's implicit solvers): an equinox
    # "filter primitive" whose Jaxpr is the linear operator's closure-converted
    # matvec, kept inside static params; only lineax can rebuild it.
    "linear_solve": "lineax's solve; its operator is static data",
}


class CountingInterpreter(jaxinterp.EvalInterpreter):
    """Evaluates a function while counting equations per primitive name."""

    # Rebuild every `jit` and re-trace every body at each call site, so a
    # sub-Jaxpr shared by several equations is walked (and counted) for each.
    cache_subcalls = False

    def __init__(self) -> None:
        super().__init__(policies=dict.fromkeys(OPAQUE, "opaque"))
        self.counts: Counter[str] = Counter()

    def process_eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        self.counts[eqn.primitive.name] += 1
        return super().process_eqn(eqn, invals)


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    finder = getattr(jax.extend.core, "jaxprs_in_params", None)
    if finder is not None:
        yield from finder(params)
        return
    kinds = (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)
    for value in params.values():
        for v in value if isinstance(value, tuple | list) else (value,):
            if isinstance(v, kinds):
                yield v


def _has_combiner(name: str) -> bool:
    """Primitives whose sub-Jaxpr is a scalar combiner, not code of the program.

    `scatter-add`'s `update_jaxpr`, the `jaxpr` of a generic `reduce` or
    `reduce_window`...: XLA applies them inside the one operation, and an
    interpreter binds such a primitive whole, so they are not descended into.
    """
    return name.startswith(("scatter", "reduce", "select_and_")) or name in {
        "argmax",
        "argmin",
        "sort",
    }


def count_jaxpr(jaxpr: Any, counts: Counter[str] | None = None) -> Counter[str]:
    """Count equations per primitive in `jaxpr` and, recursively, its sub-Jaxprs."""
    counts = Counter() if counts is None else counts
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # ClosedJaxpr -> Jaxpr
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        counts[name] += 1
        if _has_combiner(name) or name in OPAQUE:
            continue
        for sub in _sub_jaxprs(eqn.params):
            count_jaxpr(sub, counts)
    return counts


def _counts_diff(expected: Counter[str], got: Counter[str]) -> str:
    names = sorted(set(expected) | set(got))
    return ", ".join(
        f"{n}: {expected[n]} vs {got[n]}" for n in names if expected[n] != got[n]
    )


# ---------------------------------------------------------------------------
# The checks.


def _scalarized(fn: Callable[..., Any], args: tuple[Any, ...]):
    """(g, float_leaves): `g(*float_leaves)` sums `fn`'s floating outputs."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    where = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]

    def g(*floats: Any) -> jax.Array:
        full = list(leaves)
        for i, x in zip(where, floats, strict=True):
            full[i] = x
        out = fn(*jax.tree_util.tree_unflatten(treedef, full))
        total = jnp.zeros((), jnp.float32)
        for leaf in jax.tree_util.tree_leaves(out):
            if _is_float(leaf):
                total = total + jnp.sum(jnp.real(leaf)).astype(jnp.float32)
        return total

    return g, [leaves[i] for i in where]


def check_program(
    prog: corpus.Program, emit: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run every check on one program, `emit`ting a line each; return its record."""
    record: dict[str, Any] = {"library": prog.library, "doc": prog.doc, "checks": {}}
    checks = record["checks"]
    start = time.perf_counter()

    def run(name: str, body: Callable[[], tuple[bool, str]]) -> None:
        t0 = time.perf_counter()
        try:
            ok, detail = body()
            status = "PASS" if ok else "FAIL"
            checks[name] = {"status": status, "detail": detail}
        except Exception as err:  # reported, not raised: the run goes on
            message = f"{type(err).__name__}: {err}".strip()
            checks[name] = {
                "status": "ERROR",
                "detail": message.splitlines()[0][:300],
                "traceback": traceback.format_exc()[-4000:],
            }
        checks[name]["seconds"] = round(time.perf_counter() - t0, 2)
        line = f"{prog.name:<32} {name:<12} {checks[name]['status']:<5}"
        emit(f"{line} {checks[name]['detail']}")

    try:
        fn, args = prog.build()
        reference = fn(*args)
        jax.block_until_ready(reference)
    except Exception as err:
        checks["build"] = {
            "status": "ERROR",
            "detail": f"{type(err).__name__}: {err}".splitlines()[0][:300],
            "traceback": traceback.format_exc()[-4000:],
        }
        emit(f"{prog.name:<32} {'build':<12} ERROR {checks['build']['detail']}")
        return record
    record["outputs"] = summarize_tree(reference)
    record["output_hash"] = tree_hash(reference)
    evaluated = jaxinterp.evaluate(fn)

    def eval_check() -> tuple[bool, str]:
        got = evaluated(*args)
        ok, detail = compare_trees(reference, got, *VALUE_TOL)
        if ok and detail != "exact":
            # Eager AD inside `fn` (op by op) may round differently from the
            # same program staged: say whether JAX's own `eval_jaxpr` of the
            # staged Jaxpr agrees with jaxinterp bit for bit.
            closed = jax.make_jaxpr(fn)(*args)
            flat = jax.core.eval_jaxpr(
                closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args)
            )
            _, vs_core = compare_trees(flat, jax.tree_util.tree_leaves(got), *VALUE_TOL)
            detail += f"; vs jax.core.eval_jaxpr of the Jaxpr: {vs_core}"
        return ok, detail

    run("eval", eval_check)
    run(
        "jit",
        lambda: compare_trees(
            jax.jit(fn)(*args), jax.jit(evaluated)(*args), *VALUE_TOL
        ),
    )

    def derivative() -> tuple[bool, str]:
        g_ref, floats = _scalarized(fn, args)
        g_int, _ = _scalarized(evaluated, args)
        if prog.reverse:
            argnums = tuple(range(len(floats)))
            got = jax.jit(jax.grad(g_int, argnums=argnums))(*floats)
            expected = jax.jit(jax.grad(g_ref, argnums=argnums))(*floats)
        else:
            keys = jax.random.split(jax.random.PRNGKey(1234), max(len(floats), 1))
            tangents = [
                jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
                for k, x in zip(keys, floats, strict=False)
            ]
            got = jax.jit(lambda *p: jax.jvp(g_int, p, tuple(tangents)))(*floats)
            expected = jax.jit(lambda *p: jax.jvp(g_ref, p, tuple(tangents)))(*floats)
        record["derivative"] = summarize_tree(expected)
        return compare_trees(expected, got, *DERIV_TOL)

    run("grad" if prog.reverse else "jvp", derivative)

    try:
        independent = count_jaxpr(jax.make_jaxpr(fn)(*args))
        record["counts"] = dict(sorted(independent.items()))
    except Exception as err:  # then both count checks report it
        independent = err

    def count_traced() -> tuple[bool, str]:
        if isinstance(independent, Exception):
            raise independent
        counter = CountingInterpreter()
        jax.make_jaxpr(counter.transform(fn))(*args)
        record["counts_interpreter"] = dict(sorted(counter.counts.items()))
        if counter.counts != independent:
            return False, _counts_diff(independent, counter.counts)
        return True, f"{sum(independent.values())} eqns, {len(independent)} primitives"

    def count_eager() -> tuple[bool, str]:
        if isinstance(independent, Exception):
            raise independent
        counter = CountingInterpreter()
        out = counter.transform(fn)(*args)
        if counter.counts != independent:
            return False, _counts_diff(independent, counter.counts)
        ok, detail = compare_trees(reference, out, *VALUE_TOL)
        return ok, f"counts equal; outputs {detail}"

    run("count", count_traced)
    run("count_eager", count_eager)
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def quiet_warnings() -> None:
    """Hide the libraries' deprecation chatter (not what this checks); keep
    jaxinterp's warnings."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("default", module="jaxinterp")


def _check_in_worker(name: str) -> tuple[dict[str, Any], list[str]]:
    """`check_program` in a worker process: the record and the lines."""
    lines: list[str] = []
    prog = next(p for p in corpus.PROGRAMS if p.name == name)
    return check_program(prog, lines.append), lines


def _emit(line: str) -> None:
    print(line, flush=True)


def check_all(programs: list[corpus.Program], jobs: int) -> dict[str, dict[str, Any]]:
    """Check `programs`, in `jobs` worker processes when `jobs` > 1.

    Lines are printed in program order either way (with workers, each
    program's lines once it is done).
    """
    if jobs <= 1:
        return {p.name: check_program(p, _emit) for p in programs}
    records = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=quiet_warnings
    ) as pool:
        futures = [(p, pool.submit(_check_in_worker, p.name)) for p in programs]
        for prog, future in futures:
            try:
                record, lines = future.result()
            except Exception as err:  # a worker died: report, go on
                detail = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                record = {"library": prog.library, "doc": prog.doc, "checks": {
                    "worker": {"status": "ERROR", "detail": detail}}}  # fmt: skip
                lines = [f"{prog.name:<32} {'worker':<12} ERROR {detail}"]
            records[prog.name] = record
            for line in lines:
                _emit(line)
    return records


def run_all(only: list[str], out: str | None, jobs: int = 1) -> int:
    meta = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in meta.items()), flush=True)
    programs = [
        p for p in corpus.PROGRAMS if not only or any(s in p.name for s in only)
    ]
    start = time.perf_counter()
    records = check_all(programs, jobs)
    statuses = [c["status"] for r in records.values() for c in r["checks"].values()]
    passed = statuses.count("PASS")
    failed = len(statuses) - passed
    summary = {
        "versions": meta,
        "seconds": round(time.perf_counter() - start, 1),
        "jobs": jobs,
        "passed": passed,
        "failed": failed,
        "programs": records,
    }
    if out:
        Path(out).write_text(json.dumps(summary, indent=1) + "\n")
    bad = [n for n, r in records.items() if any(
        c["status"] != "PASS" for c in r["checks"].values())]  # fmt: skip
    print(
        f"{len(records) - len(bad)}/{len(records)} programs clean"
        + (f"; not clean: {', '.join(bad)}" if bad else "")
        + f"; {summary['seconds']} s"
    )
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Compare mode.


def _compare_leaves(
    a: list[dict], b: list[dict], rtol: float, atol: float
) -> tuple[bool, str]:
    """Compare two `summarize_tree` lists; return (ok, detail).

    Each leaf's tolerance scales with the leaf: `atol + rtol * max|leaf|` for
    stored values, `atol + rtol * sum|leaf|` for the sum of a large leaf.
    """
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} leaves"
    max_diff, max_margin, closest, renamed = 0.0, 0.0, "", 0
    for x, y in zip(a, b, strict=True):
        renamed += x["path"] != y["path"]
        if x["shape"] != y["shape"] or x["dtype"] != y["dtype"]:
            got = f"{x['dtype']}{x['shape']} vs {y['dtype']}{y['shape']}"
            return False, f"leaf {x['path']}: {got}"
        if "values" in x and "values" in y:
            xs, ys = np.array(x["values"], float), np.array(y["values"], float)
            finite = np.abs(xs[np.isfinite(xs)])
            scale = float(finite.max()) if finite.size else 0.0
        elif "sum" in x and "sum" in y:
            xs, ys = np.array([x["sum"]], float), np.array([y["sum"]], float)
            scale = float(x["abs_sum"])
        else:
            continue
        same = (xs == ys) | (np.isnan(xs) & np.isnan(ys))
        diff = np.where(same, 0.0, np.abs(xs - ys))
        if np.any(np.isnan(diff)):
            return False, f"leaf {x['path']}: NaN or inf in one summary only"
        leaf_max = float(diff.max()) if diff.size else 0.0
        max_diff = max(max_diff, leaf_max)
        margin = leaf_max / (atol + rtol * scale)  # > 1 fails
        if margin > max_margin:
            max_margin, closest = margin, f"{x['path'] or '<root>'}"
        if margin > 1:
            return False, (
                f"leaf {x['path']}: max abs diff {leaf_max:.3g} beyond "
                f"{atol:g} + {rtol:g} x its scale {scale:.3g}"
            )
    note = f" ({renamed} leaf paths renamed)" if renamed else ""
    if max_diff == 0.0:
        return True, "identical" + note
    return True, (
        f"max abs diff {max_diff:.3g}; closest to tolerance: {closest} at "
        f"{max_margin:.2g} of it{note}"
    )


def compare(path_a: str, path_b: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    va, vb = a["versions"], b["versions"]
    print(f"A: {path_a}: jax {va['jax']}, flax {va['flax']}, python {va['python']}")
    print(f"B: {path_b}: jax {vb['jax']}, flax {vb['flax']}, python {vb['python']}")
    passed = failed = 0
    for name in sorted(set(a["programs"]) | set(b["programs"])):
        ra, rb = a["programs"].get(name), b["programs"].get(name)
        results: list[tuple[str, bool, str]] = []
        if ra is None or rb is None:
            results.append(
                ("present", False, "missing from " + ("A" if ra is None else "B"))
            )
        else:
            for side, r in (("A", ra), ("B", rb)):
                bad = [f"{c}={v['status']}" for c, v in r["checks"].items()
                       if v["status"] != "PASS"]  # fmt: skip
                results.append((f"pass_{side}", not bad, ", ".join(bad) or "all PASS"))
            if "outputs" in ra and "outputs" in rb:
                same = ra.get("output_hash") == rb.get("output_hash")
                ok, detail = _compare_leaves(ra["outputs"], rb["outputs"], *COMPARE_TOL)
                results.append(("outputs", ok, "bit-identical" if same else detail))
            if "derivative" in ra and "derivative" in rb:
                ok, detail = _compare_leaves(
                    ra["derivative"], rb["derivative"], *COMPARE_DERIV_TOL
                )
                results.append(("derivative", ok, detail))
            ca, cb = Counter(ra.get("counts", {})), Counter(rb.get("counts", {}))
            info = _counts_diff(ca, cb)
            print(f"{name:<32} {'counts':<12} INFO  "
                  f"{sum(ca.values())} vs {sum(cb.values())} eqns"
                  + (f"; {info}" if info else "; identical"))  # fmt: skip
        for check, ok, detail in results:
            passed += ok
            failed += not ok
            print(f"{name:<32} {check:<12} {'PASS' if ok else 'FAIL':<5} {detail}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON summary to this file")
    parser.add_argument("--only", nargs="*", default=[], help="program name parts")
    parser.add_argument("--list", action="store_true", help="list the programs")
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes (default 1)"
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="compare two summaries"
    )
    opts = parser.parse_args(argv)
    if opts.compare:
        return compare(*opts.compare)
    if opts.list:
        for p in corpus.PROGRAMS:
            print(f"{p.name:<32} {p.library:<10} {p.doc}")
        return 0
    quiet_warnings()
    return run_all(opts.only, opts.out, opts.jobs)


if __name__ == "__main__":
    sys.exit(main())
