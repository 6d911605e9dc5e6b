"""The packages' import graph: no module of server/ or client/ imports, directly or through
others, a module that imports it back (cycles make import order matter and hide layering);
`config` reaches nothing of `engine/` or `model/` (they import their defaults from it); and no
server module reads the environment when it is imported.

Imports are read from the source with `ast`: every `import` and `from ... import` at module
level or inside functions, except under `if TYPE_CHECKING:` (annotations only, never run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from chattts_devtools import launcher

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


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between a server's layers: each subpackage (`chattts_server.text`) and each
    top-level module (`chattts_server.config`) is one node."""

    def layer(module: str) -> str:
        return ".".join(module.split(".")[:2])

    layers: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if module.startswith("chattts_server."):
            node = layer(module)
            wanted = {layer(d) for d in deps if d.startswith("chattts_server.")}
            layers.setdefault(node, set()).update(wanted - {node})
    return layers


def test_no_import_cycle_between_packages() -> None:
    """Layers import downward only: text never imports engine, model never imports text..."""
    layers = _packages(_graph())
    assert {"chattts_server.text", "chattts_server.engine", "chattts_server.api"} <= set(layers)
    cycle = _cycle(layers)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle or [])


def test_the_package_graph_joins_modules_into_layers() -> None:
    graph = {
        "chattts_server.text.a": {"chattts_server.engine.b"},
        "chattts_server.engine.b": {"chattts_server.text.c"},
        "chattts_server.text.c": set(),
    }
    layers = _packages(graph)
    assert _cycle(layers) == [
        "chattts_server.engine",
        "chattts_server.text",
        "chattts_server.engine",
    ]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_client_never_imports_the_server() -> None:
    graph = _graph()
    client = {m: deps for m, deps in graph.items() if m.startswith("chattts_client")}
    assert client and not {
        m for m, deps in client.items() if any("chattts_server" in d for d in deps)
    }


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_config_reaches_nothing_of_engine_or_model() -> None:
    reached = _reachable(_graph(), "chattts_server.config")
    upward = sorted(
        m for m in reached if m.startswith(("chattts_server.engine", "chattts_server.model"))
    )
    assert not upward, f"config imports {upward}: move the default into config instead"


def test_the_reach_finder_follows_chains() -> None:
    assert _reachable({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}


# Imports every chattts_server module with os.environ reads recorded: a read whose nearest
# caller outside the standard library is a chattts_server file (Path.home() included) is one
# that module made at import. Reads by third-party packages they import are theirs.
_ENV_PROBE = textwrap.dedent(
    """
    import importlib, os, pkgutil, sys, sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    reads = []

    def record(key):
        frame = sys._getframe(2)
        while frame and (frame.f_code.co_filename.startswith((stdlib, "<frozen"))):
            frame = frame.f_back
        if frame and "/chattts_server/" in frame.f_code.co_filename:
            reads.append(f"{frame.f_code.co_filename}:{frame.f_lineno} reads {key!r}")

    environ = type(os.environ)
    getitem, iterate = environ.__getitem__, environ.__iter__

    def probed_getitem(self, key):
        record(key)
        return getitem(self, key)

    def probed_iter(self):
        record("*")
        return iterate(self)

    environ.__getitem__, environ.__iter__ = probed_getitem, probed_iter
    import chattts_server

    for info in pkgutil.walk_packages(chattts_server.__path__, "chattts_server."):
        importlib.import_module(info.name)
    print("\\n".join(reads) or "no reads")
    """
)


def test_no_server_module_reads_the_environment_at_import() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ENV_PROBE],
        env=launcher.server_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "no reads"
