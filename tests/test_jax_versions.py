"""What moves between JAX releases is read in one place, and covered.

The coverage test traces a corpus using every higher-order construct on the
installed JAX, and fails, naming the primitive and the param, when a
primitive carries sub-Jaxprs that no handler enters, or a param that
`_jax_compat.HIGHER_ORDER_PARAMS` does not account for. The next rename in a
JAX release fails here, not in a user's program.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PrimitiveLog,
    assert_program_result,
    assert_tree_equal,
    flags_off,
    iter_eqns,
    tree_allclose,
)
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import mlir
from jax.sharding import PartitionSpec

import jaxinterp
from jaxinterp import _jax_compat as compat

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxinterp"


# ---------------------------------------------------------------------------
# One accessor per concept.


def test_no_equation_params_indexed_outside_the_compat_module():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_jax_compat.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if "eqn.params[" in line or re.search(r"\bparams\[\"(num_|ft_)", line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "read params through `_jax_compat`:\n" + "\n".join(offenders)


def test_no_private_jax_outside_the_compat_module():
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_jax_compat.py" and "jax._src" in path.read_text()
    ]
    assert not offenders


def test_pyproject_declares_the_supported_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def version(text: str) -> tuple[int, ...]:
        parts = tuple(int(p) for p in text.split("."))
        return parts + (0,) * (3 - len(parts))

    for dep in ("jax", "jaxlib"):
        (spec,) = [d for d in project["dependencies"] if re.match(rf"{dep}\b", d)]
        match = re.fullmatch(rf"{dep}>=([\d.]+),<([\d.]+)", spec)
        assert match, spec
        declared = (version(match[1]), version(match[2]))
        assert declared == jaxinterp.SUPPORTED_JAX, spec


def test_the_installed_jax_is_supported():
    assert compat.unsupported_jax_message() is None, compat.unsupported_jax_message()


@pytest.mark.parametrize("version", [(0, 6, 2), (0, 13, 0), (1, 0, 0)])
def test_an_unsupported_jax_warns_once_naming_the_range(monkeypatch, version):
    monkeypatch.setattr(compat, "_warned_version", False)
    with pytest.warns(jaxinterp.UnsupportedJaxWarning) as record:
        assert compat.warn_if_unsupported(version)
        assert not compat.warn_if_unsupported(version)  # once per process
    assert len(record) == 1
    message = str(record[0].message)
    assert "JAX >= 0.7.0, < 0.13.0" in message
    assert f"JAX {'.'.join(map(str, version))} is installed" in message


@pytest.mark.parametrize("version", [(0, 7, 0), (0, 10, 2), (0, 12, 0)])
def test_a_supported_jax_does_not_warn(monkeypatch, version):
    monkeypatch.setattr(compat, "_warned_version", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not compat.warn_if_unsupported(version)


# ---------------------------------------------------------------------------
# The corpus of higher-order constructs.


@jax.custom_jvp
def _soft_clip(x):
    return jnp.tanh(x) * 2.0


_soft_clip.defjvp(lambda p, t: (_soft_clip(p[0]), (1 - jnp.tanh(p[0]) ** 2) * 2 * t[0]))


@jax.custom_vjp
def _scaled_grad(x):
    return jnp.sin(x)


_scaled_grad.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (0.5 * jnp.cos(x) * g,))


def _mesh() -> Any:
    return jax.make_mesh((1,), ("i",))


def _closed_call(x):
    inner = jax.make_jaxpr(lambda t: jnp.exp(t) - 1.0)(x)
    # Bound as a staged equation is (`get_bind_params` differs by release).
    (out,) = compat.bind_eqn(compat.closed_call_p, [x], {"call_jaxpr": inner})
    return out * 2.0


def _callbacks(x):
    jax.debug.print("x[0] = {}", x[0])
    jax.debug.callback(lambda v: None, x)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    doubled = jax.pure_callback(lambda v: np.asarray(v) * 2, spec, x)
    return doubled + 1.0


CORPUS: dict[str, Callable[[Any], Any]] = {
    "jit": lambda x: jax.jit(lambda t: jnp.sin(t) * 2)(x),
    "cond": lambda x: lax.cond(x[0] > 0, jnp.sin, jnp.cos, x),
    "switch": lambda x: lax.switch(
        jnp.int32(x[0] > 0) + 1, [jnp.sin, jnp.cos, jnp.tanh], x
    ),
    "scan": lambda x: lax.scan(lambda c, t: (c + t, t * c), 0.0, x),
    "scan_forwarded": lambda x: lax.scan(lambda c, t: (c * t, t), 1.0, x, reverse=True),
    "scan_consts": lambda x: lax.scan(lambda c, t: (c * x[0] + t, c), 0.0, x)[1],
    "fori_static": lambda x: lax.fori_loop(0, 3, lambda i, t: t * 1.5 + i, x),
    "fori_dynamic": lambda x: lax.fori_loop(
        0, jnp.int32(x[1] > 0) + 2, lambda i, t: t * 1.5, x
    ),
    "while": lambda x: lax.while_loop(lambda t: t[0] < 5.0, lambda t: t + 1.0, x),
    "checkpoint": lambda x: jax.checkpoint(lambda t: jnp.sin(jnp.sin(t)))(x),
    "remat_policy": lambda x: jax.checkpoint(
        lambda t: jnp.sin(t @ jnp.ones((4, 4))),
        policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    )(x),
    "custom_jvp": lambda x: _soft_clip(x) + jax.nn.relu(x),
    "custom_vjp": lambda x: _scaled_grad(x),
    "closed_call": _closed_call,
    "shard_map": lambda x: jax.shard_map(
        lambda t: t * 2.0,
        mesh=_mesh(),
        in_specs=PartitionSpec(),
        out_specs=PartitionSpec(),
    )(x),
    "pmap": lambda x: jax.pmap(lambda t: jnp.sin(t) + 1.0)(x.reshape(1, -1)),
    "callbacks": _callbacks,
    "linear_solve": lambda x: jnp.linalg.solve(jnp.eye(4) * 2.0 + 0.1, x),
    "nested": lambda x: jax.jit(
        lambda t: lax.scan(
            lambda c, a: (lax.cond(a > 0, jnp.sin, jnp.cos, c), a), t[0], t
        )
    )(x),
}
X = jnp.array([0.5, -1.25, 2.0, 0.75], jnp.float32)


def _sub_jaxpr_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of `jaxpr` and its sub-Jaxprs that carries a sub-Jaxpr."""
    for eqn in iter_eqns(jaxpr):
        if any(True for _ in compat.jaxprs_in_params(eqn.params)):
            yield eqn


