"""The inference proxy: forwards a client's KServe v2 request to the deployment's Triton."""

from __future__ import annotations

import logging

from conch.errors import Conflict, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from deployments.services.records import internal_url
from tritonserving.client import InferenceResponse, TritonClient

log = logging.getLogger(__name__)


def infer(*, deployment: Deployment, body: bytes, header_length: int | None = None) -> InferenceResponse:
    """Forward a KServe v2 / Open Inference Protocol request body to the deployment's Triton, unchanged.

    `body`: JSON, or (`header_length` set, Triton's `Inference-Header-Content-Length`) a JSON header followed by
    binary tensor data. Returns Triton's response as Triton wrote it (`InferenceResponse`). Raises Conflict when
    the deployment is not ready, InvalidInput naming the field or tensor at fault (Triton's own message when
    Triton rejects the request), Unavailable when Triton cannot be reached. A deployment with several Tritons
    (Kubernetes pods) has each request sent to the next ready one (round-robin).
    """
    if deployment.status not in (DeploymentStatus.READY, DeploymentStatus.DEGRADED):
        raise Conflict(f"Deployment {deployment.pk} is '{deployment.status}', not ready.", field=None)
    url = internal_url(deployment)
    if not url:
        raise Unavailable(f"Deployment {deployment.pk} has no ready Triton right now; retry in a few seconds.")
    client = TritonClient(url, timeout_s=60)
    return client.infer_request_body(deployment.model_name, body, header_length=header_length)
