"""Check `jaxinterp.inverse` against the bijectors of NumPyro, distrax and TFP.

    python tests/peers/check_peers.py [--library tfp] [--only SUBSTRING]
                                      [--out report.json] [--timeout 120]
                                      [--batch B]

(`nox -s peers` installs the three libraries and runs it.) Not a pytest
module: `tests/peers/conftest.py` keeps the default suite from collecting
this folder, and nothing here imports a peer library at import time.

For every bijector instance of `cases_numpyro.py`, `cases_distrax.py` and
`cases_tfp.py`, `f` is the library's own forward map, `x` a point of its
domain and `y = f(x)`; five checks compare jaxinterp with the library's own
inverse and log-det at `y`:

* `inverse`: `jaxinterp.inverse(f)(y)` against the library's inverse;
* `ildj`: `jaxinterp.ildj(f)(y)` against the library's inverse log-det
  (summed over every element, whatever its event dims);
* `jit`: `jax.jit` of `inverse_and_ildj(f)` (of `inverse(f)` when the eager
  ildj did not pass), both values checked;
* `vmap`: `jax.vmap` of the same over a batch of three `y`s;
* `grad`: `jax.grad` of the sum of the inverse with respect to `y`, against
  the same gradient of the library's inverse; for a map onto a manifold (more
  results than inputs), on the tangent space of the image: `J_f(x)^T grad`
  must be 1 (`judge_tangent_grad`), the normal part being a convention of
  each left inverse.

`example_args=(x,)` is passed only where `x` does not mirror `y`.

Each check is `pass`; `refused` (`NotInvertibleError`, or `MissingRuleError`:
jaxinterp declines); `wrong` (a value that matches neither the library nor
an independent witness: the worst); `crash` (any other exception); `n/a` (an
ildj that differs on a map whose library log-det follows its own
parametrization of a manifold, see `Case.square`); or `skip` (no reference
to judge by). Witnesses keep float32 rounding in the library from counting
against jaxinterp: an inverse also passes when `f(x_got)` reproduces `y`
and `x_got` is within 5% of the library's (an ill-conditioned inverse), or
when the library's own inverse does not reproduce `y` and jaxinterp's does;
an ildj or gradient also passes when it matches `-log|det J_f(x)|` or
`J_f(x)^-T 1`, computed with `jax.jacfwd` at the sampled `x`.

Writes a JSON report and prints tables per library, per check and per
reason, then every wrong answer.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import jaxinterp

CHECKS = ("inverse", "ildj", "jit", "vmap", "grad")
STATUSES = ("pass", "refused", "wrong", "crash", "n/a", "skip")
LIBRARIES = ("numpyro", "distrax", "tfp")
PACKAGES = ("jax", "jaxlib", "numpyro", "distrax", "tfp-nightly", "jaxinterp")
BATCH = 3

# Tolerances (float32): inverse values, round trips, ildj scalars, gradients.
X_TOL = (2e-3, 2e-4)
RT_TOL = (1e-4, 1e-5)
ILDJ_TOL = (2e-3, 2e-3)
GRAD_TOL = (1e-2, 1e-3)


class CheckTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise CheckTimeout(f"check took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --- values ------------------------------------------------------------------


def fresh(tree: Any) -> Any:
    """A copy of every leaf (a new array object: no TFP cache hit)."""
    return jax.tree_util.tree_map(lambda a: jnp.array(np.asarray(a)), tree)


def flat(tree: Any) -> np.ndarray:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return np.zeros(0)
    parts = [np.ravel(np.asarray(leaf)) for leaf in leaves]
    kind = np.complex128 if any(np.iscomplexobj(p) for p in parts) else np.float64
    return np.concatenate([p.astype(kind) for p in parts])


def same_structure(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(
        jnp.shape(u) == jnp.shape(v) and jnp.result_type(u) == jnp.result_type(v)
        for u, v in zip(la, lb, strict=True)
    )


def excess(got: Any, want: Any, tol: tuple[float, float], scale: float = 0.0) -> float:
    """The largest `|got - want| / (atol + rtol |want|)`: <= 1 is close.

    NaN in both at one position is equal; NaN in one only, or shapes that
    differ, are infinitely far. `scale` raises `atol` to `atol * scale` (for
    sums and gradients whose size grows with the values)."""
    g, w = flat(got), flat(want)
    if g.shape != w.shape:
        return float("inf")
    rtol, atol = tol
    atol = atol * max(1.0, scale)
    both = np.isnan(g) & np.isnan(w)
    diff = np.where(both, 0.0, np.abs(g - w))
    ratio = diff / (atol + rtol * np.abs(np.where(np.isfinite(w), w, 0.0)))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max()) if ratio.size else 0.0


def brief(tree: Any, digits: int = 5) -> Any:
    """A JSON-able rounded rendering of a pytree of arrays."""

    def leaf(a: Any) -> Any:
        arr = np.asarray(a)
        if np.iscomplexobj(arr):
            return [brief(arr.real), brief(arr.imag)]
        return np.round(arr.astype(np.float64), digits).tolist()

    return jax.tree_util.tree_map(leaf, tree)


def full_jacobian(f: Callable[[Any], Any], x: Any) -> np.ndarray | None:
    """`J_f(x)` of the flattened map (results by inputs), when it is real."""
    vx, unravel = ravel_pytree(x)
    y = f(x)
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree_util.tree_leaves(y)):
        return None
    jac = jax.jacfwd(lambda v: ravel_pytree(f(unravel(v)))[0])(vx)
    jac = np.asarray(jac, np.float64)
    return jac if jac.ndim == 2 else None


def witness_jacobian(f: Callable[[Any], Any], x: Any) -> np.ndarray | None:
    """`J_f(x)` of the flattened map, when it is a real square matrix."""
    jac = full_jacobian(f, x)
    if jac is None or jac.shape[0] != jac.shape[1]:
        return None
    return jac


def embedding_jacobian(f: Callable[[Any], Any], x: Any) -> np.ndarray | None:
    """`J_f(x)` when `f` embeds its domain in a larger space (more results
    than inputs, full column rank): its columns span the tangent space of
    the image at `f(x)`."""
    jac = full_jacobian(f, x)
    if jac is None or jac.shape[0] <= jac.shape[1]:
        return None
    if np.linalg.matrix_rank(jac) != jac.shape[1]:
        return None
    return jac


def judge_tangent_grad(got: Any, want: Any, jac: np.ndarray) -> Outcome:
    """Gradients of `sum(inverse(y))` for an embedding `f`, compared on the
    tangent space of its image.

    A left inverse is only defined on the image, so its gradient with respect
    to `y` is fixed only along the image: two left inverses may read `x`
    from different entries of `y`, and their gradients then differ by a
    vector normal to the image. Along a tangent vector `J_f(x) e_i` every
    left inverse has the same derivative: `inverse(f(x)) = x` gives
    `J_f(x)^T grad = 1`. So jaxinterp's gradient passes when its tangent
    components `J_f(x)^T grad` are 1, whatever its normal component; the
    library's are reported beside them.
    """
    g = flat(got)
    if g.shape[0] != jac.shape[0]:
        return Outcome("wrong", "gradient has the wrong size", got=brief(got))
    ones = np.ones(jac.shape[1])
    scale = float((np.abs(jac).T @ np.abs(g)).max()) if g.size else 0.0
    got_t = jac.T @ g
    detail: dict[str, Any] = dict(got=brief(got), tangent_got=brief(got_t))
    want_t = None
    if not isinstance(want, BaseException) and flat(want).shape == g.shape:
        want_t = jac.T @ flat(want)
        detail.update(want=brief(want), tangent_library=brief(want_t))
    if excess(got_t, ones, GRAD_TOL, scale) > 1:
        return Outcome(
            "wrong", "gradient is not 1 along the image's tangents", **detail
        )
    if want_t is not None and excess(got_t, want_t, GRAD_TOL, scale) <= 1:
        note = "differs from the library's only normal to the image (a left inverse)"
    else:
        note = "J_f(x)^T grad == 1 along the image (the library's differs there)"
    return Outcome("pass", note, **detail)


# --- one check ----------------------------------------------------------------


class Outcome:
    """What one check found."""

    def __init__(self, status: str, note: str = "", **detail: Any) -> None:
        self.status, self.note, self.detail = status, note, detail


def judge_x(f: Callable[[Any], Any], y: Any, got: Any, want: Any) -> Outcome:
    """An inverse value against the library's (an exception if it had none)."""
    # `fresh`: TFP would answer `f(want)` from its cache with `y` itself.
    rt_got = excess(f(fresh(got)), y, RT_TOL)
    if isinstance(want, BaseException):
        if rt_got <= 1:
            return Outcome("pass", f"no library inverse ({want!r}); f(x) == y")
        return Outcome("wrong", "no library inverse; f(x) != y", got=brief(got))
    err = excess(got, want, X_TOL)
    if err <= 1:
        return Outcome("pass")
    rt_want = excess(f(fresh(want)), y, RT_TOL)
    detail = dict(
        got=brief(got),
        want=brief(want),
        excess=err,
        roundtrip_got=rt_got,
        roundtrip_library=rt_want,
    )
    if rt_got <= 1 and rt_want > 1:
        note = "the library's inverse does not reproduce y; jaxinterp's does"
        return Outcome("pass", note, **detail)
    if rt_got <= 1 and excess(got, want, (0.05, 0.05)) <= 1:
        note = "differs from the library's inverse, but f(x) == y (ill-conditioned)"
        return Outcome("pass", note, **detail)
    nan = np.isnan(flat(got)) & np.isfinite(flat(want))
    if nan.any():
        note = f"NaN at {int(nan.sum())} elements where the library's inverse is finite"
        return Outcome("wrong", note, **detail)
    return Outcome("wrong", "inverse differs from the library's", **detail)


