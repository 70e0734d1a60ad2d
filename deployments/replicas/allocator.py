"""How the Ray processes of a deployment should allocate memory (environment of the node).

Serve's HTTP proxy reads each client frame whole (up to the proxy guard's cap; 16 MiB without
it) and the ingress decodes it.
With glibc's default, the threshold above which an allocation is its own `mmap` grows with the
largest block freed so far (up to 32 MiB): after a few large frames, 16 MiB buffers come from
the heap and their pages stay with the process after they are freed. A fixed threshold keeps
every buffer of 1 MiB or more its own mapping, returned to the system when freed, so a flood of
large frames leaves less behind (measured: a 10 s or a 30 s flood of 15 MiB frames over four
sockets leaves ~190 MiB in the proxy and the ingress either way, against ~350 MiB without, and
the peak is ~300 MiB: bounded by the per-socket byte budget, not by the flood's length). Set it
in the environment that starts Ray (the shipped k8s manifests do; `scripts/setup.sh` makes it
the default of every Python of `.venv`, so the README's `serve run` has it; elsewhere, export it
first); the tests start Ray with it.

The same environment makes each raylet free the object store's unreferenced objects every
100 ms instead of every second (`RAY_free_objects_period_milliseconds`): the ingress pulls each
client frame from the proxy through the object store, and during a flood of legitimate 11 MiB
frames (about 10 a second over reconnecting sockets) a second's worth of them stayed there, their
pages resident in both the proxy and the ingress (measured: object-store pages +87 to +143 MiB
in each after a 10 s flood at the default 1 s; +35 at 50 ms).
"""
from __future__ import annotations

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(4 * 1024 * 1024),
    "RAY_free_objects_period_milliseconds": "100",
}
