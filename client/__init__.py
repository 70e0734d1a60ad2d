"""Python client of the realtime camera protocol and the `lwf-client` CLI.

Installed from clients/python, this package is `lingbot_world_client` (protocol, camera and
media are its subpackages there): `from lingbot_world_client import SyncWorldClient`."""
from camera.plan import SessionPlan
from client.errors import BadReply, ReplyTimeout, ServerError
from client.session import WorldClient
from client.streaming import StreamResult, stream_session
from client.sync import Chunk, SyncWatch, SyncWorldClient, Video, watch
from client.trajectory import Trajectory, plan_session
from media.pyav import MissingPyAV
from protocol.requests import SessionStart, drive_request, infer_request

__all__ = ["BadReply", "Chunk", "MissingPyAV", "ReplyTimeout", "ServerError", "SessionPlan", "SessionStart",
           "StreamResult", "SyncWatch", "SyncWorldClient", "Trajectory", "Video", "WorldClient", "drive_request",
           "infer_request", "plan_session", "stream_session", "watch"]
