"""What each primitive is, by name: one table the analyses query.

An analysis that walks a Jaxpr asks of each equation's primitive what kind
of step it is (elementwise, a move of elements, a copy, a call with a body,
...). Those facts live here, once, and an analysis takes the set of names it
handles as a query on them (`having(MOVE) | having(COPY)`), adding by name
the few primitives it treats on their own.

A trait present is a claim about the primitive; a trait absent is no claim:
a primitive carries a trait only where an analysis relies on it (`exp2` is
increasing, but no analysis asks it to be `INCREASING`). Names are the ones
JAX gives its primitives; some exist only in some JAX versions (`copy_p`,
`custom_vjp_call_jaxpr`), and the call-like primitives are named from
`_jax_compat`, as the installed JAX spells them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _jax_compat as compat

# --- the traits ----------------------------------------------------------

# First-order, element by element on operands of one shape.
ELEMENTWISE = "elementwise"
# `lax`'s n-ary elementwise primitives (`broadcasting_shape_rule`): their
# operands may differ in sizes of 1.
BROADCASTING = "broadcasting"
# Elementwise comparisons in the total order `sort` and `searchsorted` use.
TOTAL_ORDER = "total order"
# Elementwise comparisons: a boolean result.
COMPARE = "compare"
# Elementwise logical operations (bitwise on integers).
LOGIC = "logic"
# Its value is a quotient of polynomials in its operands.
RATIONAL = "rational"
# Elementwise, smooth, and no quotient of polynomials.
NONRATIONAL = "nonrational"
# Elementwise and strictly increasing on its domain.
INCREASING = "increasing"
# Continuous in its operands wherever its result is finite (`select_n`: in
# the values it picks between).
CONTINUOUS = "continuous"
# Its result is positive, whatever its operands.
POSITIVE = "positive"
# Its result is non-negative, whatever its operands.
NONNEGATIVE = "nonnegative"
# Each result element is an element of its one operand, maybe converted: of
# the same sign (or a NaN where the operand is).
KEEPS_SIGN = "keeps sign"
# Given by different smooth pieces in different regions of its operands.
PIECEWISE = "piecewise"
# Piecewise constant: a float result that is a discrete choice of its operand.
STEP = "step"
# Continuous, picking between continuous pieces (a corner where they meet).
KINK = "kink"
# Returns one of its operands or a bound given by the others.
CLAMP = "clamp"
# Converts its operand to another floating format: rounds if it narrows it.
ROUNDING = "rounding"
# Returns its operand's value.
COPY = "copy"
# Moves, replicates or drops elements without arithmetic.
MOVE = "move"
# A move whose result axes are the operand's (sliced, reversed, permuted,
# broadcast or dropped).
ALONG_AXES = "along axes"
# A move that keeps the elements in their row-major order, changing only the
# shape.
RELAYOUT = "relayout"
# Reduces axes of its operand.
REDUCE = "reduce"
# Reads a table at positions computed from an operand's values.
LOOKUP = "lookup"
# Given its other operands, one to one in each (wherever its inverse rule
# solves for that operand).
INVERTIBLE_PER_OPERAND = "invertible per operand"
# Only the lower triangle of its result is meaningful.
LOWER_RESULT = "lower result"
# Its results differ between equations with the same operands (a hidden RNG
# state), although it declares no effects.
STATEFUL = "stateful"
# Call-like: runs a body whose inputs are its operands, one for one.
CALL = "call"
# A `custom_vjp` function: its derivative exists in reverse mode only.
CUSTOM_VJP = "custom vjp"
# Runs one of several bodies, chosen by an operand.
CONDITIONAL = "conditional"
# Runs its body repeatedly, carrying values from one iteration to the next.
LOOP = "loop"

# --- the table -----------------------------------------------------------

_E, _B = ELEMENTWISE, BROADCASTING

_TABLE: dict[str, tuple[str, ...]] = {
    # Elementwise arithmetic.
    "neg": (_E, RATIONAL, CONTINUOUS),
    "add": (_E, _B, RATIONAL, CONTINUOUS, INVERTIBLE_PER_OPERAND),
    "sub": (_E, _B, RATIONAL, CONTINUOUS, INVERTIBLE_PER_OPERAND),
    "mul": (_E, _B, RATIONAL, CONTINUOUS, INVERTIBLE_PER_OPERAND),
    "div": (_E, _B, RATIONAL, CONTINUOUS, INVERTIBLE_PER_OPERAND),
    "add_any": (_E, _B, RATIONAL, INVERTIBLE_PER_OPERAND),
    "square": (_E, RATIONAL, CONTINUOUS, NONNEGATIVE),
    "integer_pow": (_E, RATIONAL, CONTINUOUS),
    "pow": (_E, _B, INVERTIBLE_PER_OPERAND),
    "atan2": (_E, _B, INVERTIBLE_PER_OPERAND),
    "nextafter": (_E, _B),
    "rem": (_E, _B, PIECEWISE),
    "polynomial": (_E,),
    # Elementwise functions of one operand.
    "exp": (_E, NONRATIONAL, INCREASING, CONTINUOUS, POSITIVE),
    "exp2": (_E, CONTINUOUS, POSITIVE),
    "log": (_E, NONRATIONAL, INCREASING, CONTINUOUS),
    "log1p": (_E, NONRATIONAL, INCREASING, CONTINUOUS),
    "expm1": (_E, NONRATIONAL, INCREASING, CONTINUOUS),
    "tanh": (_E, NONRATIONAL, INCREASING, CONTINUOUS),
    "logistic": (_E, NONRATIONAL, INCREASING, CONTINUOUS, POSITIVE),
    "sqrt": (_E, NONRATIONAL, INCREASING, CONTINUOUS, NONNEGATIVE),
    "cbrt": (_E, NONRATIONAL, INCREASING, CONTINUOUS),
    "rsqrt": (_E, NONRATIONAL),
    "sin": (_E, NONRATIONAL, CONTINUOUS),
    "cos": (_E, NONRATIONAL, CONTINUOUS),
    "atan": (_E, NONRATIONAL, CONTINUOUS),
    "tan": (_E,),
    "asin": (_E,),
    "acos": (_E,),
    "sinh": (_E, CONTINUOUS),
    "cosh": (_E, CONTINUOUS, POSITIVE),
    "asinh": (_E, CONTINUOUS),
    "acosh": (_E,),
    "atanh": (_E,),
    "erf": (_E, CONTINUOUS),
    "erfc": (_E,),
    "erf_inv": (_E,),
    "lgamma": (_E,),
    "digamma": (_E,),
    "is_finite": (_E,),
    # Piecewise elementwise maps.
    "abs": (_E, CONTINUOUS, NONNEGATIVE, PIECEWISE, KINK),
    "sign": (_E, PIECEWISE, STEP),
    "floor": (_E, PIECEWISE, STEP),
    "ceil": (_E, PIECEWISE, STEP),
    "round": (_E, PIECEWISE, STEP),
    "max": (_E, _B, CONTINUOUS, PIECEWISE, KINK, CLAMP),
    "min": (_E, _B, CONTINUOUS, PIECEWISE, KINK, CLAMP),
    "clamp": (_E, PIECEWISE, KINK, CLAMP),
    "select_n": (_E, CONTINUOUS, PIECEWISE),
    # Comparisons and logic.
    "eq": (_E, _B, COMPARE),
    "ne": (_E, _B, COMPARE),
    "lt": (_E, _B, COMPARE),
    "le": (_E, _B, COMPARE),
    "gt": (_E, _B, COMPARE),
    "ge": (_E, _B, COMPARE),
    "eq_to": (TOTAL_ORDER,),
    "ne_to": (TOTAL_ORDER,),
    "lt_to": (TOTAL_ORDER,),
    "le_to": (TOTAL_ORDER,),
    "gt_to": (TOTAL_ORDER,),
    "ge_to": (TOTAL_ORDER,),
    "and": (_E, _B, LOGIC),
    "or": (_E, _B, LOGIC),
    "xor": (_E, _B, LOGIC, INVERTIBLE_PER_OPERAND),
    "not": (_E, LOGIC),
    # `lax`'s other n-ary elementwise primitives, known here for their shape
    # rule only.
    "complex": (_B,),
    "shift_left": (_B,),
    "shift_right_logical": (_B,),
    "shift_right_arithmetic": (_B,),
    "igamma": (_B,),
    "igammac": (_B,),
    "igamma_grad_a": (_B,),
    "random_gamma_grad": (_B,),
    "polygamma": (_B,),
    "zeta": (_B,),
    # Copies and conversions.
    "copy": (_E, COPY, CONTINUOUS, KEEPS_SIGN),
    "copy_p": (_E, COPY, CONTINUOUS, KEEPS_SIGN),
    "stop_gradient": (_E, CONTINUOUS, KEEPS_SIGN),
    "optimization_barrier": (_E,),
    "convert_element_type": (_E, ROUNDING, CONTINUOUS, KEEPS_SIGN),
    "reduce_precision": (_E, ROUNDING, CONTINUOUS, KEEPS_SIGN),
    "bitcast_convert_type": (_E,),
    # Moves.
    "broadcast_in_dim": (MOVE, ALONG_AXES, CONTINUOUS, KEEPS_SIGN),
    "squeeze": (MOVE, ALONG_AXES, RELAYOUT, CONTINUOUS, KEEPS_SIGN),
    "slice": (MOVE, ALONG_AXES, CONTINUOUS, KEEPS_SIGN),
    "transpose": (MOVE, ALONG_AXES, CONTINUOUS, KEEPS_SIGN),
    "rev": (MOVE, ALONG_AXES, CONTINUOUS, KEEPS_SIGN),
    "reshape": (MOVE, RELAYOUT, CONTINUOUS, KEEPS_SIGN),
    "expand_dims": (MOVE, RELAYOUT, CONTINUOUS, KEEPS_SIGN),
    "dynamic_slice": (MOVE, CONTINUOUS, KEEPS_SIGN),
    "concatenate": (MOVE, CONTINUOUS),
    "pad": (MOVE, CONTINUOUS),
    "dynamic_update_slice": (MOVE,),
    "split": (MOVE,),
    "gather": (LOOKUP,),
    "SearchSorted": (LOOKUP,),
    # Reductions and linear algebra.
    "reduce_sum": (REDUCE, CONTINUOUS),
    "reduce_max": (REDUCE, CONTINUOUS),
    "reduce_min": (REDUCE, CONTINUOUS),
    "reduce_prod": (REDUCE,),
    "reduce_or": (REDUCE,),
    "reduce_and": (REDUCE,),
    "dot_general": (CONTINUOUS,),
    "cholesky": (LOWER_RESULT,),
    "rng_uniform": (STATEFUL,),
    # A `custom_vjp` function (`custom_vjp_call_jaxpr` in older JAX releases).
    "custom_vjp_call": (CUSTOM_VJP,),
    "custom_vjp_call_jaxpr": (CUSTOM_VJP,),
}

# Control flow, named as the installed JAX names it (`jit` is `pjit` in
# older releases, `remat2` is `checkpoint` from JAX 0.12).
_CONTROL: tuple[tuple[Any, tuple[str, ...]], ...] = (
    (compat.jit_p, (CALL,)),
    (compat.closed_call_p, (CALL,)),
    (compat.core_call_p, (CALL,)),
    (compat.custom_jvp_call_p, (CALL,)),
    (compat.remat_p, (CALL,)),
    (compat.call_hi_primitive_p, (CALL,)),
    (compat.custom_vjp_call_p, (CALL, CUSTOM_VJP)),
    (compat.cond_p, (CONDITIONAL,)),
    (compat.scan_p, (LOOP,)),
    (compat.while_p, (LOOP,)),
)


def _build() -> dict[str, frozenset[str]]:
    table = {name: set(traits) for name, traits in _TABLE.items()}
    for p, traits in _CONTROL:
        if p is not None:
            table.setdefault(p.name, set()).update(traits)
    return {name: frozenset(traits) for name, traits in table.items()}


TRAITS: Mapping[str, frozenset[str]] = _build()


def having(*traits: str) -> frozenset[str]:
    """The names of the primitives with any of `traits`."""
    wanted = set(traits)
    return frozenset(name for name, own in TRAITS.items() if own & wanted)


def has(name: str, trait: str) -> bool:
    """Whether the primitive named `name` has `trait`."""
    return trait in TRAITS.get(name, frozenset())
