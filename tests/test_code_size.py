"""The size rules of the library code: no module over 450 lines, no function over 60.

A function is counted from its ``def`` line to its last line, docstring included (nested
functions count on their own and inside their parent).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mazerl", "tasks", "flows", "cli", "envs")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_no_library_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}; split them by the concepts they hold"


def test_no_function_is_over_60_lines():
    long = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}; split them along their steps"
