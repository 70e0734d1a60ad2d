"""The application's waiting room: one line of sessions waiting for a place (issue 46).

`book.py` keeps the line (no Ray); `room.py` is the one-replica deployment every ingress
replica asks; `seat.py` is a connection's side of it (join, wait, try the admission, notices).
"""
