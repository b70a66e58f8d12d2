"""Pytest plugin: a real S3 protocol server over HTTP on 127.0.0.1, for tests of the S3 object store.

MinIO cannot be installed here, so this runs moto's S3 server (`moto.server.ThreadedMotoServer`,
a Werkzeug HTTP server speaking the S3 REST protocol, multipart uploads included) in a thread of
the test process, on a free port. Clients talk to it over HTTP exactly as to MinIO.

Fixtures:
- `s3_server` (session): an `S3Server` with the endpoint URL, dummy credentials and region;
- `s3_client` (session): a boto3 client on it, for tests that check what the server holds;
- `s3_bucket` (function): a fresh, empty bucket, as `(endpoint_url, bucket)`; emptied and
  removed afterwards, pending multipart uploads included;
- `s3_store` (function): an `S3ObjectStore` on `s3_bucket` under the prefix `S3_STORE_PREFIX`.

Enable with `pytest_plugins = ["tests.s3_server"]` in the top-level conftest.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from models_registry.storage import S3ObjectStore

# Dummy credentials, set explicitly so nothing from the environment (~/.aws, AWS_*) is used.
S3_ACCESS_KEY = "conch-test-access-key"
S3_SECRET_KEY = "conch-test-secret-key"
S3_REGION = "us-east-1"
S3_STORE_PREFIX = "conch"


@dataclass(frozen=True)
class S3Server:
    """A running S3 protocol server: where it listens and what credentials to send."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str


def make_s3_client(server: S3Server) -> Any:
    """Return a boto3 S3 client for `server` (path-style addressing, short timeouts)."""
    return boto3.session.Session(
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
    ).client(
        "s3",
        endpoint_url=server.endpoint_url,
        config=Config(
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )


def empty_bucket(client: Any, bucket: str) -> None:
    """Abort every pending multipart upload in `bucket` and delete every object in it."""
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", ()):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        objects = [{"Key": item["Key"]} for item in page.get("Contents", ())]
        if objects:
            client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (a free port) for the whole session."""
    # Werkzeug logs one INFO line per request; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(
            endpoint_url=f"http://{host}:{port}",
            access_key=S3_ACCESS_KEY,
            secret_key=S3_SECRET_KEY,
            region=S3_REGION,
        )
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_client(s3_server: S3Server) -> Any:
    """A boto3 client on the test server, for checking what it holds."""
    return make_s3_client(s3_server)


@pytest.fixture
def s3_bucket(s3_server: S3Server, s3_client: Any) -> Iterator[tuple[str, str]]:
    """Create a fresh bucket; yield `(endpoint_url, bucket)`; then empty and delete it."""
    bucket = f"conch-test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=bucket)
    try:
        yield s3_server.endpoint_url, bucket
    finally:
        empty_bucket(s3_client, bucket)
        s3_client.delete_bucket(Bucket=bucket)


@pytest.fixture
def s3_store(s3_server: S3Server, s3_bucket: tuple[str, str]) -> S3ObjectStore:
    """An S3ObjectStore on the fresh bucket, keys under the prefix `S3_STORE_PREFIX`."""
    endpoint_url, bucket = s3_bucket
    return S3ObjectStore(
        bucket,
        S3_STORE_PREFIX,
        endpoint_url,
        s3_server.region,
        s3_server.access_key,
        s3_server.secret_key,
    )
