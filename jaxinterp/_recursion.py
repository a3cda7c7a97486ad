"""Python's recursion limit, raised while deeply nested Jaxprs are walked.

Walking a Jaxpr nested `n` levels deep costs a few Python frames per level on
top of JAX's own tracing frames. This has nothing to do with JAX versions, so
it lives here rather than in `_jax_compat`.
"""

from __future__ import annotations

import sys
import threading

from . import _jax_compat as compat

# Threads share Python's recursion limit: it is raised while any walk runs and
# restored when the last one ends, so one thread never lowers it under another.
_limit_lock = threading.Lock()
_limit_users = 0
_limit_saved: int | None = None  # the limit to restore, if we raised it
_limit_depth = threading.local()  # per thread: how many blocks are open


# Deep enough for walking and tracing 100+ nested `jit`s: each level adds a few
# walker frames on top of JAX's own tracing frames.
DEEP_RECURSION_LIMIT = 12_000
# Jaxprs nested at most this deep are walked under Python's own limit.
SHALLOW_NESTING = 8


def nesting_depth(jaxpr: compat.Jaxpr) -> int:
    """How deep sub-Jaxprs nest in `jaxpr` (0 for none); iterative, so any depth."""
    deepest = 0
    stack = [(compat.open_jaxpr(jaxpr), 0)]
    seen: set[int] = set()
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        for eqn in current.eqns:
            for sub in compat.sub_jaxprs(eqn, expand=False):
                if id(sub) not in seen:
                    seen.add(id(sub))
                    stack.append((sub, depth + 1))
    return deepest


def recursion_limit(minimum: int) -> _RecursionLimit:
    """Raise Python's recursion limit to at least `minimum` inside the block.

    Walking a jaxpr nested `n` levels deep costs a few Python frames per
    level on top of what JAX itself needs. Safe to use from several threads.
    """
    return _RecursionLimit(minimum)


class _RecursionLimit:
    """The context manager of `recursion_limit`.

    A class rather than a `contextlib.contextmanager` generator: it is entered
    on every call of a transformed function. A thread already inside one
    (a walk nested in a transformed call) only counts the nesting.
    """

    __slots__ = ("minimum",)

    def __init__(self, minimum: int) -> None:
        self.minimum = minimum

    def __enter__(self) -> None:
        global _limit_users, _limit_saved
        depth = getattr(_limit_depth, "value", 0)
        _limit_depth.value = depth + 1
        if depth and sys.getrecursionlimit() >= self.minimum:
            return
        with _limit_lock:
            if not depth:  # threads are counted once, by their outermost block
                _limit_users += 1
            current = sys.getrecursionlimit()
            if current < self.minimum:
                if _limit_saved is None:
                    _limit_saved = current
                sys.setrecursionlimit(self.minimum)

    def __exit__(self, *exc_info: object) -> None:
        global _limit_users, _limit_saved
        depth = _limit_depth.value - 1
        _limit_depth.value = depth
        if depth:
            return
        with _limit_lock:
            _limit_users -= 1
            if _limit_users == 0 and _limit_saved is not None:
                sys.setrecursionlimit(_limit_saved)
                _limit_saved = None
