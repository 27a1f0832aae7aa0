"""The package's shape (issue #14): imports run one way, and what ``analyze`` and the
agent run never loads the generator, the fake NVML or the Grafana generator."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ncclscope"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, type-only imports included."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]  # fmt: skip
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    edges = _graph()
    assert "ncclscope.model" in edges
    assert "ncclscope.detect.context" in edges
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The pipeline's layers, top to bottom: a module may import its own layer and those
#: below it, never one above.
_LAYERS = [
    ("ncclscope.agent", "ncclscope.agent_cli", "ncclscope.cli", "ncclscope.synth"),
    ("ncclscope.export",),
    ("ncclscope.analysis",),
    ("ncclscope.diagnose",),
    ("ncclscope.detect",),
    ("ncclscope.model",),
    ("ncclscope.parsers", "ncclscope.sources"),
]


def _layer(module: str) -> int | None:
    for k, prefixes in enumerate(_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return k
    return None  # shared leaves: schema, units, findings, catalog


def test_imports_run_one_way_down_the_pipeline() -> None:
    upward = []
    for module, targets in _graph().items():
        here = _layer(module)
        for target in targets:
            there = _layer(target)
            if here is not None and there is not None and there < here:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert _layer("ncclscope.parsers.nccl.scan") == len(_LAYERS) - 1
    assert _layer("ncclscope.model.identity") < _layer("ncclscope.parsers.nccl.scan")  # type: ignore[operator]
    assert _layer("ncclscope.schema") is None


def test_analyze_and_the_agent_never_load_the_tooling() -> None:
    code = (
        "import sys, ncclscope.cli, ncclscope.agent_cli, ncclscope.analysis, "
        "ncclscope.agent.run, ncclscope.agent.live, ncclscope.export.json_report, "
        "ncclscope.export.text_report, ncclscope.export.html_report\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('ncclscope'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "ncclscope.analysis" in loaded
    tooling = [m for m in loaded if "synth" in m or "fake_nvml" in m or "grafana" in m]
    assert tooling == []


def test_no_module_is_over_a_thousand_lines() -> None:
    sizes = {_module(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 50
    assert {m: n for m, n in sizes.items() if n > 1000} == {}
