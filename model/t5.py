"""Text encoder (spec C.1): the reference's tokenizer and cleaning + transformers' UMT5 encoder.

The released encoder is a Wan-format state dict (`models_t5_umt5-xxl-enc-bf16.pth`, no config);
the dims are read from tensor shapes, the keys are mapped onto `transformers.UMT5EncoderModel`
(per-layer relative position bias, gated-GELU FFN, no attention scaling: the same network)
and assigned one tensor at a time into a model built on the meta device.
"""
from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import ftfy
import torch
from tokenizers import Tokenizer

if TYPE_CHECKING:
    from transformers import UMT5Config, UMT5EncoderModel

from model.checkpoint import CheckpointError, CheckpointLayout, assign_state_dict, load_pth, shape_of
from model.config import T5Config
from model.text_int8 import BLOCK_ROWS, Int8Embedding, Int8Linear, quantize_rows, quantized_tensors, swap_in_int8

TEXT_LEN = 512  # tokens after padding / truncation (`</s>` included)
PAD_ID = 0
EOS_ID = 1
REL_MAX_DISTANCE = 128
LAYER_NORM_EPS = 1e-6

_TOP_KEYS = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}
_BLOCK_KEYS = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
_WAN_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def clean_text(text: str) -> str:
    """The reference's 'whitespace' cleaning: ftfy fix, HTML-unescape twice, strip, collapse
    whitespace runs to one space, strip."""
    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def wan_to_hf_t5_key(key: str) -> str:
    """Wan T5 encoder key -> `UMT5EncoderModel` parameter name."""
    if key in _TOP_KEYS:
        return _TOP_KEYS[key]
    m = _WAN_BLOCK.fullmatch(key)
    if m is None or m.group(2) not in _BLOCK_KEYS:
        raise CheckpointError(f"not a Wan T5 encoder key: {key!r}")
    return f"encoder.block.{m.group(1)}.{_BLOCK_KEYS[m.group(2)]}"


def t5_config_from_state_dict(sd: Mapping[str, torch.Tensor], source: Path | str) -> T5Config:
    """Encoder dims from the tensor shapes of a Wan-format state dict."""
    vocab, dim = shape_of(sd, "token_embedding.weight", source)
    num_buckets, num_heads = shape_of(sd, "blocks.0.pos_embedding.embedding.weight", source)
    dim_attn = shape_of(sd, "blocks.0.attn.q.weight", source)[0]
    dim_ffn = shape_of(sd, "blocks.0.ffn.fc1.weight", source)[0]
    num_layers = len({m.group(1) for k in sd if (m := _WAN_BLOCK.fullmatch(k))})
    if dim_attn % num_heads:
        raise CheckpointError(f"{source}: attention width {dim_attn} does not split into {num_heads} heads")
    return T5Config(vocab, dim, dim_attn, dim_ffn, num_heads, num_layers, num_buckets)


def umt5_config(cfg: T5Config) -> UMT5Config:
    """The transformers config of the same network (eval: no dropout)."""
    from transformers import UMT5Config  # here, not at import: transformers takes ~2-4 s to import, and
    # importing the deployments (Serve's app build, every replica's start) must not pay it
    return UMT5Config(
        vocab_size=cfg.vocab,
        d_model=cfg.dim,
        d_kv=cfg.dim_attn // cfg.num_heads,
        d_ff=cfg.dim_ffn,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        relative_attention_num_buckets=cfg.num_buckets,
        relative_attention_max_distance=REL_MAX_DISTANCE,
        dropout_rate=0.0,
        layer_norm_epsilon=LAYER_NORM_EPS,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
    )


