"""The model-path benchmark's parts (`python -m benchmarks.run`, run.py): bench.py (Bench: the
stages' shared state and results, the VAE variants), dit_stages.py (the DiT's paths: float32
reference, eager, fast, compiled; their profiles), pipeline.py (the VAE variants and the end-to-end
chunk loop), fp8.py (FP8 GEMMs and attention, one change at a time), profiling.py (per-op
tables, device time per kernel kind)."""
