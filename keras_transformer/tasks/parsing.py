"""English constituency parsing as translation (paper Section 6.3): sentence -> linearized tree.

    parser = Parser.from_run("runs/ptb-parse")          # beam 21, alpha 0.3, input + 300
    parser.parse(["The dog runs ."])                     # -> [Tree(...)]
    evaluate_run("runs/ptb-parse", "test")              # EVALB-convention F1 on the test files

Training uses the ordinary translation path (`keras-transformer train --dataset ptb`), with the
tree tokens ("(NP", ")NP", POS tags) as single vocabulary pieces. Output that is not a
well-formed tree is repaired deterministically (`pipelines.treebank.delinearize`).
"""

from keras_transformer.decoding.translate import Translator
from keras_transformer.defaults import PARSING
from keras_transformer.runs import Run
from keras_transformer.tasks import evalb
from pipelines import treebank


class Parser:
    """Parses whitespace-tokenized sentences with a model trained on linearized trees."""

    def __init__(self, translator):
        self.translator = translator

    @classmethod
    def from_run(cls, run, model_file=None, beam_size=PARSING.beam_size, alpha=PARSING.alpha,
                 batch_size=PARSING.batch_size):
        """A parser of a run (a `Run` or its directory) trained on dataset "ptb"."""
        # float32: bf16 parsing has not been measured against the trees' F1.
        translator = Translator.from_run(run, model_file, beam_size=beam_size, alpha=alpha,
                                         batch_size=batch_size,
                                         extra_length=PARSING.extra_length,
                                         precision="float32")
        return cls(translator)

    def parse(self, sentences, progress=None):
        """Sentences (strings, words separated by spaces) -> trees (`treebank.Tree`)."""
        outputs = self.translator.translate(sentences, progress=progress)
        return [treebank.delinearize(output.split(), sentence.split())
                for sentence, output in zip(sentences, outputs)]


def evaluate_run(run_dir, split="test", progress=None, **kwargs):
    """Parses a split of the PTB sample with a run; returns (EVALB scores, predicted trees)."""
    run = Run(run_dir)
    config = run.config
    archive = treebank.default_ptb_archive(config.source_dir)
    gold = treebank.sample_splits(str(archive))[split]
    sentences, _ = treebank.task_pairs(gold)
    predicted = Parser.from_run(run, **kwargs).parse(sentences, progress=progress)
    return evalb.score(gold, predicted), predicted
