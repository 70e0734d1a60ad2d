"""Worlds people share (issue 56): an owner's session watched live by link.

`book.py` keeps the worlds (no Ray); `hub.py` is the one-replica deployment every ingress
replica asks; `owner.py` is a connection's side as a world's owner (share, unshare, publish);
`feed.py` one ingress replica's viewers of a world, fed by one long poll; `viewer.py` the
watch route's sockets. Players: `policy.py` who drives a world (turns, crowd; no Ray, kept by
the book); `playing.py` a viewer socket's player requests to the hub; `inbox.py` the owner
side's long poll of its players' inputs, read per chunk by the connection's ControlBook.
"""
