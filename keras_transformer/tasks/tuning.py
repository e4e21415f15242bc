"""Choices made on validation data: which weights to decode with (the final ones, an average
of checkpoints, or best.keras, the best dev evaluation's) and the length penalty. The main
job makes them and saves them in the run (`decoding.decoder.Decoder.save_choice`), where
translate, evaluate and export find them.

Only val is used: a test set is decoded once, at the end, and only reported.
"""

from keras_transformer.decoding.request import DEFAULTS

# Weights tried on val: (k, j) = the average of the last k checkpoints taken j apart (every
# j-th one counting back from the newest); (1, 1) is the final weights.
AVERAGE_CANDIDATES = ((1, 1), (5, 1), (10, 1), (5, 2), (10, 2), (20, 1), (20, 2))
# GNMT length penalties tried on val with the beam (the paper's is 0.6). The grid reaches a
# value past the best one seen on Multi30k (docs/results.md), so the choice is never its edge.
ALPHAS = (0.6, 1.0, 1.4, 1.8)
VAL_SENTENCES = 500  # val sentences decoded to make those choices


def weights_label(k, every):
    if k == 1:
        return "final weights"
    return f"average of the last {k} checkpoints" + (f", {every} apart" if every > 1 else "")


def best_label(record):
    return (f"best.keras (dev {record['metric']} {record['value']:.4f} at step "
            f"{record['step']})")


def choose_weights(run, sources, references):
    """Final weights, an average of checkpoints (AVERAGE_CANDIDATES) or the run's best.keras
    (when it holds other weights than the final ones), whichever has the best greedy sacreBLEU
    on the given val sentences. Returns (model, label, {label: BLEU})."""
    from keras_transformer.decoding.decoder import greedy_translator
    from keras_transformer.evaluation.bleu import score

    config, tokenizer = run.config, run.vocabulary()
    checkpoints = run.checkpoints()
    available = len(checkpoints)
    candidates = [(weights_label(k, every), k, every) for k, every in AVERAGE_CANDIDATES
                  if k == 1 or (k - 1) * every + 1 <= available]
    record = run.best()
    final_step = run.checkpoint_step(checkpoints[-1]) if checkpoints else None
    if record is not None and record["step"] != final_step:  # else: the final weights
        candidates.append((best_label(record), None, None))
    results, best = {}, None
    for label, k, every in candidates:
        if k is None:
            model = run.load_model(path=run.best_path)
        elif k == 1:
            model = run.load_model(prefer_averaged=False)
        else:
            model, _ = run.average(k, every=every)
        translator = greedy_translator(model, tokenizer, config.max_length)
        bleu = score(translator.translate(sources), references)["sacrebleu"]
        results[label] = bleu
        print(f"  val (first {len(sources)} sentences, greedy): {label}: sacreBLEU {bleu:.2f}",
              flush=True)
        if best is None or bleu > best[2]:
            best = (model, label, bleu)
    return best[0], best[1], results


def choose_alpha(model, tokenizer, max_length, sources, references,
                 beam=DEFAULTS["beam_size"]):
    """The GNMT length penalty (ALPHAS) with the best beam sacreBLEU on the given val
    sentences. Returns (alpha, {alpha: (BLEU, brevity penalty)})."""
    import sacrebleu

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.engines.precision import cast_model
    from keras_transformer.decoding.request import Request

    # The model in the precision a translator picks here, cast once for every alpha.
    precision = Decoder().precision[0]
    model = cast_model(model, precision)
    results, best = {}, None
    for alpha in ALPHAS:
        request = Request(beam_size=beam, alpha=alpha, precision=precision)
        translator = Decoder(request).engine(model, tokenizer, max_length)
        bleu = sacrebleu.corpus_bleu(translator.translate(sources), [references])
        results[alpha] = (round(bleu.score, 2), round(bleu.bp, 3))
        print(f"  val (first {len(sources)} sentences, beam {beam}): alpha {alpha}: sacreBLEU "
              f"{bleu.score:.2f} (brevity penalty {bleu.bp:.3f})", flush=True)
        if best is None or bleu.score > best[1]:
            best = (alpha, bleu.score)
    return best[0], results
