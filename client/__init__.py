"""Python client of the realtime camera protocol and the `lwf-client` CLI."""
from camera.plan import SessionPlan
from client.errors import ServerError
from client.session import WorldClient
from client.streaming import StreamResult, stream_session
from client.trajectory import Trajectory, plan_session

__all__ = ["ServerError", "SessionPlan", "StreamResult", "Trajectory", "WorldClient", "plan_session", "stream_session"]
