"""Every public name of `jaxinterp` and `jaxinterp.testing` is documented.

The names are read from the modules at test time (`__all__` where defined,
else every non-underscore, non-module attribute), so a name added to
`jaxinterp/__init__.py` is checked as soon as it exists: it needs a docstring
whose first paragraph is a sentence, public methods with docstrings, and an
entry `::: jaxinterp.NAME` in docs/api.md.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxinterp
import jaxinterp.testing

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)
        ]
    return sorted(names)


PUBLIC = [
    (module.__name__, name)
    for module in (jaxinterp, jaxinterp.testing)
    for name in public_names(module)
]
IDS = [f"{module}.{name}" for module, name in PUBLIC]


def own_docstring(obj) -> str | None:
    """The docstring written for `obj` itself (classes do not inherit one here)."""
    return obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__


def summary(doc: str) -> str:
    """The first paragraph of a docstring, on one line."""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def test_the_public_api_is_found():
    names = {name for _, name in PUBLIC}
    expected = {"stage", "Interpreter", "RuleRegistry", "evaluate", "eval_rules"}
    assert expected <= names
    assert {"compare_with_reference", "tree_allclose"} <= names
    assert "testing" not in names and not any(n.startswith("_") for n in names)


@pytest.mark.parametrize("module, name", PUBLIC, ids=IDS)
def test_public_name_has_a_docstring(module, name):
    obj = getattr(__import__(module, fromlist=[name]), name)
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        # An instance (a rule registry): its docs are prose on the API page.
        text = API_PAGE.read_text()
        heading = f"### `{module}.{name}`"
        assert heading in text, f"{module}.{name} needs a `{heading}` section"
        after = text.split(heading, 1)[1].lstrip().split("\n\n", 1)[0]
        assert after and not after.startswith(":::"), f"{heading} needs prose"
        return
    doc = own_docstring(obj)
    assert doc and doc.strip(), f"{module}.{name} has no docstring"
    assert summary(doc).endswith("."), f"{module}.{name}: first paragraph: {doc!r}"
    if inspect.isclass(obj):
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            func = getattr(value, "__func__", value)
            func = func.fget if isinstance(func, property) else func
            if inspect.isroutine(func):
                assert func.__doc__, f"{module}.{name}.{attr} has no docstring"


@pytest.mark.parametrize("module, name", PUBLIC, ids=IDS)
def test_public_name_is_in_the_api_reference(module, name):
    pattern = rf"^::: {re.escape(module)}\.{re.escape(name)}\s*$"
    assert re.search(pattern, API_PAGE.read_text(), flags=re.MULTILINE), (
        f"docs/api.md has no `::: {module}.{name}` entry"
    )


# ---------------------------------------------------------------------------
# Names renamed in 0.2.0: the old ones warn, then do what the new ones do.


def _renamed_message(old: str, new: str) -> str:
    return re.escape(
        f"`jaxinterp.{old}` is deprecated in 0.2.0, removed in 0.3.0: "
        f"use `jaxinterp.{new}`, which takes the same arguments."
    )


def _run_rule(rule, outvals, *invals):
    return rule(jaxinterp.InverseContext(), outvals, *invals)


def test_register_elementwise_is_a_deprecated_alias():
    y = jnp.linspace(-0.9, 0.9, 7)
    new = jaxinterp.InverseRuleRegistry("new", parent=jaxinterp.inverse_rules)
    old = jaxinterp.InverseRuleRegistry("old", parent=jaxinterp.inverse_rules)
    jaxinterp.register_elementwise_inverse(
        lax.tanh_p, jnp.arctanh, registry=new, override=True
    )
    with pytest.warns(
        DeprecationWarning,
        match=_renamed_message("register_elementwise", "register_elementwise_inverse"),
    ):
        jaxinterp.register_elementwise(
            lax.tanh_p, jnp.arctanh, registry=old, override=True
        )
    (got,), got_ildj = _run_rule(old.get(lax.tanh_p), [y], None)
    (want,), want_ildj = _run_rule(new.get(lax.tanh_p), [y], None)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_ildj, want_ildj)
    # And both against the closed form: x = atanh(y), log|dx/dy| = -log(1 - y^2).
    np.testing.assert_allclose(got, np.arctanh(np.asarray(y)), rtol=1e-6)
    np.testing.assert_allclose(
        got_ildj, -np.sum(np.log1p(-(np.asarray(y) ** 2))), rtol=1e-5
    )


def test_register_binary_is_a_deprecated_alias():
    y, b = jnp.arange(1.0, 6.0), jnp.full(5, 4.0)
    new = jaxinterp.InverseRuleRegistry("new", parent=jaxinterp.inverse_rules)
    old = jaxinterp.InverseRuleRegistry("old", parent=jaxinterp.inverse_rules)

    def lhs(y, b):
        return y - b

    def rhs(y, a):
        return y - a

    jaxinterp.register_binary_inverse(lax.add_p, lhs, rhs, registry=new, override=True)
    with pytest.warns(
        DeprecationWarning,
        match=_renamed_message("register_binary", "register_binary_inverse"),
    ):
        jaxinterp.register_binary(lax.add_p, lhs, rhs, registry=old, override=True)
    got, got_ildj = _run_rule(old.get(lax.add_p), [y], None, b)
    want, want_ildj = _run_rule(new.get(lax.add_p), [y], None, b)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[0], np.asarray(y) - np.asarray(b))
    np.testing.assert_array_equal(got_ildj, want_ildj)


def test_eval_jaxpr_is_a_deprecated_alias():
    def f(x, y):
        return jnp.sin(x) * y + 1.0

    args = (jnp.linspace(0.0, 1.0, 4), jnp.float32(3.0))
    closed = jax.make_jaxpr(f)(*args)
    with pytest.warns(
        DeprecationWarning, match=_renamed_message("eval_jaxpr", "eval_closed_jaxpr")
    ):
        got = jaxinterp.eval_jaxpr(closed, *args)
    np.testing.assert_array_equal(got[0], jaxinterp.eval_closed_jaxpr(closed, *args)[0])
    np.testing.assert_array_equal(got[0], f(*args))


def test_interpreter_eval_jaxpr_keeps_its_name_and_does_not_warn():
    closed = jax.make_jaxpr(lambda x: jnp.exp(x) - 1.0)(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        got = jaxinterp.EvalInterpreter().eval_jaxpr(closed.jaxpr, closed.consts, 2.0)
    np.testing.assert_array_equal(got[0], jnp.exp(jnp.float32(2.0)) - 1.0)
