"""The methods the engine tries, in order, when no equation can be inverted
alone.

Each is a function `step(walker, st)` that reads the stuck `SolveState`
`st` and returns what it solved of one region as a `Solved` (which the
engine records with `SolveState.commit`), or `None` when nothing applies.
It says why it left a blocked equation unsolved with `st.refuse(i,
reason)`: kept per method, so the final `NotInvertibleError` lists what
each tried. `walker` runs sub-solves (`walker.solve`, with `methods=` for a
part of this table).
Adding a method is one function and one entry in `METHODS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import _block_method as bm, _gram as gm, _normalized as nz
from ._dataflow import Solved, SolveState, Walker, numerical


@dataclasses.dataclass(frozen=True)
class Method:
    """One entry of the table: a name, its step, and when it may run.

    Attributes:
        name: how sub-solves name it (`without`).
        title: what it tries, as a refusal names it ("tried as <title>").
        step: `step(walker, st) -> Solved | None`.
        numerical: only where numerical solvers are on (`solvers=True`);
            its step imports its module from `_numerical/` when it runs.
        completes: only in a run that may complete discarded elements
            (`complete=True`).
    """

    name: str
    title: str
    step: Callable[[Walker, SolveState], Solved | None]
    numerical: bool = False
    completes: bool = False

    def applies(self, st: SolveState) -> bool:
        """Whether the run's options let this method run."""
        options = st.options
        return (options.solvers or not self.numerical) and (
            options.complete or not self.completes
        )


def _normalized(walker: Any, st: SolveState) -> Solved | None:
    return bm.solved(st, nz.normalized_step(st))


def _sequential(walker: Any, st: SolveState) -> Solved | None:
    return bm.solved(st, numerical("_sequential").sequential_step(st))


def _bottleneck(walker: Any, st: SolveState) -> Solved | None:
    return bm.solved(st, numerical("_bottleneck").bottleneck_step(walker, st))


METHODS: tuple[Method, ...] = (
    # A principal factor of `L @ L.T` first: a block solve of the product,
    # with the factor filled in by a scatter, picks no branch and gives NaN.
    Method("gram", "a Gram product of a triangular factor", gm.gram_step),
    # Elementwise and linear blocks of one unknown (`_block_method.py`).
    Method("block", "an elementwise or linear block", bm.block_step),
    # A value divided by a function of itself.
    Method("normalized", "a normalized block", _normalized),
    # A triangular map of one unknown.
    Method("sequential", "a triangular map", _sequential, numerical=True),
    # A map through one number computed from all of its unknown.
    Method(
        "bottleneck", "a map through a scalar bottleneck", _bottleneck, numerical=True
    ),
    # Last, discarded elements chosen (also with nothing blocked: a
    # `triangular_solve` solved for the triangle of its matrix it reads is
    # done).
    Method(
        "complete",
        "a completion of discarded elements",
        gm.fill_step,
        completes=True,
    ),
)


def without(*names: str) -> tuple[Method, ...]:
    """The table without the methods named."""
    return tuple(m for m in METHODS if m.name not in names)
