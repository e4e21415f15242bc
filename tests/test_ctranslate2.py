"""CTranslate2 export: the exported model scores given targets as ours does (post-norm and
pre-norm, sinusoidal and learned positions), the CLI exports and translates with it, and what it
cannot express or run without is refused in one line."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("ctranslate2")

from keras_transformer import Transformer, cli  # noqa: E402
from keras_transformer.export import ExportError, export_run  # noqa: E402
from keras_transformer.decoding.engines.ctranslate2 import CTranslate2Translator  # noqa: E402
from keras_transformer.export.ct2 import build_spec, export_ctranslate2  # noqa: E402
from keras_transformer.runs import Run  # noqa: E402
from pipelines.special_ids import BOS_ID, EOS_ID  # noqa: E402
from tests.conftest import RUNTIME_MODEL, RUNTIME_PRESET, run_decoder, run_engine  # noqa: E402

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SOURCES = ["the dog runs in the park", "a big red cat", "green water"]
TARGETS = ["PARK THE IN RUNS DOG THE", "CAT RED BIG A", "WATER GREEN"]


def our_log_probs(model, processor, source, target):
    """Per-token log-probabilities of `target` (EOS last) under teacher forcing."""
    source_ids, target_ids = processor.encode(source) + [EOS_ID], processor.encode(target)
    logits = model((np.array([source_ids]), np.array([[BOS_ID] + target_ids])))
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    return [log_probs[i, token] for i, token in enumerate(target_ids + [EOS_ID])]


def assert_same_scores(model, tokenizer, folder):
    translator = CTranslate2Translator(folder)
    theirs = translator.score_pieces(translator.encode(SOURCES), translator.encode(TARGETS))
    for source, target, scores in zip(SOURCES, TARGETS, theirs):
        ours = our_log_probs(model, translator.processor, source, target)
        np.testing.assert_allclose(scores, ours, atol=1e-4)


@pytest.fixture(scope="module")
def tiny_export(tiny_run, tmp_path_factory):
    """tiny_run's model, tokenizer and its float32 CTranslate2 export, made once for the file
    (the tests only read the export)."""
    run = Run(tiny_run)
    model, tokenizer = run.load_model(), run.tokenizer()
    folder = export_ctranslate2(model, tokenizer, tmp_path_factory.mktemp("ct2") / "ctranslate2",
                                max_input_length=run.config.max_length)
    return model, tokenizer, folder


@pytest.fixture(scope="module")
def tiny_export_int8(tiny_run, tmp_path_factory):
    """tiny_run's int8 CTranslate2 export by `export_run` (the export command's), made once for
    the file."""
    return export_run(run_decoder(tiny_run), format="ctranslate2", quantize="int8",
                      output_dir=tmp_path_factory.mktemp("ct2-int8") / "exports", name="toy")


def test_a_trained_post_norm_run_scores_as_ours(tiny_export):
    model, tokenizer, folder = tiny_export
    assert (folder / "spm.model").read_bytes() == tokenizer.model_proto
    assert_same_scores(model, tokenizer, folder)


def test_pre_norm_with_learned_positions_and_gelu_scores_as_ours(tiny_run, tmp_path):
    tokenizer = Run(tiny_run).tokenizer()
    model = Transformer(vocab_size=tokenizer.vocab_size, num_layers=2, d_model=32, num_heads=4,
                        d_ff=64, norm_first=True, positional="learned", max_length=400,
                        activation="gelu", layer_norm_epsilon=1e-6)
    model.build()
    folder = export_ctranslate2(model, tokenizer, tmp_path / "ct2", max_input_length=32)
    assert_same_scores(model, tokenizer, folder)


def test_architectures_it_cannot_express_are_refused_by_name():
    model = Transformer(vocab_size=50, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                        key_dim=16, value_dim=8)
    model.build()
    with pytest.raises(ExportError, match="key_dim=16 differs from value_dim=8"):
        build_spec(model, [f"p{i}" for i in range(50)])
    model = Transformer(vocab_size=50, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                        activation="silu")
    model.build()
    with pytest.raises(ExportError, match="activation='silu'"):
        build_spec(model, [f"p{i}" for i in range(50)])


def test_export_and_translate_from_the_command_line(tiny_run, tmp_path, capsys):
    exports = tmp_path / "exports"
    for quantize in (["--quantize", "none"], []):  # float32, then the default: int8
        assert cli.main(["export", "--run-dir", str(tiny_run), "--format", "ctranslate2",
                         *quantize, "--output-dir", str(exports), "--name", "toy"]) == 0
    assert (exports / "toy" / "ctranslate2" / "model.bin").is_file()
    assert (exports / "toy" / "ctranslate2-int8" / "model.bin").is_file()
    # An existing export is kept unless overwriting is asked for.
    assert cli.main(["export", "--run-dir", str(tiny_run), "--format", "ctranslate2",
                     "--output-dir", str(exports), "--name", "toy"]) == 2
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(ExportError, match="does not apply to the ctranslate2 format"):
        export_run(run_decoder(tiny_run), format="ctranslate2", quantize="dynamic")

    source = tmp_path / "input.txt"
    source.write_text("the dog runs\n\n  a   big cat \n", encoding="utf-8")
    for folder in ("ctranslate2", "ctranslate2-int8"):
        output = tmp_path / f"{folder}.txt"
        assert cli.main(["translate", "--run-dir", str(tiny_run), "--engine", "ctranslate2",
                         "--ctranslate2-model", str(exports / "toy" / folder), "--beam", "2",
                         "--input", str(source), "--output", str(output)]) == 0
        lines = output.read_text(encoding="utf-8").split("\n")
        assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # one line per input
    # Greedy through the CLI equals greedy through the translator object.
    translator = CTranslate2Translator(exports / "toy" / "ctranslate2", beam_size=1)
    expected = translator.translate(["the dog runs", "", "a big cat"])
    assert expected[1] == ""
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--engine", "ctranslate2",
                     "--ctranslate2-model", str(exports / "toy" / "ctranslate2"), "--beam",
                     "1", "--input", str(source), "--output", str(tmp_path / "g.txt")]) == 0
    assert (tmp_path / "g.txt").read_text(encoding="utf-8").split("\n")[:3] == expected


def test_the_lane_takes_the_runs_int8_export_first_and_says_which_and_why(
        tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the run's exports in their default place, saved_models/
    source = tmp_path / "input.txt"
    source.write_text("the dog runs\n", encoding="utf-8")
    translate = ["translate", "--run-dir", str(tiny_run), "--engine", "ctranslate2",
                 "--input", str(source)]
    exports = pathlib.Path("saved_models") / tiny_run.name
    assert cli.main(["export", "--run-dir", str(tiny_run), "--format", "ctranslate2",
                     "--quantize", "none"]) == 0
    capsys.readouterr()
    assert cli.main([*translate, "--output", "a.txt"]) == 0
    assert (f"CTranslate2 export {exports / 'ctranslate2'} [the run's float32 export; "
            "--ctranslate2-model picks another]") in capsys.readouterr().err
    assert cli.main(["export", "--run-dir", str(tiny_run), "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    assert cli.main([*translate, "--output", "b.txt"]) == 0
    assert (f"CTranslate2 export {exports / 'ctranslate2-int8'} [the run's int8 export, "
            "preferred over its float32 one; --ctranslate2-model picks another]"
            ) in capsys.readouterr().err
    named = str(exports / "ctranslate2")
    assert cli.main([*translate, "--output", "c.txt", "--ctranslate2-model", named]) == 0
    assert f"CTranslate2 export {named} [--ctranslate2-model]" in capsys.readouterr().err


def test_a_missing_export_or_package_is_one_line_saying_what_to_do(tiny_run, tmp_path, capsys):
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--engine", "ctranslate2",
                     "--ctranslate2-model", str(tmp_path / "nowhere"),
                     "--input", str(tmp_path / "x")]) == 2
    assert "--format ctranslate2" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (about 7 CPU-s)
def test_a_missing_package_is_one_line_saying_what_to_do(tiny_run, tmp_path):
    # Without the package (hidden from the import system), export says how to install it. The
    # subprocess is the command as a user starts it (`keras_transformer_command.main`: native
    # logs hidden before TensorFlow loads), with TensorFlow's own notices not filtered and
    # oneDNN on (its "... round-off errors ..." notice is printed on every CPU class then).
    argv = ["keras-transformer", "export", "--run-dir", str(tiny_run), "--format",
            "ctranslate2", "--output-dir", str(tmp_path)]
    code = ("import sys; sys.modules['ctranslate2'] = None; "
            f"sys.argv = {argv!r}; "
            "import keras_transformer_command; keras_transformer_command.main()")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_ENABLE_ONEDNN_OPTS="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "keras-transformer[ctranslate2]" in error[0], result.stderr


@pytest.mark.slow
def test_prefixes_sampling_and_scores_as_the_translators(tiny_run, tiny_export, toy_translators,
                                                         tmp_path, capsys):
    from keras_transformer.errors import InputError

    folder = tiny_export[2]
    ours = toy_translators[1]  # run_engine(tiny_run, beam_size=1, precision="float32")
    theirs = CTranslate2Translator(folder, beam_size=1)
    # Scores: CTranslate2's score_batch equals ours within 1e-3 per token (EOS counted).
    sources, targets = SOURCES + ["", "a dog"], TARGETS + ["", ""]
    expected, found = ours.score(sources, targets), theirs.score(sources, targets)
    assert [f["tokens"] for f in found] == [e["tokens"] for e in expected]
    for e, f in zip(expected, found):
        assert abs(f["log_prob"] - e["log_prob"]) <= 1e-3 * e["tokens"], (e, f)
        assert abs(f["mean"] - e["mean"]) <= 1e-3
    # Prefixes: target_prefix; greedy search with them gives our greedy search's output.
    prefixes = ["PARK THE", "", "WATER"]
    with_prefix = theirs.translate(SOURCES, prefixes=prefixes)
    assert with_prefix == ours.translate(SOURCES, prefixes=prefixes)
    assert all(text.startswith(prefix) for text, prefix in zip(with_prefix, prefixes))
    assert theirs.translate(["", "a cat"], prefixes=["CAT", ""])[0] == ""
    # Alignments (return_attention, our rule on it): the same links as ours, teacher-forced
    # on given pairs and on the search's output with prefixes (docs/decoding.md's tolerance:
    # a near tie may flip, >= 95% of target words alike); an empty line gives "".
    scored = [[s["alignment"] for s in engine.score(sources, targets, alignments=True)]
              for engine in (ours, theirs)]
    searched = [engine.translate(SOURCES + [""], prefixes=prefixes + [""], alignments=True)
                for engine in (ours, theirs)]
    assert [t for t, _ in searched[0]] == [t for t, _ in searched[1]]
    for mine, found in (scored, [[a for _, a in pairs] for pairs in searched]):
        assert mine[-1] == found[-1] == ""
        links = [(x, y) for m, f in zip(mine, found) for x, y in zip(m.split(), f.split())]
        assert len(links) == sum(len(m.split()) for m in mine) > 0
        assert sum(x == y for x, y in links) >= 0.95 * len(links), (mine, found)
    # Sampling: seeded and reproducible; top_k=1 is greedy search, scored as ours.
    options = dict(num_samples=3, top_k=10, top_p=0.9, temperature=0.8, seed=5)
    first = theirs.sample(SOURCES + [""], **options)
    assert first == theirs.sample(SOURCES + [""], **options)
    assert [len(s) for s in first] == [3, 3, 3, 1] and first[3] == [("", 0.0)]
    greedy = theirs.sample(SOURCES, num_samples=2, top_k=1)
    expected = ours.translate(SOURCES, nbest=True)
    assert all(s[0] == s[1] for s in greedy)
    assert [s[0][0] for s in greedy] == [e[0][0] for e in expected]
    for (_, score), (_, our_score) in zip([s[0] for s in greedy], [e[0] for e in expected]):
        assert abs(score - our_score) <= 1e-2, (score, our_score)
    # The Translator's rules for what it cannot do.
    with pytest.raises(InputError, match="prefixes must give one string per sentence"):
        theirs.translate(SOURCES, prefixes=["A"])
    with pytest.raises(InputError, match="one target per source"):
        theirs.score(SOURCES, TARGETS[:1])
    with pytest.raises(InputError, match=r"top_p=1.5 must be in \(0, 1\]"):
        theirs.sample(SOURCES, top_p=1.5)
    with pytest.raises(InputError, match="alpha=nan must be at least 0"):
        CTranslate2Translator(folder, alpha=float("nan"))
    # The same rules on the command line, with either engine.
    source = tmp_path / "input.txt"
    source.write_text("the dog runs\n", encoding="utf-8")
    for engine in (["tensorflow"], ["ctranslate2", "--ctranslate2-model", str(folder)]):
        for flag, value, message in (("--alpha", "nan", "--alpha nan must be at least 0"),
                                     ("--beam", "0", "--beam 0 must be at least 1")):
            assert cli.main(["translate", "--run-dir", str(tiny_run), "--engine", *engine,
                             flag, value, "--input", str(source),
                             "--output", str(tmp_path / "out.txt")]) == 2
            assert message in capsys.readouterr().err, (engine, flag)


# A process in which TensorFlow, Keras and JAX cannot be imported (as in a container that has
# only ctranslate2 and sentencepiece): any import of them raises ModuleNotFoundError, as it
# would there. The command and the Python API must translate all the same.
WITHOUT_TENSORFLOW = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "jax", "jaxlib", "tensorflow_text",
                                  "tensorflow_datasets", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
for name in list(sys.modules):
    if name.split(".")[0] in ("tensorflow", "keras", "jax"):
        del sys.modules[name]
sys.meta_path.insert(0, Absent())
from keras_transformer.models import presets  # the tests' runtime preset, as tests.conftest
presets.PRESETS[RUNTIME_PRESET] = presets._variant(
    "tiny", model=RUNTIME_MODEL,
    training=dict(warmup_steps=50, train_steps=20))
"""


