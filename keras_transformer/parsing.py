"""English constituency parsing as translation (paper Section 6.3): sentence -> linearized tree.

    parser = Parser.from_run("runs/ptb-parse")          # beam 21, alpha 0.3, input + 300
    parser.parse(["The dog runs ."])                     # -> [Tree(...)]
    evaluate_run("runs/ptb-parse", "test")              # EVALB-convention F1 on the test files

Training uses the ordinary translation path (`keras-transformer train --dataset ptb`), with the
tree tokens ("(NP", ")NP", POS tags) as single vocabulary pieces. Output that is not a
well-formed tree is repaired deterministically (`pipelines.treebank.delinearize`).
"""

from keras_transformer import evalb
from keras_transformer.translate import Translator, load_run
from pipelines import treebank

BEAM_SIZE = 21  # paper, Section 6.3
ALPHA = 0.3
EXTRA_LENGTH = 300


class Parser:
    """Parses whitespace-tokenized sentences with a model trained on linearized trees."""

    def __init__(self, translator):
        self.translator = translator

    @classmethod
    def from_run(cls, run_dir, model_file=None, beam_size=BEAM_SIZE, alpha=ALPHA,
                 batch_size=16):
        model, tokenizer, config = load_run(run_dir, model_file)
        translator = Translator(model, tokenizer, beam_size=beam_size, alpha=alpha,
                                max_input_length=config.get("max_length", 256),
                                batch_size=batch_size, extra_length=EXTRA_LENGTH)
        return cls(translator)

    def parse(self, sentences, progress=None):
        """Sentences (strings, words separated by spaces) -> trees (`treebank.Tree`)."""
        outputs = self.translator.translate(sentences, progress=progress)
        return [treebank.delinearize(output.split(), sentence.split())
                for sentence, output in zip(sentences, outputs)]


def evaluate_run(run_dir, split="test", progress=None, **kwargs):
    """Parses a split of the PTB sample with a run; returns (EVALB scores, predicted trees)."""
    from keras_transformer.config import load_run_config

    config = load_run_config(run_dir)
    archive = treebank.default_ptb_archive(config.source_dir)
    gold = treebank.sample_splits(str(archive))[split]
    sentences, _ = treebank.task_pairs(gold)
    predicted = Parser.from_run(run_dir, **kwargs).parse(sentences, progress=progress)
    return evalb.score(gold, predicted), predicted
