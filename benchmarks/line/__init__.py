"""Issue 46's benchmarks of the waiting room: Poisson arrivals (`arrivals.py`, serve_load's
--arrival-rate mode) and the three served scenarios (`scenarios.py`: the line, live before
jobs, fairness)."""
