"""Where each decision of a run lives: no import cycle among lustrain_core's modules, every CreateTrainingJob field
decided in the launch plan (the builders read no spec), and a new spec field reaching CreateTrainingJob touching
the four files launch_plan's docstring names, the doc among them the one that lists the launch plan's fields."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "functions" / "lustrain_core"


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """lustrain_core's modules but its copy of the trainer's planner (a package of its own, with no core imports)."""
    return {_module_name(p): p for p in CORE.rglob("*.py") if "trainer" not in p.relative_to(CORE).parts}


def import_graph(
    modules: dict[str, Path] | None = None, package: str = "lustrain_core", parents: bool = True
) -> dict[str, set[str]]:
    """Every module of `package` a module imports, wherever the import stands (a function's import is an import
    all the same: it runs the other module, and it hid the cycle launch -> steps -> steps.training -> launch); with
    `parents`, the packages above each imported module too (importing a.b.c runs a.b's __init__ first)."""
    modules = _modules() if modules is None else modules
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(package))
        if parents:
            for target in list(found):
                parts = target.split(".")
                found.update(".".join(parts[:i]) for i in range(2, len(parts)))
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as the modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_lustrain_core_module_imports_itself_back_through_another() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_of_the_twin_imports_one_that_imports_it_back() -> None:
    """The twin's modules import each other one way (its patches package installs them all, so the packages above
    an import are left out here): processing.py and sagemaker.py share the job's role through job_roles.py."""
    twin = ROOT / "lustrain" / "twin"
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts[: -1 if p.name == "__init__.py" else None]): p
        for p in twin.rglob("*.py")
    }
    cycle = find_cycle(import_graph(modules, "lustrain.twin", parents=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_the_cycle_the_launch_compiler_had() -> None:
    """The shape the check must catch: launch -> steps (a function's import) -> steps.training -> launch."""
    had = {
        "lustrain_core.launch": {"lustrain_core.steps", "lustrain_core.steps.training"},
        "lustrain_core.steps": {"lustrain_core.launch"},
        "lustrain_core.steps.training": {"lustrain_core.steps", "lustrain_core.launch"},
    }
    assert find_cycle(had) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_layers_import_downwards_only() -> None:
    """The run document's models and the launch plan know no step; the builders know no step and no compiler."""
    graph = import_graph()
    below = {
        "lustrain_core.launch_plan": {
            "lustrain_core.document",
            "lustrain_core.aws_requests",
            "lustrain_core.launch",
        },
        "lustrain_core.document": {"lustrain_core.aws_requests", "lustrain_core.launch"},
        "lustrain_core.aws_requests": {"lustrain_core.launch"},
    }
    for module, forbidden in below.items():
        reached = graph[module]
        assert not reached & forbidden, f"{module} imports {reached & forbidden}"
        assert not {m for m in reached if m.startswith("lustrain_core.steps")}, f"{module} imports a step"


@pytest.mark.parametrize(
    "module",
    [
        "lustrain_core.document",
        "lustrain_core.aws_requests",
        "lustrain_core.steps.training",
        "lustrain_core.steps.warm_pool",
    ],
)
def test_each_layer_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """Imported first, in a fresh interpreter, as a Lambda handler's cold start imports it."""
    path = f"{ROOT}{':'}{ROOT / 'functions'}"
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": path, "PATH": ""},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _reads_spec(function: ast.FunctionDef) -> list[int]:
    return [n.lineno for n in ast.walk(function) if isinstance(n, ast.Attribute) and n.attr == "spec"]


def test_the_training_job_builders_read_the_launch_plan_and_never_the_spec() -> None:
    """Every CreateTrainingJob field is decided once, in the launch plan: the builders only place it."""
    tree = ast.parse((CORE / "aws_requests.py").read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    builders = ["training_job", "preload_job", "channels", "resource_config", "stopping_condition"]
    for name in builders:
        assert not _reads_spec(functions[name]), (
            f"aws_requests.{name} reads the spec at {_reads_spec(functions[name])}"
        )
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "lustrain_core.spec" not in imported


def test_a_new_spec_field_reaching_create_training_job_touches_four_files() -> None:
    """launch_plan's docstring names them; what makes that list true is held here: the launch plan's model and its
    decisions share a module, the builder and the request paths' spec fields share another, and neither the
    compiler nor the run document's models hold anything per field."""
    from lustrain_core import aws_requests, launch_plan

    named = re.search(r"touches four files: (.*?)\. tests/", launch_plan.__doc__ or "", flags=re.DOTALL)
    assert named is not None
    # the four it names ("this module" among them), what each holds said in parentheses
    files = {*re.findall(r"([\w/.-]+\.(?:py|md))\b", re.sub(r"\([^)]*\)", "", named[1])), "launch_plan.py"}
    assert files == {"spec.py", "launch_plan.py", "aws_requests.py", "docs/how-a-run-goes.md"}
    # and the doc named is where the launch plan's fields are listed (test_contract holds the list to LaunchPlan)
    assert "<!-- launch-plan-fields -->" in (ROOT / "docs" / "how-a-run-goes.md").read_text()
    assert launch_plan.LaunchPlan.__module__ == launch_plan.decide.__module__ == "lustrain_core.launch_plan"
    assert aws_requests.SPEC_FIELDS and aws_requests.training_job.__module__ == "lustrain_core.aws_requests"
    for module in ("launch.py", "document.py"):
        text = (CORE / module).read_text()
        assert not re.search(r'"(ResourceConfig|OutputDataConfig|StoppingCondition)\.', text), module