READERS: dict[str, Callable[[Any], Any]] = {
    "jit": compat.jit_params,
    "cond": compat.cond_branches,
    "scan": compat.scan_params,
    "while": compat.while_params,
    "checkpoint": compat.remat_params,
    "remat2": compat.remat_params,
    "custom_jvp_call": compat.call_jaxpr,
    "custom_vjp_call": compat.call_jaxpr,
    "closed_call": compat.call_jaxpr,
    "core_call": compat.call_jaxpr,
    "eval_jaxpr": compat.call_jaxpr,
    "custom_linear_solve": compat.linear_solve_params,
    "shard_map": compat.shard_map_params,
    "xla_pmap": compat.pmap_params,
}


def coverage_problems(eqn: Any) -> list[str]:
    """What jaxinterp does not cover about one equation, as sentences."""
    name = eqn.primitive.name
    if name in compat.FIRST_ORDER_WITH_JAXPRS or name in compat.REBOUND_HIGHER_ORDER:
        return []
    coverage = compat.HIGHER_ORDER_PARAMS.get(name)
    if coverage is None:
        return [f"higher-order primitive `{name}` has no entry in HIGHER_ORDER_PARAMS"]
    problems = []
    if eqn.primitive not in jaxinterp.higher_order_primitives():
        problems.append(f"higher-order primitive `{name}` has no walker handler")
    for param in sorted(set(eqn.params) - coverage.read - coverage.passed_over):
        problems.append(f"`{name}` has a param `{param}` jaxinterp does not know")
    try:
        READERS[name](eqn)
    except Exception as err:  # noqa: BLE001 - reported with the primitive
        problems.append(
            f"reading `{name}`'s params failed: {type(err).__name__}: {err}"
        )
    return problems


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_higher_order_primitive_and_param_is_covered(name):
    closed = jax.make_jaxpr(CORPUS[name])(X)
    problems = [p for eqn in _sub_jaxpr_eqns(closed) for p in coverage_problems(eqn)]
    assert not problems, "\n".join(problems)


def _classic_jaxpr(fn):
    """`fn`'s Jaxpr with JAX's hijax flags off: these tests are about the
    params of the classic constructs (test_hijax.py covers the hijax ones)."""
    return flags_off(jax.make_jaxpr(fn), X)


def test_the_corpus_reaches_every_construct():
    names = {
        eqn.primitive.name
        for fn in CORPUS.values()
        for eqn in _sub_jaxpr_eqns(_classic_jaxpr(fn))
    }
    expected = {"jit", "cond", "scan", "while", "custom_jvp_call", "custom_vjp_call"}
    expected |= {"custom_linear_solve", compat.closed_call_p.name}
    expected.add("remat2" if "remat2" in names else "checkpoint")
    expected.add("shard_map" if compat.JAX_VERSION >= (0, 10) else "xla_pmap")
    assert expected <= names, expected - names


