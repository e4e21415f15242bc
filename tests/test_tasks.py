"""The tasks on a tiny run: the main job's choice of weights on val, parsing's output repair."""

from keras_transformer.runs import Run
from keras_transformer.tasks import main_job
from keras_transformer.tasks.parsing import Parser
from pipelines import datasets
from pipelines.treebank import words
from tests.conftest import run_engine


def test_main_job_chooses_among_final_and_averaged_weights_on_val(run_copy, capsys):
    run = Run(run_copy)  # two checkpoints: only the final weights are a candidate
    sources, references = datasets.pair_texts(
        datasets.load_pairs("text", "dev", **run.config.data_arguments()))
    model, label, scores = main_job.choose_weights(run, sources, references)
    assert label == "final weights" and list(scores) == ["final weights"]
    assert model.count_params() == run.load_model(prefer_averaged=False).count_params()
    assert "val (first 40 sentences, greedy): final weights: sacreBLEU" in \
        capsys.readouterr().out


def test_parser_output_is_repaired_onto_the_input_words(tiny_run):
    # The tiny run translates toy text, not trees: its output is repaired into a tree that
    # holds exactly the input words.
    parser = Parser(run_engine(tiny_run, beam_size=2, extra_length=5))
    sentences = ["the dog runs", "a big red cat sleeps"]
    for sentence, tree in zip(sentences, parser.parse(sentences)):
        assert words(tree) == sentence.split()
