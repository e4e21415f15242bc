"""Training as events and listeners (training/events.py): the callbacks' order comes from what
each declares it needs and gives, the dev evaluations are judged once by their one owner, no
callback touches another (read from the modules' source, and held by none at run time), and a
run whose callbacks are given in another order is the same run (with the ordering turned off,
that test fails: the checkpoints then miss their step's evaluation)."""

import ast
import json
import pathlib
import random
import re

import keras
import pytest

from keras_transformer.training import events
from keras_transformer.training.events import Evaluations, in_order

TRAINING = pathlib.Path(events.__file__).parent


# -- The order -------------------------------------------------------------------------------

def run_callbacks():
    """Stand-ins with the declarations of the run's callbacks (their constructors need a run),
    and a user's callback, which declares nothing."""
    from keras_transformer.training.callbacks import (DevBleu, NanGuard, PeriodicCheckpoint,
                                                      Progress, StopAt, Validation)
    from keras_transformer.training.early_stopping import BestModel, EarlyStopping
    from keras_transformer.training.preemption import CheckpointOnSignal
    from keras_transformer.training.tensorboard import TensorBoardLog

    classes = (NanGuard, Validation, DevBleu, EarlyStopping, BestModel, StopAt,
               PeriodicCheckpoint, CheckpointOnSignal, TensorBoardLog, Progress)
    stand_ins = [type(cls.__name__, (), {"needs": getattr(cls, "needs", ()),
                                         "gives": getattr(cls, "gives", ())})()
                 for cls in classes]
    return stand_ins + [type("UsersCallback", (), {})()]


def check_order(ordered):
    for index, callback in enumerate(ordered):
        for topic in getattr(callback, "needs", ()):
            for later in ordered[index + 1:]:
                assert topic not in getattr(later, "gives", ()), (
                    f"{type(callback).__name__} needs {topic!r}, given later by "
                    f"{type(later).__name__}: {[type(c).__name__ for c in ordered]}")


def test_each_callback_runs_after_what_it_needs_whatever_the_order_given():
    callbacks = run_callbacks()
    rng = random.Random(0)
    for _ in range(300):
        given = rng.sample(callbacks, len(callbacks))
        ordered = in_order(given + [None])
        assert sorted(map(id, ordered)) == sorted(map(id, callbacks))
        check_order(ordered)
    names = [type(c).__name__ for c in in_order(callbacks)]
    assert names.index("NanGuard") < names.index("Validation") < names.index(
        "PeriodicCheckpoint") < names.index("CheckpointOnSignal")
    assert names.index("DevBleu") < names.index("PeriodicCheckpoint")


def test_independent_callbacks_keep_the_order_given_and_a_circle_is_refused():
    first, second, third = (type(name, (), {})() for name in ("First", "Second", "Third"))
    assert in_order([third, first, second]) == [third, first, second]
    producer = type("Producer", (), {"gives": ("x",)})()
    consumer = type("Consumer", (), {"needs": ("x",)})()
    assert in_order([consumer, first, producer]) == [first, producer, consumer]
    assert in_order([consumer]) == [consumer]  # nothing gives "x" here: no constraint
    a = type("A", (), {"needs": ("y",), "gives": ("x",)})()
    b = type("B", (), {"needs": ("x",), "gives": ("y",)})()
    with pytest.raises(ValueError, match="A, B"):
        in_order([a, b])


# -- The one owner of what the evaluations found ---------------------------------------------

def test_an_evaluation_is_judged_once_and_its_counters_resume_from_a_checkpoint():
    heard = []
    evaluations = Evaluations("loss", min_delta=0.1, every=10, train_steps=25)
    evaluations.listen(heard.append)
    first = evaluations.publish("loss", 10, {"val_loss": 3.0})
    assert (first.counted, first.improved) == (True, True)
    bleu = evaluations.publish("translation", 10, {"bleu": 1.0, "chrf": 2.0})
    assert (bleu.counted, bleu.improved) == (False, False)  # not the followed metric
    elsewhere = evaluations.publish("loss", 15, {"val_loss": 1.0})  # at a time limit
    assert not elsewhere.counted and evaluations.record.best == 3.0
    small = evaluations.publish("loss", 20, {"val_loss": 2.95})  # better by less than 0.1
    assert (small.counted, small.improved) == (True, False)
    assert evaluations.record.without_improvement == 1
    assert heard == evaluations.history == [first, bleu, elsewhere, small]

    resumed = Evaluations("loss", min_delta=0.1, every=10, train_steps=25)
    resumed.restore(json.loads(json.dumps(evaluations.state())))  # as a checkpoint holds it
    assert resumed.record == evaluations.record
    assert not resumed.owes(20) and resumed.owes(25)  # train_steps counts too
    owed = resumed.publish("loss", 25, {"val_loss": 2.0}, owed=True)
    assert (owed.counted, owed.improved, owed.owed) == (True, True, True)
    assert resumed.history == [] and resumed.record.best_step == 25
    resumed.stop(25)
    assert resumed.stopped and resumed.state()["early_stopping"]["stopped_step"] == 25


