"""Same output as recorded: every search mode, through every caller (the compiled searches of
`Translator`, the exported graphs of the SavedModel and TFLite), gives the ids and scores saved
in tests/fixtures/search_outputs.json (text: name -> dtype, shape, values) from a fixed tiny model (see make_search_fixtures.py)."""

import numpy as np
import pytest

from tests.fixtures import make_search_fixtures as fixtures


@pytest.fixture(scope="module")
def recorded():
    return fixtures.read_fixture()


@pytest.fixture(scope="module")
def model(recorded):
    model = fixtures.fixed_model()
    digest = fixtures.weights_digest(model)
    # Otherwise the comparisons below would be of another model, not of the search.
    assert digest == pytest.approx(float(recorded["weights_digest"]), rel=1e-12), (
        f"the fixed model rebuilt from seed {fixtures.SEED} has other weights (digest {digest} "
        f"!= {float(recorded['weights_digest'])} in {fixtures.FIXTURE}): the initializers or "
        "the tiny preset changed; rebuild the fixture only with the search unchanged")
    return model


def compare(recorded, outputs, exported=None):
    """Today's outputs equal to the recorded ones; with `exported` given, every recorded
    output of that group (exported graphs or in-process searches) is among them."""
    assert outputs and set(outputs) <= set(recorded), sorted(set(outputs) - set(recorded))
    if exported is not None:
        group = {name for name in recorded if name != "weights_digest"
                 and name.startswith(("graph_", "tflite_")) == exported}
        assert set(outputs) == group, sorted(set(outputs) ^ group)
    for name, value in outputs.items():
        expected = recorded[name]
        assert value.shape == expected.shape, (name, value.shape, expected.shape)
        if np.issubdtype(expected.dtype, np.integer):
            np.testing.assert_array_equal(value, expected, err_msg=name)
        else:
            # Ids exactly; scores within float32 summation noise: oneDNN picks other kernels
            # on other CPU classes (on the AMX class a sum of -64.8 differs by 1.5e-5, two
            # units in its last place), so the bound is relative as well as absolute.
            np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def quick_outputs(model):
    return fixtures.in_process_outputs(model, quick=True)


def test_each_mode_gives_the_recorded_ids_and_scores(quick_outputs, recorded):
    compare(recorded, quick_outputs)
    assert {"greedy.ids", "beam.ids", "beam_prefix.ids", "sample_topk.ids",
            "score.log_prob"} <= set(quick_outputs)


@pytest.mark.slow
def test_every_compiled_search_gives_the_recorded_ids_and_scores(model, recorded,
                                                                 quick_outputs):
    # The quick searches' outputs are the quick test's (computed once); the rest here.
    rest = fixtures.in_process_outputs(model, rest=True)
    assert not set(rest) & set(quick_outputs)
    compare(recorded, {**quick_outputs, **rest}, exported=False)


@pytest.mark.slow
def test_exported_searches_give_the_recorded_ids_and_scores(model, recorded):
    outputs = fixtures.exported_outputs(model)
    compare(recorded, outputs, exported=True)
    assert {"graph_search.ids", "graph_nbest.ids", "graph_sample.ids", "graph_xla.ids",
            "tflite_beam4_row3.nbest_ids"} <= set(outputs)
