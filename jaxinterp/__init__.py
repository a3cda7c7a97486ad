"""jaxinterp: write JAX function transformations as Jaxpr interpreters."""

from . import _higher_order as _higher_order  # registers the built-in handlers
from ._errors import (
    JaxinterpError as JaxinterpError,
    MissingRuleError as MissingRuleError,
    NotInvertibleError as NotInvertibleError,
    RuleError as RuleError,
    StagingError as StagingError,
)
from ._eval._api import (
    EvalInterpreter as EvalInterpreter,
    eval_jaxpr as eval_jaxpr,
    evaluate as evaluate,
)
from ._eval._rules import eval_rules as eval_rules
from ._interpreter import (
    BackwardWalker as BackwardWalker,
    Env as Env,
    Interpreter as Interpreter,
    higher_order_primitives as higher_order_primitives,
)
from ._registry import RuleRegistry as RuleRegistry
from ._trace import Staged as Staged, stage as stage

__version__ = "0.1.0"
