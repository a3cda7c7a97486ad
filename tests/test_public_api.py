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
from pathlib import Path

import pytest

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