def load_umt5(
    cfg: T5Config,
    wan_tensors: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]],
    source: Path | str,
    dtype: torch.dtype,
    device: torch.device | str,
    int8: bool = False,
) -> UMT5EncoderModel:
    """Build the encoder on the meta device and assign Wan-format tensors one by one.
    `int8`: its matrices stored as int8 with row scales (model/text_int8.py)."""
    from transformers import UMT5EncoderModel  # (see umt5_config)

    with torch.device("meta"):
        model = UMT5EncoderModel(umt5_config(cfg))
    items = wan_tensors.items() if isinstance(wan_tensors, Mapping) else wan_tensors

    def remapped() -> Iterator[tuple[str, torch.Tensor]]:
        for key, value in items:
            try:
                yield wan_to_hf_t5_key(key), value
            except CheckpointError as exc:
                raise CheckpointError(f"{source}: {exc}") from exc

    tensors, exact = remapped(), frozenset()
    if int8:
        with torch.device("meta"):
            names = swap_in_int8(model, dtype)
        model.encoder.set_input_embeddings(model.shared)  # tied to the int8 table, not a second one
        tensors = quantized_tensors(tensors, names, device)
        exact = frozenset(n.removesuffix("weight") + "scale" for n in names)  # float32 scales stay float32
    assign_state_dict(model, tensors, source, dtype, device, exact=exact)
    model.encoder.set_input_embeddings(model.shared)  # re-tie: the encoder embeds with `shared`
    return model.eval().requires_grad_(False)


def _padded_tokenizer(tokenizer: str | Path | Tokenizer | object) -> Tokenizer:
    """A private `tokenizers.Tokenizer` padding/truncating to TEXT_LEN, from a tokenizer
    directory (tokenizer.json), a Tokenizer, or a transformers fast tokenizer."""
    if isinstance(tokenizer, (str, Path)):
        path = Path(tokenizer) / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"missing tokenizer {path}")
        tok = Tokenizer.from_file(str(path))
    elif isinstance(tokenizer, Tokenizer):
        tok = Tokenizer.from_str(tokenizer.to_str())
    elif isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
        tok = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    else:
        raise ValueError(
            f"expected a tokenizer directory or a fast tokenizer, got {type(tokenizer).__name__}"
        )
    if tok.encode("").ids != [EOS_ID]:
        raise ValueError(f"the tokenizer must append </s> = {EOS_ID} to every sequence (UMT5 layout)")
    tok.enable_truncation(max_length=TEXT_LEN)
    tok.enable_padding(length=TEXT_LEN, pad_id=PAD_ID, pad_token=tok.id_to_token(PAD_ID))
    return tok


class TextEncoder:
    """Prompt -> UMT5 context [L, dim] (L = tokens incl. `</s>`), as the reference."""

    def __init__(self, model: UMT5EncoderModel, tokenizer: str | Path | Tokenizer | object) -> None:
        self.model = model
        self.tokenizer = _padded_tokenizer(tokenizer)
        if self.tokenizer.get_vocab_size() > model.config.vocab_size:
            raise ValueError(
                f"tokenizer has {self.tokenizer.get_vocab_size()} tokens, the encoder only "
                f"{model.config.vocab_size} embeddings"
            )

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: CheckpointLayout | str | Path,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        int8: bool = False,
    ) -> "TextEncoder":
        """Load `<root>/models_t5_umt5-xxl-enc-bf16.pth` and `<root>/google/umt5-xxl`."""
        layout = checkpoint
        if not isinstance(layout, CheckpointLayout):
            layout = CheckpointLayout.discover(checkpoint)
        sd = load_pth(layout.t5_file)  # memory-mapped: tensors are read as they are assigned
        cfg = t5_config_from_state_dict(sd, layout.t5_file)
        model = load_umt5(cfg, sd, layout.t5_file, dtype, device, int8)
        return cls(model, layout.tokenizer_dir)

    @property
    def dim(self) -> int:
        return self.model.config.d_model

    @property
    def device(self) -> torch.device:
        return self.model.shared.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The context's dtype (the final norm's: the token table may be int8)."""
        return self.model.encoder.final_layer_norm.weight.dtype

    def tokenize(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Cleaned prompt -> (ids, mask), int64 [1, 512] on the CPU; `</s>` appended, pad 0."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        enc = self.tokenizer.encode(clean_text(prompt))
        ids = torch.tensor([enc.ids], dtype=torch.int64)
        mask = torch.tensor([enc.attention_mask], dtype=torch.int64)
        return ids, mask

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        """Context [L, dim] in the model's dtype and device, trimmed to the L real tokens."""
        ids, mask = self.tokenize(prompt)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.last_hidden_state[0, : int(mask.sum())]


