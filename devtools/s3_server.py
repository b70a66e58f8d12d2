"""The demo's S3 protocol server: moto's, on 127.0.0.1, run as a vital process of the demo's supervisor, with the
demo's bucket. Development tooling: the Kubernetes demo's pods read the model repository from it over S3."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

from devtools.supervisor import Supervisor

S3_BUCKET = "conch-demo"
# moto's server takes any credentials; these only have to be the same in Conch and in the pods' Secret.
S3_CREDENTIALS = {"CONCH_S3_ACCESS_KEY_ID": "conch-demo", "CONCH_S3_SECRET_ACCESS_KEY": "conch-demo-secret"}
START_TIMEOUT_S = 60.0


def start_demo_s3_server(
    supervisor: Supervisor, log_path: Path, *, port: int, pause: Callable[[float], None] = time.sleep
) -> tuple[str, dict[str, str]]:
    """Start moto's S3 server on 127.0.0.1:`port` as the vital supervised service `s3` and create S3_BUCKET in it.

    Returns (the endpoint URL, the CONCH_STORAGE_URL/CONCH_S3_* settings that point Conch at the bucket). Raises
    TimeoutError naming the endpoint and the log when it does not answer within START_TIMEOUT_S seconds. `pause`
    waits between tries (the demo's own, which keeps its supervisor ticking).
    """
    endpoint = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    supervisor.start("s3", argv, log_path, vital=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            # S3 CreateBucket, path-style (`PUT /<bucket>`); moto does not check request signatures.
            if requests.put(f"{endpoint}/{S3_BUCKET}", timeout=10).ok:
                break
        except (requests.ConnectionError, requests.Timeout):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the S3 server did not answer at {endpoint} within 60 s (log {log_path})")
        pause(0.5)
    storage = {
        "CONCH_STORAGE_URL": f"s3://{S3_BUCKET}/conch",
        "CONCH_S3_ENDPOINT_URL": endpoint,
        "CONCH_S3_REGION": "us-east-1",
        **S3_CREDENTIALS,
    }
    return endpoint, storage
