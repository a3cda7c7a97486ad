"""A griffe extension: read Google-style `Example:` sections as examples.

The house style writes `Example:`; griffe only treats the plural `Examples:`
as an examples section (with doctests rendered as code) and otherwise makes
the singular an admonition of Markdown text. Loaded by mkdocs.yml.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename `Example:` section headers to `Examples:` before parsing."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, "docstring", None)
        if docstring is not None:
            docstring.value = _EXAMPLE.sub(r"\1Examples:", docstring.value)
