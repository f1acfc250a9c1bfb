"""The package's layering, read from the source (ast; imports inside functions count): each
layer imports only itself and the layers below it, no module imports itself back through
others, and every kernel family that has variants has its package under elman/families/."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from book_pages import ROOT
from elman import registry
from elman.core.entry import FAMILIES

PACKAGE = ROOT / "lib" / "elman"

# layer -> the layers it may import (itself included); `elman` is the package's entry
# points (__init__, __main__, cli), which may import anything.
ALLOWED = {
    "core": {"core"},
    "families": {"core", "families"},
    "variants": {"core", "families", "variants"},
    "baselines": {"core", "baselines"},
    "registry": {"core", "variants", "baselines", "registry"},
    "harness": {"core", "families", "variants", "baselines", "registry", "harness"},
    "training": {"core", "registry", "training"},
    "results": {"core", "results"},
}
ENTRY_POINTS = {"elman", "elman.__main__", "elman.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The elman modules `name` imports, anywhere in its source (module level or lazily)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import mod` imports the module pkg.mod where there is one
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != name:
                found.add(t)
    return found


def layer(name: str) -> str:
    if name in ENTRY_POINTS:
        return "elman"
    return name.split(".")[1]


MODULES = modules()
GRAPH = {n: imports(n, p, set(MODULES)) for n, p in MODULES.items()}


def test_every_module_has_a_layer():
    unknown = sorted(n for n in MODULES if layer(n) not in ALLOWED and layer(n) != "elman")
    assert not unknown, f"modules outside the layers {sorted(ALLOWED)}: {unknown}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer(n) in ALLOWED))
def test_imports_point_down(name: str):
    wrong = sorted(t for t in GRAPH[name]
                   if layer(t) != "elman" and layer(t) not in ALLOWED[layer(name)]
                   or layer(t) == "elman" and t != "elman")
    assert not wrong, (f"{name} ({layer(name)}) imports {wrong}; {layer(name)} may import "
                       f"only {sorted(ALLOWED[layer(name)])}")


def test_no_import_cycles():
    """Depth-first search over the module graph; a back edge is a cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for t in sorted(GRAPH[n]):
            if t == "elman":  # the package's own __init__ imports nothing
                continue
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(MODULES):
        if n not in state:
            cycle = visit(n)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_families_with_variants_have_a_package():
    used = {e.family for e in registry.variants()}
    assert used <= set(FAMILIES)
    for family in sorted(used):
        assert (PACKAGE / "families" / family / "__init__.py").is_file(), \
            f"variants of family {family!r} are registered, but elman/families/{family}/ is missing"


def test_the_graph_is_read():
    """The parser sees the imports it must see (a guard against a test that checks nothing)."""
    assert "elman.core.entry" in GRAPH["elman.registry"]
    assert "elman.families.dense.op" in GRAPH["elman.variants.e1"]
    assert "elman.core.layer" in GRAPH["elman.variants.e0"]
