"""Special token ids, defined once for the tokenizer, the pipelines, the model and search."""

PAD_ID = 0  # padding: masked in attention, ignored by the loss
BOS_ID = 1  # begins every decoder input
EOS_ID = 2  # ends every source and every target
UNK_ID = 3  # unknown piece (rare: the vocabulary falls back to UTF-8 bytes)
