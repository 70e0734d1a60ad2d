"""Engine-level probes, one question each, run on the device without Serve: attention kernels at
the DiT's shapes (`attention`), the device's idle gaps (`gaps`), a fork's copy against the
journal's replay (`clone_bench`), the first chunk after a start (`first_chunk`); and one without
a device: the world store's bytes, writes and opens (`world_store`)."""
