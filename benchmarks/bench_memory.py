"""Peak memory of an eager walk: values are released after their last use.

An eager chain of 50 elementwise steps over one large array (100 MB) needs at
most three arrays alive at once: the caller's input, the step's operand and
its result. The walker keeps to that only if it drops each intermediate value
once its last user has run.

Two measures, each as a multiple of the array's size:

* live arrays: the bytes of `jax.live_arrays()`, sampled after every equation
  by an `Interpreter` subclass (and after every step of the eager reference).
  Overriding `process_eqn` takes the walker's general path; `evaluate` itself
  runs eager calls through its fast path (compiled calls per equation), whose
  release of values shows in the resident memory below;
* resident memory: the growth of the process's peak RSS (`VmHWM`, reset
  through `/proc/self/clear_refs`, Linux only) during the call, plus the
  input, so it also sees buffers XLA still holds. Informational: it counts
  whatever else the process allocates, and with `--quick` the allocator
  recycles the 10 MB arrays within its heap, so the RSS hardly moves.

Figures and their targets:

* `walker peak live arrays, 50-step chain`: <= 3.
* `inverse by intervals, every interval tried`: XLA's temporary buffers
  of the compiled inverse of a piecewise-linear zigzag (32 breakpoints, not
  monotone, so every interval is tried per element), as a multiple of `y`'s
  size: <= 16. (Stacking every interval's candidates would hold `(3K + 2)`
  arrays, 255 here: the intervals are tried one at a time.)

Run with `python benchmarks/bench_memory.py` (`--quick` for 10 MB arrays).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from _common import parse_args, print_header, report

import jaxinterp

STEPS = 50


def live_bytes() -> int:
    """Return the bytes held by every live JAX array."""
    return sum(a.nbytes for a in jax.live_arrays())


def chain(x: jax.Array, probe: Callable[[], None] | None = None) -> jax.Array:
    """Apply `STEPS` elementwise steps (one equation each).

    With a `probe`, call it after each step while the step's operand and
    result are both alive, as the walker's sample sees them.
    """
    for i in range(STEPS):
        y = x * 1.5 if i % 2 == 0 else x - 0.5
        if probe is not None:
            probe()
        x = y
    return x


class PeakProbe(jaxinterp.EvalInterpreter):
    """The evaluator, sampling the live arrays' bytes after every equation."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0

    def process_eqn(self, eqn: Any, invals: list[Any]) -> list[Any]:
        outvals = super().process_eqn(eqn, invals)
        self.peak = max(self.peak, live_bytes())
        return outvals


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss(run: Callable[[], Any], nbytes: int) -> float | None:
    """Peak resident memory during `run()`, in arrays, counting the input."""
    gc.collect()
    before = _status("VmRSS")
    if before is None or not _reset_peak_rss():
        return None
    jax.block_until_ready(run())
    peak = _status("VmHWM")
    assert peak is not None
    return (peak - before + nbytes) / nbytes


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    print_header("bench_memory", timed=False)
    size = 2_500_000 if args.quick else 25_000_000
    x = jnp.linspace(0.0, 1.0, size, dtype=jnp.float32)
    nbytes = x.nbytes
    print(f"  {STEPS}-step chain over f32[{size}] ({nbytes / 1e6:.0f} MB arrays)")

    probe = PeakProbe()
    walker = probe.transform(chain)
    peak_eager = 0

    def sample() -> None:
        nonlocal peak_eager
        peak_eager = max(peak_eager, live_bytes())

    # Counting live arrays does not depend on timing or on compilation, so
    # these runs also warm up (compile the steps, stage `chain`) for the RSS.
    gc.collect()
    assert live_bytes() == nbytes, "only the input should be alive"
    checksum = jnp.sum(walker(x))  # reduce at once: keep no extra array alive
    peak_walker = probe.peak
    assert checksum == jnp.sum(chain(x, sample)), "the walker's result differs"
    del checksum
    print(f"  eager `chain` itself: peak live arrays {peak_eager / nbytes:.2f}")

    fast = jaxinterp.evaluate(chain)
    assert jnp.sum(fast(x)) == jnp.sum(chain(x)), "evaluate's result differs"
    rss = {
        "eager": peak_rss(lambda: chain(x), nbytes),
        "walker": peak_rss(lambda: walker(x), nbytes),
        "evaluate (fast path)": peak_rss(lambda: fast(x), nbytes),
    }
    for name, arrays in rss.items():
        text = "unavailable" if arrays is None else f"{arrays:.2f} arrays"
        print(f"  {name}: peak resident memory {text}")

    extra = peak_walker - 3 * nbytes
    print(f"  walker: peak live bytes {peak_walker} ({extra:+d} over 3 arrays)")
    report(f"walker peak live arrays, {STEPS}-step chain", peak_walker / nbytes, 3.0)
    bench_every_interval(args.quick)


def zigzag(x: jax.Array) -> jax.Array:
    """Piecewise linear, rising and falling on alternate unit intervals."""
    out = 0.05 * x
    for i in range(16):
        out = out + (-1.0) ** i * jnp.clip(x - i, 0.0, 1.0)
    return out


def bench_every_interval(quick: bool) -> None:
    n = 100_000 if quick else 1_000_000
    y = zigzag(jnp.linspace(-2.0, 18.0, n, dtype=jnp.float32))
    compiled = jax.jit(jaxinterp.inverse(zigzag)).lower(y).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        print("  inverse by intervals: memory analysis unavailable")
        return
    arrays = analysis.temp_size_in_bytes / y.nbytes
    report("inverse by intervals, every interval tried: temporaries", arrays, 16.0)


if __name__ == "__main__":
    main()
