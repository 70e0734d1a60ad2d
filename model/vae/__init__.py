"""The causal Wan VAE: its model, blocks, conv caches, memory footprint and fast paths."""
