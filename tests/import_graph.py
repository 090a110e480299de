"""The project's import graph, read from the source with `ast` (function-local imports included):
what tests/test_layout.py checks and docs/render_import_graph.py draws.

Packages are the stages of `cvae/` (data, model, sampling, training, evaluation, export), the
config package and the two leaf modules at its top (errors, limits) below everything, the
command line's package above everything, and `service/`, which sits above `cvae`'s stages and
below the command line that starts it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data", "model", "sampling", "training", "evaluation")
# Each package's level: a package may import its own level and those below, never above.
LEVELS = {"config": 0, "errors": 0, "limits": 0, "data": 1, "model": 2, "sampling": 3,
          "training": 4, "evaluation": 5, "export": 6, "service": 7, "cli": 8}


def module_paths() -> dict[str, Path]:
    """Dotted module name -> file, for every module of `cvae/` and `service/`."""
    modules = {}
    for package in ("cvae", "service"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_of(module: str) -> str:
    """cvae.data.idx -> data; cvae.config.sections -> config; cvae -> config (its light
    root); service.routes.classify -> service."""
    parts = module.split(".")
    if parts[0] == "service":
        return "service"
    return parts[1] if len(parts) > 1 else "config"


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project's modules that `path` imports anywhere in it, resolved to modules: `from cvae
    import config` is cvae.config, `from cvae.sampling.grid import make_grid` cvae.sampling.grid."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def module_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    paths = module_paths()
    return {module: imported_modules(path, set(paths)) - {module}
            for module, path in paths.items()}


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        source = package_of(module)
        graph.setdefault(source, set()).update(package_of(t) for t in targets)
        graph[source].discard(source)
    return graph
