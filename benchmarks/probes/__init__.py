"""Engine-level probes, one question each, run on the device without Serve: attention kernels at
the DiT's shapes (`attention`), the device's idle gaps (`gaps`), a fork's copy against the
journal's replay (`clone_bench`), the first chunk after a start (`first_chunk`). The world store's benchmark is
benchmarks/worlds/store.py."""
