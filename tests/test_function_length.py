"""No function of the package over ``LIMIT`` lines (issue 42 item 4): a long one is cut into pieces
that each own one concern, before it grows at every review."""

from __future__ import annotations

import ast
from pathlib import Path

import mimi_extract

LIMIT = 80


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """``path:line name (n lines)`` of every function or method under ``root`` longer than ``limit``
    lines, counted from its ``def`` to its last line (decorators excluded), longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append((n, f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)"))
    return [where for _, where in sorted(found, reverse=True)]


def test_no_function_of_the_package_is_over_the_limit():
    over = long_functions(Path(mimi_extract.__file__).parent)
    assert not over, f"functions over {LIMIT} lines (cut them into pieces that each own one concern):\n" + "\n".join(over)


def test_the_count_runs_from_the_def_to_the_last_line(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))  # the def and these: LIMIT lines
    (package / "a.py").write_text("import functools\n\n\n" + "@functools.cache\n" * 5 + "def fits():\n" + body
                                  + "\n\nclass C:\n    def method_too_long(self):\n" + body.replace("    ", "        ")
                                  + "        return 1\n", encoding="utf-8")
    assert long_functions(package) == [f"pkg/a.py:{LIMIT + 12} method_too_long ({LIMIT + 1} lines)"]
