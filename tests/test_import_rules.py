"""The import rules of docs/architecture.md, checked on the real import graph.

Every module of ``envs``, ``mazerl``, ``tasks``, ``flows`` and ``cli`` is parsed with ``ast``;
every import in it, at module level or inside a function, is resolved to the project unit it
names (a top-level package, or ``mazerl.<package>`` / ``mazerl.<module>`` inside the library).
A unit may import only the units :data:`RULES` lists for it, and never the third-party libraries
:data:`NEVER` lists. The library's units must form no cycle, so the layers of
docs/architecture.md stay layers.

The rules have one home: the table under "## Import rules" in docs/architecture.md, which this
module reads (:func:`rules_table`). To change a rule, change that table.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("envs", "mazerl", "tasks", "flows", "cli")
ARCHITECTURE = REPO / "docs" / "architecture.md"
HELPERS = "helpers"  # the table's name for the small modules directly in mazerl/ that have no row of their own
THIRD_PARTY = {"torch", "transformers", "peft", "vllm", "ray", "mlflow", "prefect"}


def library_units() -> set[str]:
    """``mazerl`` itself, and each package and module directly in ``mazerl/``."""
    library = REPO / "mazerl"
    packages = {path.parent.name for path in library.glob("*/__init__.py")}
    modules = {path.stem for path in library.glob("*.py") if path.name != "__init__.py"}
    return {"mazerl"} | {f"mazerl.{name}" for name in packages | modules}


def _unit_named(cell: str) -> str:
    """A row's first cell as a unit: `envs/` -> envs, `mazerl/policy/` -> mazerl.policy, `mazerl/params.py`
    -> mazerl.params, "`mazerl` helper modules" -> the helpers."""
    if cell == "`mazerl` helper modules":
        return HELPERS
    match = re.fullmatch(r"`([\w/.]+?)/?`", cell)
    if not match:
        raise ValueError(f"docs/architecture.md's import rules: {cell!r} names no unit")
    return match.group(1).removesuffix(".py").replace("/", ".")


def _units_allowed(cell: str, unit: str) -> set[str]:
    """A row's "may import" cell as units: `envs`, `policy` (mazerl.policy), helpers, the library."""
    allowed: set[str] = set()
    for word in (part.strip() for part in cell.split(",")):
        if word == "nothing of the project":
            continue
        elif word == "each other" and unit == HELPERS or word == "helpers":
            allowed.add(HELPERS)
        elif word == "the library":
            allowed |= {"the library"}
        elif match := re.fullmatch(r"`(\w+)`", word):
            name = match.group(1)
            allowed.add(name if name in ROOTS else f"mazerl.{name}")
        else:
            raise ValueError(f"docs/architecture.md's import rules: {word!r} (row {unit}) is no unit")
    return allowed


def _libraries_refused(cell: str, unit: str) -> set[str]:
    refused = {word.strip().lower() for word in cell.split(",") if word.strip() not in ("", "-")}
    unknown = refused - THIRD_PARTY
    if unknown:
        raise ValueError(
            f"docs/architecture.md's import rules: {sorted(unknown)} (row {unit}) are not in {THIRD_PARTY}"
        )
    return refused


