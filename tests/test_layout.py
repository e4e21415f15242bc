"""The package's floors: imports go one way, and only the run module spells a run's files."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keras_transformer"

# keras_transformer/<first part> -> floor. A module may import from its own floor and below.
# The package's face (keras_transformer/__init__.py) stands on training's floor: it names and
# registers the saveable classes of layers, models and training.
FLOORS = {"errors": 1, "defaults": 1, "dimensions": 1, "hardware": 1, "layers": 2,
          "models": 3, "runs": 4, "decoding": 5, "evaluation": 5, "training": 6, "__init__": 6,
          "export": 7, "tasks": 8, "serving": 8, "cli": 9}
# A string that is a whole module name is one that importlib may load (a lazy attribute's
# table, say): it counts as an import.
MODULE_NAME = re.compile(r"(keras_transformer|pipelines)(\.\w+)+")


def is_module(name):
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def modules(folder):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def imported(path):
    """Every module that `path` imports, at module level or inside functions, by an import
    statement or by name (a string that importlib may load)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module != "keras_transformer":  # (the face's names: each one below)
                names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                MODULE_NAME.fullmatch(node.value) and is_module(node.value):
            names.append(node.value)
    return names


def floor(path):
    part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    return part, FLOORS[part]


@pytest.mark.parametrize("path", modules(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_floors(path):
    own, level = floor(path)
    for name in imported(path):
        parts = name.split(".")
        if parts[0] != "keras_transformer":
            continue
        # `import keras_transformer`, or a name of the face (not a folder or module of a floor)
        to = parts[1] if len(parts) > 1 and parts[1] in FLOORS else "__init__"
        assert FLOORS[to] <= level, f"{own} (floor {level}) imports {name}"


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


# decoding/'s rooms, in the order they may import each other (`keras_transformer.decoding`);
# its face (decoding/__init__.py) names the request, the engines and the decoder.
DECODING_FLOORS = {"request": 1, "search": 2, "engines": 3, "decoder": 4, "__init__": 4,
                   "jobs": 5}
DECODING = PACKAGE / "decoding"


@pytest.mark.parametrize("path", modules(DECODING), ids=lambda p: str(p.relative_to(ROOT)))
def test_decodings_rooms_import_down_only(path):
    room = path.relative_to(DECODING).parts[0].removesuffix(".py")
    level = DECODING_FLOORS[room]
    for name in imported(path):
        parts = name.split(".")
        if parts[:2] != ["keras_transformer", "decoding"] or len(parts) < 3:
            continue
        assert DECODING_FLOORS[parts[2]] <= level, f"decoding/{room} imports {name}"


def calls(path):
    """(function name, line) of every call in `path` (the last part of a dotted name; calls
    into the ctranslate2 package itself left out: its own Translator is not our engine)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "ctranslate2":
                continue
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            yield name, node.lineno


def test_engines_are_built_in_decoding_only_and_the_choice_has_one_writer():
    engines = {"Translator", "CTranslate2Translator", "from_request"}
    for path in modules(PACKAGE) + modules(ROOT / "benchmarks"):
        inside = DECODING in path.parents
        for name, line in calls(path):
            if name in engines and not inside:
                raise AssertionError(f"{path.relative_to(ROOT)}:{line} builds an engine "
                                     f"({name}): go through decoding.decoder.Decoder")
            if name == "save_decoding" and path not in (DECODING / "decoder.py",
                                                        PACKAGE / "runs" / "ensemble.py"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{line} writes decoding.json: "
                                     "go through Decoder.save_choice")


def test_no_private_state_read_across_modules_and_no_argparse_internals():
    for path in modules(PACKAGE):
        text = path.read_text(encoding="utf-8")
        assert "_actions" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                owner = getattr(node.value, "id", None)
                assert owner in ("self", "cls"), \
                    f"{path.relative_to(ROOT)}:{node.lineno} reads {owner}.__dict__"
