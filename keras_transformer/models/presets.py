"""Presets as data: the paper's base and big models, every Table 3 variant, small CPU models.

Each preset has `model` (architecture: arguments of `Transformer`) and `training` (settings the
training recipe reads: label smoothing, warmup, steps). Parameter counts in the comments are for a
shared 37000-token vocabulary, as in the paper's Table 3 (`keras-transformer params`).
"""

import copy

from keras_transformer.errors import ConfigError

# Architecture of the paper's base model (Table 3, first row).
_BASE_MODEL = dict(
    num_layers=6, d_model=512, num_heads=8, d_ff=2048, key_dim=None, value_dim=None,
    dropout=0.1, positional="sinusoidal",
)
_BASE_TRAINING = dict(label_smoothing=0.1, warmup_steps=4000, train_steps=100_000)


def _variant(description, model=None, training=None):
    return {
        "description": description,
        "model": {**_BASE_MODEL, **(model or {})},
        "training": {**_BASE_TRAINING, **(training or {})},
    }


PRESETS = {
    # 63.1M. Paper: 65M.
    "base": _variant("Paper base model (Table 3, base row)."),
    # 214.3M. Paper: 213M. P_drop 0.3 for en-de (0.1 for en-fr).
    "big": _variant(
        "Paper big model (Table 3, big row).",
        model=dict(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
        training=dict(train_steps=300_000),
    ),
    # Row (A): number of heads, d_k = d_v = d_model / h. All 63.1M, like base.
    "base-a-h1": _variant("Table 3 row A: h=1, d_k=d_v=512.", model=dict(num_heads=1)),
    "base-a-h4": _variant("Table 3 row A: h=4, d_k=d_v=128.", model=dict(num_heads=4)),
    "base-a-h16": _variant("Table 3 row A: h=16, d_k=d_v=32.", model=dict(num_heads=16)),
    "base-a-h32": _variant("Table 3 row A: h=32, d_k=d_v=16.", model=dict(num_heads=32)),
    # Row (B): smaller attention keys. 56.0M and 58.4M (paper: 58M, 60M).
    "base-b-dk16": _variant("Table 3 row B: d_k=16.", model=dict(key_dim=16, value_dim=64)),
    "base-b-dk32": _variant("Table 3 row B: d_k=32.", model=dict(key_dim=32, value_dim=64)),
    # Row (C): model size. 33.7M, 48.4M, 77.8M (paper: 36M, 50M, 80M).
    "base-c-n2": _variant("Table 3 row C: N=2.", model=dict(num_layers=2)),
    "base-c-n4": _variant("Table 3 row C: N=4.", model=dict(num_layers=4)),
    "base-c-n8": _variant("Table 3 row C: N=8.", model=dict(num_layers=8)),
    # 26.8M and 163.9M (paper: 28M, 168M).
    "base-c-d256": _variant(
        "Table 3 row C: d_model=256, d_k=d_v=32.", model=dict(d_model=256, key_dim=32, value_dim=32)
    ),
    "base-c-d1024": _variant(
        "Table 3 row C: d_model=1024, d_k=d_v=128.",
        model=dict(d_model=1024, key_dim=128, value_dim=128),
    ),
    # 50.5M and 88.3M (paper: 53M, 90M).
    "base-c-ff1024": _variant("Table 3 row C: d_ff=1024.", model=dict(d_ff=1024)),
    "base-c-ff4096": _variant("Table 3 row C: d_ff=4096.", model=dict(d_ff=4096)),
    # Row (D): regularization. 63.1M each.
    "base-d-drop0": _variant("Table 3 row D: P_drop=0.0.", model=dict(dropout=0.0)),
    "base-d-drop0.2": _variant("Table 3 row D: P_drop=0.2.", model=dict(dropout=0.2)),
    "base-d-ls0": _variant("Table 3 row D: eps_ls=0.0.", training=dict(label_smoothing=0.0)),
    "base-d-ls0.2": _variant("Table 3 row D: eps_ls=0.2.", training=dict(label_smoothing=0.2)),
    # Row (E): learned positional embeddings instead of sinusoids. 63.6M.
    "base-e-learned": _variant(
        "Table 3 row E: learned positional embeddings.",
        model=dict(positional="learned", max_length=512),
    ),
    # Small models for CPU work. tiny: 1.2M at 37k (mostly embeddings), for tests.
    "tiny": _variant(
        "Tiny model for tests and smoke runs (2 layers, d_model=32).",
        model=dict(num_layers=2, d_model=32, num_heads=4, d_ff=64),
        training=dict(warmup_steps=100, train_steps=1000),
    ),
    # Multi30k-sized model for a 2-core CPU: 15.0M at 37k; 7.6M with an 8000-piece vocabulary.
    "small": _variant(
        "Small model for Multi30k on a CPU (3 layers, d_model=256, d_ff=1024, h=4).",
        model=dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024),
        training=dict(warmup_steps=2000, train_steps=20_000),
    ),
    # The Multi30k recipe for a 2-core CPU: the small architecture with a little more dropout
    # for ~60 epochs of this small corpus (29k pairs); docs/results.md has the runs that chose
    # it. 7.6M parameters with an 8000-piece vocabulary.
    "multi30k": _variant(
        "Multi30k recipe for a 2-core CPU (3 layers, d_model=256, d_ff=1024, h=4, P_drop=0.2).",
        model=dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.2),
        training=dict(warmup_steps=800, train_steps=8_000),
    ),
    # The d_model-128 family of the strongest text-only Multi30k en-de result we know (Wu et
    # al., ACL 2021, "Transformer-tiny": 41.02 BLEU on test2016 in the lowercased, tokenized
    # convention): 4 + 4 layers, d_model 128, d_ff 256, 4 heads, P_drop 0.3, all embeddings
    # shared. 2.6M parameters with a 10000-piece vocabulary (1.3M outside the embedding).
    "multi30k-tiny": _variant(
        "Multi30k Transformer-tiny for a 2-core CPU (4 layers, d_model=128, d_ff=256, h=4, "
        "P_drop=0.3; Wu et al., 2021).",
        model=dict(num_layers=4, d_model=128, num_heads=4, d_ff=256, dropout=0.3),
        training=dict(warmup_steps=2000, train_steps=8_000),
    ),
    # Constituency parsing (Section 6.3) scaled to a 2-core CPU: the paper's 4 layers, a smaller
    # d_model for the ~3.7k training trees of the WSJ sample, with P_drop 0.2.
    "parse-small": _variant(
        "Parsing on the WSJ sample for a 2-core CPU (4 layers, d_model=256, d_ff=1024, h=4, "
        "P_drop=0.2, pre-norm: with post-norm the encoder collapsed to a constant output on "
        "this small set).",
        model=dict(num_layers=4, d_model=256, num_heads=4, d_ff=1024, dropout=0.2,
                   norm_first=True),
        training=dict(warmup_steps=1000, train_steps=10_000),
    ),
}


def preset_names():
    return sorted(PRESETS)


def get_preset(name):
    """Returns a deep copy of preset `name`: {"description", "model", "training"}."""
    if name not in PRESETS:
        raise ConfigError(f"Unknown preset {name!r}. Known presets: {', '.join(preset_names())}.")
    return copy.deepcopy(PRESETS[name])