def rules_table() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(may import, never imports) per unit, from the first table under "## Import rules"."""
    section = ARCHITECTURE.read_text().split("\n## Import rules\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # past the header and its rule
    library = library_units()
    helpers = library - {_unit_named(row.split(" | ")[0].removeprefix("| ")) for row in rows}
    may, never = {}, {}
    for row in rows:
        first, allowed, refused = (cell.strip() for cell in row.strip("| ").split(" | "))
        unit = _unit_named(first)
        may[unit], never[unit] = _units_allowed(allowed, unit), _libraries_refused(refused, unit)
    expand = {HELPERS: helpers, "the library": library}
    rules = {unit: set().union(*(expand.get(name, {name}) for name in allowed)) for unit, allowed in may.items()}
    for unit in helpers:  # the helpers' row holds for each of them
        rules[unit], never[unit] = rules[HELPERS], never[HELPERS]
    del rules[HELPERS], never[HELPERS]
    return rules, never


# unit -> the project units it may import (besides itself); unit -> the third-party libraries it never imports.
RULES, NEVER = rules_table()
LIBRARY = library_units()


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. mazerl.merge.lora
    target: str  # the imported project module (or package), or the third-party top-level name
    line: int

    def __str__(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def project_modules() -> dict[str, Path]:
    modules = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import in the module, module-level and function-level, resolved to module names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append(Import(module, submodule if submodule in modules else base, node.lineno))
    return found


def unit_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "mazerl":
        return parts[0]
    return ".".join(parts[:2])


def all_imports() -> list[Import]:
    modules = project_modules()
    return [found for module, path in modules.items() for found in imports_of(module, path, modules)]


def test_every_unit_has_a_rule():
    units = {unit_of(module) for module in project_modules()}
    missing = sorted(units - set(RULES))
    assert not missing, f"no import rule for {missing}: add them to RULES here and to docs/architecture.md"


def test_every_project_import_is_allowed_by_the_rules():
    broken = []
    for found in all_imports():
        if found.target.split(".")[0] not in ROOTS:
            continue
        source, target = unit_of(found.module), unit_of(found.target)
        if source != target and target not in RULES[source]:
            broken.append(f"{found}: {source} may not import {target}")
    assert not broken, "imports against docs/architecture.md's rules:\n" + "\n".join(broken)


def test_no_unit_imports_a_library_it_must_never_import():
    broken = []
    for found in all_imports():
        library = found.target.split(".")[0]
        if library in NEVER.get(unit_of(found.module), set()):
            broken.append(f"{found}: {unit_of(found.module)} never imports {library}")
    assert not broken, "third-party imports against docs/architecture.md's rules:\n" + "\n".join(broken)


def test_the_library_packages_form_layers_without_cycles():
    # No exception: every import of one library unit from another runs down the layers.
    graph: dict[str, set[str]] = {unit: set() for unit in LIBRARY}
    for found in all_imports():
        source, target = unit_of(found.module), unit_of(found.target)
        if source in LIBRARY and target in LIBRARY and source != target:
            graph[source].add(target)
    # depth-first search; a back edge is a cycle
    state: dict[str, str] = {}

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = "open"
        for target in sorted(graph[unit]):
            if state.get(target) == "open":
                cycle = [*path[path.index(target) :], target]
                raise AssertionError(f"the library's packages import each other in a cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*path, target])
        state[unit] = "done"

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [unit])


def test_the_rules_are_read_from_the_architecture_page():
    # The table's rows as this test reads them: the layer order of docs/architecture.md, and Prefect
    # nowhere in the library.
    assert RULES["envs"] == set() and NEVER["envs"] == THIRD_PARTY
    assert "mazerl.paths" in RULES["mazerl.policy"] and "mazerl.training" not in RULES["mazerl.policy"]
    assert RULES["mazerl.atomic"] == RULES["mazerl.paths"] and "mazerl.params" not in RULES["mazerl.paths"]
    assert RULES["tasks"] >= LIBRARY and "flows" not in RULES["tasks"] and "tasks" not in RULES["cli"]
    assert all("prefect" in NEVER[unit] for unit in LIBRARY), sorted(u for u in LIBRARY if "prefect" not in NEVER[u])


def test_the_rules_catch_a_forbidden_import(tmp_path):
    # Given a tracking module that imports training (as the merge once made tracking do),
    module = tmp_path / "mazerl" / "tracking" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f():\n    from mazerl.training import checkpoints\n")
    modules = {"mazerl.tracking.bad": module, "mazerl.training.checkpoints": module}
    # when its imports are resolved, the function-level one is found and the rule refuses it.
    (found,) = imports_of("mazerl.tracking.bad", module, modules)
    assert (found.target, found.line) == ("mazerl.training.checkpoints", 2)
    assert unit_of(found.target) not in RULES[unit_of(found.module)]
