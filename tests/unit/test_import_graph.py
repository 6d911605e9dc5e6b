"""The packages' import graph: no module of server/ or client/ imports, directly or through
others, a module that imports it back (cycles make import order matter and hide layering).

Imports are read from the source with `ast`: every `import` and `from ... import` at module
level or inside functions, except under `if TYPE_CHECKING:` (annotations only, never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"chattts_server": REPO / "server", "chattts_client": REPO / "client"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _graph() -> dict[str, set[str]]:
    files = {}
    for package, root in ROOTS.items():
        for path in (root / package).rglob("*.py"):
            if "_proto" in path.parts:
                continue  # generated
            files[_module_name(path, root)] = path
    return {
        module: {m for m in _imports(path, module, path.name == "__init__.py") if m in files}
        - {module}
        for module, path in files.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_graph_sees_the_packages() -> None:
    graph = _graph()
    assert "chattts_server.engine.runner" in graph["chattts_server.engine.engine"]
    assert "chattts_server.model.llama" in graph["chattts_server.engine.runner"]


def test_no_import_cycle_in_server_or_client() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_client_never_imports_the_server() -> None:
    graph = _graph()
    client = {m: deps for m, deps in graph.items() if m.startswith("chattts_client")}
    assert client and not {
        m for m, deps in client.items() if any("chattts_server" in d for d in deps)
    }