def run_without_tensorflow(code, tmp_path):
    setup = WITHOUT_TENSORFLOW.replace("RUNTIME_PRESET", repr(RUNTIME_PRESET)).replace(
        "RUNTIME_MODEL", repr(RUNTIME_MODEL))
    result = subprocess.run([sys.executable, "-c", setup + code],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=dict(os.environ, KERAS_TRANSFORMER_DEBUG="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_ctranslate2_lane_runs_where_tensorflow_cannot_be_imported(tiny_run, tmp_path):
    folder = tmp_path / "exports" / "toy" / "ctranslate2-int8"
    assert cli.main(["export", "--run-dir", str(tiny_run), "--format", "ctranslate2",
                     "--quantize", "int8", "--output-dir", str(tmp_path / "exports"),
                     "--name", "toy"]) == 0
    source, reference = tmp_path / "input.txt", tmp_path / "reference.txt"
    source.write_text("the dog runs\n\na big cat\ngreen water\n", encoding="utf-8")
    reference.write_text("RUNS DOG THE\n\nCAT BIG A\nWATER GREEN\n", encoding="utf-8")
    # What the lane gives in this process (TensorFlow loaded), as the reference.
    expected = CTranslate2Translator(folder, beam_size=2).translate(
        source.read_text(encoding="utf-8").splitlines())
    common = ["--run-dir", str(tiny_run), "--engine", "ctranslate2", "--ctranslate2-model",
              str(folder), "--beam", "2"]
    commands = [["translate", *common, "--input", str(source), "--output", "out.txt"],
                ["evaluate", *common, "--src", str(source), "--ref", str(reference),
                 "--output", "hyp.txt"],
                ["score", *common[:-2], "--src", str(source), "--tgt", str(reference),
                 "--output", "scores.txt"]]
    code = "".join(f"""
sys.argv = ["keras-transformer", *{argv!r}]
import keras_transformer_command
try:
    keras_transformer_command.main()
except SystemExit as exit:
    assert exit.code == 0, exit.code
""" for argv in commands) + f"""
from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.request import Request
engine = Decoder(Request(engine="ctranslate2", ctranslate2_model={str(folder)!r},
                         beam_size=2)).engine()
print("API:" + repr(engine.translate(["the dog runs", "", "a big cat", "green water"])))
assert not [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")]
"""
    # evaluate with --src but without a dataset: an empty line is a sentence too, so the
    # files have no empty line for it.
    result = run_without_tensorflow(code, tmp_path)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == expected
    assert len((tmp_path / "scores.txt").read_text(encoding="utf-8").splitlines()) == 4
    assert "sacreBLEU" in result.stdout or "sacrebleu" in result.stdout
    assert f"API:{expected!r}" in result.stdout
    # The command says which workers and threads CTranslate2 runs with.
    assert "workers" in result.stderr and "threads 1" in result.stderr, result.stderr


def test_the_benchmarks_sweep_ctranslate2s_threading_and_take_its_best(tiny_export_int8,
                                                                      tmp_path, monkeypatch):
    """decode.py's in-process sweep on the tiny preset, and the reference script's sweep of
    fresh processes on the tiny run's int8 export: every setting of the grid measured, the
    best chosen among the tuned ones (never CTranslate2's untuned defaults)."""
    import argparse

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import ct2_reference
    import decode

    grid = ct2_reference.threading_grid(2)
    assert grid == [(1, 1), (1, 2), (2, 1), (1, 0)]
    assert ct2_reference.threading_grid(4)[:-1] == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2),
                                                    (4, 1)]
    model = Transformer.from_preset("tiny", vocab_size=60)
    model.build()
    source = np.full((3, 5), 7, np.int32)
    source[:, -1] = EOS_ID
    args = argparse.Namespace(vocab_size=60, src_len=5, out_len=4, beam=2, batch=3,
                              repeats=1, quantize="none")
    found = decode.ctranslate2_sweep(model, source, args)
    assert sorted(found) == sorted(ct2_reference.label(s) for s in ct2_reference.threading_grid())
    assert all(seconds > 0 for seconds in found.values())

    folder = tiny_export_int8
    source_file = tmp_path / "source.txt"
    source_file.write_text("the dog runs\n\na big red cat\n", encoding="utf-8")
    swept = ct2_reference.sweep(folder, source_file, beam=2, alpha=1.0,
                                grid=[(1, 1), (2, 1), (1, 0)],
                                output_for=lambda name: tmp_path / f"{name}.txt")
    assert sorted(swept["settings"]) == ["1x0 (CTranslate2's defaults)", "1x1", "2x1"]
    assert swept["best"] in ("1x1", "2x1")
    assert swept["best_seconds"] == min(swept["settings"][n]["wall_seconds"]
                                        for n in ("1x1", "2x1"))
    outputs = {n: (tmp_path / f"{n}.txt").read_text(encoding="utf-8") for n in swept["settings"]}
    assert len(set(outputs.values())) == 1  # the threading changes the time, not the output
    lines = outputs["1x1"].split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[0] and lines[2]
    for record in swept["settings"].values():
        assert record["child_peak_rss_mb"] > 0 and record["lines"] == 3


