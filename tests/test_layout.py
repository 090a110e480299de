"""The layout of docs/design.md: no module over 400 lines and no function over 80 in cvae/ and
service/, so every piece can be read in one sitting; and the stages imported in one direction
only, with no cycle (tests/import_graph.py reads the imports)."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import import_graph
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(path for package in ("cvae", "service") for path in (ROOT / package).rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_module_and_its_functions_are_within_the_size_limits(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}


# ---- the import graph: the stages in order, and no cycle ------------------------------------


def test_no_package_imports_one_above_it():
    """data < model < sampling < training < evaluation (config, errors and limits below them
    all; service above them; the CLI above everything), function-local imports included."""
    level = {module: import_graph.LEVELS[import_graph.package_of(module)]
             for module in import_graph.module_paths()}
    upward = sorted(f"{module} -> {target}"
                    for module, targets in import_graph.module_graph().items()
                    for target in targets if level[target] > level[module])
    assert upward == []


def test_packages_import_each_other_without_a_cycle():
    graph = import_graph.package_graph()
    assert set(graph) == set(import_graph.LEVELS)
    graphlib.TopologicalSorter(graph).static_order()  # raises CycleError naming the cycle


def test_modules_import_each_other_without_a_cycle():
    """No cycle among the modules of `cvae/` and `service/` either, function-local imports
    included (a cycle there is one a later refactor turns into an import error)."""
    graph = import_graph.module_graph()
    assert {"cvae.model.interface", "cvae.model.registry", "cvae.model.objectives"} <= set(graph)
    graphlib.TopologicalSorter(graph).static_order()  # raises CycleError naming the cycle


def test_the_component_registry_imports_no_component_and_no_jax_at_its_top():
    """The config reads the registry's names, so the registry stays light: components are
    imported by name when one is used (importlib), never by an import statement."""
    tree = ast.parse((ROOT / "cvae/config/components.py").read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import)
           for alias in node.names}
    top |= {node.module for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module}
    assert top <= {"__future__", "dataclasses", "importlib", "os", "typing",
                   "cvae.config.settings", "cvae.errors"}


def compared_component_names(path: Path) -> list[str]:
    """Comparisons (==, !=, in, not in) with a registered component's name as a literal."""
    from cvae.config import components

    names = {name for kind in components.KINDS for name in components.names(kind)}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [c.value for operand in operands
                    for c in (operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set))
                              else [operand]) if isinstance(c, ast.Constant)]
        if any(isinstance(value, str) and value in names for value in literals):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_code_outside_the_registry_compares_a_component_name():
    """A family, prior or likelihood is asked what it does (its class's attributes), never
    which one it is: `config.prior.name == "standard"` would leave a new prior out."""
    assert [hit for path in SOURCES for hit in compared_component_names(path)] == []


# ---- no caller asks which family it holds ------------------------------------------------------

# Names of model classes, today's and the deleted ones', that a caller could dispatch on.
FAMILY_CLASSES = ("Family", "OneLatent", "Ladder", "LadderCVAE", "CVAE")
# isinstance checks on a variable called `model` that are not about a family: a file or bytes.
NOT_A_FAMILY = {"bytes", "str", "Path", "os.PathLike"}


def family_dispatch(path: Path) -> list[str]:
    """`isinstance(..., <a family class>)`, `isinstance(model, ...)` other than a file's type
    check, and any mention of the deleted `uses_levers`, as `path:line: source`."""
    text = path.read_text()
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for number, line in enumerate(text.splitlines(), 1) if "uses_levers" in line]
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance" and len(node.args) == 2):
            continue
        subject, classes = node.args
        names = {ast.unparse(n) for n in (classes.elts if isinstance(classes, ast.Tuple)
                                          else [classes])}
        by_family = any(name.split(".")[-1] in FAMILY_CLASSES for name in names)
        on_model = ast.unparse(subject).split(".")[-1] == "model" and not names <= NOT_A_FAMILY
        if by_family or on_model:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_caller_asks_which_model_family_it_holds():
    """`grep -rn "isinstance(.*Ladder\\|isinstance(model\\|uses_levers" cvae service` finds
    nothing but a file's type check: every caller goes through the `Family` interface
    (cvae/model/interface.py), so a new family is one module and one registry line."""
    assert [hit for path in SOURCES for hit in family_dispatch(path)] == []


def test_the_family_dispatch_checker_finds_each_kind_of_dispatch(tmp_path, monkeypatch):
    """The checker sees what it looks for: a family class, a non-file check on `model`, the
    deleted lever switch; a file's type check on `model` (line 3) passes."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    source = tmp_path / "probe.py"
    source.write_text("if isinstance(model, hierarchical.LadderCVAE):\n    pass\n"
                      "ok = isinstance(model, bytes)\n"
                      "flag = isinstance(self.model, (OneLatent, int))\n"
                      "use = lever_losses.uses_levers(config)\n")
    assert [hit.split(":")[1] for hit in family_dispatch(source)] == ["5", "1", "4"]


def test_every_stage_is_a_package_with_a_light_init():
    """`__init__.py` files hold a docstring and import nothing, so importing one stage's module
    loads only what that module needs."""
    for package in ("cvae", *(f"cvae/{stage}" for stage in import_graph.STAGES)):
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        assert [type(node) for node in tree.body] == [ast.Expr], package


def test_cli_help_loads_no_jax():
    """`cvae --help` and every command's `--help` answer at once: nothing heavy is imported.
    `cvae train --help` is the exception: it lists every registered component's options,
    which are declared beside their code (and so import JAX)."""
    code = """
import contextlib, io, sys
from cvae.cli.main import main
for command in ([], ["data"], ["launch"], ["sample"], ["eval"], ["serve"], ["export"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([*command, "--help"])
heavy = ("jax", "jaxlib", "flax", "optax", "orbax", "numpy", "fastapi", "matplotlib")
print(sorted(name for name in sys.modules if name.split(".")[0] in heavy))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.strip() == "[]"


# ---- calls that read: keywords past the third value, and for every flag -----------------------


def positional_parameters(function: ast.FunctionDef) -> list[ast.arg]:
    return [arg for arg in function.args.posonlyargs + function.args.args
            if arg.arg not in ("self", "cls")]


def is_flag(arg: ast.arg, default: ast.expr | None) -> bool:
    return (isinstance(arg.annotation, ast.Name) and arg.annotation.id == "bool") or (
        isinstance(default, ast.Constant) and isinstance(default.value, bool))


def unreadable_signatures(tree: ast.Module) -> list[str]:
    """Module-level functions and methods taking more than three values positionally, or a
    flag positionally. Left out: functions defined inside others (jitted device programs and
    scan bodies, whose positional signature is the compiled program's) and jitted ones."""
    found = []

    def visit(body):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            if not isinstance(node, ast.FunctionDef) or any(
                    "jit" in ast.unparse(decorator) for decorator in node.decorator_list):
                continue
            params = positional_parameters(node)
            all_args = node.args.posonlyargs + node.args.args
            defaults = dict(zip(reversed([a.arg for a in all_args]), reversed(node.args.defaults)))
            flags = [a.arg for a in params if is_flag(a, defaults.get(a.arg))]
            if len(params) > 3 or (flags and len(params) > 1):
                found.append(f"{node.name}({', '.join(a.arg for a in params)})")

    visit(tree.body)
    return found


CVAE_SOURCES = [path for path in SOURCES if path.relative_to(ROOT).parts[0] == "cvae"]


@pytest.mark.parametrize("path", CVAE_SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_functions_take_flags_and_values_past_the_third_by_keyword(path):
    assert unreadable_signatures(ast.parse(path.read_text())) == []
