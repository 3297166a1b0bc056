"""No import cycle between pipeline's packages, and privacy code stands on its own.

Every module under ``pipeline/`` is parsed with ``ast`` (imports inside functions included, a
deferred import is still a dependency) and each import is mapped to the top-level part of
``pipeline`` it lands in: a subpackage (``privacy``, ``models``, ...) or a top-level module
(``io``, ``stage``, ``images``, ...). Issue #14: a cycle means two packages cannot be understood,
tested or replaced one without the other; ``reporting`` <-> ``accounting`` and
``models.checkpoint`` <-> ``models.precond`` were the cycles that prompted this test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline"

#: what the privacy mechanisms and accountants must never depend on (STYLE: "Privacy code imports
#: nothing from evaluation or reporting"; a mechanism never reads a table or a diagnostic)
PRIVACY_FORBIDDEN = ("evaluation", "reporting", "results", "diagnostics")


def module_name(path: Path) -> str:
    parts = ("pipeline",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The ``pipeline`` modules ``name`` imports anywhere in its source (absolute or relative)."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # "from pipeline import images" imports the module pipeline.images
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m == "pipeline" or m.startswith("pipeline.")}


def top_level(module: str) -> str | None:
    """``pipeline.models.edm`` -> ``models``; the root package itself (``pipeline``) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph() -> dict[str, set[str]]:
    """Top-level part of pipeline -> the other top-level parts it imports."""
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        src = top_level(name)
        if src is None:
            continue
        for target in imported_modules(name, path, modules):
            dst = top_level(target)
            if dst is not None and dst != src:
                graph.setdefault(src, set()).add(dst)
    return graph


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same subpackage it imports (the package's own __init__ excluded)."""
    modules = all_modules()
    prefix = f"pipeline.{package}."
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name.startswith(prefix):
            graph[name] = {m for m in imported_modules(name, path, modules) if m.startswith(prefix) and m != name}
    return graph


# --------------------------------------------------------------------------- the finder itself


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_scan_sees_deferred_relative_and_from_package_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom . import sibling\nfrom pipeline import images\n"
                   "def f():\n    from pipeline.models.precond import PRECONDITIONERS\n")
    known = {"pipeline.images", "pipeline.models.precond", "pipeline.pkg.sibling"}
    found = imported_modules("pipeline.pkg.m", src, known)
    assert found == {"pipeline.pkg.sibling", "pipeline.images", "pipeline.models.precond"}


# --------------------------------------------------------------------------- the house


def test_no_import_cycle_between_pipeline_packages():
    graph = package_graph()
    assert "privacy" in graph and "sampling" in graph  # the scan really read the packages
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between pipeline packages: {' -> '.join(cycle or [])}"


@pytest.mark.parametrize("package", sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()))
def test_no_import_cycle_between_the_modules_of_a_package(package):
    cycle = find_cycle(module_graph(package))
    assert cycle is None, f"import cycle inside pipeline.{package}: {' -> '.join(cycle or [])}"


def test_privacy_imports_nothing_from_evaluation_reporting_results_or_diagnostics():
    imports = package_graph().get("privacy", set())
    assert not imports & set(PRIVACY_FORBIDDEN), f"pipeline.privacy imports {sorted(imports & set(PRIVACY_FORBIDDEN))}"


def test_the_shared_diffusion_formulas_depend_on_nothing_in_pipeline():
    # pipeline.diffusion is the neutral ground privacy, sampling and diagnostics all stand on
    assert package_graph().get("diffusion", set()) == set()
