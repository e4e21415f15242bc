"""The package's floors: imports go one way, and only the run module spells a run's files."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keras_transformer"

# keras_transformer/<first part> -> floor. A module may import from its own floor and below.
FLOORS = {"errors": 1, "defaults": 1, "hardware": 1, "layers": 2,
          "models": 3, "runs": 4, "decoding": 5, "evaluation": 5, "training": 6, "export": 7,
          "tasks": 8, "cli": 9}


def modules(folder):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def imported(path):
    """Every module that `path` imports, at module level or inside functions."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def floor(path):
    part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    return part, FLOORS[part]


@pytest.mark.parametrize("path", [p for p in modules(PACKAGE) if p != PACKAGE / "__init__.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_floors(path):
    own, level = floor(path)
    for name in imported(path):
        parts = name.split(".")
        if parts[0] != "keras_transformer" or len(parts) < 2 or parts[1] not in FLOORS:
            continue
        assert FLOORS[parts[1]] <= level, f"{own} (floor {level}) imports {name}"


def test_pipelines_know_nothing_of_the_model():
    for path in modules(ROOT / "pipelines"):
        assert not [n for n in imported(path) if n.startswith("keras_transformer")], path


# A run's files and folders as path components, and temporary names.
RUN_FILES = re.compile(r"(^|/)(config\.json|model\.keras|averaged\.keras|checkpoints|vocab|"
                       r"scratch-worker-?|spm\.model)(/|$)|\.tmp")


def path_literals(path):
    """String constants that are not docstrings, help texts or messages (those name files for
    people): constants used in expressions that build values."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            prose.add(id(node.body[0].value))
        if isinstance(node, ast.keyword) and node.arg in ("help", "description", "epilog",
                                                             "default_text"):
            prose.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("print",) or \
                isinstance(node, ast.Raise) or (isinstance(node, ast.Call) and getattr(
                    node.func, "attr", None) in ("info", "warning", "error", "debug")):
            prose.update(id(n) for n in ast.walk(node))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in prose]


def test_only_the_run_module_names_a_runs_files():
    owners = {PACKAGE / "runs" / "run.py",
              ROOT / "pipelines" / "files.py"}  # the atomic writer names its temporaries
    for path in modules(PACKAGE) + modules(ROOT / "pipelines"):
        if path in owners:
            continue
        named = [text for text in path_literals(path) if RUN_FILES.search(text)]
        if path == ROOT / "pipelines" / "vocabulary.py":  # the vocabulary names its own file
            named = [text for text in named if text != "spm.model"]
        assert not named, f"{path.relative_to(ROOT)} names {named}"
