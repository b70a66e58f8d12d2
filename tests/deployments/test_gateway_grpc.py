"""The gateway's KServe v2 gRPC edge with NVIDIA's `tritonclient.grpc`, unchanged, in front of a real Triton.

One deployment (`adder`, y = x + 1, batching) serves every test of this module: the deployment, its Triton, the
gateway and the tokens the tests use are made once, committed, for the module (each test's own transaction
could not be seen by the gateway's thread); the module's end flushes the tables as a transactional test does.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from django.core.management import call_command
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from builds.model_config import BuildOptions
from deployments import services as deployments
from deployments.models import Deployment, GatewayUsage
from deployments.services.requests import DeploymentRequest, PlacementRequest
from deployments.services.serving import Serving
from tenancy.models import ApiToken
from tenancy.services import create_api_token
from tests.conftest import Caller, make_caller
from tests.deployments.conftest import write_built_version
from tests.gateway_server import GatewayServer
from tests.tiny_models import add_constant

pytestmark = [pytest.mark.triton, pytest.mark.django_db]

X = np.full((2, 4), 0.5, dtype=np.float32)


class _Clock:
    """The rate limiter's clock (seconds since the epoch), moved only by the tests: 10 s into a minute."""

    def __init__(self) -> None:
        self.now = 1_800_000_010.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    caller: Caller
    deployment: Deployment
    gateway: GatewayServer
    clock: _Clock
    #: Secrets of tokens the tests use: "outsider" (another team's), "read" (read scope only), "limited" (2
    #: requests per minute), "counted" (usage read by a test).
    tokens: dict[str, str]
    limited_prefix: str

    def client(self) -> triton_grpc.InferenceServerClient:
        return triton_grpc.InferenceServerClient(url=self.gateway.grpc_target)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"authorization": f"Bearer {token or self.caller.token}", "conch-deployment": "grpc-team/adder"}


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Served]:
    """A ready local deployment `adder` of team `grpc-team`, and a gateway serving gRPC in front of it."""
    from conch.celery import app

    app.loader.import_default_modules()
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    clock = _Clock()
    with django_db_blocker.unblock():
        caller = make_caller("grace", "grpc-team")
        model = add_constant(tmp_path_factory.mktemp("grpc") / "v1.onnx", 1.0)
        version = write_built_version(caller.team, "adder", model, BuildOptions(max_batch_size=4))
        deployment = deployments.create_deployment(
            user=caller.user,
            request=DeploymentRequest(
                team_slug="grpc-team", name="adder", model_version_id=version.pk, placement=PlacementRequest()
            ),
        )
        deployment.refresh_from_db()
        assert deployment.status == "ready", deployment.error
        limited = create_api_token(user=caller.user, team=caller.team, name="slow", scopes=["infer"])
        ApiToken.objects.filter(pk=limited.token.pk).update(requests_per_minute=2)
        tokens = {
            "outsider": make_caller("mallory", "other-team").token,
            "read": create_api_token(user=caller.user, team=caller.team, name="read", scopes=["read"]).secret,
            "limited": limited.secret,
            "counted": create_api_token(user=caller.user, team=caller.team, name="counted", scopes=["infer"]).secret,
        }
        gateway = GatewayServer(grpc=True, serving=Serving(clock=clock))
        gateway.start()
        try:
            yield Served(
                caller=caller,
                deployment=deployment,
                gateway=gateway,
                clock=clock,
                tokens=tokens,
                limited_prefix=limited.token.prefix,
            )
        finally:
            gateway.stop()
            deployments.stop_deployment(deployment_id=deployment.pk)
            app.conf.task_always_eager = False
            call_command("flush", interactive=False, verbosity=0)


def _x() -> triton_grpc.InferInput:
    x = triton_grpc.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    return x


