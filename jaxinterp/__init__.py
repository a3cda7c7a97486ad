"""jaxinterp: write JAX function transformations as Jaxpr interpreters."""

import importlib.metadata as _metadata

from . import (
    _higher_order as _higher_order,  # registers the built-in handlers
    _state as _state,  # installs the pass that removes references
)
from ._backward import BackwardWalker as BackwardWalker
from ._caches import clear_caches as clear_caches
from ._deprecated import (  # deprecated in 0.2.0, removed in 0.3.0
    eval_jaxpr as eval_jaxpr,
    register_binary as register_binary,
    register_elementwise as register_elementwise,
)
from ._env import Env as Env
from ._errors import (
    CustomValueError as CustomValueError,
    JaxinterpError as JaxinterpError,
    MissingRuleError as MissingRuleError,
    NotInvertibleError as NotInvertibleError,
    RuleError as RuleError,
    StagingError as StagingError,
)
from ._eval._api import (
    EvalInterpreter as EvalInterpreter,
    eval_closed_jaxpr as eval_closed_jaxpr,
    evaluate as evaluate,
)
from ._eval._rules import eval_rules as eval_rules
from ._interpreter import (
    Handler as Handler,
    Interpreter as Interpreter,
    higher_order_primitives as higher_order_primitives,
)
from ._inverse import _control_flow as _control_flow  # registers the rules
from ._inverse._api import (
    ildj as ildj,
    inverse as inverse,
    inverse_and_ildj as inverse_and_ildj,
)
from ._inverse._custom import custom_inverse as custom_inverse
from ._inverse._explain import explain_inverse as explain_inverse
from ._inverse._rules import (
    InverseContext as InverseContext,
    InverseRuleRegistry as InverseRuleRegistry,
    Piece as Piece,
    PieceResult as PieceResult,
    inverse_rules as inverse_rules,
    register_binary_inverse as register_binary_inverse,
    register_elementwise_inverse as register_elementwise_inverse,
)
from ._jax_compat import (
    SUPPORTED_JAX as SUPPORTED_JAX,
    UnsupportedJaxWarning as UnsupportedJaxWarning,
    cond_branches as cond_branches,
    hijax_params as hijax_params,
    iter_eqns as iter_eqns,
    jit_params as jit_params,
    scan_params as scan_params,
    sub_jaxprs as sub_jaxprs,
    while_params as while_params,
)
from ._registry import RuleRegistry as RuleRegistry
from ._trace import Staged as Staged, stage as stage

# The version is pyproject.toml's, read from the installed package's metadata;
# a source tree that was never installed has none.
try:
    __version__ = _metadata.version("jaxinterp")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
