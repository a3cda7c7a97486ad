"""Every ```python block of the docs and the README runs.

Blocks of one page run in order in a shared namespace, so a page reads like a
session. A `<!-- skip -->` line just before a block leaves that block out.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import future_flags_on

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SKIP = "<!-- skip -->"
_FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown text, as (first line number, code).

    Blocks preceded by `<!-- skip -->` (blank lines in between allowed) are
    left out. Indented fences (inside lists) are dedented.
    """
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i, previous = 0, ""
    while i < len(lines):
        stripped = lines[i].strip()
        match = _FENCE.match(stripped)
        if not match:
            if stripped:
                previous = stripped
            i += 1
            continue
        fence, lang = match.groups()
        indent = len(lines[i]) - len(lines[i].lstrip())
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:])
            i += 1
        if lang in ("python", "py") and previous != SKIP:
            blocks.append((start + 1, "\n".join(body) + "\n"))
        previous = fence
        i += 1
    return blocks


def test_python_blocks_parser():
    text = "\n".join(
        [
            "# Title",
            "```python",
            "a = 1",
            "```",
            SKIP,
            "",
            "```python",
            "raise SystemExit",
            "```",
            "```bash",
            "echo no",
            "```",
            "- item",
            "    ```python",
            "    b = a + 1",
            "    ```",
        ]
    )
    assert python_blocks(text) == [(3, "a = 1\n"), (15, "b = a + 1\n")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_run(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # pages may write files
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for lineno, code in python_blocks(page.read_text()):
        compiled = compile(code, f"{page}:{lineno}", "exec")
        try:
            exec(compiled, namespace)  # noqa: S102
        except NotImplementedError as err:
            # Under JAX's hijax flags, a page's plain-JAX reference may need a
            # `grad` or `vmap` of `Scan3`, which JAX 0.12.0.1 does not have.
            if future_flags_on() and "Scan3" in str(err):
                reason = f"plain JAX fails {page.name}:{lineno}: {str(err)[:120]}"
                print(reason)
                pytest.skip(reason)
            raise


def test_pages_are_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed"
)
def test_site_builds_strictly(tmp_path):
    if not (ROOT / "docs" / "benchmarks.md").exists():
        pytest.skip("docs/benchmarks.md has not been written yet")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
