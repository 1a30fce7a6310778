"""The import rules of docs/architecture.md, checked on the real import graph.

Every module of ``envs``, ``mazerl``, ``tasks``, ``flows`` and ``cli`` is parsed with ``ast``;
every import in it, at module level or inside a function, is resolved to the project unit it
names (a top-level package, or ``mazerl.<package>`` / ``mazerl.<module>`` inside the library).
A unit may import only the units :data:`RULES` lists for it, and never the third-party libraries
:data:`NEVER` lists. The library's units, minus the edges in :data:`KNOWN_CYCLE_EDGES`, must form
no cycle, so the layers of docs/architecture.md stay layers.

To change a rule, change the table here and the table in docs/architecture.md together.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("envs", "mazerl", "tasks", "flows", "cli")

# A library package's command-line module (``mazerl eval``, ``build-starter``, ``ui``, ``ray``): a
# front end of its package, which may also use the flag checks of mazerl.preflight. Only cli.main
# imports one, so they count as one unit of their own.
COMMANDS = "mazerl.<package>.cli"

BASE = {
    "mazerl",
    "mazerl.eval_files",
    "mazerl.paths",
    "mazerl.progress",
    "mazerl.run_clock",
    "mazerl.atomic",
    "mazerl.process_lock",
    "mazerl.fingerprint",
    "mazerl.upstream_warnings",
    "mazerl.input_files",
}
LOW = {"envs"} | BASE
LIBRARY = BASE | {
    "mazerl.policy",
    "mazerl.tracking",
    "mazerl.cluster",
    "mazerl.starter",
    "mazerl.evaluation",
    "mazerl.training",
    "mazerl.merge",
    "mazerl.reporting",
    "mazerl.params",
    "mazerl.preflight",
}

# unit -> the project units it may import (besides itself), lowest layer first.
RULES: dict[str, set[str]] = {
    "envs": set(),  # the maze world imports nothing of the project
    **{unit: BASE for unit in BASE},  # small helpers: paths, progress lines, atomic writes, digests
    "mazerl.policy": LOW,  # the policy runtime: loader, chat, engines, episodes
    "mazerl.tracking": LOW,  # MLflow only: never training, policy, merge, starter, evaluation, cluster
    "mazerl.cluster": LOW,  # Ray: the local head, jobs, checks (see KNOWN_CYCLE_EDGES)
    "mazerl.starter": LOW | {"mazerl.policy"},
    "mazerl.evaluation": LOW | {"mazerl.policy", "mazerl.starter", "mazerl.cluster"},
    "mazerl.training": LOW
    | {"mazerl.policy", "mazerl.starter", "mazerl.tracking", "mazerl.evaluation", "mazerl.cluster"},
    "mazerl.merge": LOW | {"mazerl.policy", "mazerl.starter", "mazerl.training", "mazerl.tracking"},
    # the pipeline's outcomes in MLflow: eval reports into stage runs, the conclusion and promotion
    "mazerl.reporting": LOW | {"mazerl.tracking", "mazerl.evaluation", "mazerl.training", "mazerl.cluster"},
    "mazerl.params": LOW | {"mazerl.training"},
    "mazerl.preflight": LOW | {"mazerl.params", "mazerl.policy", "mazerl.starter", "mazerl.training", "mazerl.cluster"},
    COMMANDS: LOW | LIBRARY,
    "tasks": LOW | LIBRARY,  # one library call per Prefect task
    "flows": LOW | LIBRARY | {"tasks"},  # composition only
    "cli": LOW | LIBRARY | {COMMANDS, "flows"},  # `mazerl`: the commands, and `mazerl run` starts the flow
}

# unit -> third-party libraries it must never import (at any level).
HEAVY = {"torch", "transformers", "peft", "vllm", "ray", "mlflow", "prefect"}
NEVER: dict[str, set[str]] = {
    "envs": HEAVY,  # numpy + Pillow (and skyrl-gym for its adapter)
    **{unit: {"prefect"} for unit in LIBRARY | {COMMANDS}},  # the library is plain Python: no Prefect
    "mazerl.policy": {"prefect", "mlflow", "ray"},
    "mazerl.tracking": {"prefect", "ray"},
}

# Edges that close a cycle between library packages today: (module, imported module, why it is
# still there). Each is a layering bug to remove; the test fails once one is gone, so the list
# stays true (delete the line then).
KNOWN_CYCLE_EDGES = {
    (
        "mazerl.cluster.submitter",
        "mazerl.training.progress",
        "the submitter watches a job's `step N/M:` lines with training.progress's parser, while training "
        "imports cluster.metrics: the step-line format belongs below both (issue 12 point 5, the step-log regex)",
    ),
    (
        "mazerl.cluster.verify",
        "mazerl.merge.memory",
        "verify_cluster's ray.merge_memory row asks the merge for its memory need, while merge imports "
        "training (checkpoints) and training imports cluster",
    ),
}


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
    if len(parts) > 2 and (parts[-1] == "cli" or parts[-1].endswith("_cli")):
        return COMMANDS
    return ".".join(parts[:2])


def all_imports() -> list[Import]:
    modules = project_modules()
    return [found for module, path in modules.items() for found in imports_of(module, path, modules)]


def test_every_unit_has_a_rule():
    units = {unit_of(module) for module in project_modules()}
    missing = sorted(units - set(RULES))
    assert not missing, f"no import rule for {missing}: add them to RULES here and to docs/architecture.md"


def test_every_project_import_is_allowed_by_the_rules():
    known = {(module, target) for module, target, _ in KNOWN_CYCLE_EDGES}
    broken = []
    for found in all_imports():
        if found.target.split(".")[0] not in ROOTS or (found.module, found.target) in known:
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
    known = {(module, target) for module, target, _ in KNOWN_CYCLE_EDGES}
    graph: dict[str, set[str]] = {unit: set() for unit in LIBRARY}
    seen = set()
    for found in all_imports():
        source, target = unit_of(found.module), unit_of(found.target)
        if (found.module, found.target) in known:
            seen.add((found.module, found.target))
        elif source in LIBRARY and target in LIBRARY and source != target:
            graph[source].add(target)
    gone = sorted(known - seen)
    assert not gone, f"{gone} no longer import each other: delete them from KNOWN_CYCLE_EDGES"
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