def test_health_metadata_and_config_through_the_gateway(served):
    client, headers = served.client(), served.headers()
    assert client.is_server_live(headers=headers)
    assert client.is_server_ready(headers=headers)
    assert client.is_model_ready("adder", headers=headers)
    metadata = client.get_server_metadata(headers=headers, as_json=True)
    assert metadata["name"] == "adder"  # the deployment's name, not Triton's internal id
    assert "model_repository" not in metadata.get("extensions", [])
    model = client.get_model_metadata("adder", headers=headers, as_json=True)
    assert [t["name"] for t in model["inputs"]] == ["x"]
    assert client.get_model_config("adder", headers=headers, as_json=True)["config"]["max_batch_size"] == 4
    # statistics of the deployment's model (tritonclient asks for every model's when given no name)
    stats = client.get_inference_statistics(headers=headers, as_json=True)
    assert [entry["name"] for entry in stats["model_stats"]] == ["adder"]
    client.close()


def test_infer_through_the_gateway(served):
    client = served.client()
    result = client.infer("adder", [_x()], headers=served.headers())
    assert result.as_numpy("y").tolist() == (X + 1).tolist()
    client.close()


def test_streaming_infer_through_the_gateway_answers_each_request_and_refuses_another_model_in_the_stream(served):
    client = served.client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=served.headers())
    for index in range(3):
        client.async_stream_infer("adder", [_x()], request_id=str(index))
    client.async_stream_infer("other", [_x()], request_id="wrong")
    got = [answers.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    client.close()
    results = {result.get_response().id: result for result, error in got if error is None}
    errors = [str(error) for result, error in got if error is not None]
    assert sorted(results) == ["0", "1", "2"]
    assert all(result.as_numpy("y").tolist() == (X + 1).tolist() for result in results.values())
    assert errors == ["Model 'other' is not served here; deployment 'adder' serves 'adder'."]


def test_refused_without_a_token_with_another_teams_token_and_for_another_model(served):
    client = served.client()
    with pytest.raises(InferenceServerException) as anonymous:
        client.get_model_metadata("adder", headers={"conch-deployment": "grpc-team/adder"})
    assert anonymous.value.status() == "StatusCode.UNAUTHENTICATED"
    assert "Bearer" in anonymous.value.message()
    with pytest.raises(InferenceServerException) as wrong:
        client.infer("adder", [_x()], headers=served.headers("conch_notatoken"))
    assert wrong.value.status() == "StatusCode.UNAUTHENTICATED"
    # another team's token: the deployment does not exist for it (no existence leak)
    with pytest.raises(InferenceServerException) as hidden:
        client.infer("adder", [_x()], headers=served.headers(served.tokens["outsider"]))
    assert hidden.value.status() == "StatusCode.NOT_FOUND"
    assert hidden.value.message() == (
        "There is no running deployment 'adder' in team 'grpc-team' that this token can use."
    )
    with pytest.raises(InferenceServerException) as no_deployment:
        client.is_server_live(headers={"authorization": f"Bearer {served.caller.token}"})
    assert no_deployment.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "conch-deployment" in no_deployment.value.message()
    with pytest.raises(InferenceServerException) as other_model:
        client.infer("other", [_x()], headers=served.headers())
    assert other_model.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as read_only:
        client.infer("adder", [_x()], headers=served.headers(served.tokens["read"]))
    assert read_only.value.status() == "StatusCode.PERMISSION_DENIED" and "infer" in read_only.value.message()
    client.close()


def test_repository_control_and_shared_memory_are_refused(served):
    channel = grpc.insecure_channel(served.gateway.grpc_target)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    metadata = tuple(served.headers().items())
    for call, request in (
        (stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(model_name="adder")),
        (stub.SystemSharedMemoryRegister, service_pb2.SystemSharedMemoryRegisterRequest(name="r")),
        (stub.LogSettings, service_pb2.LogSettingsRequest()),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call(request, metadata=metadata, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "does not serve" in refused.value.details()
    channel.close()
    client = served.client()
    assert client.is_model_ready("adder", headers=served.headers())  # the server still serves
    client.close()


def test_a_token_past_its_rate_limit_is_refused_with_resource_exhausted(served):
    client = served.client()
    headers = served.headers(served.tokens["limited"])
    assert client.is_server_live(headers=headers)
    assert client.infer("adder", [_x()], headers=headers).as_numpy("y").shape == (2, 4)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("adder", [_x()], headers=headers)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert refused.value.message() == (
        f"Rate limit of 2 requests/minute for token {served.limited_prefix}… reached; retry in 50 s."
    )
    served.clock.now += 60  # the next minute
    assert client.is_server_live(headers=headers)
    client.close()


def test_usage_is_counted_per_token_like_http(served):
    client = served.client()
    headers = served.headers(served.tokens["counted"])
    for _ in range(2):
        client.infer("adder", [_x()], headers=headers)  # 2 inferences each (batch of 2)
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("other", headers=headers)  # NOT_FOUND: an error
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error), headers=headers)
    client.async_stream_infer("adder", [_x()])
    assert answers.get(timeout=30) is None
    client.stop_stream()
    client.close()
    served.gateway.app.serving.usage.flush_blocking()
    row = GatewayUsage.objects.get(token__prefix=served.tokens["counted"][:12])
    assert row.deployment_id == served.deployment.pk
    assert (row.requests, row.inferences, row.errors) == (4, 6, 1)
    request_bytes = 2 * 4 * 4
    assert row.bytes_in > 3 * request_bytes and row.bytes_out > 3 * request_bytes


def test_the_deployment_shows_the_grpc_gateway_and_the_documented_block_works_with_it(served, settings):
    # given the gateway's gRPC address as the settings tell clients, and the caller's route known to the gateway
    # before this test's transaction writes the token's last use (the gateway's lookup would wait for that row)
    primed = served.client()
    assert primed.is_server_ready(headers=served.headers())
    primed.close()
    settings.CONCH_GATEWAY_GRPC_ADDRESS = served.gateway.grpc_target
    shown = served.caller.client.get(f"/api/v1/deployments/{served.deployment.pk}/").json()["endpoints"]
    assert shown["gateway_grpc"] == served.gateway.grpc_target
    assert shown["gateway_grpc_metadata"] == {"conch-deployment": "grpc-team/adder"}
    text = (Path(settings.BASE_DIR) / "docs" / "gateway.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("## gRPC") :], re.DOTALL).group(1)
    # when the tritonclient.grpc block of docs/gateway.md runs as written, with what the deployment shows
    done = subprocess.run(
        [sys.executable, "-c", block],
        env={
            **os.environ,
            "CONCH_GATEWAY_GRPC": shown["gateway_grpc"],
            "CONCH_GATEWAY_DEPLOYMENT": shown["gateway_grpc_metadata"]["conch-deployment"],
            "CONCH_MODEL": served.caller.client.get(f"/api/v1/deployments/{served.deployment.pk}/").json()["model"],
            "CONCH_TOKEN": served.caller.token,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    # then it is ready and infers
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "(1, 4)"]


def test_without_a_grpc_bind_the_deployment_shows_no_grpc_gateway(served, settings):
    settings.CONCH_GATEWAY_GRPC_BIND = ""
    shown = served.caller.client.get(f"/api/v1/deployments/{served.deployment.pk}/").json()["endpoints"]
    assert (shown["gateway_grpc"], shown["gateway_grpc_metadata"]) == ("", {})


def test_the_console_page_shows_the_grpc_gateway_and_its_metadata(served, client, settings):
    settings.CONCH_GATEWAY_GRPC_ADDRESS = "grpc.example:8002"
    client.force_login(served.caller.user)
    page = client.get(f"/deployments/{served.deployment.pk}/")
    assert page.status_code == 200
    text = " ".join(re.sub(r"<[^>]+>", " ", page.content.decode()).split())
    assert (
        "Inference gateway, gRPC (token) grpc.example:8002 with metadata conch-deployment: grpc-team/adder , "
        "authorization: Bearer $CONCH_TOKEN"
    ) in text


def _shared_memory_regions(served) -> tuple[str, str, list[dict]]:
    """(base URL, key, the system shared-memory regions registered) of the deployment's one Triton."""
    import requests

    (server,) = {
        value[1].servers[0]
        for value in served.gateway.app.serving.routes.entries.values()
        if not isinstance(value[1], Exception) and value[1].servers
    }
    url, key = server
    status = requests.get(f"{url}/v2/systemsharedmemory/status", headers={"X-Conch-Key": key}, timeout=10)
    assert status.status_code == 200, status.text
    return url, key, status.json()


def test_raw_tensors_reach_a_triton_on_this_host_through_shared_memory_each_call_its_own(served):
    """ModelInfer's raw input tensors are handed to a same-host Triton in the gateway's shared-memory region (the
    one the HTTP edge uses); 24 concurrent calls with different tensors each get their own answer, every span is
    given back, and a Triton that lost the region is sent the bytes and given a new one."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    client = served.client()

    def infer(value: float) -> list:
        x = triton_grpc.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(np.full(X.shape, value, dtype=np.float32))
        return client.infer("adder", [x], headers=served.headers()).as_numpy("y").tolist()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(infer, [float(i) for i in range(24)]))
    assert answers == [np.full(X.shape, i + 1.0, dtype=np.float32).tolist() for i in range(24)]
    url, key, regions = _shared_memory_regions(served)
    (region,) = regions
    assert re.fullmatch(r"conch-gw-\d+-[0-9a-f]{16}", region["name"])
    shared_memory = served.gateway.app.grpc.shared_memory
    assert shared_memory is served.gateway.app._shared_memory  # one region per server for both edges
    assert shared_memory._regions[url].spans.used_bytes == 0
    unregistered = requests.post(f"{url}/v2/systemsharedmemory/unregister", headers={"X-Conch-Key": key}, timeout=10)
    assert unregistered.status_code == 200
    assert infer(2.0) == np.full(X.shape, 3.0).tolist()  # the region is gone: sent as it came, region dropped
    assert infer(3.0) == np.full(X.shape, 4.0).tolist()
    (second,) = _shared_memory_regions(served)[2]
    assert second["name"] != region["name"]
    client.close()


def test_a_bad_tensor_gets_tritons_own_error_never_naming_the_gateways_region(served):
    client = served.client()
    for _ in range(2):  # the first may register the region, the second surely uses it
        x = triton_grpc.InferInput("x", [2, 4], "FP32")
        x._raw_content = bytes(16)  # 16 bytes for a [2,4] FP32 tensor of 32
        with pytest.raises(InferenceServerException) as refused:
            client.infer("adder", [x], headers=served.headers())
        assert "'x'" in str(refused.value) and "conch-gw" not in str(refused.value)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


def test_a_request_without_the_batch_dimension_is_told_the_shape_to_send_unary_and_in_a_stream(served):
    # given the batching adder, whose input x is [-1, 4]: a caller sends one sample as [4]
    def unbatched() -> triton_grpc.InferInput:
        x = triton_grpc.InferInput("x", [4], "FP32")
        x.set_data_from_numpy(X[0])
        return x

    client = served.client()
    # when
    with pytest.raises(InferenceServerException) as refused:
        client.infer("adder", [unbatched()], headers=served.headers())
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error), headers=served.headers())
    client.async_stream_infer("adder", [unbatched()], request_id="one")
    streamed = answers.get(timeout=30)
    client.stop_stream()
    client.close()
    # then both say what to send, not how to edit a configuration Conch wrote
    for error in (refused.value, streamed):
        text = str(error)
        assert "Expected [-1,4], got [4]." in text, text
        assert "so send shape [1,4] for one sample (or [N,4] for N)." in text, text
        assert "NOTE" not in text and "max_batch_size to zero" not in text, text
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_batch_past_max_batch_size_is_told_how_to_send_it(served):
    # given the adder built with max_batch_size 4: a caller sends 5 samples at once
    x = triton_grpc.InferInput("x", [5, 4], "FP32")
    x.set_data_from_numpy(np.full((5, 4), 0.5, dtype=np.float32))
    client = served.client()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("adder", [x], headers=served.headers())
    client.close()
    assert "batch-size must be <= 4 for 'adder'. Send at most 4 samples per request (split a larger batch)" in str(
        refused.value
    )
