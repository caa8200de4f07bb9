"""The layout's promises, read from the source: no import cycles, and one import direction.

Every ``import``/``from`` statement counts, including those under ``TYPE_CHECKING`` and inside
functions, because a cycle that only a type checker or a late import hides is still one that a
newcomer has to untangle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chaos_edge", "daemon", "chaosctl", "netprobe", "chaos_bench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Modules of ours that ``path`` imports (``from pkg import mod`` resolves to ``pkg.mod``)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] in PACKAGES}


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        # An import of a package counts as an import of its __init__; drop the importer's
        # own parent packages, which Python runs first anyway and which are not edges.
        deps = {m for m in _imports(path, name) if m in files and m != name}
        # Importing a.b.c runs a/__init__ and a/b/__init__ first: those are edges too.
        deps |= {p for d in deps for p in _parents(d) if p in files}
        graph[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def _edges(graph: dict[str, set[str]], src: str, dst: str) -> list[tuple[str, str]]:
    return [(a, b) for a, deps in graph.items() if _under(a, src) for b in deps if _under(b, dst)]


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(("src", "dst"), [
    ("netprobe", "daemon"), ("netprobe", "chaosctl"), ("netprobe", "chaos_edge"),
    ("daemon", "chaosctl"), ("daemon", "chaos_edge"),
    ("daemon.contracts", "daemon.agent"), ("daemon.contracts", "daemon.cluster"),
    ("daemon.cluster", "daemon.agent"),
    # The library in the training process shares only the contracts with chaosd.
    ("chaos_edge.trainer", "daemon.agent"), ("chaos_edge.trainer", "daemon.cluster"),
    ("chaos_edge.dataplane", "daemon.agent"), ("chaos_edge.dataplane", "daemon.cluster"),
    ("chaos_edge.replication", "daemon.agent"), ("chaos_edge.replication", "daemon.cluster"),
    ("chaos_edge.examples", "daemon.agent"), ("chaos_edge.examples", "daemon.cluster"),
    ("chaos_edge.dataplane", "chaos_edge.trainer"),
    ("chaos_edge.dataplane", "chaos_edge.replication"),
    ("chaos_edge.replication", "chaos_edge.trainer"),
    ("chaos_edge.replication.planning", "chaos_edge.replication.transfer"),
    # The framework adapters sit on top: the Trainer knows none of them.
    ("chaos_edge.trainer", "chaos_edge.lightning"), ("chaos_edge.trainer", "chaos_edge.hf"),
    ("chaos_edge.trainer", "chaos_edge.ddp"),
    # The benchmarks drive everything else; nothing of the product depends on them.
    ("netprobe", "chaos_bench"), ("daemon", "chaos_bench"), ("chaos_edge", "chaos_bench"),
    ("chaos_bench", "chaosctl.main"),
])
def test_import_direction(src: str, dst: str) -> None:
    assert _edges(_graph(), src, dst) == []


def test_cluster_logic_does_no_io() -> None:
    """The pure cluster logic imports no asyncio, sockets, MQTT or subprocesses."""
    banned = {"asyncio", "socket", "aiomqtt", "subprocess", "threading"}
    for path in (ROOT / "daemon" / "cluster").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom)}
        assert not names & banned, f"{path.name} imports {sorted(names & banned)}"


def test_only_the_chaosd_entry_point_of_chaos_edge_reaches_the_agent() -> None:
    """``chaos_edge.cli`` is the ``chaosd`` console script: it checks the ``daemon`` import
    name first (python-daemon clashes with it), then runs the agent. No other module of the
    library reaches into chaosd."""
    graph = _graph()
    wrong = [(a, b) for a, b in _edges(graph, "chaos_edge", "daemon")
             if b not in ("daemon", "daemon.contracts") and not b.startswith("daemon.contracts.")
             and a != "chaos_edge.cli"]
    assert wrong == []
    assert {b for a, b in _edges(graph, "chaos_edge.cli", "daemon")} <= {
        "daemon", "daemon.agent", "daemon.agent.main"}


def test_chaosctl_uses_only_the_contracts() -> None:
    """chaosctl is a client of the socket: of ours it needs only the contracts (and netprobe,
    for the testbed). The benchmarks are ``chaos_bench``, which ``chaosctl.main`` alone
    imports, and only its typer app, to add ``chaosctl bench``."""
    graph = _graph()
    wrong = [(a, b) for a, deps in graph.items() if _under(a, "chaosctl") for b in deps
             if not _under(b, "chaosctl") and not _under(b, "daemon.contracts")
             and b != "daemon" and not _under(b, "netprobe")
             and not (a == "chaosctl.main" and b in ("chaos_bench", "chaos_bench.cli"))]
    assert wrong == []
