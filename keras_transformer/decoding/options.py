"""The checks of decoding options, shared by every engine (`Translator`,
`CTranslate2Translator`): one rule and one message per option. No heavy imports."""

from keras_transformer.errors import InputError


def check_search_options(beam_size, batch_size, alpha):
    """Raises InputError naming a beam size or batch size below 1, or a negative (or NaN)
    alpha."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise InputError(f"beam_size={beam_size!r} must be an integer of at least 1.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r} must be an integer of at least 1.")
    if not alpha >= 0:  # NaN too
        raise InputError(f"alpha={alpha!r} must be at least 0.")


def check_sampling(num_samples=1, top_k=0, top_p=1.0, temperature=1.0, seed=0):
    """Raises InputError (a ValueError) naming each sampling option outside its range."""
    problems = []
    if not isinstance(num_samples, int) or num_samples < 1:
        problems.append(f"num_samples={num_samples!r} must be an integer of at least 1")
    if not isinstance(top_k, int) or top_k < 0:
        problems.append(f"top_k={top_k!r} must be an integer >= 0 (0: no top-k cut)")
    if not 0.0 < top_p <= 1.0:
        problems.append(f"top_p={top_p!r} must be in (0, 1] (1: no nucleus cut)")
    if not temperature > 0.0:
        problems.append(f"temperature={temperature!r} must be > 0")
    if not isinstance(seed, int) or not 0 <= seed < 2 ** 31:
        problems.append(f"seed={seed!r} must be an integer in [0, 2**31)")
    if problems:
        raise InputError("; ".join(problems) + ".")


def check_prefixes(sentences, prefixes):
    """Raises InputError unless `prefixes` is None or gives one string per sentence."""
    if prefixes is not None and len(prefixes) != len(sentences):
        raise InputError(f"prefixes must give one string per sentence: {len(sentences)} "
                         f"sentences, {len(prefixes)} prefixes.")


def check_targets(sources, targets):
    """Raises InputError unless there is one target per source (scoring)."""
    if len(sources) != len(targets):
        raise InputError(f"score needs one target per source: {len(sources)} sources, "
                         f"{len(targets)} targets.")
