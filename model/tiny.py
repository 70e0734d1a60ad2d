"""The embedded tiny default model: served when no checkpoint is configured.

It has the dims of the `tiny` preset (those of the upstream-layout tiny test checkpoint),
seeded random weights built in-process, and a byte-level tokenizer made in code (pad 0,
`</s>` 1, `<unk>` 2, then the 256 bytes), so `serve run serve_config.yaml` needs no files.
Its videos are noise-like: it exists to exercise the whole serving path on any machine.
"""
from __future__ import annotations

from functools import lru_cache

EMBEDDED_SEED = 20260408
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")


@lru_cache(maxsize=1)
def tiny_tokenizer():
    """A deterministic byte-level tokenizer with the UMT5 special-token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
