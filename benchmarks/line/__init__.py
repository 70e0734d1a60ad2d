"""Issue 46's benchmarks of the waiting room: Poisson arrivals (`arrivals.py`, serve_load's
--arrival-rate mode) and the three served scenarios (`scenarios.py`: the line, live before
jobs, fairness). What every served benchmark shares about the line (issue 54, item 8): a
session's wait in it (`wait.py`) and the app's seats (`seats.py`: what needs more is skipped)."""
