"""The project as a reader meets it: one version, a changelog, no work log.

History belongs in git: the package, docs, tests, benchmarks, examples, the
README and the CHANGELOG say what is true now, so none of them may number
the work that led there (the check `house.py` makes, kept by a test).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import pytest

import jaxinterp

ROOT = Path(__file__).resolve().parent.parent

# A work log's numbering: "S/session" and a number, or "since" and the same
# word. Assembled from pieces so that this file does not match it itself.
_WORD = "ession"
HISTORY = re.compile(rf"\b[Ss]{_WORD} \d+|\bsince s{_WORD}\b")

SEARCHED = [
    "jaxinterp",
    "docs",
    "tests",
    "benchmarks",
    "examples",
    "README.md",
    "CHANGELOG.md",
    "noxfile.py",
    "conftest.py",
    ".ci",
]
_TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".yml", ".yaml", ""}


def _searched_files() -> list[Path]:
    files = []
    for name in SEARCHED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and p.suffix in _TEXT_SUFFIXES
                and "__pycache__" not in p.parts
            )
    return files


def test_the_history_pattern_matches_a_work_log_and_not_prose():
    assert HISTORY.search("fixed in S" + _WORD + " 12")
    assert HISTORY.search("as measured since s" + _WORD + ".")
    assert not HISTORY.search("`nox -s peers` runs a nox s" + _WORD + " of its own")


def test_nothing_narrates_the_work_log():
    files = _searched_files()
    assert any(p.name == "CHANGELOG.md" for p in files)
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not hits, "lines that narrate history (git keeps it):\n" + "\n".join(hits)


def _pyproject_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_the_changelog_names_the_version_as_its_latest_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert releases and releases[0] == _pyproject_version(), releases
    assert text.index("## [Unreleased]") < text.index(f"## [{releases[0]}]")


def test_version_is_the_installed_metadata():
    try:
        dist = importlib.metadata.distribution("jaxinterp")
    except importlib.metadata.PackageNotFoundError:
        assert jaxinterp.__version__ == "0+unknown"
        return
    assert jaxinterp.__version__ == dist.version
    # When this checkout is the one installed (the README's `pip install -e`),
    # its metadata is pyproject.toml's version.
    direct = dist.read_text("direct_url.json")
    url = json.loads(direct).get("url", "") if direct else ""
    if url.removeprefix("file://").rstrip("/") != str(ROOT):
        pytest.skip(f"the installed jaxinterp is not this checkout ({url or dist})")
    assert dist.version == _pyproject_version()