def judge_ildj(got: Any, want: Any, witness: float | None, square: bool) -> Outcome:
    """A summed ildj against the library's, then against `-log|det J_f(x)|`."""
    if isinstance(want, BaseException):
        if witness is None:
            return Outcome("skip", f"no library ildj ({want!r}) and no witness")
        if excess(got, witness, ILDJ_TOL, abs(witness)) <= 1:
            return Outcome("pass", f"no library ildj ({want!r}); matches witness")
        return Outcome("wrong", "no library ildj; differs from witness")
    scale = float(np.max(np.abs(flat(want)), initial=0.0))
    if excess(got, want, ILDJ_TOL, scale) <= 1:
        return Outcome("pass")
    detail = dict(got=brief(got), want=brief(want), witness=witness)
    if witness is not None and excess(got, witness, ILDJ_TOL, abs(witness)) <= 1:
        note = "the library's ildj differs from -log|det J_f(x)|; jaxinterp's matches"
        return Outcome("pass", note, **detail)
    if not square:
        note = "differs from the library's log-det, which uses its own parametrization"
        return Outcome("n/a", note, **detail)
    return Outcome("wrong", "ildj differs from the library's", **detail)


def worst(outcomes: list[Outcome]) -> Outcome:
    order = {s: i for i, s in enumerate(("wrong", "n/a", "skip", "pass"))}
    return min(outcomes, key=lambda o: order[o.status])