def init_t5_random(
    cfg: T5Config,
    tokenizer: str | Path | Tokenizer | object,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    int8: bool = False,
) -> TextEncoder:
    """An encoder of the given dims with seeded random weights (the embedded tiny model).

    Matrices are N(0, 1/fan_in) (embeddings and relative biases alike), norms are 1; the
    tensors are drawn in Wan key order from a CPU generator, so the weights do not depend
    on the device.
    """
    gen = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {"token_embedding.weight": (cfg.vocab, cfg.dim)}
    for i in range(cfg.num_layers):
        block = {
            "norm1.weight": (cfg.dim,),
            "attn.q.weight": (cfg.dim_attn, cfg.dim),
            "attn.k.weight": (cfg.dim_attn, cfg.dim),
            "attn.v.weight": (cfg.dim_attn, cfg.dim),
            "attn.o.weight": (cfg.dim, cfg.dim_attn),
            "norm2.weight": (cfg.dim,),
            "ffn.gate.0.weight": (cfg.dim_ffn, cfg.dim),
            "ffn.fc1.weight": (cfg.dim_ffn, cfg.dim),
            "ffn.fc2.weight": (cfg.dim, cfg.dim_ffn),
            "pos_embedding.embedding.weight": (cfg.num_buckets, cfg.num_heads),
        }
        shapes.update({f"blocks.{i}.{k}": s for k, s in block.items()})
    shapes["norm.weight"] = (cfg.dim,)

    def draw() -> Iterator[tuple[str, torch.Tensor]]:
        for key, shape in shapes.items():
            if len(shape) == 1:
                yield key, torch.ones(shape)
            else:
                yield key, torch.randn(shape, generator=gen) * shape[1] ** -0.5

    model = load_umt5(cfg, draw(), f"random T5 (seed {seed})", dtype, device, int8)
    return TextEncoder(model, tokenizer)


@torch.no_grad()
def init_t5_random_on_device(
    cfg: T5Config,
    tokenizer: str | Path | Tokenizer | object,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    int8: bool = False,
) -> TextEncoder:
    """An encoder of `cfg`'s dims with random weights drawn directly on `device` (released-size
    load tests and benchmarks: nothing passes through host memory).

    Matrices ~ N(0, 1/fan_in) (embeddings and relative biases alike), norms 1; the values
    depend on the device's generator. `int8`: the matrices drawn in row blocks and stored
    quantized (model/text_int8.py), so the device never holds them in bf16.
    """
    from transformers import UMT5EncoderModel  # (see umt5_config)

    with torch.device("meta"):
        model = UMT5EncoderModel(umt5_config(cfg)).to(dtype)
        if int8:
            swap_in_int8(model, dtype)
    # Untied while allocating: to_empty would give the tied embedding a second tensor (2 GiB at
    # the released size, over an 80 GB card's 0.14 share at load), then re-tied.
    model.encoder.embed_tokens = None
    model.to_empty(device=device)
    model.encoder.set_input_embeddings(model.shared)
    gen = torch.Generator(device=device).manual_seed(seed)
    for _, p in model.named_parameters():
        if p.ndim == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    for module in model.modules():
        if isinstance(module, (Int8Linear, Int8Embedding)):
            rows, cols = module.weight.shape
            for lo in range(0, rows, BLOCK_ROWS):  # a block of float32 draws at a time, never the whole matrix
                block = torch.empty(min(BLOCK_ROWS, rows - lo), cols, device=device).normal_(0.0, cols ** -0.5, generator=gen)
                module.weight[lo:lo + len(block)], module.scale[lo:lo + len(block)] = quantize_rows(block)
    return TextEncoder(model.eval().requires_grad_(False), tokenizer)
