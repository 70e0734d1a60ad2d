"""`worlds` in the app's args: a local folder by default, S3 only with a bucket, no secrets."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.config import AppArgs
from deployments.worlds.backends import describe, open_store, open_worlds
from deployments.worlds.local import LocalStore


def test_the_default_is_a_local_folder_under_a_data_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = AppArgs().worlds
    assert args.backend == "local" and args.root == "lwf-data/worlds"
    store = open_store(args)
    assert isinstance(store, LocalStore) and store.root == tmp_path / "lwf-data" / "worlds"
    assert describe(args) == f"local folder {tmp_path / 'lwf-data' / 'worlds'}"


def test_s3_needs_a_bucket_and_takes_no_secret_in_the_config():
    with pytest.raises(ValidationError, match="needs worlds.bucket"):
        AppArgs.model_validate({"worlds": {"backend": "s3"}})
    with pytest.raises(ValidationError, match="extra"):
        AppArgs.model_validate({"worlds": {"backend": "s3", "bucket": "b", "secret_access_key": "x"}})
    args = AppArgs.model_validate({"worlds": {"backend": "s3", "bucket": "b", "endpoint": "http://h:8333"}}).worlds
    assert describe(args) == "s3 http://h:8333 bucket b prefix worlds"


def test_the_quota_and_retention_reach_the_worlds(tmp_path):
    worlds = open_worlds(AppArgs.model_validate({"worlds": {"root": str(tmp_path), "quota_mib": 1.5,
                                                            "retention_days": 2}}).worlds)
    assert (worlds.quota_bytes, worlds.retention_s) == (1572864, 172800.0)
    assert (open_worlds(AppArgs().worlds.model_copy(update={"root": str(tmp_path)})).quota_bytes) is None