def test_batches_of_mixed_lengths_keep_each_sentences_own_limit(tiny_export_int8):
    """Searches batch sentences of different output limits together (under the largest) and
    search again those that came near their own limit: the same hypotheses as each sentence
    searched alone under its own limit. The tiny run's outputs run to their limits, so the
    second search is exercised."""
    folder = tiny_export_int8
    words = "the dog runs in the park a big red cat green water".split()
    sentences = [" ".join(words[: 1 + i % len(words)]) for i in range(30)]
    together = CTranslate2Translator(folder, beam_size=2, extra_length=0)
    alone = CTranslate2Translator(folder, beam_size=2, extra_length=0, batch_size=1)
    mixed, own = (engine.translate(sentences, nbest=True) for engine in (together, alone))
    assert [[t for t, _ in h] for h in mixed] == [[t for t, _ in h] for h in own]
    # (the scores to float rounding: a batch's padding changes the sums' order)
    np.testing.assert_allclose([s for h in mixed for _, s in h], [s for h in own for _, s in h],
                               rtol=1e-5)
    limits = [together._limit(p, None) for p in together.encode(sentences)]
    near = [len(together.encode_targets([h[0][0]])[0]) + together.LIMIT_MARGIN >= limit
            for h, limit in zip(own, limits)]
    # several limits in one batch; outputs near their limit (searched again) and not
    assert len(set(limits)) > 3 and any(near) and not all(near), (limits, own)