def test_a_resumed_run_makes_the_evaluation_it_owes_once_and_it_may_stop_the_run():
    evaluations = Evaluations("bleu", min_delta=0.0, every=5, train_steps=20)
    evaluations.restore({"early_stopping": {"best": 10.0, "best_step": 5,
                                            "without_improvement": 0, "evaluated_step": 5}})
    made = []
    assert not evaluations.catch_up(5, lambda: made.append(5))  # counted before the save
    assert not evaluations.catch_up(7, lambda: made.append(7))  # not an evaluation step
    assert made == []
    heard = []
    evaluations.listen(heard.append)
    evaluations.listen(lambda e: e.counted and not e.improved and evaluations.stop(e.step))
    assert evaluations.catch_up(10, lambda: {"bleu": 9.0, "chrf": 30.0})
    assert [(e.step, e.kind, e.counted, e.improved, e.owed) for e in heard] == [
        (10, "translation", True, False, True)]
    assert evaluations.history == [] and evaluations.record.evaluated_step == 10
    assert evaluations.latest("translation", 10) is None  # owed: not this process's history
    assert not evaluations.catch_up(15, lambda: made.append(15)) and made == []  # stopped


# -- No callback touches another (the source) ------------------------------------------------

def _trees(folder):
    return {path.name: ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(folder.glob("*.py"))}


def _callback_classes(trees):
    """{name: ClassDef} of the Keras callbacks defined in the modules."""
    classes = {node.name: node for tree in trees.values() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)}
    found, grown = {}, True
    while grown:
        grown = False
        for name, node in classes.items():
            bases = {ast.unparse(base) for base in node.bases}
            if name not in found and (bases & {"keras.callbacks.Callback", "Callback"}
                                      or bases & set(found)):
                found[name], grown = node, True
    return found


def _elements(node):
    """The names an expression hands over as callbacks: a list's, a tuple's, a starred or
    conditional value's, a comprehension's source and `in_order`'s argument."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return set().union(*map(_elements, node.elts)) if node.elts else set()
    if isinstance(node, ast.Starred):
        return _elements(node.value)
    if isinstance(node, ast.BinOp):
        return _elements(node.left) | _elements(node.right)
    if isinstance(node, ast.IfExp):
        return _elements(node.body) | _elements(node.orelse)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return set().union(*(_elements(g.iter) for g in node.generators))
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("in_order") and node.args:
        return _elements(node.args[0])
    return set()


def _callback_names(trees, callbacks):
    """The names that hold a callback in the modules: those bound to a callback's
    construction or put in a list of callbacks, and, in each callback class, the constructor
    parameters such a name is handed to. Returns (names anywhere, {class: its parameters})."""
    names, parameters = set(), {name: set() for name in callbacks}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                made = [v for v in ([value.body, value.orelse] if isinstance(value, ast.IfExp)
                                    else [value]) if isinstance(v, ast.Call)
                        and ast.unparse(v.func) in callbacks]
                listed = any(isinstance(t, ast.Name) and t.id == "callbacks" for t in targets)
                if made:
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
                if listed:
                    names |= _elements(value)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "append" and ast.unparse(node.func.value) == "callbacks"):
                names |= _elements(node.args[0])
    for _ in range(3):  # handed on: a callback's parameter given a callback
        for tree in trees.values():
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
                cls = callbacks.get(ast.unparse(call.func))
                init = cls and next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                                     and f.name == "__init__"), None)
                if init is None:
                    continue
                params = [a.arg for a in init.args.args[1:]]
                given = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords]
                for param, value in given:
                    if _elements(value) & names:
                        parameters[cls.name].add(param)
    return names, parameters


def callbacks_touching_others(folder):
    """'Class.method: what' for every place a callback class of `folder` names another
    callback class (isinstance, a constructor: anything but its bases) or reads or writes an
    attribute of a value that holds another callback."""
    trees = _trees(folder)
    callbacks = _callback_classes(trees)
    names, parameters = _callback_names(trees, callbacks)
    found = []
    for cls in callbacks.values():
        held = names | parameters[cls.name]
        for method in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            for node in ast.walk(method):
                where = f"{cls.name}.{method.name}: {ast.unparse(node)}"
                if isinstance(node, ast.Name) and node.id in callbacks:
                    found.append(where)
                elif isinstance(node, ast.Attribute):
                    base = node.value
                    holder = (base.id if isinstance(base, ast.Name) and base.id != "self" else
                              base.attr if isinstance(base, ast.Attribute)
                              and ast.unparse(base.value) == "self" else None)
                    if holder in held:
                        found.append(where)
    return found


def test_no_callback_reads_or_writes_another_callbacks_attributes():
    assert len(_callback_classes(_trees(TRAINING))) >= 10  # the walk finds them
    assert callbacks_touching_others(TRAINING) == []


def test_the_walk_finds_a_callback_that_reads_another(tmp_path):
    (tmp_path / "mine.py").write_text('''
import keras

class Evaluator(keras.callbacks.Callback):
    pass

class Follower(keras.callbacks.Callback):
    def __init__(self, evaluator):
        self.evaluator = evaluator

    def on_epoch_end(self, epoch, logs=None):
        print(self.evaluator.last)

class Finder(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        return [c for c in self.model.callbacks if isinstance(c, Evaluator)]

def make():
    evaluator = Evaluator()
    callbacks = [evaluator, Follower(evaluator), Finder()]
    return callbacks
''', encoding="utf-8")
    found = callbacks_touching_others(tmp_path)
    assert any(f.startswith("Follower.on_epoch_end: self.evaluator.last") for f in found)
    assert any(f.startswith("Finder.on_train_begin") and "Evaluator" in f for f in found)


# -- The same run in any order ---------------------------------------------------------------

class BatchLosses(keras.callbacks.Callback):
    """A user's callback: the loss after every batch."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def held_callbacks(callback):
    """The other callbacks `callback` holds (its attributes, their items, bound methods)."""
    values = []
    for value in vars(callback).values():
        values += list(value.values()) if isinstance(value, dict) else (
            list(value) if isinstance(value, (list, tuple, set)) else [value])
    values = [getattr(v, "__self__", v) for v in values]
    return [v for v in values if isinstance(v, keras.callbacks.Callback) and v is not callback
            and type(v).__name__ != "History"]


