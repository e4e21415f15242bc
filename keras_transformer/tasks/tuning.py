"""Choices made on dev sentences: which weights to decode with (the final ones, an average of
checkpoints, or best.keras, the best dev evaluation's), the length penalty, and the
repetition controls (`decoding.search.repetition`: on only where the dev set says they help).
The `tune` stage (tasks/stages.py) makes them and saves them in the run
(`decoding.decoder.Decoder.save_choice`), where translate, evaluate and export find them.

Only dev sentences are used: a test set is decoded once, at the end, and only reported.

Every search takes `progress`, a bar to advance by the sentences it decoded (one bar over every
try: `tune`'s).
"""

from keras_transformer.decoding.request import DEFAULTS

# Weights tried: (k, j) = the average of the last k checkpoints taken j apart (every j-th one
# counting back from the newest); (1, 1) is the final weights.
AVERAGE_CANDIDATES = ((1, 1), (5, 1), (10, 1), (5, 2), (10, 2), (20, 1), (20, 2))
# GNMT length penalties tried with the beam (the paper's is 0.6). The grid reaches a value
# past the best one seen on Multi30k (docs/results.md), so the choice is never its edge.
ALPHAS = (0.6, 1.0, 1.4, 1.8)
VAL_SENTENCES = 500  # dev sentences decoded to make those choices (per pair)
# The repetition controls tried with the chosen alpha, as (no_repeat_ngram_size,
# repetition_penalty): off, and each control alone at common values (CTRL's penalty is 1.2).
# On the demo run no combination of the two stuttered less than 3-grams alone within NEAR_TIE
# of the best (the grid in docs/repetition.md). Off is the alpha search's own output: these
# cost four more decodes.
REPETITION_OFF = (0, 1.0)
REPETITION_CANDIDATES = (REPETITION_OFF, (3, 1.0), (4, 1.0), (0, 1.1), (0, 1.2))
# A user does not want an output that stutters: among the settings within this much of the
# best dev sacreBLEU, the one with the fewest stuttering outputs wins (then off, then the
# higher sacreBLEU). A setting that costs more BLEU than this is not taken for its stutters.
NEAR_TIE = 0.3


def _print(line):
    print(line, flush=True)


def beam_searches():
    """The beam searches of the dev sentences `choose_search` makes: every alpha, then every
    repetition setting but off (the chosen alpha's own output)."""
    return len(ALPHAS) + len(REPETITION_CANDIDATES) - 1


def weights_label(k, every):
    if k == 1:
        return "final weights"
    return f"average of the last {k} checkpoints" + (f", {every} apart" if every > 1 else "")


def best_label(record):
    return (f"best.keras (dev {record['metric']} {record['value']:.4f} at step "
            f"{record['step']})")


def weight_candidates(run):
    """[(label, k, every)] of the weights `choose_weights` tries on `run`: the final weights,
    the averages of AVERAGE_CANDIDATES its checkpoints allow, and best.keras where it holds
    other weights than the final ones ((label, None, None))."""
    checkpoints = run.checkpoints()
    available = len(checkpoints)
    candidates = [(weights_label(k, every), k, every) for k, every in AVERAGE_CANDIDATES
                  if k == 1 or (k - 1) * every + 1 <= available]
    record = run.best()
    final_step = run.checkpoint_step(checkpoints[-1]) if checkpoints else None
    if record is not None and record["step"] != final_step:  # else: the final weights
        candidates.append((best_label(record), None, None))
    return candidates


def choose_weights(run, sources, references, progress=None, name="val", say=_print):
    """Final weights, an average of checkpoints (AVERAGE_CANDIDATES) or the run's best.keras
    (when it holds other weights than the final ones), whichever has the best greedy sacreBLEU
    on the given dev sentences (`name`: what the lines call them). Returns (model, label,
    {label: BLEU})."""
    from keras_transformer.decoding.decoder import greedy_translator
    from keras_transformer.evaluation.bleu import score

    config, tokenizer = run.config, run.vocabulary()
    results, best = {}, None
    for label, k, every in weight_candidates(run):
        if k is None:
            model = run.load_model(path=run.best_path)
        elif k == 1:
            model = run.load_model(prefer_averaged=False)
        else:
            model, _ = run.average(k, every=every)
        translator = greedy_translator(model, tokenizer, config.max_length)
        translations = translator.translate(sources, progress=progress)
        bleu = score(translations, references)["sacrebleu"]
        results[label] = bleu
        say(f"  {name} (first {len(sources)} sentences, greedy): {label}: sacreBLEU {bleu:.2f}")
        if best is None or bleu > best[2]:
            best = (model, label, bleu)
    return best[0], best[1], results