@pytest.mark.slow  # tiny_run's CTranslate2 export and our searches with the controls: 7 CPU-s
def test_the_repetition_controls_pass_through_and_match_ours(tiny_run, tiny_export):
    """translate_batch's no_repeat_ngram_size and repetition_penalty: the rules ours apply
    (`decoding.search.repetition`), so greedy search gives our greedy search's output. (Not
    the same scores: CTranslate2 divides them by length^alpha, and bans tokens, the n-grams'
    included, before its softmax, where ours, as fairseq, bans them in the log-probabilities.)
    """
    from keras_transformer.decoding.request import Request

    folder = tiny_export[2]
    sources = SOURCES + ["a dog runs in the green park with a big red cat"]
    for controls in (dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.5),
                     dict(no_repeat_ngram_size=3, repetition_penalty=1.2)):
        ours = run_engine(tiny_run, beam_size=1, precision="float32", **controls)
        theirs = CTranslate2Translator.from_request(
            Request(engine="ctranslate2", beam_size=1, **controls), folder)
        assert theirs.repetition == {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
                                     **controls}
        assert theirs.translate(sources) == ours.translate(sources), controls
    # Beam search too: the penalty changes the beams' scores.
    plain = CTranslate2Translator(folder, beam_size=4).translate(sources, nbest=True)
    assert plain != CTranslate2Translator(folder, beam_size=4, repetition_penalty=3.0).translate(
        sources, nbest=True)


