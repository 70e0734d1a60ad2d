"""GPU benchmarks of the model path (`python -m benchmarks.run --help`)."""
