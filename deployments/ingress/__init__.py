"""The ingress side: the FastAPI WorldIngress, one Connection per socket and what it owns (lanes, replies, resume, releases), the session journal and recovery, the parking of dropped sessions."""
