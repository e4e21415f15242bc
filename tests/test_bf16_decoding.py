"""Decoding in bfloat16 (decoding/engines/precision.py): the same output as float32 on most sentences,
weights cast once, float32 where the CPU has no bf16 units, and the command's --precision.
`make test-fast` keeps greedy's agreement, the casts and the choice of precision."""

import numpy as np
import pytest

from keras_transformer import Transformer, hardware
from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.request import Request
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.engines.precision import cast_model, resolve_precision
from keras_transformer.decoding.engines.translator import Translator
from keras_transformer.errors import InputError
from keras_transformer.models import Ensemble
from keras_transformer.runs import Run
from tests.conftest import run_engine

# Recorded /proc/cpuinfo flags (abridged) of the three classes.
AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
AVX512_BF16 = AVX512 | {"avx512_bf16"}
AMX = AVX512_BF16 | {"amx_bf16", "amx_tile", "amx_int8"}


@pytest.fixture(scope="module")
def trained(tiny_run, toy_corpus):
    """(the tiny run's float32 model, its vocabulary, its dev sentences)."""
    run = Run(tiny_run)
    sentences = toy_corpus["dev.src"].read_text(encoding="utf-8").splitlines()
    return run.load_model(), run.vocabulary(), sentences


@pytest.fixture(scope="module")
def translators(trained):
    """Translators of the tiny run's model by (precision, beam size), each built (and its
    search traced) once for the module's tests."""
    class Translators(dict):
        def __missing__(self, key):
            precision, beam_size = key
            model, vocabulary, _ = trained
            self[key] = Translator(model, vocabulary, beam_size=beam_size, alpha=0.6,
                                   batch_size=8, max_input_length=32, precision=precision)
            return self[key]

    return Translators()


def _source(translator, sentences):
    """(N, S) int32 source ids, 0-padded."""
    rows = translator.encode(sentences)
    source = np.zeros((len(rows), max(len(row) for row in rows)), np.int32)
    for i, row in enumerate(rows):
        source[i, :len(row)] = row
    return source


def _best_ids(translator, sentences):
    """The best hypothesis of each sentence, as id tuples up to EOS."""
    ids = np.asarray(translator.search_ids(_source(translator, sentences))["ids"])[:, 0]
    return [tuple(row[row != 0]) for row in ids]


