"""Worlds in the ingress: sessions kept in the world store (keeping.py) and revived from it (revive.py)."""
