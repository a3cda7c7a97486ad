"""Hypothesis strategies for the interpreter-core property tests.

Values are drawn inside each operation's domain (no overflow to inf in
`exp`, no negative `sqrt`), so that a mismatch means a real difference rather
than two NaNs with different payloads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

FLOAT_DTYPES = [np.dtype("float32"), np.dtype("float16"), jnp.dtype(jnp.bfloat16)]
INT_DTYPES = [np.dtype("int32"), np.dtype("int8"), np.dtype("uint8")]

# Unary float ops that map [-4, 4] into [-4, 4] (up to rounding), so any
# composition stays in range.
FLOAT_UNARY: dict[str, Callable[[Any], Any]] = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "neg": jnp.negative,
    "abs": jnp.abs,
    "logistic": lax.logistic,
    "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x)),
    "exp_clip": lambda x: jnp.exp(jnp.clip(x, -4.0, 1.0)),
    "log1p_abs": lambda x: jnp.log1p(jnp.abs(x)),
    "square_half": lambda x: x * x * 0.25,
    "round": jnp.round,
}
FLOAT_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add_half": lambda x, y: (x + y) * 0.5,
    "mul_clip": lambda x, y: jnp.clip(x * y, -4.0, 4.0),
    "max": jnp.maximum,
    "min": jnp.minimum,
    "sub_half": lambda x, y: (x - y) * 0.5,
    "select": lambda x, y: jnp.where(x > y, x, y * 0.5),
}
INT_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": lambda x: -x,
    "invert": jnp.invert,
    "shift_right": lambda x: x >> 1,
    "and_mask": lambda x: x & 5,
    "mod": lambda x: x % 7,
}
INT_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda x, y: x + y,
    "xor": lambda x, y: x ^ y,
    "max": jnp.maximum,
    "mul": lambda x, y: x * y,
}


# A few shapes, 0-d and empty ones included: each new (shape, dtype) costs XLA
# compilations of every eager op, so a small set keeps the suite fast while the
# programs and values vary. The `dev` profile draws arbitrary shapes.
SHAPES = [(), (0,), (3,), (2, 3), (2, 0, 2)]


def shapes(max_rank: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes, 0-d and empty ones included."""
    if settings.default.max_examples > 100:  # the `dev` profile
        return hnp.array_shapes(
            min_dims=0, max_dims=max_rank, min_side=0, max_side=max_side
        )
    return st.sampled_from([s for s in SHAPES if len(s) <= max_rank])


def float_dtypes() -> st.SearchStrategy[Any]:
    return st.sampled_from(FLOAT_DTYPES)


def int_dtypes() -> st.SearchStrategy[Any]:
    return st.sampled_from(INT_DTYPES)


@st.composite
def arrays(draw: st.DrawFn, dtype: Any, shape: tuple[int, ...]) -> Any:
    """A JAX array of `dtype` and `shape` with values in each op's domain."""
    if jnp.issubdtype(dtype, jnp.floating):
        values = hnp.arrays(
            np.float32,
            shape,
            elements=st.floats(-4.0, 4.0, width=32, allow_subnormal=False),
        )
    else:
        info = np.iinfo(dtype)
        values = hnp.arrays(dtype, shape, elements=st.integers(info.min, info.max))
    return jnp.asarray(draw(values), dtype=dtype)


@st.composite
def programs(
    draw: st.DrawFn, int_valued: bool, max_ops: int = 5
) -> list[tuple[str, str, int]]:
    """A straight-line program: a list of `(kind, op name, operand index)`.

    Each step applies a unary op to the latest value, or a binary op to the
    latest value and an earlier one (by index, modulo the values so far).
    """
    unary, binary = (
        (INT_UNARY, INT_BINARY) if int_valued else (FLOAT_UNARY, FLOAT_BINARY)
    )
    step = st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(sorted(unary)), st.just(0)),
        st.tuples(
            st.just("binary"), st.sampled_from(sorted(binary)), st.integers(0, 10)
        ),
    )
    return draw(st.lists(step, min_size=1, max_size=max_ops))


def build(
    program: list[tuple[str, str, int]], int_valued: bool
) -> Callable[[Any], Any]:
    """The function of one array that runs `program`; returns the last two values."""
    unary, binary = (
        (INT_UNARY, INT_BINARY) if int_valued else (FLOAT_UNARY, FLOAT_BINARY)
    )

    def fn(x: Any) -> Any:
        values = [x]
        for kind, name, operand in program:
            if kind == "unary":
                values.append(unary[name](values[-1]))
            else:
                other = values[operand % len(values)]
                values.append(binary[name](values[-1], other))
        return values[-1], values[len(values) // 2]

    fn.__name__ = "program_" + "_".join(name for _, name, _ in program)
    return fn


@st.composite
def elementwise_cases(draw: st.DrawFn) -> tuple[Callable[[Any], Any], Any]:
    """A random elementwise function and an argument for it."""
    int_valued = draw(st.booleans())
    dtype = draw(int_dtypes() if int_valued else float_dtypes())
    shape = draw(shapes())
    program = draw(programs(int_valued))
    return build(program, int_valued), draw(arrays(dtype, shape))


@st.composite
def batched_cases(draw: st.DrawFn) -> tuple[Callable[[Any], Any], Any]:
    """A random float32 elementwise function and a batch of arguments for it."""
    batch = draw(st.integers(1, 3))
    shape = draw(shapes(max_rank=2, max_side=3))
    program = draw(programs(int_valued=False))
    return build(program, False), draw(arrays(np.dtype("float32"), (batch, *shape)))