# --- one case ------------------------------------------------------------------


def case_seed(name: str) -> int:
    return sum(ord(c) * (i + 7) for i, c in enumerate(name)) % (2**31)


def attempt(fn: Callable[[], Any]) -> Any:
    """`fn()`, or the exception it raised (a reference that may be missing)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure of the library
        return e


def classify_error(e: BaseException) -> tuple[str, str]:
    """(status, reason key) for an exception raised by a jaxinterp check."""
    if isinstance(e, (jaxinterp.NotInvertibleError, jaxinterp.MissingRuleError)):
        return "refused", reason_key(e)
    return "crash", f"{type(e).__name__}: {normalize(first_line(e))}"


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def normalize(text: str) -> str:
    """A message without shapes, source lines and numbers (for grouping)."""
    dtype = r"(?:float|int|uint|complex|bfloat)\d+|bool|[fiuc]\d+"
    text = re.sub(rf"\b(?:{dtype})\[[^\]]*\]", "T[..]", text)
    text = re.sub(r"[\w./<>-]+\.py:\d+(?::\d+)?(?: \([^)]*\))?", "<line>", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return text[:300]


_REASON_LINE = re.compile(r"^  `([^`]+)` at (?:.*?\.py:\d+\S* \([^)]*\)|[^:]*): (.*)$")


def reason_key(e: BaseException) -> str:
    """`Blocked at <prim>: <reason>` for a refusal, from the innermost equation
    that blocked (a refusal inside a `jit` names the `jit`, then its body's
    equation), else the message's first line."""
    text = str(e)
    if isinstance(e, jaxinterp.MissingRuleError):
        return "MissingRuleError: " + normalize(first_line(e))
    reasons = [m.groups() for m in map(_REASON_LINE.match, text.splitlines()) if m]
    if not reasons:
        return normalize(first_line(e))
    prim, why = reasons[-1]
    return f"Blocked at `{prim}`: {normalize(why)}"