def trained(config, monkeypatch, capsys, reverse):
    """(batch losses, printed lines without timings, checkpoints' states, best.json, the
    summary's stop, the order) of a run whose callbacks are handed to the ordering in the
    trainer's order or reversed."""
    from keras_transformer.training import trainer

    given = []

    def shuffled(callbacks):
        callbacks = [c for c in callbacks if c is not None]
        if reverse:  # each callback before what it needs, a user's first
            callbacks = callbacks[::-1]
        ordered = events.in_order(callbacks)
        given.append(ordered)
        return ordered

    monkeypatch.setattr(trainer, "in_order", shuffled)
    losses = BatchLosses()
    summary = trainer.train(config, callbacks=[losses])
    out = capsys.readouterr().out
    for callback in given[0]:
        assert held_callbacks(callback) == [], type(callback).__name__
    run_dir = pathlib.Path(summary["run_dir"])
    lines = [line.replace(str(run_dir), "RUN") for line in out.splitlines()
             if re.match(r"step \d+:|early stopping", line)]
    states = {path.name: {k: v for k, v in json.loads(path.read_text()).items()
                          if k in ("step", "data_position", "state")}
              for path in sorted((run_dir / "checkpoints").glob("ckpt-*.json"))}
    best = json.loads((run_dir / "best.json").read_text())
    return losses.losses, lines, states, best, summary["stopped"], [type(c).__name__
                                                                     for c in given[0]]


@pytest.mark.slow  # two short trainings of the runtime preset (~1 minute on 2 cores)
def test_a_run_with_its_callbacks_given_in_another_order_is_the_same_run(
        toy_corpus, runtime_preset, tmp_path, monkeypatch, capsys):
    """Early stopping on dev BLEU every 5 steps, the dev loss every 10, a checkpoint every 5:
    the checkpoints hold the counters of their step's evaluation only if the ordering put the
    evaluations before them (given reversed, without the ordering, they do not). The user's
    callback runs in both: the losses of every batch are the same."""
    from tests.conftest import toy_config

    settings = dict(train_steps=100, eval_steps=10, checkpoint_steps=5, bleu_steps=5,
                    early_stopping_metric="bleu", early_stopping_patience=2,
                    early_stopping_min_delta=50.0, keep_checkpoints=100,
                    num_layers=1)  # one layer each side: half the graph each run traces
    first = trained(toy_config(toy_corpus, tmp_path / "given", **settings), monkeypatch,
                    capsys, reverse=False)
    second = trained(toy_config(toy_corpus, tmp_path / "reversed", **settings), monkeypatch,
                     capsys, reverse=True)
    assert first[-1] != second[-1]  # the order differs
    assert "BatchLosses" in first[-1] and len(first[0]) == 15
    assert first[:-1] == second[:-1]
    losses, lines, states, best, stopped, _ = first
    assert stopped == "early stopping: no improvement of dev bleu in 2 evaluations"
    assert any(line.startswith("early stopping at step 15") for line in lines), lines
    assert states["ckpt-15.json"]["state"]["early_stopping"]["stopped_step"] == 15
    assert states["ckpt-10.json"]["state"]["early_stopping"]["evaluated_step"] == 10
    assert best["step"] == 5 and best["metric"] == "bleu"
