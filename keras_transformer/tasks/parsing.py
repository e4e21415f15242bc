"""English constituency parsing as translation (paper Section 6.3): sentence -> linearized tree.

    parser = Parser.from_run("runs/ptb-parse")          # beam 21, alpha 0.3, input + 300
    parser.parse(["The dog runs ."])                     # -> [Tree(...)]
    evaluate_run("runs/ptb-parse", "test")              # EVALB-convention F1 on the test files

Training uses the ordinary translation path (`keras-transformer train --dataset ptb`), with the
tree tokens ("(NP", ")NP", POS tags) as single vocabulary pieces. Output that is not a
well-formed tree is repaired deterministically (`pipelines.treebank.delinearize`).
"""

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.request import PARSE
from keras_transformer.runs import Run
from keras_transformer.tasks import evalb
from pipelines import treebank


class Parser:
    """Parses whitespace-tokenized sentences with a model trained on linearized trees.

    Args:
        translator: the engine searching the trees (`Decoder(...).engine()`; `from_run`
            makes the parsing search's).
    """

    def __init__(self, translator):
        self.translator = translator

    @classmethod
    def from_run(cls, run, model_file=None, beam_size=None, alpha=None, batch_size=None):
        """A parser of a run (a `Run` or its directory) trained on dataset "ptb": the parsing
        search (`decoding.request.PARSING`) unless a value is given."""
        run = run if isinstance(run, Run) else Run(run)
        given = {name: value for name, value in (
            ("model", model_file and str(model_file)), ("beam_size", beam_size),
            ("alpha", alpha), ("batch_size", batch_size)) if value is not None}
        return cls(Decoder.resolve(run, given, command=PARSE).engine())

    def parse(self, sentences, progress=None):
        """Sentences (strings, words separated by spaces) -> trees (`treebank.Tree`)."""
        outputs = self.translator.translate(sentences, progress=progress)
        return [treebank.delinearize(output.split(), sentence.split())
                for sentence, output in zip(sentences, outputs)]


def evaluate_run(run_dir, split="test", progress=None, parser=None, **kwargs):
    """Parses a split of the PTB sample with a run (a `Run` or its directory) and `parser`
    (default: `Parser.from_run(run, **kwargs)`); returns (EVALB scores, predicted trees)."""
    run = run_dir if isinstance(run_dir, Run) else Run(run_dir)
    config = run.config
    archive = treebank.default_ptb_archive(config.source_dir)
    gold = treebank.sample_splits(str(archive))[split]
    sentences, _ = treebank.task_pairs(gold)
    parser = parser or Parser.from_run(run, **kwargs)
    predicted = parser.parse(sentences, progress=progress)
    return evalb.score(gold, predicted), predicted
