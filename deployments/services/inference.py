"""The inference proxy: forwards a client's KServe v2 request to the deployment's Triton."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from conch.errors import Conflict, InvalidInput, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.services.records import require_deployment_access
from tenancy.choices import Scope
from tenancy.services import TokenGrant
from tritonserving.client import InferenceResponse, TritonClient, TritonUnreachable

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How many servers one request may be tried on when the first cannot be reached.
MAX_SERVERS_TRIED = 3


def infer(
    *,
    user: AbstractBaseUser,
    deployment: Deployment,
    body: bytes,
    header_length: int | None = None,
    token: TokenGrant | None = None,
) -> InferenceResponse:
    """Forward a KServe v2 / Open Inference Protocol request body to the deployment's Triton, unchanged.

    `body`: JSON, or (`header_length` set, Triton's `Inference-Header-Content-Length`) a JSON header followed by
    binary tensor data. Returns Triton's response as Triton wrote it (`InferenceResponse`). Raises Conflict when
    the deployment is not ready, InvalidInput naming the field or tensor at fault (Triton's own message when
    Triton rejects the request), Unavailable when Triton cannot be reached. A deployment with several Tritons
    (Kubernetes pods) has each request sent to the next ready one (round-robin); a server that cannot be reached
    (nothing was sent) is left out and the request goes to the next one, up to `MAX_SERVERS_TRIED` servers.
    Needs the developer role in the deployment's team and, with a token, the `infer` scope and (for a token
    limited to named deployments) the deployment's name: Forbidden otherwise.
    """
    require_deployment_access(
        user=user, deployment=deployment, action="Sending an inference request", token=token, scope=Scope.INFER
    )
    if deployment.status not in (DeploymentStatus.READY, DeploymentStatus.DEGRADED):
        raise Conflict(f"Deployment {deployment.pk} is '{deployment.status}', not ready.", field=None)

    def send(url: str) -> InferenceResponse:
        with TritonClient(url, timeout_s=60) as client:
            return client.infer_request_body(deployment.model_name, body, header_length=header_length)

    try:
        return send_to_a_server(deployment, send)
    except InvalidInput as error:
        raise _with_model_inputs(error, deployment) from None


#: Words of Triton's refusals of a request whose input names do not match the model's: an unknown input, a
#: missing one, or a count that differs (core's "expected 2 inputs but got 3 inputs").
_INPUT_NAME_PROBLEMS = ("unexpected inference input", "missing required input", "inputs but got")


def _with_model_inputs(error: InvalidInput, deployment: Deployment) -> InvalidInput:
    """`error` with the model's inputs appended ("The model's inputs: x FP32 [-1, 4]; shift FP32 [-1, 1]", -1
    marking a variable axis) when Triton refused the request's input names, so the caller reads what to send
    instead; any other error unchanged."""
    if not any(words in error.detail for words in _INPUT_NAME_PROBLEMS):
        return error
    inputs = (deployment.model_version.signature or {}).get("inputs") or []
    if not inputs:
        return error
    listed = "; ".join(f"{spec['name']} {spec['datatype']} {list(spec['dims'])}" for spec in inputs)
    error.detail = f"{error.detail.rstrip('.')}. The model's inputs: {listed}."
    return error


def send_to_a_server(deployment: Deployment, send: Callable[[str], T]) -> T:
    """Call `send(url)` with the HTTP URL of a ready Triton of `deployment` and return what it returns.

    With several Tritons (Kubernetes pods) they are taken in turn (round-robin). When `send` raises
    `TritonUnreachable` (no connection opened: nothing was sent), that server is left out and the next one is
    tried, up to `MAX_SERVERS_TRIED`. Raises Conflict (field `replicas`) for a deployment scaled to 0,
    Unavailable when no Triton is ready, and whatever `send` raises otherwise.
    """
    runtime = get_runtime(deployment.runtime)
    tried: set[str] = set()
    while True:
        url = runtime.internal_url(deployment.runtime_state)
        if url in tried:
            url = runtime.internal_url(deployment.runtime_state)  # the next one in turn
        if not url and deployment.runtime == "kubernetes" and not deployment.autoscaling and deployment.replicas == 0:
            raise Conflict(
                f"Deployment {deployment.pk} is scaled to 0 replicas; PATCH replicas to 1 or more to serve.",
                field="replicas",
            )
        if not url:
            raise Unavailable(f"Deployment {deployment.pk} has no ready Triton right now; retry in a few seconds.")
        try:
            return send(url)
        except TritonUnreachable:
            # Nothing reached that server (a pod that just went away): the request may go to another one.
            runtime.forget_server(deployment.runtime_state, url)
            if url in tried or len(tried) >= MAX_SERVERS_TRIED:
                raise
            tried.add(url)