def blocked_path(e: BaseException) -> str:
    """Where each nested refusal sits, outermost first: `prim` at file:line."""
    text = str(e)
    out = []
    for line in text.splitlines():
        m = re.match(r"^  `([^`]+)` at (.*?\.py:\d+\S* \([^)]*\)|[^:]*): ", line)
        if m:
            out.append(f"`{m.group(1)}` at {m.group(2)}")
    return " > ".join(out)


def run_case(case: Any, timeout: int) -> list[dict[str, Any]]:
    base = {"library": case.library, "bijector": case.name}
    rng = np.random.default_rng(case_seed(case.name))
    stage = "setup"
    try:
        x = case.sample(rng)
        xs = [case.sample(rng) for _ in range(BATCH)]
        y = fresh(case.forward(x))
        ys = [fresh(case.forward(xi)) for xi in xs]
        if not np.all(np.isfinite(flat(y))):
            raise ValueError(f"f(x) is not finite at x = {brief(x)}")
        # A forward that JAX cannot trace is the library's limit, not ours.
        stage = "setup (the library's forward does not trace under jax.make_jaxpr)"
        jax.make_jaxpr(case.forward)(x)
    except Exception as e:  # noqa: BLE001 - the library's own forward failed
        reason = f"{stage}: {type(e).__name__}: {normalize(first_line(e))}"
        return [
            {
                **base,
                "check": c,
                "status": "skip",
                "reason": reason,
                "message": f"{type(e).__name__}: {e}"[:2000],
            }
            for c in CHECKS
        ]
    f = case.forward
    kw: dict[str, Any] = {} if same_structure(x, y) else {"example_args": (x,)}
    lib_inverse = case.inverse
    lib_x = attempt(lambda: lib_inverse(fresh(y)))
    lib_xs = [attempt(lambda yi=yi: lib_inverse(fresh(yi))) for yi in ys]
    lib_ildj = attempt(lambda: case.ildj(fresh(y)))
    lib_ildjs = [attempt(lambda yi=yi: case.ildj(fresh(yi))) for yi in ys]

    def slogdet_witness(xi: Any) -> float | None:
        jac = attempt(lambda: witness_jacobian(f, xi))
        if jac is None or isinstance(jac, BaseException):
            return None
        return -float(np.linalg.slogdet(jac)[1])

    records: list[dict[str, Any]] = []
    common = {
        "x": brief(x),
        "y": brief(y),
        "example_args": bool(kw),
        "square": case.square,
    }

    def run(check: str, body: Callable[[], Outcome]) -> Outcome:
        start = time.perf_counter()
        try:
            with time_limit(timeout):
                out = body()
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            status, reason = classify_error(e)
            out = Outcome(status, reason, message=f"{type(e).__name__}: {e}"[:4000])
            if status == "refused":
                out.detail["blocked"] = blocked_path(e)
            if status == "crash":
                out.detail["traceback"] = traceback.format_exc()[-3000:]
        record = {
            **base,
            "check": check,
            "status": out.status,
            "reason": out.note if out.status in ("refused", "crash") else "",
            "note": out.note if out.status not in ("refused", "crash") else "",
            "seconds": round(time.perf_counter() - start, 3),
            **out.detail,
        }
        if out.status in ("wrong", "n/a") or out.note:
            record.update(common)
        records.append(record)
        return out

    def check_inverse() -> Outcome:
        return judge_x(f, y, jaxinterp.inverse(f, **kw)(y), lib_x)

    def check_ildj() -> Outcome:
        got = jaxinterp.ildj(f, **kw)(y)
        return judge_ildj(got, lib_ildj, slogdet_witness(x), case.square)

    run("inverse", check_inverse)
    ildj_ok = run("ildj", check_ildj).status == "pass"

    def check_jit() -> Outcome:
        if not ildj_ok:
            return judge_x(f, y, jax.jit(jaxinterp.inverse(f, **kw))(y), lib_x)
        got_x, got_ildj = jax.jit(jaxinterp.inverse_and_ildj(f, **kw))(y)
        return worst(
            [
                judge_x(f, y, got_x, lib_x),
                judge_ildj(got_ildj, lib_ildj, slogdet_witness(x), case.square),
            ]
        )

    def check_vmap() -> Outcome:
        batch = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ys)
        fn = (jaxinterp.inverse_and_ildj if ildj_ok else jaxinterp.inverse)(f, **kw)
        got = jax.vmap(fn)(batch)
        outcomes, items = [], []
        for i in range(BATCH):
            gi = jax.tree_util.tree_map(lambda a, i=i: a[i], got)
            if ildj_ok:
                witness = slogdet_witness(xs[i])
                outcomes.append(judge_x(f, ys[i], gi[0], lib_xs[i]))
                outcomes.append(judge_ildj(gi[1], lib_ildjs[i], witness, case.square))
                items += [i, i]
            else:
                outcomes.append(judge_x(f, ys[i], gi, lib_xs[i]))
                items.append(i)
        out = worst(outcomes)
        if out.detail:
            i = items[outcomes.index(out)]
            out.detail.update(batch_index=i, x_item=brief(xs[i]), y_item=brief(ys[i]))
        return out

    def check_grad() -> Outcome:
        inv = jaxinterp.inverse(f, **kw)
        got = jax.grad(lambda t: jnp.sum(ravel_pytree(inv(t))[0]))(y)
        want = attempt(
            lambda: jax.grad(lambda t: jnp.sum(ravel_pytree(lib_inverse(t))[0]))(
                fresh(y)
            )
        )
        jac = attempt(lambda: witness_jacobian(f, x))
        witness = None
        if isinstance(jac, np.ndarray):
            ones = np.ones(jac.shape[0])
            try:
                witness = np.linalg.solve(jac.T, ones)
            except np.linalg.LinAlgError:
                # A map onto a subspace (`cholesky` reads only the symmetric
                # part of its operand): no witness; the library's gradient
                # and the embedding judge instead.
                witness = None
        if isinstance(want, BaseException) or not np.all(np.isfinite(flat(want))):
            embedding = attempt(lambda: embedding_jacobian(f, x))
            if witness is None and isinstance(embedding, np.ndarray):
                return judge_tangent_grad(got, want, embedding)
            if witness is None:
                return Outcome("skip", f"no library gradient ({want!r}), no witness")
            if excess(got, witness, GRAD_TOL, np.abs(witness).max()) <= 1:
                return Outcome("pass", "library gradient missing or not finite")
            return Outcome("wrong", "gradient differs from witness", got=brief(got))
        scale = float(np.abs(flat(want)).max(initial=0.0))
        if excess(got, want, GRAD_TOL, scale) <= 1:
            return Outcome("pass")
        embedding = attempt(lambda: embedding_jacobian(f, x))
        if isinstance(embedding, np.ndarray):
            return judge_tangent_grad(got, want, embedding)
        detail = dict(
            got=brief(got),
            want=brief(want),
            witness=None if witness is None else brief(witness),
        )
        if witness is None and isinstance(jac, np.ndarray):
            # A map of a submanifold (`cholesky` of symmetric matrices): its
            # Jacobian is singular, and `J^T grad = 1` holds along its row
            # space (the submanifold's tangents) only.
            row_space = np.linalg.pinv(jac) @ jac
            g = flat(got)
            residual = row_space @ (jac.T @ g - np.ones(jac.shape[1]))
            scale = float((np.abs(jac).T @ np.abs(g)).max()) if g.size else 0.0
            if excess(residual, np.zeros_like(residual), GRAD_TOL, scale) <= 1:
                note = (
                    "J_f(x)^T grad == 1 along the tangents of the domain (the row "
                    "space of J_f); the library's gradient differs normal to them"
                )
                return Outcome("pass", note, **detail)
        if witness is not None and (
            excess(flat(got), witness, GRAD_TOL, np.abs(witness).max()) <= 1
        ):
            note = (
                "the library's gradient differs from J_f(x)^-T 1; jaxinterp's matches"
            )
            return Outcome("pass", note, **detail)
        return Outcome("wrong", "gradient differs from the library's", **detail)

    run("jit", check_jit)
    run("vmap", check_vmap)
    run("grad", check_grad)
    return records


