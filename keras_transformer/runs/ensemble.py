"""A run directory that holds an ensemble: RUN_DIR/members/NAME/ are ordinary runs (the full
en-de recipe trains three), decoded together as one `models.Ensemble`.

    run = open_run("runs/multi30k-en-de-full")   # a Run, or an EnsembleRun if it has members/
    model = run.load_model()                      # an Ensemble of the members' chosen weights

The members must share their vocabulary (the same pieces in the same order: runs that built
it from the same data with the same settings do); `vocabulary()` checks it and names the
member that differs. The ensemble's own files (summaries, hypotheses, decoding.json) live in
RUN_DIR; `EnsembleRun.member_directory(RUN_DIR, NAME)` is the one place that spells a member's
path.
"""

import pathlib

from keras_transformer.errors import RunError
from keras_transformer.runs.run import Run

MEMBERS = "members"


def member_directories(directory):
    """The member run directories under DIRECTORY/members, sorted by name ([] if none)."""
    folder = pathlib.Path(directory) / MEMBERS
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if (path / Run.CONFIG).is_file())


def open_run(directory):
    """`EnsembleRun` for a directory with member runs (and no config of its own), else `Run`."""
    directory = pathlib.Path(directory)
    members = [] if (directory / Run.CONFIG).is_file() else member_directories(directory)
    return EnsembleRun(directory, members) if members else Run(directory)


def open_single_run(directory, what):
    """`Run` of a directory for something that takes one model (`what`, e.g. "averaging");
    RunError naming a member to give instead when the directory is an ensemble."""
    return single_run(open_run(directory), what)


def single_run(run, what):
    """`run` itself, or RunError naming a member to give instead when it is an ensemble."""
    if isinstance(run, EnsembleRun):
        raise RunError(f"{run.directory} is an ensemble of {len(run.members)} models; {what} "
                       f"takes one: give a member, e.g. --run-dir {run.members[0].directory}.")
    return run


class EnsembleRun(Run):
    """A directory of member runs, used as one run for decoding, evaluation and SavedModel
    export. Training, averaging and checkpoints belong to the members."""

    def __init__(self, directory, members=None):
        """members: the member runs (`Run`s or their directories); default: those under
        DIRECTORY/members."""
        super().__init__(directory)
        self.members = [member if isinstance(member, Run) else Run(member)
                        for member in (members or member_directories(directory))]
        if not self.members:
            raise RunError(f"{self.directory} has no member runs under {MEMBERS}/.")

    def __repr__(self):
        return f"EnsembleRun({str(self.directory)!r}, {len(self.members)} members)"

    @staticmethod
    def member_directory(directory, name):
        """The directory of member `name` of the ensemble in `directory`
        (DIRECTORY/members/NAME), whether or not it exists yet."""
        name = str(name)
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"{name!r} is not a member name (a plain folder name).")
        return pathlib.Path(directory) / MEMBERS / name

    @property
    def config(self):
        """The first member's config (the members share data, languages and max_length)."""
        return self.members[0].config

    def is_run(self):
        return all(member.is_run() for member in self.members)

    def has_model(self):
        return all(member.has_model() for member in self.members)

    def vocabulary_bytes(self):
        return self.members[0].vocabulary_bytes()

    @property
    def tokenizer_path(self):
        return self.members[0].tokenizer_path

    def vocabulary(self):
        """The members' shared vocabulary; RunError names a member whose pieces differ."""
        if self._vocabulary is None:
            first = self.members[0].vocabulary()
            pieces = first.pieces()
            for member in self.members[1:]:
                if member.vocabulary().pieces() != pieces:
                    raise RunError(f"{member.directory} has another vocabulary than "
                                   f"{self.members[0].directory}: an ensemble's members must "
                                   "share one (the same pieces in the same order).")
            self._vocabulary = first
        return self._vocabulary

    def tokenizer(self):
        self.vocabulary()  # checked
        return self.members[0].tokenizer()

    def load_model(self, prefer_averaged=True, path=None):
        """The `Ensemble` of the members' models (each: averaged.keras if present, else
        model.keras)."""
        from keras_transformer.models import Ensemble

        if path is not None:
            raise RunError(f"{self.directory} is an ensemble: it has no single model file to "
                           f"load ({path}); choose each member's weights in its own run.")
        self.vocabulary()
        return Ensemble([member.load_model(prefer_averaged) for member in self.members])

    def save_decoding(self, **choices):
        """Saves the ensemble's decoding choices in its own directory (`Run.save_decoding`).
        It has no single model file: "model" must be absent or None (each member decodes with
        its own averaged.keras, else model.keras)."""
        if choices.get("model") is not None:
            raise RunError(f"{self.directory} is an ensemble: it has no single model file to "
                           f"choose ({choices['model']}); choose each member's weights in its "
                           "own run.")
        return super().save_decoding(**choices)

    def decoding_model_path(self):
        """None: an ensemble has no single model file (`load_model` loads each member's)."""
        return None

    def build_model(self):
        raise RunError(f"{self.directory} is an ensemble of trained runs: train its members.")