def test_a_file_on_standard_input_is_read_as_input_is_and_a_pipe_a_batch_at_a_time(
        tiny_run, tiny_export_int8, tmp_path, capsys, monkeypatch):
    """`translate < input.txt` (what `make demo` prints for the CTranslate2 lane) reads the
    file in windows with the engine's windows in flight, as `--input input.txt` does, and
    writes the same lines; a pipe is still read a batch at a time, one batch in flight (a
    program that writes a line and waits is answered after a batch)."""
    from keras_transformer.decoding.jobs import streaming, textio

    words = "the dog runs in the park a big red cat green water".split()
    source = tmp_path / "input.txt"
    source.write_text("".join(" ".join(words[: 1 + i % len(words)]) + "\n" for i in range(70)),
                      encoding="utf-8")
    command = ["translate", "--run-dir", str(tiny_run), "--engine", "ctranslate2",
               "--ctranslate2-model", str(tiny_export_int8), "--beam", "2", "--batch-size", "8"]
    calls = []
    real = streaming.stream_lines

    def recording(*args, **kwargs):  # what translate_file asks of the real reader
        calls.append((kwargs["window"], kwargs["windows_in_flight"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming, "stream_lines", recording)
    assert cli.main([*command, "--input", str(source), "--output", str(tmp_path / "o.txt")]) == 0
    named = (tmp_path / "o.txt").read_text(encoding="utf-8")
    capsys.readouterr()

    read_end, write_end = os.pipe()
    os.write(write_end, source.read_bytes())
    os.close(write_end)
    for stdin in (open(source, encoding="utf-8"), open(read_end, encoding="utf-8")):
        with stdin:
            monkeypatch.setattr(sys, "stdin", stdin)
            assert cli.main(command) == 0
        assert capsys.readouterr().out == named
    (by_name, file, pipe) = calls
    assert by_name == file and file[0] > 8 and file[1] == 2, calls  # CTranslate2's 2 windows
    assert pipe == (8, 1), calls
    with open(source, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert textio.stdin_is_a_file()
    monkeypatch.setattr(sys, "stdin", None)  # (python -c ... <&-: no standard input)
    assert not textio.stdin_is_a_file()


def test_the_workers_get_the_longest_batches_first_and_the_lines_keep_their_order(
        tiny_export_int8, monkeypatch):
    """CTranslate2's workers are given a call's batches longest first, so that they end on
    short batches together; the results still come in input order, as each batch alone."""
    words = "the dog runs in the park a big red cat green water".split()
    sentences = [" ".join(words[: 1 + (5 * i) % len(words)]) for i in range(24)]
    engine = CTranslate2Translator(tiny_export_int8, beam_size=2, batch_size=4)
    queued = []
    searcher = engine._searcher

    def recording_searcher(*args, **kwargs):
        search = searcher(*args, **kwargs)
        submit = search.submit

        def recording(sources, prefixes):
            queued.append(max(len(row) for row in sources))
            return submit(sources, prefixes)

        search.submit = recording
        return search

    monkeypatch.setattr(engine, "_searcher", recording_searcher)
    lines = engine.translate(sentences)
    assert len(queued) == 6 and len(set(queued)) > 2 and queued == sorted(queued, reverse=True)
    alone = CTranslate2Translator(tiny_export_int8, beam_size=2, batch_size=1)
    assert lines == alone.translate(sentences)
