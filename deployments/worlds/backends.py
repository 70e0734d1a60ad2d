"""open_store / open_worlds: the configured backend and its worlds (`worlds` in the app's args)."""
from __future__ import annotations

from pathlib import Path

from deployments.worlds.local import LocalStore
from deployments.worlds.store import WorldStore
from deployments.worlds.worlds import Worlds
from deployments.worlds_args import WorldsArgs


def open_store(args: WorldsArgs) -> WorldStore:
    """A local folder (`root`), or an S3 bucket through obstore (imported only then)."""
    if args.backend == "local":
        return LocalStore(args.root)
    from deployments.worlds.s3 import S3WorldStore

    return S3WorldStore(args.bucket, endpoint=args.endpoint, prefix=args.prefix, region=args.region,
                        access_key_env=args.access_key_env, secret_key_env=args.secret_key_env,
                        timeout_s=args.timeout_s)


def open_worlds(args: WorldsArgs) -> Worlds:
    """The store's worlds with the configured quota (`quota_mib` per principal) and retention."""
    quota = None if args.quota_mib is None else int(args.quota_mib * 1024 * 1024)
    retention = None if args.retention_days is None else args.retention_days * 86400.0
    return Worlds(open_store(args), quota_bytes=quota, retention_s=retention)


def describe(args: WorldsArgs) -> str:
    """Where the store keeps worlds, for a log line (no secrets: the config holds none)."""
    if args.backend == "local":
        return f"local folder {Path(args.root).resolve()}"
    return f"s3 {args.endpoint or 'AWS'} bucket {args.bucket} prefix {args.prefix}"
