"""The package layering: each package imports only from layers below it, and nothing imports in a
cycle (imports inside functions and under TYPE_CHECKING count: a lazy import does not hide one)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "opsched"

#: Lowest first. A module may import from its own layer only within its own package (the top
#: layer excepted: its modules use each other, without cycles).
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "errors _toposort _text timing progress timeline execution",
    "structure",
    "ir",
    "ops",
    "transforms",
    "frontends models",
    "schedule",
    "cost",
    "schedulers",
    "runtime",
    "backends",
    "api contenders costing request race report check compare module viz testing cli dynamo dynamo_admission "
    "dynamo_options dynamo_report schedule_cache "
    "buckets "
    "__init__ __main__",
))
TOP = len(LAYERS) - 1


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every opsched module ``path`` imports, anywhere in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("opsched"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import: up from this module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if not base.startswith("opsched"):
                continue
            for alias in node.names:  # ``from opsched import ops`` imports the submodule
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(package: str) -> int:
    for k, layer in enumerate(LAYERS):
        if package in layer:
            return k
    raise AssertionError(f"package {package!r} is in no layer: add it to LAYERS")


GRAPH = {m: _imports(p, _modules()) for m, p in _modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_each_module_imports_only_from_lower_layers(module: str) -> None:
    mine = _package(module)
    for imported in GRAPH[module]:
        theirs = _package(imported)
        if theirs == mine:
            continue
        assert _layer(theirs) < _layer(mine) or _layer(mine) == TOP, (
            f"{module} (layer {_layer(mine)}, {mine}) imports {imported} (layer {_layer(theirs)}, {theirs})")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, rest = stack[-1]
            for nxt in rest:
                if state.get(nxt) == 1:
                    return path[path.index(nxt):] + [nxt]
                if nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    path.append(nxt)
                    break
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    return None


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        mine = _package(module)
        packages.setdefault(mine, set()).update(_package(m) for m in imported if _package(m) != mine)
    assert _cycle(packages) is None, f"packages import each other in a cycle: {_cycle(packages)}"


def test_the_checker_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_package_and_its_ir_import_without_heavy_libraries() -> None:
    """``import opsched`` loads nothing (the CLI's --help and --version answer at once); the IR
    knows every op without ONNX, ONNX Runtime or matplotlib."""
    import subprocess
    import sys

    probe = ("import sys, opsched; before = set(sys.modules); import opsched.ir as ir; "
             "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'matplotlib') if m in before), "
             "sorted(m for m in ('onnx', 'onnxruntime', 'matplotlib') if m in sys.modules), "
             "'conv2d' in ir.registered_ops())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "[]", "True"]


_REFERENCE = re.compile(r":(?:mod|func|class|meth|attr|data|exc):`~?(\.*[\w.]+)`")


def _resolves(name: str) -> bool:
    """Whether the dotted ``name`` is a module of the package, or an attribute of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_cross_reference_in_the_docstrings_names_something_that_exists() -> None:
    """A docstring's ``:mod:``, ``:func:``, ``:class:``... reference to the package (absolute, or
    relative to the module's package) resolves: modules move, and a reference left behind sends
    a reader to nothing."""
    stale = []
    for module, path in _modules().items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target in _REFERENCE.findall(path.read_text()):
            if target.startswith("."):
                dots = len(target) - len(target.lstrip("."))
                target = ".".join(package.split(".")[:len(package.split(".")) - dots + 1] + [target.lstrip(".")])
            if target.startswith("opsched") and not _resolves(target):
                stale.append(f"{module}: {target}")
    assert stale == []


def test_the_reference_check_tells_a_stale_name_from_a_live_one() -> None:
    assert _resolves("opsched.schedulers.units.UnitGraph.build") and _resolves("opsched.ir")
    assert not _resolves("opsched.schedule.units") and not _resolves("opsched.ir.NoSuchThing")
