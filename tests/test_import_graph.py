"""The package's import graph: no circle, and every module imports only from its own
floor or the floors below (ARCHITECTURE.md's layering, the folders of src/esync/). Every
import of one esync module by another counts, at the top or inside a function (a lazy
import hides a circle from Python, not from the reader), under TYPE_CHECKING too. Read
from the source: nothing is imported, so an upward import fails the day it is written."""
import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

from esync.registry import ALGORITHMS

SOURCE = Path(__file__).resolve().parent.parent / "src"
#: bottom up: a module may import from its own floor and those below it. A name stands
#: for the module or its folder; one ending in "." for every module under it; one ending
#: in "$" for the module alone (an algorithm's policy, whose folder holds its hooks too)
FLOORS: List[Tuple[str, Tuple[str, ...]]] = [
    ("leaves", ("esync.errors", "esync.config", "esync.registry", "esync.flagtypes",
                "esync.comm.compress$")),
    ("infrastructure", ("esync.infra",)),
    ("logs", ("esync.logs",)),
    ("data and models", ("esync.data", "esync.models")),
    ("algorithms' policies", ("esync.algorithms$", "esync.algorithms.policy$",
                              *(row.policy.partition(":")[0] + "$"
                                for row in ALGORITHMS.values()))),
    ("flags", ("esync.options",)),
    ("transport", ("esync.transport",)),
    ("the hooks' interface, the rules' machinery", ("esync.algorithms.base$",
                                                    "esync.algorithms.rules$")),
    ("moving vectors", ("esync.comm",)),
    ("algorithms' hooks and rules", ("esync.algorithms.",)),
    ("worker runtime", ("esync.runtime",)),
    ("stall analysis", ("esync.stalls",)),
    ("front doors", ("esync.cli", "esync.__main__", "esync$")),
    ("commands", ("esync.launch", "esync.logs_tools")),
]


def _modules() -> Dict[str, Path]:
    found = {}
    for path in (SOURCE / "esync").rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _graph(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    """module -> the esync modules it imports (`from esync.x import name`: esync.x, or
    esync.x.name where that is a module)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    imported.add(whole if whole in modules else base)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _circles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle():
    assert _circles(_graph(_modules())) == []


def test_a_circle_is_found_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [{"a", "b", "c"}]
    graph = _graph(_modules())
    assert "esync.runtime.session" in graph["esync.runtime.loader"]  # lazy and top-level imports alike
    assert "esync.runtime.shardloader" in graph["esync.runtime.loader"]


def floor_of(module: str) -> int:
    """The floor of `module`: that of the longest name in FLOORS that matches it."""
    best, floor = -1, None
    for number, (_, names) in enumerate(FLOORS):
        for name in names:
            if name.endswith("$"):
                matches = module == name[:-1]
            elif name.endswith("."):
                matches = module.startswith(name)
            else:
                matches = module == name or module.startswith(name + ".")
            if matches and len(name) > best:
                best, floor = len(name), number
    assert floor is not None, f"{module} stands on no floor: add it to FLOORS"
    return floor


def test_every_module_imports_only_from_its_floor_or_below():
    upward = [f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})"
              for m, targets in sorted(_graph(_modules()).items()) for t in sorted(targets)
              if floor_of(t) > floor_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_an_upward_import_is_found_where_there_is_one():
    assert floor_of("esync.comm.kvstore") > floor_of("esync.transport.node")
    assert floor_of("esync.algorithms.esync.worker") > floor_of("esync.algorithms.esync")
    graph = _graph(_modules())
    assert "esync.comm.kvstore" in graph["esync.algorithms.backend"]


def test_every_registry_row_names_modules_that_exist():
    """The registry names its classes as `module:Class` strings, which no import
    checks until a job runs the algorithm."""
    modules = _modules()
    for row in ALGORITHMS.values():
        for path in filter(None, (row.policy, row.worker, row.rule)):
            module, _, name = path.partition(":")
            assert module in modules, f"{row.key}: {path}"
            assert f"class {name}(" in modules[module].read_text(encoding="utf-8"), path
