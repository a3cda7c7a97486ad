"""`inverse` benchmarks: compiled speed, tracing cost and eager calls.

Run: `python benchmarks/bench_inverse.py` (add `--quick` for small sizes,
`--only blocks` for one section: compiled, blocks, compile, tracing, eager,
runtime, first).

* compiled: `jit(inverse(f))` against a hand-written inverse under `jit`, for
  an elementwise chain, a stack of affine coupling layers and a `scan` of
  layers; also the equation counts of both Jaxprs (target: no more);
* tracing: building the inverse Jaxpr of a chain of N equations against one
  re-trace of `f`'s Jaxpr through `jax.core.eval_jaxpr`, N = 1,000 and
  10,000, and the scaling to 100,000; a wide graph of k independent inputs;
* blocks: `jit(inverse(f))` of maps solved as blocks (numerically, case by
  case, by a linear solve) against their closed-form inverses under `jit`;
* compile: the gallery's spline compiled with its parameters closed over
  and as arguments, against its hand-written inverse, and its time per call
  with the parameters as arguments (no targets);
* eager: repeated `inverse(f)(y)` calls against the hand-written inverse
  called eagerly;
* first: the first call of `jit(inverse(f))`, each map in a fresh process:
  a numerically solved elementwise map against an exactly inverted one of
  the same size, and the gallery's spline against a coupling layer.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    compare,
    compare_steady,
    describe,
    parse_args,
    print_header,
    report,
    section,
)

import jaxinterp  # noqa: E402
from jaxinterp._inverse import _api  # noqa: E402


def count_eqns(jaxpr) -> int:
    """Equations in a Jaxpr, sub-Jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += count_eqns(sub)
    return total


# ---------------------------------------------------------------------------
# Models with hand-written inverses.


def chain(x):
    x = x * 1.5 + 0.25
    x = jnp.tanh(x)
    x = jnp.arctanh(x * 0.9)
    x = jnp.exp(x)
    return jnp.log1p(x)


def chain_inverse(y):
    x = jnp.expm1(y)
    x = jnp.log(x)
    x = jnp.tanh(x) / 0.9
    x = jnp.arctanh(x)
    return (x - 0.25) / 1.5


def mlp(params, h):
    w1, b1, w2, b2 = params
    h = jnp.tanh(h @ w1 + b1)
    out = h @ w2 + b2
    d = out.shape[-1] // 2
    return jnp.tanh(out[..., :d]), out[..., d:]


def coupling(x, params):
    d = x.shape[-1] // 2
    for layer in params:
        x1, x2 = x[..., :d], x[..., d:]
        s, t = mlp(layer, x1)
        x = jnp.concatenate([x2 * jnp.exp(s) + t, x1], axis=-1)
    return x


def coupling_inverse(y, params):
    d = y.shape[-1] // 2
    for layer in reversed(params):
        z, x1 = y[..., :d], y[..., d:]
        s, t = mlp(layer, x1)
        y = jnp.concatenate([x1, (z - t) * jnp.exp(-s)], axis=-1)
    return y


def scan_layers(x, weights):
    def layer(c, w):
        scale, shift = w
        return jnp.tanh(c) * jnp.exp(scale) + shift, None

    return lax.scan(layer, x, weights)[0]


def scan_layers_inverse(y, weights):
    def layer(c, w):
        scale, shift = w
        return jnp.arctanh((c - shift) * jnp.exp(-scale)), None

    return lax.scan(layer, y, weights, reverse=True)[0]


