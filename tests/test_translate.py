import logging
import subprocess
import sys

import pytest

from keras_transformer import Transformer
from keras_transformer.evaluation.attention_maps import attention_weights, plot
from keras_transformer.evaluation.bleu import score, split_compounds
from keras_transformer.decoding.engines.translator import Translator
from pipelines.tokenizer import train_tokenizer
from tests.conftest import run_engine


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    texts = ["a dog runs in the park", "the red cat sleeps on the big tree"] * 30
    tokenizer = train_tokenizer(texts, 300, progress=False)
    model = Transformer.from_preset("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0)
    model.build()
    return Translator(model, tokenizer, beam_size=4, max_input_length=12, batch_size=2)


def test_empty_lines_give_empty_outputs(translator):
    outputs = translator.translate(["", "a dog", "   ", "the cat"])
    assert outputs[0] == "" and outputs[2] == ""
    assert len(outputs) == 4
    nbest = translator.translate(["", "a dog"], nbest=True)
    assert nbest[0] == [("", 0.0)] and 1 <= len(nbest[1]) <= 4
    assert translator.translate([]) == []


def test_long_inputs_are_truncated_with_a_warning(translator, caplog):
    long = " ".join(["the red cat sleeps"] * 10)
    with caplog.at_level(logging.WARNING):
        encoded = translator.encode(["a dog", long])
    assert len(encoded[1]) == 12 and encoded[1][-1] == 2
    assert "input 2 has" in caplog.text and "truncated to max_input_length=12" in caplog.text
    assert isinstance(translator.translate([long])[0], str)


def test_attention_pictures_are_written(translator, tmp_path):
    import tensorflow as tf

    source = tf.constant([translator.encode(["a dog runs"])[0]])
    output = translator._search(source)["ids"][:, 0]
    weights = attention_weights(translator.model, translator.tokenizer, source, output)
    assert weights["encoder"][0].shape == (4, source.shape[1], source.shape[1])
    assert weights["cross"][1].shape[-1] == source.shape[1]
    for kind in ("encoder", "decoder", "cross"):
        path = plot(weights, kind, layer=1, head=0, path=tmp_path / f"{kind}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="layer=5 is out of range"):
        plot(weights, "encoder", layer=5, head=0, path=tmp_path / "x.png")


def test_scores_report_sacrebleu_signature_chrf_and_tokenized_bleu():
    refs = ["Der Lkw-Fahrer fährt nach Hause.", "Ein Hund läuft."]
    result = score(["Der Lkw-Fahrer fährt nach Hause.", "Ein Hund läuft."], refs)
    assert result["sacrebleu"] == pytest.approx(100.0)
    assert result["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert result["chrf"] == pytest.approx(100.0)
    worse = score(["Der Fahrer fährt.", "Ein Hund."], refs)
    assert 0 < worse["sacrebleu"] < 100 and worse["tokenized_bleu"] < 100
    assert split_compounds("Lkw-Fahrer-Zentrale") == "Lkw ##AT##-##AT## Fahrer ##AT##-##AT## Zentrale"
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        score(["a", "b"], ["a"])


@pytest.mark.slow
def test_translate_command_reports_a_missing_run(tmp_path):
    # The installed command in a fresh process (the in-process error rule: tests/runs).
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--run-dir",
         str(tmp_path / "nothing")], capture_output=True, text=True, input="a dog\n")
    assert result.returncode == 2
    assert "not found" in result.stderr


BAD_UTF8 = b"a red dog\nthe \xff cat runs\nthe tree\n"  # line 2, byte 4 of the line, 14 of all


def test_translate_names_a_line_that_is_not_utf8_and_translates_the_rest(tiny_run, tmp_path,
                                                                        capsys, monkeypatch):
    import io

    from keras_transformer import cli

    source = tmp_path / "in.txt"
    source.write_bytes(BAD_UTF8)
    output = tmp_path / "out.txt"
    status = cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(source),
                       "--output", str(output), "--beam", "1"])
    assert status == 2
    err = capsys.readouterr().err
    assert (f"{source}, line 2: invalid UTF-8 (invalid start byte) at byte 4 of the line, "
            "byte 14 of the input") in err
    assert "1 input line(s) were not valid UTF-8 and were left empty in the output" in err
    lines = output.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == "" and lines[0] and lines[2]

    class Stdin:  # what a pipe gives: bytes, not a terminal
        buffer = io.BytesIO(BAD_UTF8)

        @staticmethod
        def isatty():
            return False

    monkeypatch.setattr("sys.stdin", Stdin())
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--beam", "1"]) == 2
    out, err = capsys.readouterr()
    assert out.split("\n")[:3] == lines
    assert "standard input, line 2: invalid UTF-8" in err


