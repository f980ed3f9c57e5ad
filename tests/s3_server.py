"""A real S3-compatible endpoint for the tests: moto's server on 127.0.0.1, a free port.

Import the fixtures into a test module (``from s3_server import s3, s3_endpoint``). The
server runs once per session in a thread of the test process; each test gets its own
bucket and the AWS test credentials in its environment only (jobs the test starts
inherit them, as a user's job inherits the user's). Without moto the tests are skipped
with the reason, except under CI (``CI=true``), where a missing moto is a failure.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Recognisable test credentials: the tests grep the store and the logs for them.
ACCESS_KEY_ID = "STEPSCOPETESTKEYID"
SECRET_ACCESS_KEY = f"stepscope-test-secret-{uuid.uuid4().hex}"
REGION = "us-east-1"


@dataclass
class S3:
    """One test's bucket on the session's endpoint, and a boto3 client on it."""

    endpoint: str
    bucket: str
    client: Any

    def keys(self) -> list[str]:
        listing = self.client.list_objects_v2(Bucket=self.bucket)
        return [o["Key"] for o in listing.get("Contents", [])]

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()


def free_port() -> int:
    """A port nothing listens on (bound, then released): an unreachable endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server for the session; its URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"moto[server] is not installed ({exc}): pip install -e '.[dev]'")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """The standard AWS variables for the test endpoint, nothing from the user's AWS
    config (no profile, no config files, no instance metadata)."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def make_bucket(endpoint: str) -> S3:
    """A new bucket on the endpoint, made with the test credentials."""
    import boto3  # local: comes with moto, which the session fixture checked

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        region_name=REGION,
    )
    bucket = f"stepscope-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3(endpoint=endpoint, bucket=bucket, client=client)


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    """A new bucket on the endpoint, the AWS test credentials set for this test."""
    aws_env(monkeypatch, s3_endpoint)
    return make_bucket(s3_endpoint)
