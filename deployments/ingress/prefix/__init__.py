"""Exact-prefix reuse (issue 33 part 1): keys.py, store.py, reuse.py."""