def test_a_new_param_is_reported_with_its_primitive():
    (eqn,) = _classic_jaxpr(CORPUS["scan"]).jaxpr.eqns
    renamed = eqn.replace(params={**eqn.params, "num_carry_v2": 1})
    assert "`scan` has a param `num_carry_v2` jaxinterp does not know" in (
        coverage_problems(renamed)
    )


def test_a_higher_order_primitive_without_a_table_entry_is_reported():
    (eqn,) = jax.make_jaxpr(CORPUS["jit"])(X).jaxpr.eqns
    other = eqn.replace(primitive=jex_core.Primitive("jit_v2"))
    assert coverage_problems(other) == [
        "higher-order primitive `jit_v2` has no entry in HIGHER_ORDER_PARAMS"
    ]


class _Names(jaxinterp.EvalInterpreter):
    """Records the name of every equation it walks, nested ones included."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.names: list[str] = []

    def process_eqn(self, eqn, invals):
        self.names.append(eqn.primitive.name)
        return super().process_eqn(eqn, invals)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_construct_evaluates_as_the_function(name):
    fn = CORPUS[name]
    assert_program_result(jaxinterp.evaluate(fn)(X), fn, X)
    tree_allclose(jax.jit(jaxinterp.evaluate(fn))(X), flags_off(jax.jit(fn), X))


@pytest.mark.parametrize(
    "name", ["scan", "scan_forwarded", "while", "checkpoint", "custom_jvp", "nested"]
)
def test_every_construct_differentiates_as_the_function(name):
    fn = CORPUS[name]
    if name == "while":  # reverse mode does not go through `while`
        expected = flags_off(
            jax.jacfwd(lambda x: sum(map(jnp.sum, jax.tree.leaves(fn(x))))), X
        )
        got = jax.jacfwd(
            lambda x: sum(map(jnp.sum, jax.tree.leaves(jaxinterp.evaluate(fn)(x))))
        )(X)
    else:
        expected = flags_off(
            jax.grad(lambda x: sum(map(jnp.sum, jax.tree.leaves(fn(x))))), X
        )
        got = jax.grad(
            lambda x: sum(map(jnp.sum, jax.tree.leaves(jaxinterp.evaluate(fn)(x))))
        )(X)
    tree_allclose(got, expected)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_subclass_sees_every_nested_equation(name):
    fn = CORPUS[name]
    closed = jax.make_jaxpr(fn)(X)
    walker = _Names()
    jax.make_jaxpr(walker.transform(fn))(X)  # traced: every branch once
    reference = [
        eqn.primitive.name
        for eqn in iter_eqns(closed)
        if eqn.primitive.name not in compat.REBOUND_HIGHER_ORDER
    ]
    rebound = [
        e for e in iter_eqns(closed) if e.primitive.name in compat.REBOUND_HIGHER_ORDER
    ]
    if rebound:  # a re-bound construct's body is not walked
        assert sorted(set(walker.names)) == sorted(
            {e.primitive.name for e in closed.jaxpr.eqns}
        )
        return
    assert sorted(walker.names) == sorted(reference)


# ---------------------------------------------------------------------------
# `custom_linear_solve` (what `jnp.linalg.solve` stages).


def test_linear_solve_is_walked_inside_and_keeps_its_derivative():
    fn = CORPUS["linear_solve"]
    walker = _Names()
    assert_tree_equal(walker.transform(fn)(X), fn(X))
    assert "lu" in walker.names  # inside the `solve` Jaxpr
    grad = lambda f: jax.grad(lambda x: jnp.sum(f(x) ** 2))(X)  # noqa: E731
    tree_allclose(grad(jaxinterp.evaluate(fn)), grad(fn))
    staged = jax.make_jaxpr(jaxinterp.evaluate(fn))(X)
    assert "custom_linear_solve" in [e.primitive.name for e in iter_eqns(staged)]


def test_linear_solve_inline_drops_the_construct():
    fn = CORPUS["linear_solve"]
    walker = jaxinterp.EvalInterpreter(policies={"custom_linear_solve": "inline"})
    tree_allclose(walker.transform(fn)(X), fn(X))
    staged = jax.make_jaxpr(walker.transform(fn))(X)
    assert "custom_linear_solve" not in [e.primitive.name for e in iter_eqns(staged)]


# ---------------------------------------------------------------------------
# An unknown higher-order primitive is refused, not silently re-bound.


my_call_p = jex_core.Primitive("my_call")
my_call_p.multiple_results = True


@my_call_p.def_impl
def _my_call_impl(*args, body):
    return jax.core.eval_jaxpr(body.jaxpr, body.consts, *args)


my_call_p.def_abstract_eval(lambda *avals, body: [v.aval for v in body.jaxpr.outvars])
mlir.register_lowering(my_call_p, mlir.lower_fun(_my_call_impl, multiple_results=True))


def _uses_my_call(x):
    body = jax.make_jaxpr(jnp.sin)(x)
    (out,) = my_call_p.bind(x, body=body)
    return out + 1.0


class _Counting(jaxinterp.EvalInterpreter):
    """Overrides `process_eqn`: it must see every body it walks."""

    def process_eqn(self, eqn, invals):
        return super().process_eqn(eqn, invals)


_cos_for_sin = jaxinterp.RuleRegistry("substitute")
_cos_for_sin.register(lax.sin_p, lambda x, **_: [jnp.cos(x)])


class _Substitute(jaxinterp.EvalInterpreter):
    rules = _cos_for_sin


@pytest.mark.parametrize("make", [_Counting, _Substitute], ids=["process_eqn", "rules"])
def test_an_unknown_higher_order_primitive_raises_missing_rule_error(make):
    line = _uses_my_call.__code__.co_firstlineno + 2
    with pytest.raises(jaxinterp.MissingRuleError) as info:
        make().transform(_uses_my_call)(X)
    message = str(info.value)
    assert "cannot reach inside higher-order primitive `my_call`" in message
    assert f"test_jax_versions.py:{line}" in message
    assert "policies={'my_call': 'opaque'}" in message


def test_an_unknown_higher_order_primitive_is_re_bound_by_the_identity():
    # `evaluate` changes nothing, so re-binding is exact.
    assert_tree_equal(jaxinterp.evaluate(_uses_my_call)(X), _uses_my_call(X))
    assert_tree_equal(
        jax.jit(jaxinterp.evaluate(_uses_my_call))(X), jax.jit(_uses_my_call)(X)
    )


def test_an_unknown_higher_order_primitive_can_be_re_bound_opaquely():
    walker = _Counting(policies={"my_call": "opaque"})
    assert_tree_equal(walker.transform(_uses_my_call)(X), _uses_my_call(X))
    opaque = _Counting(higher_order="opaque")
    assert_tree_equal(opaque.transform(_uses_my_call)(X), _uses_my_call(X))


def test_first_order_primitives_with_a_combiner_jaxpr_are_re_bound():
    def fn(x):
        scattered = x.at[jnp.array([1, 3])].add(1.0)
        product = lax.reduce(x, jnp.float32(1), lambda a, b: a * b + 0.5, (0,))
        return scattered, product

    assert_tree_equal(jaxinterp.evaluate(fn)(X), fn(X))


# ---------------------------------------------------------------------------
# The public readers.


def test_public_readers_accept_an_equation_or_its_params():
    (eqn,) = _classic_jaxpr(CORPUS["scan_consts"]).jaxpr.eqns
    p = jaxinterp.scan_params(eqn)
    assert p == jaxinterp.scan_params(eqn.params)
    assert (p.num_consts, p.num_carry, p.length, p.reverse) == (1, 1, 4, False)
    body = compat.open_jaxpr(p.jaxpr)
    assert len(body.invars) == p.num_consts + p.num_carry + 1
    (eqn,) = _classic_jaxpr(CORPUS["while"]).jaxpr.eqns
    w = jaxinterp.while_params(eqn)
    assert (w.cond_nconsts, w.body_nconsts) == (0, 0)
    (eqn,) = jax.make_jaxpr(CORPUS["switch"])(X).jaxpr.eqns[-1:]
    assert len(jaxinterp.cond_branches(eqn)) == 3
    (eqn,) = jax.make_jaxpr(CORPUS["jit"])(X).jaxpr.eqns
    assert jaxinterp.jit_params(eqn).name == "<lambda>"


def test_public_readers_refuse_other_objects():
    with pytest.raises(TypeError, match="expected a `JaxprEqn` or its `params` dict"):
        jaxinterp.scan_params([1, 2])


# ---------------------------------------------------------------------------
# JAX's future-default "hijax" constructs (JAX >= 0.11, opt-in flags).


@pytest.fixture
def custom_jvp3():
    if not hasattr(jax.config, "jax_custom_jvp3"):
        pytest.skip(f"JAX {jax.__version__} has no `jax_custom_jvp3` flag")
    before = jax.config.jax_custom_jvp3
    jax.config.update("jax_custom_jvp3", True)
    try:
        yield
    finally:
        jax.config.update("jax_custom_jvp3", before)


def test_hijax_calls_are_walked_by_customising_interpreters(custom_jvp3):
    fn = lambda x: jax.nn.relu(x) * 2.0  # noqa: E731
    names = [e.primitive.name for e in jax.make_jaxpr(fn)(X).jaxpr.eqns]
    assert "call_hi_primitive" in names
    # Its body is not a Jaxpr param, but the walker reaches it (test_hijax.py).
    log = PrimitiveLog()
    assert_tree_equal(log.transform(fn)(X), fn(X))
    assert "max" in log.names
    assert_tree_equal(jaxinterp.evaluate(fn)(X), fn(X))
