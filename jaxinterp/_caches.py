"""The caches jaxinterp keeps, cleared together by `jaxinterp.clear_caches()`.

Each module that caches registers how to clear its cache here, next to the
cache itself; interpreters register themselves for their per-instance caches
(rebuilt `jit`s, traced bodies, eager plans).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

_clearers: list[Callable[[], None]] = []
_interpreters: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def on_clear(clear: Callable[[], None]) -> Callable[[], None]:
    """Register `clear` to run on `clear_caches()`; return it."""
    with _lock:
        _clearers.append(clear)
    return clear


def track_interpreter(interp: Any) -> None:
    """Remember `interp` (weakly), whose `clear_cache()` runs on `clear_caches()`."""
    with _lock:
        _interpreters.add(interp)


def clear_caches() -> None:
    """Forget everything jaxinterp has cached.

    That is: staged signatures (`jaxinterp.stage`), release and eager plans,
    every live interpreter's rebuilt `jit`s and traced bodies, and compiled
    inverses. Later calls stage and compile again. JAX's own caches are kept
    (`jax.clear_caches()` clears those).

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxinterp
        >>> f = lambda x: jnp.sin(x) * 2.0
        >>> _ = jaxinterp.stage(f, 1.0)
        >>> jaxinterp.clear_caches()
        >>> jaxinterp._trace.cache_size(f)
        0
    """
    with _lock:
        clearers = list(_clearers)
        interpreters = list(_interpreters)
    for clear in clearers:
        clear()
    for interp in interpreters:
        interp.clear_cache()
