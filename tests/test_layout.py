"""The test package stays a leaf: no code outside `tests/` imports it (the product, the development tooling in
`devtools/`, bench/, the CLI, manage.py). What tests, benchmarks and `make cluster` share lives in `devtools/`."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Folders that hold no project code: virtual environments, npm's, git-ignored outputs.
SKIPPED_FOLDERS = {"node_modules", "var", "__pycache__", "build", "staticfiles"}


def _python_files_outside_tests() -> Iterator[Path]:
    for folder, subfolders, files in os.walk(REPO_ROOT):
        here = Path(folder)
        subfolders[:] = [
            name
            for name in subfolders
            if not name.startswith(".") and name not in SKIPPED_FOLDERS and here / name != REPO_ROOT / "tests"
        ]
        yield from (here / name for name in files if name.endswith(".py"))


def _imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every `import m` and absolute `from m import …` in the file, nested ones included."""
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_no_code_outside_tests_imports_the_test_package():
    # given every Python file of the project outside tests/
    files = list(_python_files_outside_tests())
    assert REPO_ROOT / "bench" / "reconcile.py" in files
    assert REPO_ROOT / "devtools" / "cluster" / "control_plane.py" in files
    # then none imports `tests` or a module under it
    offenders = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
        for path in files
        for line, module in _imported_modules(path)
        if module == "tests" or module.startswith("tests.")
    ]
    assert offenders == []
