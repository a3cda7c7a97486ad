"""The inverse rule of `fft` (all four types), and its log-det-Jacobians.

`lax.fft` computes, over its last `len(fft_lengths)` axes (`N` elements per
batch element, the product of `fft_lengths`), one of:

- `FFT`: the unnormalized discrete Fourier transform `F`, complex to complex.
  Inverse: `IFFT` (which divides by `N`). As a map of `2N` real coordinates
  `|det F|` is `N^N` (`F^H F = N I`), so the ildj is `-N log N` per batch
  element.
- `IFFT`: `F^{-1}`: inverse `FFT`, ildj `+N log N` per batch element.
- `RFFT`: real to complex, keeping the `n // 2 + 1` non-negative frequencies of
  the last axis (`n = fft_lengths[-1]`). It is injective but not square (`N`
  real unknowns, `2 N (n // 2 + 1) / n` real results): the
  results hold `x` redundantly. Inverse: `IRFFT` with the length, checked: a
  `y` off the image (an imaginary part at a self-conjugate frequency, or
  frequencies that are not each other's conjugates) gives NaN. The ildj
  follows the convention for non-square maps, `-0.5 log det(J^T J)`; here
  `J^T J = M (I_M kron G_n)` with `M = N / n` (the complex FFT over the other
  axes scales norms by `M`) and `G_n` the Gram matrix of the one-axis real FFT,
  `(n I + c_0 c_0^T + c_{n/2} c_{n/2}^T) / 2` (`c_k` the cosine at frequency
  `k`; the second term only for even `n`), so its eigenvalues are `n / 2`
  and `n` (once, or twice for even `n`).
- `IRFFT`: complex to real; it discards the imaginary part of the
  self-conjugate frequencies (and, along the other axes, all but the
  Hermitian part), so it is not injective and is refused alone. In a linear
  block (`_blocks.py`) whose other steps fix what it discards (an `rfft`
  result passed through), the block is solved as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax

from .._errors import NotInvertibleError
from . import _rounding as rd
from ._rules import InverseContext, inverse_rules

FFT, IFFT, RFFT, IRFFT = 0, 1, 2, 3


def _type(fft_type: Any) -> int:
    """The FFT type as an int (`lax.FftType` is an `IntEnum`)."""
    return int(getattr(fft_type, "value", fft_type))


def rfft_gram_logdet(n: int) -> float:
    """`log det(G_n)`: the Gram matrix of the real FFT of length `n` (as a map
    of `n` reals to the real and imaginary parts of `n // 2 + 1` terms)."""
    if n % 2 == 0:
        return (n - 2) * math.log(n / 2) + 2 * math.log(n)
    return (n - 1) * math.log(n / 2) + math.log(n)


def fft_ildj(fft_type: Any, fft_lengths: Sequence[int], size: int) -> float:
    """The ildj of `fft` of one type on an operand of `size` elements (real
    or complex), as a number (it does not depend on the values). `IRFFT`
    has none (it is not injective): NaN."""
    kind = _type(fft_type)
    lengths = tuple(int(d) for d in fft_lengths)
    total = math.prod(lengths)
    if total == 0:
        return 0.0
    batch = size // total if kind in (FFT, IFFT, RFFT) else 0
    if kind == FFT:
        return -batch * total * math.log(total)
    if kind == IFFT:
        return batch * total * math.log(total)
    if kind == RFFT:
        n = lengths[-1]
        m = total // n
        logdet = total * math.log(m) + m * rfft_gram_logdet(n)
        return -0.5 * batch * logdet
    return math.nan


def _rfft_residual_ok(x: Any, y: Any, fft_lengths: Sequence[int]) -> Any:
    """Per batch element, whether `rfft(x)` is `y` within rounding."""
    axes = tuple(range(jnp.ndim(y) - len(fft_lengths), jnp.ndim(y)))
    back = lax.fft(x, lax.FftType.RFFT, tuple(fft_lengths))
    scale = jnp.max(jnp.abs(y), axis=axes, keepdims=True)
    ulps = 8 * max(math.prod(fft_lengths), 1)
    return jnp.all(rd.close(back, y, scale, ulps), axis=axes, keepdims=True)


@inverse_rules.register(lax.fft_p)
def _fft_inverse(
    ctx: InverseContext,
    outvals: Sequence[Any],
    x: Any,
    *,
    fft_type: Any,
    fft_lengths: Sequence[int],
    **params: Any,
) -> Any:
    """`fft` inverted by the transform of the opposite direction (`RFFT` by
    `IRFFT` with the length, checked: NaN off its image); `IRFFT` refused."""
    if x is not None:
        return None
    (y,) = outvals
    kind = _type(fft_type)
    lengths = tuple(int(d) for d in fft_lengths)
    if kind == IRFFT:
        raise NotInvertibleError(
            "`fft` of type IRFFT is not invertible: it discards the imaginary "
            "part of the self-conjugate frequencies of its operand"
        )
    aval = ctx.operand_aval(0)
    if kind == FFT:
        solved = lax.fft(y, lax.FftType.IFFT, lengths)
    elif kind == IFFT:
        solved = lax.fft(y, lax.FftType.FFT, lengths)
    else:
        solved = lax.fft(y, lax.FftType.IRFFT, lengths)
        ok = _rfft_residual_ok(solved, y, lengths)
        solved = jnp.where(ok, solved, jnp.nan)
    if aval is not None:
        solved = lax.convert_element_type(solved, aval.dtype)
    ildj: Any = 0.0
    if ctx.want_ildj:
        size = math.prod(jnp.shape(solved))
        dtype = jnp.finfo(jnp.result_type(solved)).dtype
        ildj = jnp.asarray(fft_ildj(kind, lengths, size), dtype)
    return [solved], ildj
