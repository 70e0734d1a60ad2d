"""The embedded tiny default model: served when no checkpoint is configured.

Its DiT and T5 have the dims of the `tiny` preset (those of the upstream-layout tiny test
checkpoint); its VAE is the same Wan 2.1 architecture at a quarter of that checkpoint's width
(`EMBEDDED_VAE`: dim 4 instead of 16, z_dim 16 as the DiT needs), because the VAE is nearly
all of a CPU chunk's time. Seeded random weights are built in-process and the byte-level
tokenizer is made in code (pad 0, `</s>` 1, `<unk>` 2, then the 256 bytes), so
`serve run serve_config.yaml` needs no files. Its videos are coloured noise: it exists to
exercise the whole serving path (pipeline, protocol, performance) on any machine.
"""
from __future__ import annotations

from functools import lru_cache

from model.config import VAEConfig

EMBEDDED_SEED = 20260408
# CPU time of one thread (what Ray gives a replica of num_cpus < 1) per chunk at 112x224, VAE
# encode + decode: dim 16 (the golden checkpoint's) 1.8-2.4 s + 3.0-4.2 s; dim 8 0.8-1.2 s +
# 1.5-2.1 s; dim 4 0.45-0.60 s + 0.69-0.97 s (the DiT: 0.05-0.07 s). At these widths most 3-D
# convolutions take PyTorch's unfold path, not oneDNN's, which is why halving the width saves
# about 2x, not 4x.
EMBEDDED_VAE = VAEConfig(dim=4, z_dim=16)
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
