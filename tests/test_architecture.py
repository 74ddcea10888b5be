"""The layer order of ``src/memfit`` (see docs/architecture.md), enforced.

Every import inside memfit points down the layers or stays inside its own package; no
two modules import each other, even through others and inside functions; no module
imports another module's ``_private`` name; no module is over 600 lines.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 600

# Lowest first. A module may import modules of its own package and of any lower layer.
# The packages named on one layer do not import each other; the base modules (layer 0)
# may, without cycles.
LAYERS: list[tuple[str, ...]] = [
    ("memfit._version", "memfit.errors", "memfit.exitcodes", "memfit.env", "memfit.checks",
     "memfit.sizes", "memfit.atomic", "memfit.workdir", "memfit.quiet", "memfit.device",
     "memfit.callable_package", "memfit.typed_json", "memfit.frameworks",
     "memfit.lifeline", "memfit.command_start"),
    ("memfit.memory",),
    ("memfit.data", "memfit.estimate"),
    ("memfit.report",),
    ("memfit.supervise", "memfit.share"),
    ("memfit.doctor",),
    ("memfit.cli", "memfit.__main__", "memfit"),
]


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in (SRC / "memfit").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _unit(module: str) -> tuple[int, str]:
    """(layer, unit): the unit is the package (or base module) the layer lists."""
    best = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and \
                    (best is None or len(name) > len(best[1])):
                best = (rank, name)
    if best is None:
        raise AssertionError(f"{module} is on no layer: add it to LAYERS and the docs")
    return (0, "base") if best[0] == 0 else best   # base modules may import each other


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every memfit import."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names
                      if a.name.split(".")[0] == "memfit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "memfit":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES or (SRC / sub.replace(".", "/")).with_suffix(".c").exists():
                    found.append((sub, None, node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
    return found


def _private_attributes(module: str) -> list[str]:
    """``other._name`` where ``other`` is a memfit module imported by this one."""
    bound = {}
    tree = ast.parse(MODULES[module].read_text())
    for target, name, _ in _imports(module):
        if name is None and target in MODULES:
            bound[target.rsplit(".", 1)[-1]] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.asname and f"{node.module}.{a.name}" in MODULES:
                    bound[a.asname] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound and node.attr.startswith("_") \
                and not node.attr.startswith("__") and bound[node.value.id] != module:
            found.append(f"{module}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t in MODULES} for m in MODULES}


def test_every_module_is_on_a_layer():
    for module in MODULES:
        _unit(module)


def _wrong_imports() -> list[str]:
    wrong = []
    for module in MODULES:
        rank, unit = _unit(module)
        for target, _, line in _imports(module):
            if target not in MODULES:
                continue
            to_rank, to_unit = _unit(target)
            if module in ("memfit", "memfit.__main__") or to_unit == unit or to_rank < rank:
                continue
            wrong.append(f"{module}:{line} imports {target} "
                         f"({'a layer up' if to_rank > rank else 'a sibling package'})")
    return wrong


def test_imports_point_down_the_layers():
    wrong = _wrong_imports()
    assert not wrong, "\n".join(wrong)


def _private_uses() -> list[str]:
    wrong = []
    for module in MODULES:
        for target, name, line in _imports(module):
            private_module = any(p.startswith("_") and p not in ("__main__", "_version")
                                 for p in target.split(".")[1:])
            private_name = name is not None and name.startswith("_") and name != "__version__"
            if (private_name or private_module) and target != module:
                wrong.append(f"{module}:{line} imports {target}"
                             + (f".{name}" if name else ""))
        wrong += _private_attributes(module)
    return wrong


def test_no_private_names_cross_modules():
    wrong = _private_uses()
    assert not wrong, "\n".join(wrong)


def _cycles() -> list[list[str]]:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:                  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_600_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: cut it by concept"


def test_docs_architecture_names_every_module():
    """docs/architecture.md is the one-page map: a new module goes on it."""
    import re

    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    missing = [m for m in MODULES if m.rsplit(".", 1)[-1] not in ("memfit", "__main__", "_version")
               and not re.search(rf"\b{re.escape(m.rsplit('.', 1)[-1])}\b", doc)]
    assert not missing, f"not on docs/architecture.md: {missing}"


def test_the_checker_sees_a_cycle_an_upward_import_and_a_private_name(tmp_path,
                                                                        monkeypatch):
    """The checks above can fail: a planted tree with each fault is caught."""
    root = tmp_path / "memfit"
    for package in ("memory", "supervise"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "memory" / "low.py").write_text(
        "def f():\n    from memfit.supervise import high\n    return high._hidden\n")
    (root / "supervise" / "high.py").write_text(
        "from memfit.memory import low\n_hidden = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    assert _wrong_imports() == ["memfit.memory.low:2 imports memfit.supervise.high (a layer up)"]
    assert _cycles() == [["memfit.memory.low", "memfit.supervise.high"]]
    assert _private_uses() == ["memfit.memory.low:3 uses memfit.supervise.high._hidden"]


MAX_MODULES = 10        # modules in one sub-package of data/, __init__ aside


def _shadowing_exports() -> list[str]:
    """``package.name`` bound in ``package/__init__.py`` to something that is not the
    module ``package.name``: ``import package.name as m`` would then give that object."""
    found = []
    for package, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:          # a lazy export (``__getattr__``) of a module's name
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                    for t in node.targets):
                for name in ast.literal_eval(node.value):
                    if f"{package}.{name}" in MODULES:
                        found.append(f"{package}:{node.lineno} exports {name!r}, the name "
                                     f"of the module {package}.{name}")
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                names = [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [(node.name, None)]
            else:
                continue
            for bound, source in names:
                if f"{package}.{bound}" in MODULES and source != f"{package}.{bound}":
                    found.append(f"{package}:{node.lineno} binds {bound!r} over the module "
                                 f"{package}.{bound}")
    return found


def test_no_export_shadows_a_module():
    wrong = _shadowing_exports()
    assert not wrong, "\n".join(wrong)


def test_no_sub_package_of_data_is_over_ten_modules():
    packages = {p.parent for m, p in MODULES.items() if m.startswith("memfit.data.")}
    crowded = {}
    for folder in packages:
        count = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
        if count > MAX_MODULES:
            crowded[str(folder.relative_to(SRC))] = count
    assert not crowded, f"split these by concept (at most {MAX_MODULES} modules): {crowded}"


def test_the_checker_sees_an_export_that_shadows_a_module(tmp_path, monkeypatch):
    root = tmp_path / "memfit"
    (root / "doctor").mkdir(parents=True)
    (root / "__init__.py").write_text("from memfit.doctor.checkup import doctor\n")
    (root / "doctor" / "__init__.py").write_text("from memfit.doctor import checkup\n")
    (root / "doctor" / "run.py").write_text("def doctor():\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    assert _shadowing_exports() == [
        "memfit:1 binds 'doctor' over the module memfit.doctor"]


def test_the_block_reader_is_built_from_its_plan():
    """The plan decides; the reader takes the manifest, its shards, the plan and
    ``on_corrupt`` (issue 25: it took 13 arguments and clamped the cycle again)."""
    path = MODULES["memfit.data.read.blocks.block_reader"]
    [init] = [f for c in ast.parse(path.read_text()).body
              if isinstance(c, ast.ClassDef) and c.name == "BlockReader"
              for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
    args = init.args
    count = len(args.posonlyargs + args.args + args.kwonlyargs) - 1   # self
    assert count <= 6, f"BlockReader takes {count} parameters: put the rest in its plan"
