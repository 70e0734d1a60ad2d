"""Offline endpoint: a whole trajectory -> one MP4 (`POST /v1/videos`), or a job for long ones.

endpoint.py (the route handlers), request.py (body cap, validation, chunk plan), runner.py
(the session through a `Connection` in this process), jobs.py (bounded async jobs),
errors.py (wire codes as HTTP statuses).
"""
from deployments.ingress.videos.endpoint import VideoEndpoint

ROUTE = "/v1/videos"

__all__ = ["ROUTE", "VideoEndpoint"]