@pytest.mark.parametrize("beam_size", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_a_bf16_search_returns_the_float32_ids_on_most_sentences(trained, translators,
                                                                 beam_size):
    sentences = trained[2]
    float32 = _best_ids(translators["float32", beam_size], sentences)
    bf16 = _best_ids(translators["bfloat16", beam_size], sentences)
    same = np.mean([a == b for a, b in zip(float32, bf16)])
    assert len(sentences) >= 40 and same >= 0.9, same


def test_float32_searches_the_model_itself_as_before(trained, translators):
    model, _, sentences = trained
    translator = translators["float32", 4]
    assert translator.model is model and translator.precision == "float32"
    source = _source(translator, sentences[:6])
    today = compiled_beam_search(model, 4, 0.6)(source)
    ours = translator.search_ids(source)
    np.testing.assert_array_equal(ours["ids"], today["ids"])
    np.testing.assert_array_equal(ours["scores"], today["scores"])


def _first_weight(model):
    return np.asarray(model.trainable_variables[0].value, np.float32)


def _dtypes(model):
    """{(a LayerNorm weight?, dtype)} of a model's weights."""
    return {("layer_norm" in v.path, v.dtype) for v in model.trainable_variables}


BF16 = {(False, "bfloat16"), (True, "float32")}  # matrices in bf16, LayerNorms in float32


def _variable_casts(search):
    """Cast ops of a variable's value in a traced search (a tf.function of source ids)."""
    concrete = search.get_concrete_function()
    graph = concrete.graph.as_graph_def()
    count = 0
    for nodes in [graph.node] + [function.node_def for function in graph.library.function]:
        op_of = {node.name: node.op for node in nodes}
        count += sum(1 for node in nodes if node.op == "Cast" and node.input
                     and op_of.get(node.input[0].lstrip("^").split(":")[0]) == "ReadVariableOp")
    return count


@pytest.mark.slow  # a mixed-policy model and three more searches traced (7 CPU-s)
def test_the_weights_are_cast_once_when_the_translator_is_built(trained, translators):
    model, vocabulary, _ = trained
    translator = translators["bfloat16", 4]
    assert _dtypes(translator.model) == BF16
    assert {v.dtype for v in model.weights} == {"float32"}  # the caller's model is untouched
    np.testing.assert_allclose(_first_weight(translator.model), _first_weight(model), rtol=1e-2,
                               atol=1e-6)
    assert _variable_casts(translator._search) == 0
    # The check can fail: a model under the training policy casts its weights at every step
    # (searched as it is); a translator searches a copy cast once, in either precision.
    mixed = Transformer.from_config({**model.get_config(), "dtype": "mixed_bfloat16"})
    mixed.build()
    mixed.set_weights(model.get_weights())
    assert _variable_casts(compiled_beam_search(mixed, 4)) > 0
    for precision in ("bfloat16", "float32"):
        translator = Translator(mixed, vocabulary, beam_size=4, precision=precision)
        assert translator.model is not mixed
        assert _dtypes(translator.model) == (BF16 if precision == "bfloat16" else
                                             {(False, "float32"), (True, "float32")})
        assert _variable_casts(translator._search) == 0


@pytest.mark.slow  # a second model, translated three times
def test_a_model_being_trained_is_copied_again_after_its_optimizer_steps(trained):
    import keras

    model, vocabulary, _ = trained
    live = Transformer.from_config(model.get_config())
    live.build()
    live.set_weights(model.get_weights())
    live.compile(optimizer=keras.optimizers.Adam())
    live.optimizer.build(live.trainable_variables)
    translator = Translator(live, vocabulary, beam_size=1, precision="bfloat16")
    translator.translate(["a b"])
    first = live.trainable_variables[0]
    first.assign(first.value * 2.0)
    translator.translate(["a b"])  # no step taken: the copy is kept
    assert not np.allclose(_first_weight(translator.model), _first_weight(live), rtol=1e-2)
    live.optimizer.iterations.assign(1)
    translator.translate(["a b"])
    np.testing.assert_allclose(_first_weight(translator.model), _first_weight(live), rtol=1e-2,
                               atol=1e-6)


def test_auto_is_bf16_on_the_bf16_classes_only(monkeypatch, trained):
    assert resolve_precision("auto", AVX2)[0] == "float32"
    assert resolve_precision("auto", AVX512)[0] == "float32"
    dtype, reason = resolve_precision("auto", AVX512_BF16)
    assert dtype == "bfloat16"
    assert reason == "bf16: this CPU has avx512_bf16; --precision float32 restores float32"
    assert resolve_precision("auto", AMX)[0] == "bfloat16"
    assert resolve_precision("auto", AVX512)[1].startswith("float32: this CPU (avx512 class)")
    assert resolve_precision("bfloat16", AVX2) == ("bfloat16", "bf16: --precision bfloat16 given")
    with pytest.raises(InputError, match="precision='float16' must be one of"):
        resolve_precision("float16")

    # The decoder resolves auto, and the translator computes in what it resolved: on a CPU
    # without bf16 units float32 (the model itself), on a bf16 class bfloat16, said the same.
    model, vocabulary, _ = trained

    def auto():
        decoder = Decoder(Request(beam_size=1, alpha=0.6, batch_size=8, precision="auto"))
        translator = decoder.engine(model, vocabulary, 32)
        assert (translator.precision, translator.precision_reason) == decoder.precision
        return translator

    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(AVX512))
    translator = auto()
    assert translator.precision == "float32" and translator.model is model
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(AMX))
    assert auto().precision == "bfloat16"
    # Built directly, the translator takes a dtype, not the setting the decoder resolves.
    assert Translator(model, vocabulary).precision == "float32"
    with pytest.raises(InputError, match="precision='auto' must be one of float32, bfloat16"):
        Translator(model, vocabulary, precision="auto")


@pytest.mark.slow  # two more searches traced; the cast itself is checked in the fast tests
def test_an_ensemble_is_cast_member_by_member(trained):
    model, vocabulary, sentences = trained
    ensemble = Ensemble([model, model])
    translator = Translator(ensemble, vocabulary, beam_size=2, precision="bfloat16")
    assert isinstance(translator.model, Ensemble)
    assert _dtypes(translator.model) == BF16
    assert cast_model(ensemble, "float32") is ensemble
    alone = Translator(model, vocabulary, beam_size=2, precision="bfloat16")
    # Two copies of one model: their mean is that model.
    assert translator.translate(sentences[:8]) == alone.translate(sentences[:8])


@pytest.mark.slow  # the whole command, twice
def test_the_command_says_its_precision_and_float32_restores_todays_output(run_copy, tmp_path,
                                                                          capsys):
    from keras_transformer import cli

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    sentences = ["the dog runs", "", "a red cat in the house"]
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert cli.main(["translate", "--run-dir", str(run_copy), "--input", str(source),
                     "--output", str(output), "--precision", "float32"]) == 0
    err = capsys.readouterr().err
    assert "precision float32 [flag]" in err and err.splitlines()[0].endswith(
        "; float32: --precision float32 given")
    expected = run_engine(run_copy, beam_size=4, alpha=0.6,
                          precision="float32").translate(sentences)
    assert output.read_text(encoding="utf-8") == "".join(line + "\n" for line in expected)

    assert cli.main(["translate", "--run-dir", str(run_copy), "--input", str(source),
                     "--output", str(output), "--beam", "1"]) == 0
    reason = resolve_precision("auto")[1]
    assert capsys.readouterr().err.splitlines()[0].endswith(f"engine tensorflow; {reason}")

    assert cli.main(["translate", "--run-dir", str(run_copy), "--engine", "ctranslate2",
                     "--precision", "bfloat16", "--input", str(source)]) == 2
    assert "the ctranslate2 engine does not support precision yet; the tensorflow engine " \
        "does." in capsys.readouterr().err
