"""How the Ray processes of a deployment should allocate memory (environment of the node).

Serve's HTTP proxy reads each client frame whole (up to 16 MiB) and the ingress decodes it.
With glibc's default, the threshold above which an allocation is its own `mmap` grows with the
largest block freed so far (up to 32 MiB): after a few large frames, 16 MiB buffers come from
the heap and their pages stay with the process after they are freed. A fixed threshold keeps
every buffer of 1 MiB or more its own mapping, returned to the system when freed, so a flood of
large frames leaves less behind (measured: a 10 s or a 30 s flood of 15 MiB frames over four
sockets leaves ~190 MiB in the proxy and the ingress either way, against ~350 MiB without, and
the peak is ~300 MiB: bounded by the per-socket byte budget, not by the flood's length). Set it
in the environment that starts Ray (the shipped k8s manifests do; for `serve run`, export it
first); the tests start Ray with it.
"""
from __future__ import annotations

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(4 * 1024 * 1024),
}
