"""Long differential-fuzzing run of `jaxinterp.inverse` (not a pytest module).

    python tests/fuzz_inverse_main.py --programs 10000 --seed 0

Generates `--programs` random programs (see `inverse_fuzz.py`), classifies
the inverse of each as correct, refused, wrong or crash, and prints the counts
per class. Every wrong or crashing program is shrunk to a small standalone
reproducer, deduplicated by root cause (the kind of failure and the ops, or
the primitive an error names): a failure whose kind matches a cause already
found, with that cause's ops all present, is counted there without shrinking.

Program `i` depends only on `(--seed, i)`, so a run can be resumed or split
(`--start`).
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _program_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


def _matches(cause: dict[str, Any], prog: Any, outcome: Any) -> bool:
    """Whether an unshrunk failure is probably an instance of `cause`."""
    if (cause["kind"], cause["check"]) != (outcome.kind, outcome.check):
        return False
    if outcome.kind == "crash" and cause["prim"]:
        return cause["prim"] == outcome.prim
    if cause["key"][-1] == "branch":
        return prog.branchy()
    return set(cause["ops"]) <= set(prog.ops())


def run(args: argparse.Namespace) -> int:
    import inverse_fuzz as fz
    import jax

    counts: collections.Counter[str] = collections.Counter()
    checks: collections.Counter[str] = collections.Counter()
    op_counts: collections.Counter[str] = collections.Counter()
    staged: collections.Counter[str] = collections.Counter()
    causes: list[dict[str, Any]] = []
    invalid: list[str] = []
    start = time.time()
    shrink_time = 0.0
    for i in range(args.start, args.start + args.programs):
        prog = fz.generate(
            fz.RandomChooser(_program_seed(args.seed, i)), max_stmts=args.max_stmts
        )
        op_counts.update(set(prog.families()))
        if args.coverage:
            try:
                staged.update(fz.primitives_of(prog))
            except Exception:  # noqa: BLE001 - coverage is best effort
                pass
        outcome = fz.classify(prog, variants=not args.no_variants)
        counts[outcome.kind] += 1
        if outcome.kind == "invalid":
            invalid.append(f"program {i}: {outcome}")
        if outcome.kind in ("wrong", "crash"):
            checks[f"{outcome.kind}/{outcome.check}"] += 1
            # Causes blamed on a principal branch are tried last.
            ordered = sorted(causes, key=lambda c: c["key"][-1] == "branch")
            cause = next((c for c in ordered if _matches(c, prog, outcome)), None)
            if cause is None:
                t = time.time()
                small, small_out = fz.shrink(prog, outcome, budget=args.shrink_budget)
                shrink_time += time.time() - t
                key = fz.root_cause(small, small_out)
                cause = next((c for c in causes if c["key"] == key), None)
                if cause is None:
                    cause = {
                        "key": key,
                        "kind": small_out.kind,
                        "check": small_out.check,
                        "prim": small_out.prim if small_out.kind == "crash" else "",
                        "ops": sorted(set(small.ops())),
                        "count": 0,
                        "first": i,
                        "reproducer": fz.describe(small, small_out),
                    }
                    causes.append(cause)
                    if args.verbose:
                        print(f"\n[new root cause at program {i}] {key}", flush=True)
                        print(cause["reproducer"], flush=True)
            cause["count"] += 1
        done = i - args.start + 1
        if args.clear_every and done % args.clear_every == 0:
            # Every program compiles new functions; JAX's caches would grow
            # by gigabytes over thousands of programs.
            jax.clear_caches()
            gc.collect()
        if args.progress and done % args.progress == 0:
            rate = (time.time() - start) / done
            summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(
                f"[{done}/{args.programs}] {summary} ({rate:.2f} s/program, "
                f"{len(causes)} root causes)",
                file=sys.stderr,
                flush=True,
            )
    wall = time.time() - start

    total = sum(counts.values())
    print(f"programs: {total} (seed {args.seed}, from {args.start})")
    print(
        f"wall time: {wall:.1f} s ({wall / max(total, 1):.2f} s/program, "
        f"{shrink_time:.1f} s shrinking)"
    )
    for kind in ("correct", "refused", "wrong", "crash", "invalid"):
        print(f"  {kind:8s} {counts[kind]:6d}  {fz.percent(counts[kind], total)}")
    if checks:
        print("failed checks:")
        for name, n in sorted(checks.items(), key=lambda kv: -kv[1]):
            print(f"  {name:40s} {n}")
    if invalid:
        print(f"invalid programs (generator problems): {len(invalid)}")
        for line in invalid[:10]:
            print("  " + line)
    if args.coverage:
        never = [p for p in fz.rule_primitives() if p not in staged]
        print(
            f"primitives with an inverse rule never staged: {', '.join(never) or '-'}"
        )
    rare = sorted(op for op in fz.op_names() if op_counts[op] == 0)
    if rare:
        print(f"ops never generated: {', '.join(rare)}")
    print(f"\nroot causes of wrong/crash: {len(causes)}")
    for n, cause in enumerate(sorted(causes, key=lambda c: -c["count"]), 1):
        what = cause["prim"] or ", ".join(cause["ops"])
        if cause["key"][-1] == "branch":
            what = f"principal branch or lossy op; {what}"
        print(
            f"\n=== {n}. {cause['kind']}/{cause['check']} [{what}]: "
            f"{cause['count']} programs (first: program {cause['first']})"
        )
        print(cause["reproducer"])
    return 1 if causes else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first program index")
    parser.add_argument("--max-stmts", type=int, default=12)
    parser.add_argument(
        "--no-variants",
        action="store_true",
        help="skip the jit/vmap/inverse/ildj agreement checks",
    )
    parser.add_argument(
        "--shrink-budget",
        type=int,
        default=150,
        help="candidate programs tried per shrink",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="also report rule primitives no program staged",
    )
    parser.add_argument(
        "--progress",
        type=int,
        default=100,
        help="print a progress line every N programs (0: never)",
    )
    parser.add_argument(
        "--clear-every",
        type=int,
        default=200,
        help="clear JAX's caches every N programs (0: never)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print each new root cause as it is found",
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
