"""The primitive-trait table (`_inverse/_traits.py`) against the sets of
primitive names the analyses define: each is a query on the table."""

from __future__ import annotations

import pytest

from jaxinterp._inverse import (
    _blocks,
    _bottleneck,
    _branches,
    _cholesky,
    _elementwise_steps,
    _enclose,
    _fractional,
    _gram,
    _implicit,
    _intervals,
    _normalized,
    _perelement,
    _projective,
    _scattered,
    _sequential,
    _traits as t,
    _turning,
    _value_numbers,
)

h = t.having

QUERIES = {
    "ew._ELEMENTWISE": (_elementwise_steps._ELEMENTWISE, h(t.ELEMENTWISE)),
    "ew._CALLS": (_elementwise_steps._CALLS, h(t.CALL) - h(t.CUSTOM_VJP)),
    "ew._NO_FORWARD_MODE": (_elementwise_steps._NO_FORWARD_MODE, h(t.CUSTOM_VJP)),
    "blocks._CORNERS": (_blocks._CORNERS, h(t.PIECEWISE)),
    "sequential._PIECEWISE": (_sequential._PIECEWISE, h(t.PIECEWISE)),
    "bottleneck._CONTINUOUS": (
        _bottleneck._CONTINUOUS,
        h(t.CONTINUOUS, t.COMPARE) | {"is_finite", "not", "and", "or"},
    ),
    "bottleneck._POSITIVE": (_bottleneck._POSITIVE, h(t.POSITIVE)),
    "bottleneck._NONNEGATIVE": (_bottleneck._NONNEGATIVE, h(t.NONNEGATIVE)),
    "bottleneck._KEEP_SIGN": (_bottleneck._KEEP_SIGN, h(t.KEEPS_SIGN)),
    "branches.ROUNDING": (_branches.ROUNDING, h(t.ROUNDING)),
    "branches.VALUE_PRESERVING": (
        _branches.VALUE_PRESERVING,
        h(t.MOVE, t.ROUNDING)
        | {"copy", "stop_gradient", "optimization_barrier", "device_put"}
        | {"select_n", "gather", "scatter"},
    ),
    "branches.CLAMPS": (_branches.CLAMPS, h(t.CLAMP)),
    "branches.KNOWN_OPERAND_SAFE": (
        _branches.KNOWN_OPERAND_SAFE,
        h(t.INVERTIBLE_PER_OPERAND),
    ),
    "branches.BRANCH_AWARE": (_branches.BRANCH_AWARE, h(t.CALL, t.CONDITIONAL)),
    "branches.LOOPS": (_branches.LOOPS, h(t.LOOP)),
    "cholesky.READS_LOWER": (_cholesky.READS_LOWER, h(t.LOWER_RESULT)),
    "enclose._SAME": (
        _enclose._SAME,
        h(t.COPY) | {"reduce_precision", "stop_gradient"},
    ),
    "fractional._PASS": (_fractional._PASS, h(t.COPY, t.ROUNDING)),
    "gram._SAME": (
        _gram._SAME,
        h(t.COPY) | {"convert_element_type", "transpose", "squeeze"},
    ),
    "gram._MOVES": (
        _gram._MOVES,
        h(t.ALONG_AXES, t.RELAYOUT) | {"concatenate", "pad"},
    ),
    "gram._COPIES": (
        _gram._COPIES,
        h(t.COPY, t.ROUNDING) | {"optimization_barrier"},
    ),
    "implicit._NARY": (_implicit._NARY, h(t.BROADCASTING)),
    "intervals._ARITHMETIC": (
        _intervals._ARITHMETIC,
        h(t.RATIONAL, t.COPY) | {"convert_element_type", "stop_gradient"},
    ),
    "intervals._PICKS": (_intervals._PICKS, h(t.KINK) | {"select_n"}),
    "intervals._COMPARE": (_intervals._COMPARE, h(t.COMPARE)),
    "intervals._LOGIC": (_intervals._LOGIC, h(t.LOGIC)),
    "intervals._OTHER": (_intervals._OTHER, h(t.NONRATIONAL)),
    "intervals._CHAIN": (
        _intervals._CHAIN,
        h(t.RATIONAL, t.COPY, t.KINK, t.INCREASING)
        | {"convert_element_type", "stop_gradient", "broadcast_in_dim"},
    ),
    "intervals._SHAPE": (_intervals._SHAPE, h(t.ALONG_AXES)),
    "intervals._REDUCE": (_intervals._REDUCE, h(t.REDUCE) - {"reduce_prod"}),
    "normalized._ELEMENTWISE": (
        _normalized._ELEMENTWISE,
        h(t.ELEMENTWISE) - {"select_n"},
    ),
    "perelement._ELEMENTWISE": (
        _perelement._ELEMENTWISE,
        h(t.ELEMENTWISE, t.TOTAL_ORDER),
    ),
    "perelement._REDUCE": (_perelement._REDUCE, h(t.REDUCE)),
    "perelement._SHAPE": (
        _perelement._SHAPE,
        h(t.ALONG_AXES) | {"reshape", "concatenate"},
    ),
    "perelement._LOOKUPS": (_perelement._LOOKUPS, h(t.LOOKUP)),
    "projective._CUTS": (
        _projective._CUTS,
        h(t.REDUCE) - {"reduce_or", "reduce_and"},
    ),
    "scattered._RELAYOUTS": (_scattered._RELAYOUTS, h(t.RELAYOUT)),
    "turning._STEPS": (_turning._STEPS, h(t.STEP)),
    "turning._KINKS": (_turning._KINKS, h(t.KINK)),
    "value_numbers._STATEFUL": (_value_numbers._STATEFUL, h(t.STATEFUL)),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_equals_the_module_set(name):
    old, query = QUERIES[name]
    assert query == old, (sorted(query - old), sorted(old - query))
