"""The layer rule of docs/architecture.md: imports point one way (tilecommon <
kernels < simulator < planner.ir < planner.decide < planner.lowering < planner.search <
the interface modules), and no module imports itself through a circle at run
time (imports under `if TYPE_CHECKING:` are for annotations only)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("tilecommon", "kernels", "simulator", "planner.ir", "planner.decide",
         "planner.lowering", "planner.search", "planner")
TOPS = ("tilecommon", "kernels", "simulator", "planner")


def layer(module: str) -> int:
    best = max((p for p in ORDER if module == p or module.startswith(p + ".")), key=len)
    return ORDER.index(best)


def runtime_imports(path: Path) -> set[str]:
    """Modules of ours imported outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in TOPS}
    return out


def modules() -> dict[str, set[str]]:
    found = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = runtime_imports(path)
    return found


def test_imports_point_down() -> None:
    against = sorted((m, t) for m, ts in modules().items() for t in ts
                     if layer(t) > layer(m))
    assert against == []


def test_no_import_circles() -> None:
    graph = modules()
    known = set(graph)
    edges = {m: {t for t in ts if t in known and t != m and "." in t}
             for m, ts in graph.items() if "." in m}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            for t in edges.get(m, ()):
                if t == goal:
                    return True
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return False

    circles = sorted(m for m in edges if reaches(m, m))
    assert circles == []


def test_common_is_the_bottom_layer() -> None:
    """`tilecommon` (errors, jit options, runtime, config, files, tables, registry)
    imports nothing of tileplan's, and the infrastructure it holds has no
    copy left in the layers above it."""
    found = modules()
    common = {m: ts for m, ts in found.items() if layer(m) == 0}
    assert set(common) >= {f"tilecommon.{m}" for m in (
        "errors", "jit", "runtime", "config", "files", "tables", "registry")}
    assert sorted((m, t) for m, ts in common.items() for t in ts
                  if not t.startswith("tilecommon")) == []
    gone = {"kernels.exceptions", "kernels.jit", "kernels.runtime", "simulator.config",
            "simulator.files", "simulator.tables"}
    assert sorted(gone & set(found)) == []
    assert sorted((m, t) for m, ts in found.items() for t in ts if t in gone) == []
