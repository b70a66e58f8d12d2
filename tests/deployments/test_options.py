"""Deployment options share the build's bounds and batching rules (builds.model_config is the one definition)."""

from __future__ import annotations

import pytest

from builds.model_config import MAX_INSTANCE_COUNT, MAX_MAX_BATCH_SIZE, MAX_QUEUE_DELAY_MICROSECONDS
from tritonserving.config import config_from_pbtxt

pytestmark = pytest.mark.django_db


def _post(caller, version, **extra):
    body = {"name": "web", "team": caller.team.slug, "model_version": version.pk, "runtime": "local", **extra}
    return caller.client.post("/api/v1/deployments/", body, format="json")


@pytest.mark.parametrize(
    ("option", "value", "detail"),
    [
        (
            "instance_count",
            100,
            f"instance_count must be between 1 and {MAX_INSTANCE_COUNT} (model instances per group); got 100.",
        ),
        (
            "max_batch_size",
            5000,
            f"max_batch_size must be between 0 and {MAX_MAX_BATCH_SIZE} (0 turns Triton batching off); got 5000.",
        ),
        (
            "max_queue_delay_microseconds",
            20_000_000,
            f"max_queue_delay_microseconds must be between 0 and {MAX_QUEUE_DELAY_MICROSECONDS} (microseconds, i.e. "
            "up to 1 second; it is how long Triton may hold a request to batch it with others); got 20000000.",
        ),
        ("instance_count", "two", "instance_count must be a whole number such as 8"),
    ],
)
def test_deployment_options_have_the_build_bounds(alice, built_classifier, option, value, detail):
    response = _post(alice, built_classifier, **{option: value})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == option
    assert response.json()["detail"].startswith(detail)


def test_a_deployment_may_serve_a_batching_build_without_batching(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # when the classifier, built with batching, is deployed with max_batch_size 0
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(alice, built_classifier, max_batch_size=0)

    # then it serves one request per run with the full shapes
    assert response.status_code == 201, response.content
    deployment = alice.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    assert deployment["status"] == "ready", deployment["error"]
    config = config_from_pbtxt(deployment["config_pbtxt"])
    assert (config.max_batch_size, list(config.input[0].dims)) == (0, [-1, 3, 224, 224])
    assert deployment["effective"]["dynamic_batching"] is False
