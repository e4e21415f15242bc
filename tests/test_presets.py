import contextlib

import pytest

from keras_transformer import PRESETS, Transformer, cli, get_preset

VOCAB = 37000
_counts = {}


@contextlib.contextmanager
def shapes_only():
    """Variables made in the block have their shapes but no values: Keras defers their
    initialisation in a stateless scope, and here never runs it (the 63-214M random weights
    were most of what a count cost, and a count reads only shapes). The deferred variables are
    dropped afterwards, so that no later scope of this process initialises them."""
    import keras
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", []))
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", before)


def params(name):
    if name not in _counts:
        with shapes_only():
            model = Transformer.from_preset(name, vocab_size=VOCAB)
            model.build()
            _counts[name] = model.count_params()
    return _counts[name] / 1e6


@pytest.mark.slow  # builds 63M and 214M models
def test_base_and_big_match_the_paper():
    assert 60 <= params("base") <= 66  # paper: 65M
    assert 205 <= params("big") <= 216  # paper: 213M


# Table 3 parameter counts (millions) and the tolerance around the paper's change from base.
TABLE3 = {
    "base-b-dk16": 58, "base-b-dk32": 60, "base-c-n2": 36, "base-c-n4": 50, "base-c-n8": 80,
    "base-c-d256": 28, "base-c-d1024": 168, "base-c-ff1024": 53, "base-c-ff4096": 90,
}


@pytest.mark.slow  # builds a 63-214M model per variant
@pytest.mark.parametrize("name", sorted(TABLE3))
def test_table3_variants_move_like_the_paper(name):
    paper_change = TABLE3[name] - 65
    our_change = params(name) - params("base")
    assert our_change * paper_change > 0  # same direction
    assert abs(our_change - paper_change) <= 0.25 * abs(paper_change) + 3


# Row (A) keeps d_k * h = d_model, so the size must not move. (Rows D, dropout and label
# smoothing, cannot change a parameter count: no test for them.)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["base-a-h1", "base-a-h4", "base-a-h16", "base-a-h32"])
def test_variants_with_unchanged_size(name):
    assert params(name) == pytest.approx(params("base"))


def test_table3_settings_are_configuration():
    assert get_preset("base-a-h16")["model"]["num_heads"] == 16
    assert get_preset("base-b-dk16")["model"]["key_dim"] == 16
    assert get_preset("base-d-ls0.2")["training"]["label_smoothing"] == 0.2
    assert get_preset("base-e-learned")["model"]["positional"] == "learned"
    assert get_preset("big")["model"]["dropout"] == 0.3
    # Presets are data: get_preset hands out copies.
    get_preset("base")["model"]["d_model"] = 1
    assert PRESETS["base"]["model"]["d_model"] == 512


def test_params_command_prints_the_count_last(capsys):
    assert cli.main(["params", "--preset", "base", "--vocab-size", str(VOCAB)]) == 0
    assert int(capsys.readouterr().out.strip().splitlines()[-1]) == round(params("base") * 1e6)


def test_params_command_rejects_unknown_preset(capsys):
    assert cli.main(["params", "--preset", "huge"]) == 2
    assert "Unknown preset 'huge'" in capsys.readouterr().err
