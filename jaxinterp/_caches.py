"""The caches jaxinterp keeps, cleared together by `jaxinterp.clear_caches()`.

`Cache` is the one cache utility: bounded, thread-safe, holding its keys
weakly where entries must die with their key (a Jaxpr, a function). A module
cache registers itself here when created; interpreters register themselves
for their per-instance caches (rebuilt `jit`s, traced bodies, eager plans).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

_clearers: list[Callable[[], None]] = []
_interpreters: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


class Cache:
    """A bounded, thread-safe map: jaxinterp's one cache utility.

    With `weak=False` it is an LRU: reading an entry refreshes it and the
    least recently used entry goes first. With `weak=True` keys are held
    weakly, so an entry dies with its key (a Jaxpr, a function), and the
    oldest entry goes first when the cache is full; keys must then be weakly
    referenceable (`TypeError` otherwise).

    Args:
        maxsize: the most entries kept.
        weak: hold keys weakly.
        register: clear it on `clear_caches()`. Per-interpreter caches pass
            `False`: `Interpreter.clear_cache()` clears them.
    """

    __slots__ = ("_data", "_lock", "maxsize", "weak")

    def __init__(self, maxsize: int, *, weak: bool = False, register: bool = True):
        self.maxsize = maxsize
        self.weak = weak
        self._data: Any = weakref.WeakKeyDictionary() if weak else OrderedDict()
        self._lock = threading.Lock()
        if register:
            on_clear(self.clear)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for `key`, or `default`."""
        # Lock-free: each dict call is atomic; an entry another thread evicts
        # between the two calls is still returned, just not refreshed.
        value = self._data.get(key, default)
        if not self.weak and value is not default:
            try:
                self._data.move_to_end(key)
            except KeyError:
                pass
        return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Enter `value` under `key`, evicting the oldest entries if full;
        return `value`."""
        with self._lock:
            data = self._data
            data[key] = value
            if not self.weak:
                data.move_to_end(key)
            while len(data) > self.maxsize:
                if self.weak:
                    del data[next(iter(data.keys()))]
                else:
                    data.popitem(last=False)
        return value

    def pop(self, key: Hashable) -> None:
        """Forget `key`'s entry, if any."""
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._data
        except TypeError:  # a weak cache asked about an unreferenceable key
            return False


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
