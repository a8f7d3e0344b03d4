"""Imports point down: frontend -> runtime -> (schedule, lower, codegen) -> (ir, kir), with
options importable from anywhere. Parsed from the source (lazy imports inside functions count)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pyfuser"

# Layer of each top-level part of the package. The application layer (the package's __init__,
# the CLI, explain, the catalogue, benchmarks, test helpers) sits on top and may import anything.
APP = "app"
ALLOWED = {
    # importer: the parts it may import (besides itself)
    "frontend": {"runtime", "schedule", "lower", "codegen", "ir", "kir", "options"},
    "runtime": {"schedule", "lower", "codegen", "ir", "kir", "options"},
    "schedule": {"ir", "kir", "options"},          # device properties come from a table, not
                                                   # from the runtime
    "lower": {"ir", "kir", "options"},
    "codegen": {"ir", "kir", "options"},
    "kir": {"ir", "options"},
    "ir": {"options"},
    "options": set(),
}
LAYERED = set(ALLOWED)

# Edges that break the table today, each with the way out. The test fails on any other edge, and
# also when one of these disappears (then delete it here).
KNOWN_VIOLATIONS: set = set()


def _part(module: str) -> str:
    """'pyfuser.ir.tensor' -> 'ir'; the root package and top-level app modules -> 'app'."""
    parts = module.split(".")
    assert parts[0] == "pyfuser", module
    if len(parts) == 1:
        return APP
    return parts[1] if parts[1] in LAYERED else APP


def _module_name(path: Path, pkg: Path = PKG) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, pkg: Path = PKG):
    """(line, imported module, names) for every pyfuser import in the file, relative ones
    resolved."""
    module = _module_name(path, pkg)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "pyfuser" or a.name.startswith("pyfuser."):
                    yield node.lineno, a.name, [], tree
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "pyfuser" or target.startswith("pyfuser."):
                yield node.lineno, target, [a.name for a in node.names], tree


def _root_attribute_uses(tree) -> set:
    """Attributes read from a bare `import pyfuser` (pyfuser.X and getattr(pyfuser, "X"))."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "pyfuser":
            out.add(n.attr)
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "pyfuser"):
            out.add(n.args[1].value if isinstance(n.args[1], ast.Constant) else "?")
    return out


def _edges(pkg: Path = PKG):
    for path in sorted(pkg.rglob("*.py")):
        src = _part(_module_name(path, pkg))
        for line, target, names, tree in _imports(path, pkg):
            if target == "pyfuser":
                subs = [n for n in names if (pkg / n).is_dir() or (pkg / f"{n}.py").exists()]
                if names and len(subs) == len(names):
                    for n in subs:
                        yield path, line, src, _part(f"pyfuser.{n}"), f"pyfuser.{n}"
                    continue
                # The root package itself: only its metadata (__version__) is no upward edge.
                used = set(names) if names else _root_attribute_uses(tree)
                if used and used <= {"__version__"}:
                    continue
                yield path, line, src, APP, f"pyfuser ({', '.join(sorted(used)) or '?'})"
                continue
            yield path, line, src, _part(target), target


def test_every_module_is_parsed():
    files = list(PKG.rglob("*.py"))
    assert len(files) > 30
    parts = {_part(_module_name(p)) for p in files}
    assert {"frontend", "runtime", "schedule", "ir", "kir", "lower", "codegen", "options",
            APP} <= parts


def test_imports_point_down():
    bad, known = [], set()
    for path, line, src, dst, target in _edges():
        if src == APP or dst == src:
            continue
        if dst not in ALLOWED[src]:
            rel = str(path.relative_to(PKG.parent))
            if (rel, target) in KNOWN_VIOLATIONS:
                known.add((rel, target))
                continue
            bad.append(f"{rel}:{line}: {src} imports {target} ({dst})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)
    assert known == KNOWN_VIOLATIONS, f"fixed, remove from KNOWN_VIOLATIONS: {KNOWN_VIOLATIONS - known}"


def test_the_walker_resolves_imports():
    # A guard that the walker really resolves relative imports: the runtime does import the IR.
    edges = {(src, dst) for _, _, src, dst, _ in _edges()}
    assert ("runtime", "ir") in edges and ("frontend", "ir") in edges
    assert ("schedule", "ir") in edges and ("kir", "ir") in edges
    assert not any(src == "schedule" and dst == "runtime" for src, dst in edges)
    assert not any(src == "ir" and dst not in ("ir", "options") for src, dst in edges)


def test_the_checker_sees_violations(tmp_path):
    pkg = tmp_path / "pyfuser"
    files = {
        "__init__.py": "from .frontend import x\n",
        "options.py": "",
        "ir/__init__.py": "def f():\n    from ..runtime import inputs\n",
        "schedule/a.py": "from pyfuser.runtime.device import props\n",
        "runtime/__init__.py": "",
        "runtime/k.py": "import pyfuser\nv = getattr(pyfuser, '__version__', '0')\n",
        "runtime/bad.py": "import pyfuser\nfd = pyfuser.FusionDefinition\n",
        "kir/n.py": "from .. import options, ir\nfrom ..schedule import a\n",
        "frontend/__init__.py": "from .. import runtime\nfrom ..ir import y\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    edges = {(p.relative_to(tmp_path).as_posix(), src, dst) for p, _, src, dst, _ in _edges(pkg)}
    assert ("pyfuser/ir/__init__.py", "ir", "runtime") in edges
    assert ("pyfuser/schedule/a.py", "schedule", "runtime") in edges
    assert ("pyfuser/runtime/bad.py", "runtime", APP) in edges
    assert not any(p == "pyfuser/runtime/k.py" for p, _, _ in edges)  # __version__ only
    assert {("pyfuser/kir/n.py", "kir", d) for d in ("options", "ir", "schedule")} <= edges
    assert ("pyfuser/frontend/__init__.py", "frontend", "runtime") in edges
    assert ("pyfuser/__init__.py", APP, "frontend") in edges
    bad = {(p, s_, d) for p, s_, d in edges if s_ != APP and d != s_ and d not in ALLOWED[s_]}
    assert bad == {("pyfuser/ir/__init__.py", "ir", "runtime"),
                   ("pyfuser/schedule/a.py", "schedule", "runtime"),
                   ("pyfuser/runtime/bad.py", "runtime", APP),
                   ("pyfuser/kir/n.py", "kir", "schedule")}
