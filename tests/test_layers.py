"""The package's imports point down only: every `rlckpt.X` a module of package P imports (at the top or
inside a function) is of a lower layer than P. The layers are read from the README's `Layout of the code`
block ("layer N" at the end of a line), the one place they are written."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rlckpt"
LAYER_LINE = re.compile(r"^\s{2}(\w+)(?:/|\.py)\s.*\blayer (\d+)\s*$")
FORBIDDEN_IN_PACKAGE = ("pytest", "hypothesis", "moto")


def layers() -> dict[str, int]:
    """Each package (or top-level module) of the README's layout block, and its layer."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout of the code", 1)[1].split("```", 2)[1]
    found = {m.group(1): int(m.group(2)) for m in map(LAYER_LINE.match, block.splitlines()) if m}
    assert found, "no 'layer N' lines in the README's layout block"
    return found


def unit_of(path: Path) -> str:
    """The package (or top-level module) a file belongs to: rlckpt/store/x.py -> store."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, lazy ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_package_of_rlckpt_has_a_layer_in_the_readme():
    units = {unit_of(path) for path in MODULES}
    assert sorted(units - set(layers())) == []


def test_the_readme_names_no_package_that_is_not_there():
    units = {unit_of(path) for path in MODULES}
    assert sorted(set(layers()) - units) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_packages_of_lower_layers(path):
    order, mine = layers(), unit_of(path)
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {module} (layer {order[target]}; {mine} is layer {order[mine]})"
        for line, module in imports(path)
        if module.startswith("rlckpt.")
        and (target := module.split(".")[1]) != mine
        and order.get(target, order[mine]) >= order[mine]
    ]
    assert upward == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_of_the_installed_package_imports_a_test_tool(path):
    tools = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for line, module in imports(path)
        if module.split(".")[0] in (*FORBIDDEN_IN_PACKAGE, "support")
    ]
    assert tools == []


def test_the_layer_test_sees_an_upward_import(tmp_path):
    """The check itself can fail: a store module importing the CLI is caught."""
    order = layers()
    assert order["store"] < order["cli"]
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from rlckpt.cli import main\n")
    assert imports(bad) == [(2, "rlckpt.cli")]