def _beam_searcher(model, tokenizer, max_length):
    """A function of request values (beam_size, alpha, ...) -> the Keras engine searching
    `model` with them, in the precision a translator picks here (the model cast once)."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.engines.precision import cast_model
    from keras_transformer.decoding.request import Request

    precision = Decoder().precision[0]
    model = cast_model(model, precision)
    return lambda **values: Decoder(Request(precision=precision, **values)).engine(
        model, tokenizer, max_length)


def choose_alpha(model, tokenizer, max_length, sources, references,
                 beam=DEFAULTS["beam_size"], outputs=None, progress=None, name="val",
                 say=_print):
    """The GNMT length penalty (ALPHAS) with the best beam sacreBLEU on the given dev
    sentences. Returns (alpha, {alpha: (BLEU, brevity penalty)}); `outputs`, a dict, gets
    {alpha: translations} (`choose_repetition` reuses the chosen alpha's)."""
    import sacrebleu

    searcher = _beam_searcher(model, tokenizer, max_length)
    results, best = {}, None
    for alpha in ALPHAS:
        translations = searcher(beam_size=beam, alpha=alpha).translate(sources,
                                                                        progress=progress)
        if outputs is not None:
            outputs[alpha] = translations
        bleu = sacrebleu.corpus_bleu(translations, [references])
        results[alpha] = (round(bleu.score, 2), round(bleu.bp, 3))
        say(f"  {name} (first {len(sources)} sentences, beam {beam}): alpha {alpha}: "
            f"sacreBLEU {bleu.score:.2f} (brevity penalty {bleu.bp:.3f})")
        if best is None or bleu.score > best[1]:
            best = (alpha, bleu.score)
    return best[0], results


def repetition_label(setting):
    """"off", or the controls of (no_repeat_ngram_size, repetition_penalty) that are on."""
    ngram, penalty = setting
    said = ([f"no_repeat_ngram_size {ngram}"] if ngram != REPETITION_OFF[0] else []) + (
        [f"repetition_penalty {penalty}"] if penalty != REPETITION_OFF[1] else [])
    return ", ".join(said) or "off"


def pick_repetition(results, near=NEAR_TIE):
    """The setting to keep of `results` ({(no_repeat_ngram_size, repetition_penalty): (dev
    sacreBLEU, stuttering outputs)}): among those within `near` of the best sacreBLEU, the
    fewest stutters, then off, then the higher sacreBLEU, then the first tried."""
    best = max(bleu for bleu, _ in results.values())
    close = [setting for setting, (bleu, _) in results.items()
             if round(best - bleu, 6) <= near]
    return min(close, key=lambda setting: (results[setting][1], setting != REPETITION_OFF,
                                           -results[setting][0]))


def choose_repetition(model, tokenizer, max_length, sources, references, beam, alpha,
                      candidates=None, off_outputs=None, progress=None, name="val",
                      say=_print):
    """The repetition controls (`candidates`, each (no_repeat_ngram_size,
    repetition_penalty); default REPETITION_CANDIDATES) kept by `pick_repetition` after a beam
    search of the given dev sentences with `alpha`, each scored by sacreBLEU and by its
    outputs that stutter (`evaluation.stutter`: a piece 4+ times in a row). `off_outputs`: the
    translations with the controls off, when already made (the alpha search's). Returns
    (setting, {setting: (BLEU, stutters)})."""
    import sacrebleu

    from keras_transformer.evaluation.stutter import stutter_count

    searcher = _beam_searcher(model, tokenizer, max_length)
    results = {}
    for ngram, penalty in candidates or REPETITION_CANDIDATES:
        setting = (ngram, float(penalty))
        if setting == REPETITION_OFF and off_outputs is not None:
            translations = off_outputs
        else:
            translations = searcher(beam_size=beam, alpha=alpha, no_repeat_ngram_size=ngram,
                                    repetition_penalty=penalty).translate(
                sources, progress=progress)
        bleu = round(sacrebleu.corpus_bleu(translations, [references]).score, 2)
        results[setting] = (bleu, stutter_count(translations, tokenizer))
        say(f"  {name} (first {len(sources)} sentences, beam {beam}, alpha {alpha}): "
            f"{repetition_label(setting)}: sacreBLEU {bleu:.2f}, {results[setting][1]} "
            "outputs stutter")
    return pick_repetition(results), results


def choose_search(model, tokenizer, max_length, sources, references,
                  beam=DEFAULTS["beam_size"], progress=None, name="val", say=_print):
    """The length penalty (`choose_alpha`), then the repetition controls with it
    (`choose_repetition`), on the given dev sentences. Returns ({"alpha",
    "no_repeat_ngram_size", "repetition_penalty"}: the choice to save, {"alpha", "repetition"
    (`repetition_label`), and the dev figures behind them}: the main job's summary)."""
    outputs, said = {}, dict(progress=progress, name=name, say=say)
    alpha, by_alpha = choose_alpha(model, tokenizer, max_length, sources, references, beam,
                                   outputs, **said)
    (ngram, penalty), by_setting = choose_repetition(
        model, tokenizer, max_length, sources, references, beam, alpha,
        off_outputs=outputs[alpha], **said)
    figures = {"alpha": alpha, "repetition": repetition_label((ngram, penalty)),
               "val_beam_sacrebleu_by_alpha": {str(a): v for a, v in by_alpha.items()},
               "val_beam_by_repetition": {
                   repetition_label(setting): {
                       "sacrebleu": bleu, "stutters": count, "no_repeat_ngram_size": setting[0],
                       "repetition_penalty": setting[1]}
                   for setting, (bleu, count) in by_setting.items()}}
    return dict(alpha=alpha, no_repeat_ngram_size=ngram, repetition_penalty=penalty), figures


def tries(weights, figures, beam):
    """Every try of a tuning, in the order tried, as decoding.json lists them: `weights`
    ({member name or None: {label: greedy sacreBLEU}}), then `figures` (`choose_search`'s)."""
    listed = [dict({"member": member} if member else {}, search="greedy", weights=label,
                   sacrebleu=bleu)
              for member, results in weights.items() for label, bleu in results.items()]
    listed += [dict(search=f"beam {beam}", alpha=float(alpha), sacrebleu=bleu,
                    brevity_penalty=bp)
               for alpha, (bleu, bp) in figures["val_beam_sacrebleu_by_alpha"].items()]
    listed += [dict(search=f"beam {beam}", alpha=figures["alpha"], repetition=label, **values)
               for label, values in figures["val_beam_by_repetition"].items()]
    return listed