# --- driver --------------------------------------------------------------------


def batched(case: Any, size: int) -> Any:
    """`case` on a leading batch axis of `size` points: the library's own
    forward, inverse and log-det take the batch (their parameters broadcast
    against it); a bijector whose forward does not is skipped at setup."""

    def sample(rng: np.random.Generator) -> Any:
        points = [case.sample(rng) for _ in range(size)]
        return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *points)

    return dataclasses.replace(case, sample=sample)


def load_cases(libraries: list[str]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The cases of each library, or a record saying why a library is missing."""
    import importlib

    cases, missing = [], []
    for lib in libraries:
        try:
            module = importlib.import_module(f"cases_{lib}")
            cases.extend(module.cases())
        except Exception as e:  # noqa: BLE001 - a library that does not import
            missing.append({"library": lib, "error": f"{type(e).__name__}: {e}"})
    return cases, missing


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def innermost(path: str) -> str:
    """`file.py (function)` of the innermost refusal of a `blocked_path`."""
    last = path.split(" > ")[-1]
    m = re.search(r"([\w.-]+\.py):\d+\S* \(([^)]*)\)", last)
    return f"{m.group(1)} ({m.group(2)})" if m else ""


def summarize(records: list[dict[str, Any]], cases: list[Any]) -> str:
    out = []
    counts = collections.Counter((r["library"], r["status"]) for r in records)
    by_lib: dict[str, set[str]] = collections.defaultdict(set)
    failing: dict[str, set[str]] = collections.defaultdict(set)
    for r in records:
        by_lib[r["library"]].add(r["bijector"])
        if r["status"] != "pass":
            failing[r["library"]].add(r["bijector"])
    rows = []
    for lib in [*LIBRARIES, "all"]:
        libs = LIBRARIES if lib == "all" else (lib,)
        n_bij = sum(len(by_lib[b]) for b in libs)
        all_pass = n_bij - sum(len(failing[b]) for b in libs)
        rows.append(
            [lib, n_bij, all_pass]
            + [sum(counts[(b, s)] for b in libs) for s in STATUSES]
        )
    header = ["library", "bijectors", "all 5 pass", *STATUSES]
    out += ["Checks per library:", "", table(rows, header), ""]
    counts = collections.Counter((r["check"], r["status"]) for r in records)
    rows = [[c] + [counts[(c, s)] for s in STATUSES] for c in CHECKS]
    out += ["Checks per kind:", "", table(rows, ["check", *STATUSES]), ""]
    for status in ("refused", "crash", "skip"):
        groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for r in records:
            if r["status"] == status:
                groups[r["reason"]].append(r)
        if not groups:
            continue
        rows = []
        for reason, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            names = sorted({f"{r['library']}: {r['bijector']}" for r in rs})
            example = "; ".join(names[:3]) + (" ..." if len(names) > 3 else "")
            sites = sorted({innermost(r.get("blocked", "")) for r in rs} - {""})
            where = "; ".join(sites[:3]) + (" ..." if len(sites) > 3 else "")
            rows.append(
                [len(rs), len(names), reason, where, example]
                if status == "refused"
                else [len(rs), len(names), reason, example]
            )
        rows = [[str(c).replace("|", "\\|") for c in row] for row in rows]
        header = ["checks", "bijectors", "reason", "examples"]
        if status == "refused":
            header.insert(3, "blocked in")
        out += [f"Reasons ({status}):", "", table(rows, header), ""]
    notes = [r for r in records if r["status"] == "pass" and r.get("note")]
    if notes:
        out += ["Passes judged by a witness (the library's value differs):", ""]
        out += [
            f"- {r['library']}: {r['bijector']} [{r['check']}]: {r['note']}"
            for r in notes
        ]
        out.append("")
    wrong = [r for r in records if r["status"] == "wrong"]
    out += [f"Wrong answers: {len(wrong)}", ""]
    for r in wrong:
        out.append(f"- {r['library']}: {r['bijector']} [{r['check']}]: {r['note']}")
        for key in (
            "x",
            "y",
            "got",
            "want",
            "witness",
            "excess",
            "roundtrip_got",
            "roundtrip_library",
            "batch_index",
            "x_item",
            "y_item",
        ):
            if key in r:
                out.append(f"    {key}: {r[key]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", action="append", choices=LIBRARIES)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--out", default=os.path.join(".nox", "peers.json"))
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument(
        "--summarize",
        metavar="REPORT",
        help="print the tables of an existing JSON report and exit",
    )
    parser.add_argument(
        "--fail-on-wrong", action="store_true", help="exit 1 if any answer is wrong"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="B",
        help="give each bijector a leading batch axis of B points (its parameters "
        "then broadcast against the batch, as in a flow trained on batches)",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as fh:
            report = json.load(fh)
        print(json.dumps(report["meta"]))
        print(summarize(report["results"], []))
        return 0
    libraries = args.library or list(LIBRARIES)
    cases, missing = load_cases(libraries)
    for m in missing:
        print(f"{m['library']}: not checked ({m['error']})", file=sys.stderr)
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    if args.batch:
        cases = [batched(c, args.batch) for c in cases]
    start = time.time()
    records: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        t0 = time.time()
        recs = run_case(case, args.timeout)
        records.extend(recs)
        marks = " ".join(f"{r['check']}={r['status']}" for r in recs)
        print(
            f"[{i + 1}/{len(cases)}] {case.library}: {case.name}: {marks} "
            f"({time.time() - t0:.1f}s)",
            flush=True,
        )
        jax.clear_caches()
        jaxinterp.clear_caches()
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "versions": versions(),
        "x64": bool(jax.config.jax_enable_x64),
        "seconds": round(time.time() - start, 1),
        "missing_libraries": missing,
        "bijectors": len(cases),
        "batch": args.batch,
    }
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "results": records}, fh, indent=1, default=str)
    print()
    print(json.dumps(meta["versions"]))
    print(summarize(records, cases))
    print(f"\nReport written to {args.out}")
    counts = collections.Counter(r["status"] for r in records)
    print(
        f"{counts['pass']} passed, {counts['wrong']} wrong, {counts['refused']} "
        f"refused, {counts['crash']} crashed, {counts['n/a']} n/a, "
        f"{counts['skip']} skipped"
    )
    if missing:
        return 2
    return 1 if args.fail_on_wrong and counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
