"""Worlds in the ingress: sessions kept in the world store (keeping.py, sessions.py), revived
from it (revive.py), saved and opened (requests.py), the caller's worlds over HTTP (routes.py)."""
from deployments.ingress.worlds.keeping import WorldKeeping
from deployments.ingress.worlds.requests import WorldRequests
from deployments.ingress.worlds.sessions import SessionWorlds

__all__ = ["SessionWorlds", "WorldKeeping", "WorldRequests"]
