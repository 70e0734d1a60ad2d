"""S3WorldStore: the world store in any S3-compatible object store (AWS S3, SeaweedFS, MinIO, ...)
through `obstore` (the Rust `object_store` crate's Python binding), not hand-written HTTP.

Imported only where the S3 backend is chosen (`open_store`). Keys live under `prefix` in
`bucket`. A PUT is atomic in S3 (an object appears whole or not at all), so no temporary
object is needed. Credentials come from the environment (the variables
`worlds.access_key_env` / `worlds.secret_key_env` name, AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY by default; unset: obstore's own chain, e.g. an instance role). Requests
time out (`timeout_s`) and are retried once: a store that is down fails fast with
StoreUnavailable instead of holding a thread.
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import obstore
import obstore.exceptions
import obstore.store

from deployments.worlds.errors import StoreUnavailable, WorldNotFound
from deployments.worlds.store import ObjectInfo, WorldStore


class S3WorldStore(WorldStore):
    name = "s3"

    def __init__(self, bucket: str, *, endpoint: Optional[str] = None, prefix: str = "", region: str = "us-east-1",
                 access_key_env: str = "AWS_ACCESS_KEY_ID", secret_key_env: str = "AWS_SECRET_ACCESS_KEY",
                 timeout_s: float = 10.0) -> None:
        creds = {}
        if os.environ.get(access_key_env) and os.environ.get(secret_key_env):
            creds = {"access_key_id": os.environ[access_key_env], "secret_access_key": os.environ[secret_key_env]}
        extra = {}
        if endpoint:  # a non-AWS endpoint: path-style requests, http allowed when it says http
            extra = {"endpoint": endpoint, "virtual_hosted_style_request": False,
                     "client_options": {"allow_http": endpoint.startswith("http://"),
                                        "timeout": timedelta(seconds=timeout_s),
                                        "connect_timeout": timedelta(seconds=min(timeout_s, 2.0))}}
        else:
            extra = {"client_options": {"timeout": timedelta(seconds=timeout_s)}}
        self._store = obstore.store.S3Store(
            bucket, prefix=prefix.strip("/") or None, region=region,
            retry_config={"max_retries": 1, "backoff": {"init_backoff": timedelta(milliseconds=100),
                                                        "max_backoff": timedelta(seconds=1), "base": 2},
                          "retry_timeout": timedelta(seconds=timeout_s)},
            **creds, **extra)

    def _call(self, what: str, fn, *args):
        try:
            return fn(self._store, *args)
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            raise WorldNotFound("no such object") from None
        except Exception as e:  # obstore's errors, and the transport's (connection refused, timeout)
            raise StoreUnavailable(f"s3 store: {what} failed ({type(e).__name__})") from e

    def _put(self, key: str, data: bytes) -> None:
        self._call("put", obstore.put, key, data)

    def _get(self, key: str) -> bytes:
        return bytes(self._call("get", lambda s, k: obstore.get(s, k).bytes(), key))

    def _list(self, prefix: str) -> list[ObjectInfo]:
        def listing(store, p):
            return [o for batch in obstore.list(store, p or None) for o in batch]

        return [ObjectInfo(o["path"], int(o["size"]), o["last_modified"].timestamp())
                for o in self._call("list", listing, prefix)]

    def _delete(self, key: str) -> None:
        try:
            self._call("delete", obstore.delete, key)
        except WorldNotFound:
            pass
