"""The main job's recipes, as data: the settings of the quick and the full run, their changes
for one target language, the full en-de ensemble's members, and the quick recipe scaled for
several targets (`tasks/main_job.py` runs them)."""

import dataclasses

from keras_transformer.defaults import MAX_LENGTH, TRAIN_TOKENS_PER_BATCH, VOCAB_SIZE

# Settings both recipes share. Checkpoints by steps only (the minutes' clock never fires), so
# that the averaging candidates are evenly spaced.
COMMON = dict(dataset="multi30k", tokens_per_batch=TRAIN_TOKENS_PER_BATCH,
              max_length=MAX_LENGTH, eval_steps=500, checkpoint_minutes=10_000,
              checkpoint_steps=100)
# The recipe: the `multi30k` preset (3 layers, d_model 256, d_ff 1024, 4 heads, P_drop 0.2;
# 7.6M parameters with 8000 shared pieces) and the paper's schedule with warmup 800. The quick
# run trains it with 2 layers (5.7M parameters) and no dropout; the full run with P_drop 0.3,
# and en-fr keeps the 0.2 it was measured with.
RECIPE = dict(COMMON, preset="multi30k", vocab_size=VOCAB_SIZE, warmup_steps=800)
QUICK = dict(RECIPE, num_layers=2, dropout=0.0, train_steps=1200, keep_checkpoints=10)
FULL = dict(RECIPE, dropout=0.3, train_steps=5500, keep_checkpoints=40)
FULL_BY_TARGET = {"fr": dict(dropout=0.2)}  # changes to FULL for one target language
# The full en-de recipe decodes an ensemble of three models (the mean of their next-token
# probabilities, `models.Ensemble`), trained one after the other with FULL's settings and these
# changes. en-fr stays one model.
ENSEMBLE_BY_TARGET = {"de": (("l3-d0.3", {}), ("l3-d0.2", dict(dropout=0.2)),
                             ("l2-d0.1", dict(num_layers=2, dropout=0.1)))}
VAL, TEST = ("dev", "val"), ("test", "test2016")  # (split, the name its files and figures use)


def _targets(tgt_lang):
    return [tgt_lang] if isinstance(tgt_lang, str) else list(tgt_lang)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One of the job's recipes: its settings, their changes for one target language, the
    ensembles it trains for a target, what one pair evaluates (several pairs: test2016), and
    whether it has a recipe for several targets (its own, scaled by their number)."""
    mode: str
    settings: dict
    by_target: dict
    ensembles: dict
    splits: tuple
    scales: bool

    def members(self, targets):
        """[(name, settings)] of the models it trains into `targets` (see `members`)."""
        if len(targets) > 1:
            if not self.scales:
                from keras_transformer.errors import ConfigError

                raise ConfigError(f"--{self.mode} has no multilingual recipe yet: leave it "
                                  "out (the quick recipe, times the number of pairs).")
            scale = len(targets)
            return [(None, dict(self.settings, tgt_lang=list(targets),
                                train_steps=self.settings["train_steps"] * scale,
                                checkpoint_steps=self.settings["checkpoint_steps"] * scale,
                                eval_steps=self.settings["eval_steps"] * scale))]
        settings = dict(self.settings, **self.by_target.get(targets[0], {}))
        ensemble = self.ensembles.get(targets[0], ())
        return [(name, dict(settings, **changes)) for name, changes in ensemble] or [
            (None, settings)]


# The recipes, by `full`.
RECIPES = (Recipe("quick", QUICK, {}, {}, (TEST,), scales=True),
           Recipe("full", FULL, FULL_BY_TARGET, ENSEMBLE_BY_TARGET, (VAL, TEST), scales=False))


def recipe(full=False, tgt_lang="de"):
    """The settings the job trains with: QUICK, or FULL with its changes for `tgt_lang`; for
    several targets (a list), the quick recipe with its steps, checkpoints and evaluations
    scaled by their number. (An ensemble's first member trains with these very settings.)"""
    return members(full, tgt_lang)[0][1]


def members(full=False, tgt_lang="de"):
    """[(name, settings)] of the models the job trains: [(None, recipe)] for one model (trained
    in the run directory itself), or the full recipe's ensemble members for `tgt_lang`."""
    return RECIPES[full].members(_targets(tgt_lang))