def test_evaluate_refuses_a_file_that_is_not_utf8_before_decoding(tiny_run, tmp_path, capsys):
    from keras_transformer import cli

    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("a red dog\nthe cat\nthe tree\n", encoding="utf-8")
    reference.write_bytes(BAD_UTF8)
    output = tmp_path / "hyp.txt"
    status = cli.main(["evaluate", "--run-dir", str(tiny_run), "--src", str(source), "--ref",
                       str(reference), "--output", str(output)])
    assert status == 2
    assert (f"{reference}, line 2: invalid UTF-8 (invalid start byte) at byte 4 of the line, "
            "byte 14 of the input. Nothing was translated") in capsys.readouterr().err
    assert not output.exists()


def test_evaluate_refuses_an_empty_test_set_before_decoding(tiny_run, tmp_path, capsys):
    from keras_transformer import cli

    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_bytes(b"")
    reference.write_bytes(b"")
    output = tmp_path / "hyp.txt"
    status = cli.main(["evaluate", "--run-dir", str(tiny_run), "--src", str(source), "--ref",
                       str(reference), "--output", str(output)])
    assert status == 2
    err = capsys.readouterr().err
    assert (f"keras-transformer evaluate: error: {source} and {reference} are empty: BLEU of no "
            "sentences is undefined. Give a test set of at least one line") in err
    assert "decoding with" not in err  # refused before the model loads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.txt", "src.txt"]


def test_evaluate_split_refuses_no_sentences_before_writing(tmp_path):
    from keras_transformer.errors import InputError
    from keras_transformer.evaluation.evaluate import evaluate_split

    class Untouched:
        def translate(self, texts, progress=None):
            raise AssertionError("nothing should be translated")

    output = tmp_path / "hyp.txt"
    for sources in ([], iter([])):
        with pytest.raises(InputError, match="Nothing to evaluate: the test set has no "
                           "sentences, and BLEU of no sentences is undefined"):
            evaluate_split(Untouched(), sources, [], lang="de", output=output,
                           alignments=tmp_path / "hyp.align.txt", progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_translate_with_xla_gives_the_same_translations(tiny_run, tmp_path):
    from keras_transformer import cli

    source = tmp_path / "input.txt"
    source.write_text("the dog runs\n\nA BIG RED CAT IN THE HOUSE\na cat\n", encoding="utf-8")
    outputs = {}
    for flags in ((), ("--xla",)):
        output = tmp_path / f"out{len(flags)}.txt"
        assert cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(source),
                         "--output", str(output), *flags]) == 0
        outputs[flags] = output.read_text(encoding="utf-8")
    assert outputs[("--xla",)] == outputs[()]
    assert outputs[()].split("\n")[1] == ""


@pytest.mark.slow
def test_translate_decodes_with_the_runs_saved_choice_and_says_so(run_copy, tmp_path, capsys):
    from keras_transformer import cli
    from keras_transformer.decoding.engines.translator import Translator
    from keras_transformer.runs import Run

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    sentences = ["the dog runs", "", "a red cat in the house"]
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")

    def translate(*flags):
        assert cli.main(["translate", "--run-dir", str(run_copy), "--input", str(source),
                         "--output", str(output), *flags]) == 0
        return output.read_text(encoding="utf-8"), capsys.readouterr().err

    def expected(**search):
        return "".join(line + "\n" for line in run_engine(
            run_copy, **search).translate(sentences))

    text, err = translate()  # no saved choice: what translate always did
    assert text == expected(beam_size=4, alpha=0.6, batch_size=64)
    assert "decoding with model.keras: beam_size 4, alpha 0.6, stop_horizon 3, precision " in err
    Run(run_copy).save_decoding(model=Run.MODEL, beam_size=2, alpha=1.5, chosen_by="a test")
    text, err = translate()
    assert text == expected(model=str(run_copy / Run.MODEL), beam_size=2, alpha=1.5)
    assert (f"decoding with {Run.MODEL} [run]: beam_size 2 [run], alpha 1.5 [run], "
            "stop_horizon 3, precision ") in err
    assert "; run: chosen by a test (a flag overrides it)" in err
    text, err = translate("--beam", "1")
    assert text == expected(model=str(run_copy / Run.MODEL), beam_size=1, alpha=1.5)
    assert "beam_size 1 [flag], alpha 1.5 [run]" in err
