"""The inference gateway with NVIDIA's own `tritonclient` (HTTP, sync and asyncio), unchanged, against a live Conch
and a real Triton: `/serve/<team>/<deployment>` with a bearer token."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import http.client
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psutil
import pytest
import redis
import requests
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from django.conf import settings
from rest_framework.test import APIClient
from tritonclient.utils import InferenceServerException

from builds.model_config import BuildOptions
from deployments import services as deployments
from deployments.models import GatewayUsage
from deployments.services import inference
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tenancy.models import ApiToken
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.services import free_port
from tests.tiny_models import add_constant

pytestmark = pytest.mark.e2e

X = np.full((2, 4), 0.5, dtype=np.float32)


@pytest.fixture
def served(gateway, transactional_db, eager_tasks, tmp_path):
    """A ready local deployment `adder` (y = x + 1) of team `vision`, a token with every scope and the base URL."""
    caller = make_caller("ada", "vision")
    version = write_built_version(
        caller.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions(max_batch_size=4)
    )
    deployment = deployments.create_deployment(
        user=caller.user,
        request=DeploymentRequest(
            team_slug="vision", name="adder", model_version_id=version.pk, placement=PlacementRequest(runtime="local")
        ),
    )
    deployment.refresh_from_db()
    assert deployment.status == "ready", deployment.error
    base = f"{gateway.url}/serve/vision/adder"
    yield caller, deployment, base
    deployments.stop_deployment(deployment_id=deployment.pk)


def _client(base: str, token: str) -> tuple[triton_http.InferenceServerClient, dict]:
    return triton_http.InferenceServerClient(url=base.split("://", 1)[1]), {"Authorization": f"Bearer {token}"}


def test_tritonclient_http_health_metadata_config_and_binary_infer(served):
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    assert client.is_server_live(headers=headers)
    assert client.is_server_ready(headers=headers)
    assert client.is_model_ready("adder", headers=headers)
    assert "version" in client.get_server_metadata(headers=headers)
    assert [t["name"] for t in client.get_model_metadata("adder", headers=headers)["inputs"]] == ["x"]
    assert client.get_model_config("adder", headers=headers)["max_batch_size"] == 4
    for binary in (True, False):
        x = triton_http.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        # a fresh dict per call: tritonclient adds Inference-Header-Content-Length to the one it is given
        result = client.infer(
            "adder", [x], outputs=[triton_http.InferRequestedOutput("y", binary_data=binary)], headers=dict(headers)
        )
        assert result.as_numpy("y").tolist() == (X + 1).tolist()
    # gzip both ways (Triton's "compression" for HTTP)
    x = triton_http.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    result = client.infer(
        "adder",
        [x],
        headers=dict(headers),
        request_compression_algorithm="gzip",
        response_compression_algorithm="gzip",
    )
    assert result.as_numpy("y").tolist() == (X + 1).tolist()
    client.close()


def test_tritonclient_asyncio_infers_through_the_gateway(served):
    caller, deployment, base = served

    async def run() -> list:
        client = triton_aio.InferenceServerClient(url=base.split("://", 1)[1])
        headers = {"Authorization": f"Bearer {caller.token}"}
        try:
            assert await client.is_server_ready(headers=headers)
            x = triton_aio.InferInput("x", list(X.shape), "FP32")
            x.set_data_from_numpy(X)
            results = await asyncio.gather(*(client.infer("adder", [x], headers=headers) for _ in range(8)))
            return [r.as_numpy("y").tolist() for r in results]
        finally:
            await client.close()

    assert asyncio.run(run()) == [(X + 1).tolist()] * 8


def test_tritonclient_reads_the_deployments_inference_statistics_through_the_gateway(served):
    # given a deployment that answered three inference requests through the gateway
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    x = triton_http.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    for _ in range(3):
        client.infer("adder", [x], headers=dict(headers))
    # when tritonclient asks for the statistics of every model (GET v2/models/stats) and of the model by name
    every = client.get_inference_statistics(headers=dict(headers))
    named = client.get_inference_statistics("adder", headers=dict(headers))
    versioned = client.get_inference_statistics("adder", "1", headers=dict(headers))
    # then both are the deployment's model's, counted by its Triton (the gateway sends the server's key)
    for stats in (every, named, versioned):
        assert [(m["name"], m["inference_stats"]["success"]["count"]) for m in stats["model_stats"]] == [("adder", 3)]
    # and another model's statistics, or a token of another team, are refused as for its other paths
    with pytest.raises(InferenceServerException, match="Model 'other' is not served here"):
        client.get_inference_statistics("other", headers=dict(headers))
    outsider = make_caller("eve", "other")
    hidden = requests.get(f"{base}/v2/models/stats", headers={"Authorization": f"Bearer {outsider.token}"}, timeout=10)
    assert hidden.status_code == 404
    client.close()


def test_errors_come_back_in_the_form_clients_read(served):
    caller, deployment, base = served
    no_token = requests.get(f"{base}/v2/health/ready", timeout=10)
    assert no_token.status_code == 401 and "Bearer" in no_token.json()["error"]
    assert no_token.headers["WWW-Authenticate"].startswith("Bearer")
    headers = {"Authorization": f"Bearer {caller.token}"}
    other_model = requests.get(f"{base}/v2/models/classifier/ready", headers=headers, timeout=10)
    assert other_model.status_code == 404 and "serves 'adder'" in other_model.json()["error"]
    unknown = requests.get(f"{base}/v2/repository/index", headers=headers, timeout=10)
    assert unknown.status_code == 404 and "error" in unknown.json()
    wrong_method = requests.get(f"{base}/v2/models/adder/infer", headers=headers, timeout=10)
    assert wrong_method.status_code == 405
    bad = requests.post(
        f"{base}/v2/models/adder/infer",
        headers=headers,
        json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]},
        timeout=10,
    )
    assert bad.status_code == 400 and "error" in bad.json()  # Triton's own message, passed back
    # with the advice for a configuration's author (Conch wrote it) worded for the caller: what shape to send
    assert "Expected [-1,4], got [1,3]." in bad.json()["error"] and "NOTE" not in bad.json()["error"]
    assert bad.json()["error"].endswith("the dimensions after it must be [4] (-1: any length).")
    assert int(bad.headers["Content-Length"]) == len(bad.content)
    unbatched = requests.post(
        f"{base}/v2/models/adder/infer",
        headers=headers,
        json={"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]},
        timeout=10,
    )
    assert unbatched.status_code == 400
    assert unbatched.json()["error"].endswith("so send shape [1,4] for one sample (or [N,4] for N).")
    # a body Triton would answer with a 500 is refused first, as a client error naming what is wrong
    garbled = requests.post(f"{base}/v2/models/adder/infer", headers=headers, data=b'{"inputs": [', timeout=10)
    assert garbled.status_code == 400 and "error" in garbled.json()
    short = requests.post(
        f"{base}/v2/models/adder/infer",
        headers={**headers, "Inference-Header-Content-Length": "999"},
        data=b'{"inputs": []}',
        timeout=10,
    )
    assert short.status_code == 400 and "Inference-Header-Content-Length" in short.json()["error"]
    client, _ = _client(base, caller.token)
    assert client.is_server_ready() is False  # no token: tritonclient reads the 401 as not ready
    with pytest.raises(InferenceServerException, match="Bearer"):
        client.get_model_metadata("adder")  # and raises Conch's error text where it reads a body
    client.close()


def test_a_token_without_infer_scope_or_of_another_team_is_refused(served):
    caller, deployment, base = served
    read_only = create_api_token(user=caller.user, name="read", team=caller.team, scopes=["read"]).secret
    refused = requests.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {read_only}"}, timeout=10)
    assert refused.status_code == 403 and "infer" in refused.json()["error"]
    outsider = make_caller("eve", "other")
    hidden = requests.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {outsider.token}"}, timeout=10)
    assert hidden.status_code == 404 and "error" in hidden.json()


def test_the_deployment_shows_its_gateway_url(served):
    caller, deployment, base = served
    shown = caller.client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert shown["endpoints"]["gateway"] == base  # in full: the gateway's own address, not the console's


def test_the_documented_tritonclient_block_works_with_the_gateway_address_the_demo_prints(served):
    # given CONCH_GATEWAY and CONCH_TOKEN as `. var/demo.env` sets them: the demo prints endpoints.gateway
    caller, deployment, base = served
    gateway = caller.client.get(f"/api/v1/deployments/{deployment.pk}/").json()["endpoints"]["gateway"]
    text = (Path(settings.BASE_DIR) / "docs" / "gateway.md").read_text()
    section = text[text.index("# The inference gateway") :]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    # when the tritonclient block of docs/gateway.md runs as written
    done = subprocess.run(
        [sys.executable, "-c", block],
        env={**os.environ, "CONCH_GATEWAY": gateway, "CONCH_TOKEN": caller.token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # then it reaches the deployment: ready, and its statistics (no request yet)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "True"
    assert done.stdout.splitlines()[1].startswith("{'count': 0, 'ns': 0}"), done.stdout


def test_gzip_request_body_is_passed_as_is(served):
    caller, deployment, base = served
    body = gzip.compress(
        json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}).encode()
    )
    answer = requests.post(
        f"{base}/v2/models/adder/infer",
        data=body,
        headers={"Authorization": f"Bearer {caller.token}", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [1.0, 1.0, 1.0, 1.0]


def test_server_metadata_names_the_deployment_not_the_internal_server(served):
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    metadata = client.get_server_metadata(headers=headers)
    assert metadata["name"] == "adder"
    assert metadata["version"].startswith("2.")
    # what the gateway refuses is not advertised (Triton itself lists model_repository, statistics, trace, …)
    assert "binary_tensor_data" in metadata["extensions"]
    assert not {"model_repository", "statistics", "system_shared_memory", "trace", "logging"} & set(
        metadata["extensions"]
    )
    client.close()


def test_a_token_past_its_rate_limit_gets_429_with_retry_after(served):
    caller, deployment, base = served
    limited = create_api_token(user=caller.user, name="slow", team=caller.team, scopes=["infer"])
    ApiToken.objects.filter(pk=limited.token.pk).update(requests_per_minute=3)
    headers = {"Authorization": f"Bearer {limited.secret}"}
    if time.time() % 60 > 50:  # the windows are calendar minutes: keep the four requests in one
        time.sleep(61 - time.time() % 60)
    answers = [requests.get(f"{base}/v2/health/live", headers=headers, timeout=10) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["error"].startswith(f"Rate limit of 3 requests/minute for token {limited.token.prefix}…")
    # another token of the same user is counted on its own
    assert requests.get(f"{base}/v2/health/live", headers={"Authorization": f"Bearer {caller.token}"}).ok


def test_usage_is_metered_per_token_and_day_and_shown_to_team_admins(served):
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    x = triton_http.InferInput("x", [3, 4], "FP32")
    x.set_data_from_numpy(np.zeros((3, 4), dtype=np.float32))
    for _ in range(2):
        client.infer("adder", [x], headers=dict(headers))
    assert client.is_model_ready("adder", headers=dict(headers))
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("other", headers=dict(headers))  # a 404: counted as an error
    client.close()
    deadline = time.monotonic() + 10
    row = None
    while time.monotonic() < deadline:
        row = GatewayUsage.objects.filter(token__prefix=caller.token[:12]).first()
        if row is not None and row.requests >= 4:
            break
        time.sleep(0.2)
    assert row is not None and row.deployment_id == deployment.pk
    assert (row.requests, row.inferences, row.errors) == (4, 6, 1)
    assert row.bytes_in > 2 * 3 * 4 * 4 and row.bytes_out > 2 * 3 * 4 * 4

    # developers may not read it; the team's admins may
    refused = caller.client.get("/api/v1/gateway-usage/vision/")
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    boss = make_caller("bea", "vision", role="admin")
    shown = boss.client.get("/api/v1/gateway-usage/vision/", {"since": row.day.isoformat()})
    assert shown.status_code == 200, shown.content
    [entry] = shown.json()["results"]
    assert entry["deployment"] == {"id": deployment.pk, "name": "adder"}
    assert (entry["requests"], entry["inferences"], entry["errors"]) == (4, 6, 1)
    bad = boss.client.get("/api/v1/gateway-usage/vision/", {"since": "yesterday"})
    assert bad.status_code == 400 and bad.json()["field"] == "since"
    outsider = make_caller("otto", "elsewhere", role="admin")
    assert outsider.client.get("/api/v1/gateway-usage/vision/").status_code == 404


def test_the_rest_api_and_the_gateway_count_a_token_against_one_limit_and_one_usage_row(served, monkeypatch):
    # given a token limited to 3 requests a minute, and this process's REST API inference edge
    caller, deployment, base = served
    limited = create_api_token(user=caller.user, name="both", team=caller.team, scopes=["infer"])
    ApiToken.objects.filter(pk=limited.token.pk).update(requests_per_minute=3)
    edge = inference.InferenceEdge()
    monkeypatch.setattr(inference, "_edge", edge)
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0.5] * 8}]}
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {limited.secret}")
    if time.time() % 60 > 50:  # the windows are calendar minutes: keep the requests in one
        time.sleep(61 - time.time() % 60)
    window = int(time.time() // 60)
    shared = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    key = f"conch:gateway:rate:{settings.CONCH_INSTANCE_ID}:{limited.token.pk}:{limited.token.prefix}:{window}"
    try:
        # when two requests go through the gateway, and its limiter has told Redis
        headers = {"Authorization": f"Bearer {limited.secret}"}
        through_gateway = [
            requests.post(f"{base}/v2/models/adder/infer", json=body, headers=headers, timeout=30) for _ in range(2)
        ]
        deadline = time.monotonic() + 10
        while int(shared.get(key) or 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # and two through the REST API, the REST edge syncing with Redis after the first (as it does every 0.1 s)
        first = api.post(f"/api/v1/deployments/{deployment.pk}/infer", body, format="json")
        edge.run(edge.serving.limiter.sync())
        second = api.post(f"/api/v1/deployments/{deployment.pk}/infer", body, format="json")
        edge.serving.usage.flush_blocking()
    finally:
        edge.close()

    # then the third request overall was the last the limit allowed, whichever edge carried it
    assert [answer.status_code for answer in through_gateway] == [200, 200]
    assert (first.status_code, second.status_code) == (200, 429)
    assert second.json()["detail"].startswith(f"Rate limit of 3 requests/minute for token {limited.token.prefix}…")
    assert json.loads(first.content)["outputs"][0]["data"] == [1.5] * 8
    # and both edges added to the token's one usage row of the day
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = GatewayUsage.objects.filter(token_id=limited.token.pk).first()
        if row is not None and row.requests >= 4:
            break
        time.sleep(0.2)
    assert row is not None and row.deployment_id == deployment.pk
    assert (row.requests, row.inferences, row.errors) == (4, 6, 1)


def test_a_revoked_token_stops_working_within_the_route_cache_time(served, settings):
    caller, deployment, base = served
    headers = {"Authorization": f"Bearer {caller.token}"}
    assert requests.get(f"{base}/v2/health/ready", headers=headers, timeout=10).status_code == 200
    ApiToken.objects.filter(prefix=caller.token[:12]).update(is_revoked=True)
    time.sleep(settings.CONCH_GATEWAY_ROUTE_CACHE_SECONDS + 0.2)
    refused = requests.get(f"{base}/v2/health/ready", headers=headers, timeout=10)
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]


def test_a_binary_body_streams_to_triton_in_pieces(served):
    caller, deployment, base = served
    data = np.arange(16, dtype=np.float32).reshape(4, 4)
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [4, 4], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
        }
    ).encode()
    payload = header + data.tobytes()

    def pieces():
        for start in range(0, len(payload), 7):  # the header arrives split too
            yield payload[start : start + 7]

    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    connection.putrequest("POST", f"{where.path}/v2/models/adder/infer")
    connection.putheader("Authorization", f"Bearer {caller.token}")
    connection.putheader("Inference-Header-Content-Length", str(len(header)))
    connection.putheader("Content-Length", str(len(payload)))
    connection.endheaders()
    for piece in pieces():
        connection.send(piece)
        time.sleep(0.001)
    answer = connection.getresponse()
    text = answer.read()
    connection.close()
    assert answer.status == 200, text
    assert json.loads(text)["outputs"][0]["data"] == (data + 1).ravel().tolist()
    # sent without a length (chunked), it is read whole first and still checked
    chunked = requests.post(
        f"{base}/v2/models/adder/infer",
        data=pieces(),
        headers={"Authorization": f"Bearer {caller.token}", "Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert chunked.status_code == 200, chunked.text
    too_short = requests.post(
        f"{base}/v2/models/adder/infer",
        data=payload[:-4],
        headers={"Authorization": f"Bearer {caller.token}", "Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert too_short.status_code == 400 and "binary_data_size" in too_short.json()["error"]


def test_a_client_that_expects_100_continue_gets_it_and_then_its_answer(served):
    """curl sends `Expect: 100-continue` with bodies over 1 MB and waits (up to a second) before sending them."""
    caller, deployment, base = served
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}]}
    ).encode()
    where = urlsplit(base)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(
            f"POST {where.path}/v2/models/adder/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {caller.token}\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header) + 32}\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(header + data.tobytes())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == (data + 1).ravel().tolist()


def test_a_body_over_the_limit_is_refused_before_it_is_read(served, settings):
    caller, deployment, base = served
    settings.CONCH_GATEWAY_MAX_BODY_BYTES = 1000
    answer = requests.post(
        f"{base}/v2/models/adder/infer",
        data=b"x" * 5000,
        headers={"Authorization": f"Bearer {caller.token}"},
        timeout=10,
    )
    assert answer.status_code == 413 and "at most 1000 bytes" in answer.json()["error"]


def test_the_console_address_says_where_the_gateway_is(served, client):
    caller, deployment, base = served
    answer = client.get("/serve/vision/adder/v2/health/ready")
    assert answer.status_code == 404 and f"{base}/v2/health/ready" in answer.json()["error"]


GATEWAY_CALLS = [
    ("GET", "v2/health/live"),
    ("GET", "v2/health/ready"),
    ("GET", "v2"),
    ("GET", "v2/models/adder"),
    ("GET", "v2/models/adder/versions/1"),
    ("GET", "v2/models/adder/ready"),
    ("GET", "v2/models/adder/config"),
    ("POST", "v2/models/adder/infer"),
    ("HEAD", "v2/models/adder"),
]


def test_no_gateway_path_answers_another_teams_token_or_a_limited_one(served):
    # given the deployment, an outsider's token, and a token of the team limited to another deployment
    caller, deployment, base = served
    outsider = make_caller("mallory", "other")
    limited = create_api_token(
        user=caller.user, name="elsewhere", team=caller.team, scopes=["infer"], deployments=["other-one"]
    ).secret
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]})
    usage_before = list(GatewayUsage.objects.values_list("requests", flat=True))
    # when each calls every path the gateway serves
    answers = {}
    for name, token in (("outsider", outsider.token), ("limited", limited)):
        for method, path in GATEWAY_CALLS:
            answer = requests.request(
                method,
                f"{base}/{path}",
                headers={"Authorization": f"Bearer {token}"},
                data=body if method == "POST" else None,
                timeout=10,
            )
            answers[(name, method, path)] = answer.status_code
    # then all are refused with 404, as if nothing were there (as the REST API does for both)
    assert {key: code for key, code in answers.items() if code != 404} == {}
    # and nothing was counted for the deployment
    time.sleep(0.5)
    assert list(GatewayUsage.objects.values_list("requests", flat=True)) == usage_before


def test_compressed_bodies_are_checked_and_limited_as_triton_would_read_them(served, settings):
    caller, deployment, base = served
    settings.CONCH_GATEWAY_MAX_BODY_BYTES = 100_000
    url, auth = f"{base}/v2/models/adder/infer", {"Authorization": f"Bearer {caller.token}"}

    def post(body: bytes, encoding: str) -> requests.Response:
        return requests.post(url, data=body, headers={**auth, "Content-Encoding": encoding}, timeout=10)

    # a small body that inflates past the limit (a "zip bomb") is refused before Triton sees it
    bomb = post(gzip.compress(b" " * 1_000_000), "gzip")
    assert bomb.status_code == 413 and "decompresses to more than the 100000 bytes" in bomb.json()["error"]
    # a compressed body that is not a well-formed request is a 400 naming what is wrong, as an uncompressed one
    garbled = post(gzip.compress(b'{"inputs": ['), "gzip")
    assert garbled.status_code == 400 and "KServe v2 inference request" in garbled.json()["error"]
    not_gzip = post(b'{"inputs": []}', "gzip")
    assert not_gzip.status_code == 400 and "not gzip data" in not_gzip.json()["error"]
    brotli = post(b"\x0b\x02\x80{}\x03", "br")
    assert brotli.status_code == 415 and "gzip or deflate" in brotli.json()["error"]
    # deflate (zlib) works as gzip does
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]})
    deflated = post(zlib.compress(body.encode()), "deflate")
    assert deflated.status_code == 200 and deflated.json()["outputs"][0]["data"] == [2.0] * 4


def test_a_large_json_request_is_parsed_off_the_event_loop_and_answered(served):
    caller, deployment, base = served
    data = np.random.default_rng(1).random((4, 4), dtype=np.float32)
    request = {"inputs": [{"name": "x", "shape": [4, 4], "datatype": "FP32", "data": data.ravel().tolist()}]}
    request["parameters"] = {"note": "x" * 300_000}  # over OFF_LOOP_BYTES
    answer = requests.post(
        f"{base}/v2/models/adder/infer", json=request, headers={"Authorization": f"Bearer {caller.token}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text[:300]
    assert np.allclose(answer.json()["outputs"][0]["data"], (data + 1).ravel())


def test_head_answers_as_get_without_a_body(served):
    caller, deployment, base = served
    auth = {"Authorization": f"Bearer {caller.token}"}
    for path in ("v2", "v2/models/adder", "v2/models/adder/config"):
        head = requests.head(f"{base}/{path}", headers=auth, timeout=10)
        get = requests.get(f"{base}/{path}", headers=auth, timeout=10)
        assert (head.status_code, head.content) == (200, b""), path
        assert head.headers["Content-Length"] == get.headers["Content-Length"], path


def test_a_triton_gone_mid_use_is_a_503_that_keeps_its_address_internal(served):
    caller, deployment, base = served
    auth = {"Authorization": f"Bearer {caller.token}"}
    assert requests.get(f"{base}/v2/models/adder/ready", headers=auth, timeout=10).status_code == 200  # route cached
    deployment.refresh_from_db()
    triton = psutil.Process(deployment.runtime_state["pid"])  # one handle: its exit watcher reaps it at once
    triton.kill()
    triton.wait(10)
    gone = requests.get(f"{base}/v2/models/adder", headers=auth, timeout=10)
    assert gone.status_code == 503, gone.text
    assert "retry in a few seconds" in gone.json()["error"]
    assert "127.0.0.1" not in gone.text and str(deployment.runtime_state["http_port"]) not in gone.text


def test_a_request_read_whole_is_sent_again_to_another_server_when_the_first_cannot_be_reached(served, gateway):
    """A pod that just went away (its port closed) costs the client nothing: the body, already read, goes to the
    next ready server of the deployment."""
    caller, deployment, base = served
    client, headers = _client(base, caller.token)
    assert client.is_model_ready("adder", headers=headers)  # the route is cached now
    ((expires, route),) = [
        value for value in gateway.app.serving.routes.entries.values() if not isinstance(value[1], Exception)
    ]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    key = next(k for k, v in gateway.app.serving.routes.entries.items() if v[1] is route)
    gateway.app.serving.routes.entries[key] = (
        expires,
        dataclasses.replace(route, servers=((dead, ""), *route.servers)),
    )
    gateway.app.serving.picker.turns[route.deployment_id] = itertools.count()  # the dead one is tried first
    x = triton_http.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X, binary_data=True)
    result = client.infer("adder", [x], headers=dict(headers))
    assert result.as_numpy("y").tolist() == (X + 1).tolist()
    # the dead server was tried: the route is to be resolved afresh
    assert key not in gateway.app.serving.routes.entries


def _raw_exchange(base: str, head: bytes, body_parts: list[bytes], pause_s: float = 0.0) -> tuple[int, bytes]:
    """Send a hand-made request to the gateway (head, then each part after `pause_s`); its status and body."""
    where = urlsplit(base)
    with socket.create_connection((where.hostname, where.port), timeout=20) as sock:
        try:
            sock.sendall(head)
            for part in body_parts:
                time.sleep(pause_s)
                sock.sendall(part)
        except OSError:
            pass  # the gateway may close on us before we are done: its answer is already there
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and len(answer.split(b"\r\n\r\n", 1)[1]) >= int(
                re.search(rb"content-length: (\d+)", answer, re.I)[1]
            ):
                break
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def test_a_huge_request_head_is_refused_with_431_before_it_is_held(served):
    caller, deployment, base = served
    path = urlsplit(base).path
    head = (
        f"GET {path}/v2/health/live HTTP/1.1\r\nHost: x\r\nX-Junk: ".encode() + b"a" * (3 * 1024 * 1024) + b"\r\n\r\n"
    )
    status, body = _raw_exchange(base, head, [])
    assert status == 431 and "send them shorter" in json.loads(body)["error"]
    # and the gateway goes on serving
    ready = requests.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {caller.token}"}, timeout=10)
    assert ready.status_code == 200


@pytest.mark.parametrize("streamed", [False, True], ids=["read-whole", "streamed"])
def test_a_client_that_stops_sending_its_body_gets_408_and_others_are_served(served, settings, streamed):
    # given a body read whole before Triton is called, or one streamed to Triton once its header is checked
    caller, deployment, base = served
    settings.CONCH_GATEWAY_CLIENT_IDLE_SECONDS = 1.0
    settings.CONCH_GATEWAY_STREAM_FROM_BYTES = 1 if streamed else 4 * 1024**2
    path = urlsplit(base).path
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
    header = json.dumps({"inputs": [tensor]})
    head = (
        f"POST {path}/v2/models/adder/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {caller.token}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header) + 16}\r\n\r\n"
    ).encode()
    stalled = []
    threads = [
        threading.Thread(
            target=lambda: stalled.append(_raw_exchange(base, head, [header.encode() if streamed else b"{"]))
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    # while they stall, others are served
    x = triton_http.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    client, headers = _client(base, caller.token)
    assert client.infer("adder", [x], headers=dict(headers)).as_numpy("y").tolist() == [[1.0] * 4]
    client.close()
    for thread in threads:
        thread.join(15)
    assert [status for status, _ in stalled] == [408, 408, 408]
    assert "stopped arriving for 1 s" in json.loads(stalled[0][1])["error"]


def _triton_of(gateway) -> tuple[str, str]:
    """(base URL, restricted-endpoint key) of the one Triton the gateway has a cached route to."""
    ((_, route),) = [
        value for value in gateway.app.serving.routes.entries.values() if not isinstance(value[1], Exception)
    ]
    return route.servers[0]


def _regions(url: str, key: str) -> list[dict]:
    status = requests.get(f"{url}/v2/systemsharedmemory/status", headers={"X-Conch-Key": key}, timeout=10)
    assert status.status_code == 200, status.text
    return status.json()


def test_binary_inputs_reach_a_triton_on_this_host_through_shared_memory_each_request_its_own(served, gateway):
    """The gateway registers one shared-memory region with a same-host Triton and hands it binary tensor data
    there (Triton's system shared-memory extension); 32 concurrent requests with different tensors each get
    their own answer."""
    caller, deployment, base = served

    async def run() -> list:
        client = triton_aio.InferenceServerClient(url=base.split("://", 1)[1])
        headers = {"Authorization": f"Bearer {caller.token}"}
        try:

            async def one(value: float) -> list:
                x = triton_aio.InferInput("x", list(X.shape), "FP32")
                x.set_data_from_numpy(np.full(X.shape, value, dtype=np.float32), binary_data=True)
                output = triton_aio.InferRequestedOutput("y", binary_data=True)
                return (await client.infer("adder", [x], outputs=[output], headers=headers)).as_numpy("y").tolist()

            return await asyncio.gather(*(one(float(i)) for i in range(32)))
        finally:
            await client.close()

    answers = asyncio.run(run())
    assert answers == [np.full(X.shape, i + 1.0, dtype=np.float32).tolist() for i in range(32)]
    url, key = _triton_of(gateway)
    (region,) = _regions(url, key)
    assert re.fullmatch(r"conch-gw-\d+-[0-9a-f]{16}", region["name"])
    assert region["byte_size"] == 64 * 1024**2
    # The object's name is gone from /dev/shm once Triton mapped it: nothing is left behind if a process dies.
    assert not list(__import__("pathlib").Path("/dev/shm").glob(region["name"]))
    assert gateway.app._shared_memory._regions[url].spans.used_bytes == 0  # every span was given back


def test_a_triton_that_lost_the_gateways_region_is_sent_the_bytes_and_given_a_new_region(served, gateway):
    """A server that restarted on the same address has no regions: the request is answered all the same (its
    body sent over HTTP), and the next one registers a new region."""
    caller, deployment, base = served
    client, headers = _client(base, caller.token)

    def infer(value: float) -> list:
        x = triton_http.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(np.full(X.shape, value, dtype=np.float32), binary_data=True)
        return client.infer("adder", [x], headers=dict(headers)).as_numpy("y").tolist()

    assert infer(1.0) == np.full(X.shape, 2.0).tolist()
    url, key = _triton_of(gateway)
    (first,) = _regions(url, key)
    unregistered = requests.post(f"{url}/v2/systemsharedmemory/unregister", headers={"X-Conch-Key": key}, timeout=10)
    assert unregistered.status_code == 200 and _regions(url, key) == []
    assert infer(2.0) == np.full(X.shape, 3.0).tolist()
    assert infer(3.0) == np.full(X.shape, 4.0).tolist()
    (second,) = _regions(url, key)
    assert second["name"] != first["name"]
    client.close()


def test_triton_errors_on_binary_inputs_read_as_without_shared_memory(served, gateway):
    """An input whose bytes do not fit its shape gets Triton's own 400, never naming the gateway's region."""
    caller, deployment, base = served
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    ).encode()
    for _ in range(2):  # the first registers the region, the second surely uses it
        answer = requests.post(
            f"{base}/v2/models/adder/infer",
            data=header + bytes(16),
            headers={"Authorization": f"Bearer {caller.token}", "Inference-Header-Content-Length": str(len(header))},
            timeout=10,
        )
        assert answer.status_code == 400, answer.text
        assert "'x'" in answer.json()["error"] and "conch-gw" not in answer.text
    url, key = _triton_of(gateway)
    assert len(_regions(url, key)) == 1  # an error of the request's own leaves the region registered


def test_without_shared_memory_binary_inputs_go_over_http_as_to_a_pod(served, gateway):
    """CONCH_GATEWAY_SHARED_MEMORY_BYTES=0 (and every Triton on another host) gets the body as the client sent it."""
    caller, deployment, base = served
    shared_memory, gateway.app._shared_memory = gateway.app._shared_memory, None  # as the setting 0 leaves it
    try:
        client, headers = _client(base, caller.token)
        x = triton_http.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X, binary_data=True)
        result = client.infer("adder", [x], headers=dict(headers))
        assert result.as_numpy("y").tolist() == (X + 1).tolist()
        url, key = _triton_of(gateway)
        assert _regions(url, key) == []
        client.close()
    finally:
        gateway.app._shared_memory = shared_memory
