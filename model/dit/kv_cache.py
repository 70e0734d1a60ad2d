"""Per-session DiT caches: the self-attention KV cache with its rolling window, and the
cross-attention cache (spec A.5, A.6).

The caches hold post-RoPE keys and raw values, batch 1, shape [capacity, heads, head_dim].
All indices are python ints (no host syncs). Every DiT call writes its chunk: the 4
denoising calls of a chunk overwrite the same slot and the t = 0 call writes the clean K/V
that later chunks read. With a window (`local_attn_size` != -1) a new chunk that does not
fit evicts the oldest tokens after the sink; without one the capacity grows on demand.
With `fp8` the self-attention cache stores float8 with per-token, per-head scales
(model/dit/kv_quant.py) and hands attention a compute-dtype copy; the FP8 attention's code cache
(model/dit/kv_codes.py, a subclass) stores the e4m3 codes attention reads. The cross-attention
cache keeps the compute dtype (512 tokens per layer).
"""
from __future__ import annotations

import torch

from model.dit.e4m3 import E4M3
from model.dit.kv_quant import SCALE_DTYPE, dequantize_into, quantize


class SelfAttnKVCache:
    """One layer's self-attention cache.

    `ring`: a window whose whole cache is visible (rolling, no `max_attention_size` below it) as
    a ring: the sink keeps its slots, and a chunk's rows go to the slots of the tokens it evicts,
    token t at slot sink + (t - sink) mod (capacity - sink); nothing moves (a shifting window
    copies the kept rows down, most of the window per chunk and layer). Attention over the whole
    window is unmasked and the keys carry their positions (RoPE before caching), so the slots'
    order changes only the order of the softmax's sums (the reference shifts: the plain path
    keeps that order). A ring does not rewind: a chunk may rewrite the last one's tokens (the
    denoising calls) or come after them, not end before them.
    """

    def __init__(
        self,
        capacity: int,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        rolling: bool = False,
        sink_tokens: int = 0,
        max_attention_size: int | None = None,
        fp8: bool = False,
        ring: bool = False,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"KV capacity must be positive, got {capacity}")
        if rolling and not 0 <= sink_tokens < capacity:
            raise ValueError(f"sink of {sink_tokens} tokens does not fit a window of {capacity}")
        if max_attention_size is not None and max_attention_size <= 0:
            raise ValueError(f"max_attention_size must be positive, got {max_attention_size}")
        if ring and fp8:
            raise ValueError("a ring cache reads its chunk back from the slots: not with fp8's per-token scales")
        self.rolling = rolling
        self.sink_tokens = sink_tokens if rolling else 0
        self.max_attention_size = max_attention_size
        self.dtype = dtype  # what attention reads (the storage too, unless fp8)
        self.fp8 = fp8
        self.k = torch.zeros(capacity, heads, head_dim, dtype=E4M3 if fp8 else dtype, device=device)
        self.v = torch.zeros_like(self.k)
        if fp8:  # one scale per cached token and head, moved with its token
            self.k_scale = torch.zeros(capacity, heads, dtype=SCALE_DTYPE, device=device)
            self.v_scale = torch.zeros_like(self.k_scale)
        self.global_end = 0  # absolute token index after the last write
        self.local_end = 0  # slot index after the last write
        self.is_ring = ring and rolling and (max_attention_size is None or max_attention_size >= capacity)

    @property
    def capacity(self) -> int:
        return self.k.shape[0]

    @property
    def nbytes(self) -> int:
        scales = self.k_scale.nbytes + self.v_scale.nbytes if self.fp8 else 0
        return self.k.nbytes + self.v.nbytes + scales

    def _stored(self) -> tuple[str, ...]:
        return ("k", "v", "k_scale", "v_scale") if self.fp8 else ("k", "v")

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int):
        """Write the chunk's K/V [L, heads, head_dim] at absolute token `start`.

        Returns the K/V that the chunk attends to, [n, heads, head_dim] views of the cache
        (subclasses: in their own form, see `_write_rows` / `_read`).
        """
        if self.is_ring:
            return self._ring_update(k, v, start)
        new, lo = self._place(v.shape[0], start)
        self._write_rows(new.start, k, v, slice(0, v.shape[0]), new.start)
        return self._read(lo, k, v)

    def _ring_update(self, k, v: torch.Tensor, start: int):
        n, end = v.shape[0], start + v.shape[0]
        ring = self.capacity - self.sink_tokens
        if end < self.global_end:
            raise ValueError(f"chunk ending at token {end} is before the cache's end {self.global_end}: a ring "
                             "cache does not rewind; reset the cache to restart a session")
        if n > ring and end > self.capacity:
            raise ValueError(f"a chunk of {n} tokens does not fit the window of {self.capacity} tokens with a "
                             f"sink of {self.sink_tokens}")
        self.global_end, self.local_end = end, min(end, self.capacity)
        t = start
        while t < end:  # one piece, or two where the chunk wraps around the ring's end
            slot = t if t < self.sink_tokens else self.sink_tokens + (t - self.sink_tokens) % ring
            rows = slice(t - start, t - start + min(end - t, self.capacity - slot))
            self._write_rows(slot, k, v, rows, self.local_end)
            t += rows.stop - rows.start
        return self._read(0, k, v)

    def _place(self, n_new: int, start: int) -> tuple[slice, int]:
        """Make room for `n_new` tokens at absolute token `start` (evicting with a window,
        growing without one); returns their slots and the first slot the chunk attends to."""
        end = start + n_new
        advance = end - self.global_end
        if self.rolling and end > self.global_end and n_new + self.local_end > self.capacity:
            if n_new > self.capacity - self.sink_tokens:
                raise ValueError(
                    f"a chunk of {n_new} tokens does not fit the window of {self.capacity} "
                    f"tokens with a sink of {self.sink_tokens}"
                )
            n_evict = n_new + self.local_end - self.capacity
            n_roll = self.local_end - n_evict - self.sink_tokens
            assert n_roll >= 0
            lo, src = self.sink_tokens, self.sink_tokens + n_evict
            for name in self._stored():
                t = getattr(self, name)
                t[lo : lo + n_roll] = t[src : src + n_roll].clone()
            local_end = self.local_end + advance - n_evict
        else:
            local_end = self.local_end + advance
            if local_end > self.capacity:
                if self.rolling:
                    raise ValueError(f"write to slot {local_end} beyond the window {self.capacity}")
                self.ensure_capacity(local_end)
        if local_end - n_new < 0:
            raise ValueError(
                f"chunk at token {start} is before the cache's history (global end "
                f"{self.global_end}); reset the cache to restart a session"
            )
        self.global_end, self.local_end = end, local_end
        lo = 0 if self.max_attention_size is None else max(0, local_end - self.max_attention_size)
        return slice(local_end - n_new, local_end), lo

    def _write_rows(self, slot: int, k: torch.Tensor, v: torch.Tensor, rows: slice, rescale: int) -> None:
        """Rows `rows` of the chunk's K and V at slots from `slot` (`rescale`: the slots a code
        cache rescales when its descale grows, model/dit/kv_codes.py)."""
        new = slice(slot, slot + rows.stop - rows.start)
        if self.fp8:
            (self.k[new], self.k_scale[new]), (self.v[new], self.v_scale[new]) = quantize(k[rows]), quantize(v[rows])
        else:
            self.k[new] = k[rows]
            self.v[new] = v[rows]

    def _read(self, lo: int, k: torch.Tensor, v: torch.Tensor):
        if self.fp8:
            return self._dequantized(self.k, self.k_scale, k, lo), self._dequantized(self.v, self.v_scale, v, lo)
        return self.k[lo : self.local_end], self.v[lo : self.local_end]

    def _dequantized(self, q: torch.Tensor, scale: torch.Tensor, exact: torch.Tensor, lo: int) -> torch.Tensor:
        """Slots [lo, local_end) in the compute dtype: the past dequantised, the chunk just
        written (`exact`, its last tokens) as computed."""
        out = torch.empty(self.local_end - lo, *q.shape[1:], dtype=self.dtype, device=q.device)
        past = max(0, self.local_end - exact.shape[0] - lo)
        if past:
            dequantize_into(out[:past], q[lo : lo + past], scale[lo : lo + past])
        out[past:] = exact[exact.shape[0] - (out.shape[0] - past):]
        return out

    def ensure_capacity(self, tokens: int) -> None:
        """Grow (copying, at least doubling) so that `tokens` slots fit.

        A rolling window never grows (it evicts instead), so this is a no-op for it.
        """
        if self.rolling or tokens <= self.capacity:
            return
        new_cap = max(tokens, 2 * self.capacity)
        for name in self._stored():
            old = getattr(self, name)
            new = old.new_zeros(new_cap, *old.shape[1:])
            new[: self.local_end] = old[: self.local_end]
            setattr(self, name, new)

    def reset(self) -> None:
        """Forget the history; the storage is kept (a slot is always written before it is read)."""
        self.global_end = 0
        self.local_end = 0

    def clone(self) -> "SelfAttnKVCache":
        """An independent copy (a forked session's): every tensor copied on its device, the
        positions and settings as they are (subclasses' tensors too: scales, descales)."""
        return _cloned(self)


class CrossAttnCache:
    """One layer's cross-attention K/V of the text, [text_len, heads, head_dim]."""

    def __init__(
        self, text_len: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        self.k = torch.zeros(text_len, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.is_init = False

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.copy_(k)
        self.v.copy_(v)
        self.is_init = True

    def reset(self) -> None:
        """Forget the text K/V; the next call recomputes them."""
        self.is_init = False

    def clone(self) -> "CrossAttnCache":
        """An independent copy (its tensors copied on their device)."""
        return _cloned(self)


def _cloned(cache):
    """A shallow copy of `cache` whose tensor attributes are copies (`Tensor.clone`, same device):
    the cache writes its tensors in place, so the copy shares none of them."""
    copy = object.__new__(type(cache))
    copy.__dict__.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(cache).items()})
    return copy