def bench_compiled(quick: bool) -> None:
    print("## compiled: jit(inverse(f)) / jit(hand-written inverse)")
    n = 100_000 if quick else 1_000_000
    key = jax.random.key(0)
    x = jax.random.uniform(key, (n,), minval=-0.5, maxval=0.5)
    dim, hidden, batch = 8, 64, (4_096 if quick else 65_536)
    keys = jax.random.split(key, 8 * 4)
    params = [
        (
            0.1 * jax.random.normal(keys[4 * i], (dim // 2, hidden)),
            jnp.zeros(hidden),
            0.1 * jax.random.normal(keys[4 * i + 1], (hidden, dim)),
            jnp.zeros(dim),
        )
        for i in range(8)
    ]
    xb = jax.random.normal(keys[-1], (batch, dim))
    weights = (
        0.1 * jax.random.normal(keys[-2], (16, n)),
        0.1 * jax.random.normal(keys[-3], (16, n)),
    )
    xs = 0.3 * x
    cases = {
        "elementwise chain": (chain, chain_inverse, (chain(x),), None),
        "coupling stack (8 layers)": (
            coupling,
            coupling_inverse,
            (coupling(xb, params), params),
            0,
        ),
        "scan of 16 layers": (
            scan_layers,
            scan_layers_inverse,
            (scan_layers(xs, weights), weights),
            0,
        ),
    }
    for name, (fn, hand, args, argnums) in cases.items():
        ours = jax.jit(jaxinterp.inverse(fn, argnums=argnums))
        cold, steady = _ratios(ours, jax.jit(hand), args, quick)
        report(f"{name}: time ratio, calls back to back", steady, 1.05)
        report(f"{name}: time ratio, single calls after a collection", cold)
        n_ours = count_eqns(
            jax.make_jaxpr(jaxinterp.inverse(fn, argnums=argnums))(*args).jaxpr
        )
        n_hand = count_eqns(jax.make_jaxpr(hand)(*args).jaxpr)
        report(f"{name}: equations (target: the hand-written's)", n_ours, n_hand)


def searchsorted_spline(x, raw):
    """A 5-bin rational-quadratic spline on [-3, 3] (the identity outside)
    as bijector libraries index it: each element's bin by
    `jnp.searchsorted` over the knots, its parameters gathered at the bin;
    `raw`, 14 unconstrained numbers."""
    bins, bound = 5, 3.0
    widths = jax.nn.softmax(raw[:bins]) * 2 * bound
    heights = jax.nn.softmax(raw[bins : 2 * bins]) * 2 * bound
    one = jnp.ones(1)
    slopes = jnp.concatenate([one, jax.nn.softplus(raw[2 * bins :]), one])
    kx = jnp.concatenate([-bound * one, -bound + jnp.cumsum(widths)])
    ky = jnp.concatenate([-bound * one, -bound + jnp.cumsum(heights)])
    xc = jnp.clip(x, -bound, bound)
    k = jnp.searchsorted(kx, xc, side="right", method="compare_all") - 1
    k = jnp.clip(k, 0, bins - 1)
    w, h, d0, d1 = widths[k], heights[k], slopes[k], slopes[k + 1]
    t, s = (xc - kx[k]) / w, h / w
    mix = t * (1 - t)
    y = ky[k] + h * (s * t * t + d0 * mix) / (s + (d0 + d1 - 2 * s) * mix)
    return jnp.where(jnp.abs(x) <= bound, y, x)


def gallery_spline():
    """The gallery flow's rational-quadratic spline (`jnp.where` over its
    bins, a clip per bin; 4 bins on [-3, 3], the identity outside), random
    parameters, and its inverse by hand, both taking the parameters as an
    argument: the bin of `y` by `searchsorted` on the knots' heights, the
    root of its quadratic."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    import normalizing_flow as nf

    rng = np.random.default_rng(0)
    sp = {k: jnp.asarray(rng.normal(size=n), jnp.float32) for k, n in
          (("w", nf.BINS), ("h", nf.BINS), ("d", nf.BINS - 1))}  # fmt: skip
    bound = nf.BOUND

    def inverse(y, p):
        widths = jax.nn.softmax(p["w"]) * 2 * bound
        heights = jax.nn.softmax(p["h"]) * 2 * bound
        zero = jnp.zeros(1)
        kx = jnp.concatenate([zero - bound, -bound + jnp.cumsum(widths)])
        ky = jnp.concatenate([zero - bound, -bound + jnp.cumsum(heights)])
        slopes = jnp.concatenate([zero + 1, jax.nn.softplus(p["d"]), zero + 1])
        k = jnp.clip(
            jnp.searchsorted(ky, y, side="right", method="compare_all") - 1,
            0,
            nf.BINS - 1,
        )
        w, h, d0, d1 = widths[k], heights[k], slopes[k], slopes[k + 1]
        s, r = h / w, y - ky[k]
        a = h * (s - d0) + r * (d1 + d0 - 2 * s)
        b = h * d0 - r * (d1 + d0 - 2 * s)
        t = -2 * s * r / (-b - jnp.sqrt(b * b + 4 * a * s * r))
        return jnp.where((y > -bound) & (y < bound), kx[k] + t * w, y)

    return sp, nf.spline, inverse


def bench_blocks(quick: bool) -> None:
    print("## blocks: jit(inverse(f)) / jit(closed-form inverse)")
    n = 100_000 if quick else 1_000_000
    x = jnp.linspace(-4.0, 4.0, n)

    def softsign(x):
        return x / (1 + jnp.abs(x))

    def softsign_solved(x):  # the same map, which no exact method inverts
        # (`|x|` and `x * sign(x)` are case splits; the `sign` of a value
        # using `x` more than once is not.)
        return x / (1 + x * jnp.sign(x * x * x))

    def logit(x):
        return jnp.log(x) - jnp.log1p(-x)

    def leaky(x):
        return jnp.where(x >= 0, x, 0.1 * x)

    def softplus_inverse(x):  # linear-fractional in e^-x
        return x + jnp.log(-jnp.expm1(-x))

    def softplus_stable(x):  # one site: max(x, 0) and |x| split at 0
        return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))

    def ndtr_regimes(x):  # erf near 0, erfc of |w| in each tail
        w = x * (0.5 * np.sqrt(2.0))
        z = jnp.abs(w)
        tails = jnp.where(w > 0.0, 2.0 - lax.erfc(z), lax.erfc(z))
        return 0.5 * jnp.where(z < 0.5 * np.sqrt(2.0), 1.0 + lax.erf(w), tails)

    sp, spline_of, spline_inverse_of = gallery_spline()

    def spline(x):
        return spline_of(x, sp)

    def spline_inverse(y):
        return spline_inverse_of(y, sp)

    def householder(x):
        v = jnp.ones(x.shape[-1]) / jnp.sqrt(x.shape[-1])
        return x - 2 * v * jnp.dot(v, x)

    xh = jnp.linspace(-1.0, 1.0, 256)
    cases = {
        # (forward, closed form, y, target ratio)
        # `|x|` is a case split and each case of softsign is
        # linear-fractional: an exact formula.
        "piecewise, linear-fractional cases (softsign)": (
            softsign,
            lambda y: y / (1 - jnp.abs(y)),
            softsign(x),
            3.0,
        ),
        "elementwise solve (softsign as x / (1 + x sign(x^3)))": (
            softsign_solved,
            lambda y: y / (1 - jnp.abs(y)),
            softsign(x),
            3.0,
        ),
        # Logit, `log(x / (1 - x))` written with `log1p`, is the logarithm
        # of a linear-fractional map: a formula.
        "linear-fractional formula (logit)": (
            logit,
            jax.nn.sigmoid,
            logit(jnp.linspace(1e-4, 1 - 1e-4, n)),
            3.0,
        ),
        # One `y` off the image: the later tiers run on the elements the
        # first leaves undecided, gathered (against the clean call's 10x).
        "elementwise solve (softsign), one y off the image": (
            softsign_solved,
            lambda y: y / (1 - jnp.abs(y)),
            softsign(x).at[0].set(2.0),
            None,
        ),
        # 2% of the `y` off the image: more than one gather of 64, so the
        # later tiers run 1/64 of the elements at a time (`_lazy._chunks`),
        # not on all of them (which would take seconds).
        "elementwise solve (softsign), 2% of y off the image": (
            softsign_solved,
            lambda y: y / (1 - jnp.abs(y)),
            softsign(x).at[:: n // (n // 50)].set(2.0),
            None,
        ),
        # A formula in s = e^-x, and piecewise maps whose cases are
        # formulas.
        "linear-fractional formula in e^-x (softplus inverse)": (
            softplus_inverse,
            jax.nn.softplus,
            softplus_inverse(jnp.linspace(0.05, 8.0, n)),
            3.0,
        ),
        "piecewise (softplus as max(x, 0) + log1p(exp(-|x|)))": (
            softplus_stable,
            softplus_inverse,
            softplus_stable(x),
            3.0,
        ),
        "piecewise (normal CDF by regimes)": (
            ndtr_regimes,
            jax.scipy.special.ndtri,
            ndtr_regimes(x),
            3.0,
        ),
        "piecewise (leaky ReLU)": (
            leaky,
            lambda y: jnp.where(y >= 0, y, y / 0.1),
            leaky(x),
            1.5,
        ),
        # More cases than the piecewise method enumerates, and a quadratic
        # in each bin: inverted interval by interval.
        "piecewise by intervals (the gallery's spline, 4 bins)": (
            spline,
            spline_inverse,
            spline(x),
            3.0,
        ),
        "linear solve (Householder, 256)": (
            householder,
            householder,  # a reflection is its own inverse
            householder(xh),
            None,
        ),
    }
    if quick:  # (the suite's smoke test: one case of each kind)
        del cases["linear-fractional formula (logit)"]
        del cases["piecewise (softplus as max(x, 0) + log1p(exp(-|x|)))"]
        del cases["piecewise (normal CDF by regimes)"]
        del cases["elementwise solve (softsign), one y off the image"]
        del cases["elementwise solve (softsign), 2% of y off the image"]
    for name, (fn, hand, y, target) in cases.items():
        ours = jax.jit(jaxinterp.inverse(fn))
        ratio, in_steady = _ratios(ours, jax.jit(hand), (y,), quick)
        report(f"{name}: time ratio, calls back to back", in_steady, target)
        report(f"{name}: time ratio, single calls after a collection", ratio)


def _ratios(ours, theirs, args, quick: bool) -> tuple[float, float]:
    """Our time over the reference's, of single calls after a collection
    (`compare`) and of calls back to back (`compare_steady`), which the
    targets judge: for a kernel of a millisecond the first leaves the caches
    cold and can flatter a slower kernel several-fold (docs/benchmarks.md,
    "How timings are taken")."""
    contenders = {
        "ours": lambda: ours(*args),
        "hand": lambda: theirs(*args),
    }
    cold = compare(contenders, repeats=10 if quick else 30)
    steady = compare_steady(
        contenders, calls=5 if quick else 20, rounds=3 if quick else 10
    )
    return (
        min(cold["ours"]) / min(cold["hand"]),
        min(steady["ours"]) / min(steady["hand"]),
    )


def bench_runtime_folds(quick: bool) -> None:
    """The search for folds between grid points when the known operands are
    traced: a host callback per call. `jit(inverse(f,
    argnums=0))(y, a)` with a new `a` each call (the search runs) and with
    the same `a` (the search's cache answers), over the same inverse with
    `a` a constant (searched while tracing: nothing per call)."""
    print("## runtime fold search: traced operand / constant operand")
    n = 1_000 if quick else 100_000

    def f(x, a):
        return x + a * jnp.tanh(3.0 * x - 0.5)

    y = f(jnp.linspace(-3.0, 3.0, n), 0.2)
    traced = jax.jit(jaxinterp.inverse(f, argnums=0))
    constant = jax.jit(jaxinterp.inverse(lambda x: f(x, 0.2)))
    # (Distinct values, more than the search's cache keeps.)
    fresh = itertools.cycle([jnp.float32(0.2 + 1e-6 * i) for i in range(256)])
    same = jnp.float32(0.2)
    # (Apart: the new values would push the same one out of the cache.)
    for name, call in [
        ("new a", lambda: traced(y, next(fresh))),
        ("same a", lambda: traced(y, same)),
    ]:
        times = compare_steady(
            {name: call, "constant": lambda: constant(y)},
            calls=5 if quick else 20,
            rounds=3 if quick else 10,
        )
        print(
            f"  {name}: {describe(times[name], unit='ms')}; constant:"
            f" {describe(times['constant'], unit='ms')}"
        )
        report(
            f"{name} each call, {n} elements: time ratio over a constant `a`",
            min(times[name]) / min(times["constant"]),
        )


# ---------------------------------------------------------------------------
# Tracing cost.


def long_chain(n: int):
    def f(x):
        for i in range(n // 2):
            x = x * 1.0001 if i % 2 else x + 0.001
            x = x - 0.0005
        return x

    return f


def build_cost(fn, args, repeats: int) -> tuple[float, float]:
    """Seconds to build the inverse Jaxpr (engine + DCE) and to re-trace `fn`."""
    staged = jaxinterp.stage(fn, *args)
    closed = staged.closed_jaxpr

    def retrace():
        return jax.make_jaxpr(
            lambda *a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *a)
        )(*args)

    y = fn(*args)
    y_leaves = jax.tree.leaves(y)
    mask = tuple([True] * len(staged.in_avals))
    specs = tuple(jax.tree.map(_api._spec, a) for a in args)

    def build():
        _api._compiled_cache.pop(staged)
        return _api._compile(staged, mask, specs, y_leaves, "x")

    times = compare({"ours": build, "ref": retrace}, repeats=repeats, warmup=1)
    return min(times["ours"]), min(times["ref"])


def bench_tracing(quick: bool) -> None:
    print("## tracing: building the inverse Jaxpr / re-trace through eval_jaxpr")
    sizes = (1_000, 10_000) if not quick else (1_000,)
    per = {}
    x = jnp.ones(4)
    for n in sizes:
        ours, ref = build_cost(long_chain(n), (x,), repeats=3 if n > 1_000 else 5)
        per[n] = ours
        report(f"chain of {n} equations: ratio", ours / ref, 1.5)
    if not quick:
        ours, _ = build_cost(long_chain(100_000), (x,), repeats=1)
        report("scaling: 100,000 / 10,000 equations", ours / per[10_000], 11.0)

    def wide(k):
        def f(*xs):
            return [jnp.exp(v) * 2.0 for v in xs]

        return f, tuple(jnp.ones(2) for _ in range(k))

    small, big = (30, 300) if quick else (300, 3_000)
    t_small, _ = build_cost(*wide(small), repeats=3)
    t_big, _ = build_cost(*wide(big), repeats=3)
    report(f"wide graph: k = {big} / k = {small}", t_big / t_small, 11.0)

    # For reference: the whole first call (staging f + building + running).
    f = long_chain(1_000)

    def first_call():
        jaxinterp.clear_caches()
        return jax.make_jaxpr(jaxinterp.inverse(f))(x)

    staged = jaxinterp.stage(f, x).closed_jaxpr

    def retrace():
        return jax.make_jaxpr(
            lambda a: jax.core.eval_jaxpr(staged.jaxpr, staged.consts, a)
        )(x)

    times = compare({"ours": first_call, "ref": retrace}, repeats=3)
    report(
        "first call of make_jaxpr(inverse(f)), 1,000 equations, staging included, "
        "over a re-trace",
        min(times["ours"]) / min(times["ref"]),
    )


# ---------------------------------------------------------------------------
# Compile time and known values passed as arguments.


def _compile_seconds(fn, args) -> float:
    """Seconds to trace, lower and compile `jit(fn)` afresh (XLA's
    optimizations on, as users compile): JAX's and jaxinterp's caches are
    cleared first (JAX would otherwise reuse the executable)."""
    jax.clear_caches()
    jaxinterp.clear_caches()
    start = time.perf_counter()
    jax.jit(fn).trace(*args).lower().compile()
    return time.perf_counter() - start


def bench_compile(quick: bool) -> None:
    """The gallery's spline (`piecewise by intervals`) compiled with its
    parameters closed over (constant tables, which XLA folds) and passed
    as arguments (tables computed per call, as in the flow's training),
    against its hand-written inverse compiled the same way; and the time
    per call with the parameters as arguments."""
    print("## compile: jit(inverse(f)) / jit(hand-written inverse), compile and run")
    sp, spline_of, inverse_of = gallery_spline()
    n = 100_000 if quick else 1_000_000
    x = jnp.linspace(-4.0, 4.0, n)
    y = spline_of(x, sp)
    ours_args = jaxinterp.inverse(spline_of, argnums=0)
    pairs = {
        "parameters closed over": (
            jaxinterp.inverse(lambda u: spline_of(u, sp)),
            lambda v: inverse_of(v, sp),
            (y,),
        ),
        "parameters as arguments": (ours_args, inverse_of, (y, sp)),
    }
    repeats = 1 if quick else 3
    for name, (ours, hand, args) in pairs.items():
        t_ours = min(_compile_seconds(ours, args) for _ in range(repeats))
        t_hand = min(_compile_seconds(hand, args) for _ in range(repeats))
        print(f"  spline, {name}: hand-written inverse compiles in {t_hand:.2f} s")
        report(f"spline, {name}: compile seconds", t_ours, unit=" s")
        report(f"spline, {name}: compile time over the hand-written's", t_ours / t_hand)
    ratio, in_steady = _ratios(jax.jit(ours_args), jax.jit(inverse_of), (y, sp), quick)
    name = "spline, parameters as arguments: time ratio"
    report(f"{name}, calls back to back", in_steady)
    report(f"{name}, single calls after a collection", ratio)


# The maps of the first-call section, each built in a fresh process
# (`_FIRST_SETUP` then one entry's lines): `f` and its `y`.
_FIRST_SETUP = """
import sys, time
sys.path[:0] = {paths!r}
import jax, jax.numpy as jnp, numpy as np
import jaxinterp
import bench_inverse as bi
"""
_FIRST_MAPS = {
    "exact elementwise": (
        "f = lambda x: jnp.sinh(1.5 * x + 0.5)\ny = f(jnp.linspace(-2.0, 2.0, 4096))"
    ),
    "numerically solved elementwise": (
        "f = lambda x: x + 0.5 * jnp.tanh(x)\ny = f(jnp.linspace(-2.0, 2.0, 4096))"
    ),
    "RealNVP coupling layer": (
        "rng = np.random.default_rng(0)\n"
        "w = lambda *s: jnp.asarray(rng.normal(size=s) * 0.3, jnp.float32)\n"
        "params = [(w(2, 16), w(16), w(16, 4), w(4))]\n"
        "f = lambda x: bi.coupling(x, params)\n"
        "y = f(w(256, 4))"
    ),
    "4-bin spline, where over its bins": (
        "sp, spline, _ = bi.gallery_spline()\n"
        "f = lambda x: spline(x, sp)\n"
        "y = f(jnp.linspace(-4.0, 4.0, 1024))"
    ),
    "5-bin spline, searchsorted over its bins": (
        "raw = jnp.asarray(np.random.default_rng(0).normal(size=14), jnp.float32)\n"
        "f = lambda x: bi.searchsorted_spline(x, raw)\n"
        "y = f(jnp.linspace(-4.0, 4.0, 1024))"
    ),
}
_FIRST_TIMED = """
jax.block_until_ready(jax.jit(lambda v: v * 2.0)(y))
start = time.perf_counter()
jax.block_until_ready(jax.jit(jaxinterp.inverse(f))(y))
print(time.perf_counter() - start)
"""


def _first_call_seconds(setup: str) -> float:
    """Seconds of the first call of `jax.jit(inverse(f))(y)` (staging,
    solving, compiling and running), in a fresh process whose JAX has
    already compiled and run one program."""
    here = str(Path(__file__).parent)
    script = _FIRST_SETUP.format(paths=[here]) + setup + _FIRST_TIMED
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return float(out.stdout.split()[-1])


def bench_first_calls(quick: bool) -> None:
    """The first call of `jax.jit(inverse(f))` for maps of one size solved
    exactly and numerically, and for a spline layer against a coupling
    layer, each in a fresh process (the least of a few)."""
    print("## first: first call of jit(inverse(f)), each in a fresh process")
    repeats = 1 if quick else 3
    t = {
        name: min(_first_call_seconds(setup) for _ in range(repeats))
        for name, setup in _FIRST_MAPS.items()
    }
    for name, seconds in t.items():
        report(f"first call, {name}: seconds", seconds, unit=" s")
    report(
        "first call, numerically solved over exact elementwise",
        t["numerically solved elementwise"] / t["exact elementwise"],
        5.0,
    )
    for way in ("4-bin spline, where", "5-bin spline, searchsorted"):
        report(
            f"first call, {way} over coupling layer",
            t[f"{way} over its bins"] / t["RealNVP coupling layer"],
            3.0,
        )


# ---------------------------------------------------------------------------
# Eager calls.


def bench_eager(quick: bool) -> None:
    print("## eager: repeated inverse(f)(y) / hand-written inverse, both eager")
    y = chain(jnp.linspace(-0.5, 0.5, 1_000))
    inv = jaxinterp.inverse(chain)
    times = compare(
        {"ours": lambda: inv(y), "hand": lambda: chain_inverse(y)},
        repeats=50 if quick else 200,
        warmup=3,
    )
    report(
        "elementwise chain, eager per call",
        min(times["ours"]) / min(times["hand"]),
        1.2,
    )


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    print_header("bench_inverse")
    sections = {
        "compiled": bench_compiled,
        "blocks": bench_blocks,
        "compile": bench_compile,
        "tracing": bench_tracing,
        "eager": bench_eager,
        "runtime": bench_runtime_folds,
        "first": bench_first_calls,
    }
    for name in args.only or sections:
        section(name)
        sections[name](args.quick)


if __name__ == "__main__":
    main()
