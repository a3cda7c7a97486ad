"""Run the README's first ```python block and check what it prints.

CI runs this with the Python of a fresh venv that the built wheel was
installed into, from a directory outside the checkout (`.ci/run`, stage
"wheel"), so the example runs against the installed package, not the source
tree. Each `print(...)` line of the block ending in `# EXPECTED` must print
EXPECTED: words alike, numbers to the digits EXPECTED gives.

    python .ci/readme_example.py README.md
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_EXPECTED = re.compile(r"^print\(.*\)\s*#\s*(?P<expected>.+?)\s*$")


def first_block(text: str) -> str:
    match = _BLOCK.search(text)
    if match is None:
        raise SystemExit("the README has no ```python block")
    return match.group(1)


def _words(line: str) -> list[str]:
    return line.replace("[", " ").replace("]", " ").split()


def agrees(printed: str, expected: str) -> bool:
    """Whether `printed` reads as `expected`, numbers to its digits."""
    got, want = _words(printed), _words(expected)
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        try:
            g_value, w_value = float(g), float(w)
        except ValueError:
            if g != w:
                return False
            continue
        decimals = len(w.partition(".")[2])
        if abs(g_value - w_value) > 0.5 * 10.0**-decimals:
            return False
    return True


def main(readme: str) -> int:
    checkout = Path(readme).resolve().parent
    code = first_block(Path(readme).read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{readme} (first python block)", "exec"), {})  # noqa: S102
    import jaxinterp

    where = Path(jaxinterp.__file__).resolve()
    if where.is_relative_to(checkout):
        print(f"jaxinterp was imported from the checkout ({where}), not the wheel")
        return 1
    expected = [
        m["expected"] for line in code.splitlines() if (m := _EXPECTED.match(line))
    ]
    printed = out.getvalue().splitlines()
    print(out.getvalue(), end="")
    if len(printed) != len(expected):
        print(f"printed {len(printed)} lines, the README shows {len(expected)}")
        return 1
    bad = [(p, e) for p, e in zip(printed, expected, strict=True) if not agrees(p, e)]
    for p, e in bad:
        print(f"printed {p!r}, the README shows {e!r}")
    if not bad:
        print(f"README example OK (jaxinterp {jaxinterp.__version__} from {where})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "README.md"))
