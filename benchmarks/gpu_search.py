"""Speed of our cached greedy and beam search under JAX, for benchmarks/gpu.py.

Each search is jit-compiled, run once (it compiles), then timed --search-repeats times on
random source ids as long as the shape's length (median). The output may be as long as the
source (extra_length=0: EOS is forced there; random weights rarely end earlier), and
target_tokens counts the tokens returned (best hypothesis). Imports no TensorFlow.
"""

import gc

import numpy as np

from common import sig, timed
from gpu_engines import ENGINES, FIRST_ID, our_model, set_policy

BEAM_SIZE = 4  # the paper's beam for translation (Section 6.1)


def import_searches():
    """(greedy, beam) factories, or the reason they cannot run under this backend."""
    try:
        from keras_transformer.decoding.search.beam_search import compiled_beam_search
        from keras_transformer.decoding.search.greedy import compiled_greedy_search
    except Exception as error:
        return None, f"search: {type(error).__name__}: {error}"
    return (compiled_greedy_search, compiled_beam_search), None


def search_speed(search, shape, batch, repeats):
    """Milliseconds per call and tokens returned (best hypothesis) on random source ids."""
    rng = np.random.default_rng(1)
    source = rng.integers(FIRST_ID, shape.vocab, (batch, shape.length), dtype=np.int32)

    def run():
        result = search(source)
        ids = result["ids"] if isinstance(result, dict) else result[0]
        ids = np.asarray(ids)  # waits for the device
        return ids[:, 0] if ids.ndim == 3 else ids  # beam: (B, K, T), best first

    seconds, ids = timed(run, repeats)
    return seconds * 1e3, int(np.count_nonzero(ids))


def search_records(shape, dtype, factories, args, report):
    """Emits one gpu_search line per search (greedy, beam) and batch of args.search_batches."""
    import keras

    set_policy(dtype)
    try:
        keras.utils.set_random_seed(0)
        model = our_model(shape)
        for batch in args.search_batches:
            for name, factory, beam in (("greedy", factories[0], 1),
                                        ("beam", factories[1], BEAM_SIZE)):
                record = {"benchmark": "gpu_search", "engine": ENGINES["ours"],
                          "shape": shape.name, "dtype": dtype, "search": name, "beam": beam,
                          "batch": batch, "src_len": shape.length, "device": args.device}

                def measure(factory=factory, beam=beam, batch=batch):
                    options = dict(extra_length=0, jit_compile=True)
                    if beam > 1:
                        options["beam_size"] = beam
                    search = factory(model, **options)
                    ms, tokens = search_speed(search, shape, batch, args.search_repeats)
                    return {"ms_per_call": sig(ms),
                            "sentences_per_s": round(batch / ms * 1e3, 1),
                            "target_tokens": tokens,
                            "target_tokens_per_s": round(tokens / ms * 1e3, 1)}

                report.attempt(record, measure)
    finally:
        set_policy("fp32")
        model = None
        keras.backend.clear_session()
        gc.collect()
