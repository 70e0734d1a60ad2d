"""A session's history on the ingress (issue 33 and recovery): journal.py, recovery.py, rebuild.py,
branching.py."""
