"""The causal DiT: its model, blocks, loader, KV caches, RoPE, Plücker camera embedding and sampler."""
