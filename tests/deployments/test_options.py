"""Deployment options share the build's bounds and batching rules (builds.model_config is the one definition)."""

from __future__ import annotations

import pytest

from builds.model_config import MAX_INSTANCE_COUNT, MAX_MAX_BATCH_SIZE, MAX_QUEUE_DELAY_MICROSECONDS
from tests import real_models
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


@pytest.mark.triton
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


def test_a_local_deployment_takes_cpu_instances_and_keeps_the_kind_through_a_version_update(
    alice, built_classifier, settings
):
    from deployments.models import Deployment
    from deployments.services.updates import effective_config
    from tests.deployments.conftest import write_built_version

    # when the classifier is deployed with 2 CPU instances
    response = _post(alice, built_classifier, instance_count=2, instance_kind="KIND_CPU")
    # then its configuration runs them on the CPU, and the API says so
    assert response.status_code == 201, response.content
    deployment = alice.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    groups = config_from_pbtxt(deployment["config_pbtxt"]).instance_group
    assert [(group.count, group.kind) for group in groups] == [(2, groups[0].KIND_CPU)]
    assert deployment["effective"]["instance_kind"] == "KIND_CPU"
    # and a switch to another version keeps the kind (and the count) it was deployed with
    other = write_built_version(alice.team, built_classifier.model.name, real_models.classifier())
    groups = effective_config(Deployment.objects.get(pk=deployment["id"]), other).instance_group
    assert [(group.count, group.kind) for group in groups] == [(2, groups[0].KIND_CPU)]


@pytest.mark.triton
def test_a_deployment_with_cpu_instances_comes_up_on_triton_and_answers(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # when the classifier is deployed with 2 KIND_CPU instances on this machine's Triton
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(alice, built_classifier, instance_count=2, instance_kind="KIND_CPU")
    # then Triton loads it and answers an inference
    assert response.status_code == 201, response.content
    deployment = alice.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    assert deployment["status"] == "ready", deployment["error"]
    assert (deployment["effective"]["instance_kind"], deployment["effective"]["instance_count"]) == ("KIND_CPU", 2)
    request = {"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": [0.5] * 150528}]}
    answer = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", request, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["shape"] == [1, 4]


@pytest.mark.parametrize(
    ("kind", "gpus", "detail"),
    [
        ("KIND_TPU", "0", "instance_kind must be one of KIND_AUTO, KIND_CPU, KIND_GPU (or empty: as built); got "),
        ("KIND_MODEL", "1", "instance_kind must be one of KIND_AUTO, KIND_CPU, KIND_GPU (or empty: as built); got "),
        (7, "1", "instance_kind must be one of KIND_AUTO, KIND_CPU, KIND_GPU (or empty: as built); got 7."),
        (
            "KIND_GPU",
            "0",
            "instance_kind KIND_GPU needs a GPU, and this machine (the local runtime's worker host) has none: choose "
            "KIND_CPU, or deploy on a Kubernetes cluster with GPUs.",
        ),
    ],
)
def test_a_local_deployment_is_refused_an_instance_kind_it_cannot_run(
    alice, built_classifier, settings, kind, gpus, detail
):
    settings.CONCH_LOCAL_GPUS = gpus
    response = _post(alice, built_classifier, instance_kind=kind)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "instance_kind"
    assert response.json()["detail"].startswith(detail)


def test_gpu_instances_are_taken_where_there_is_a_gpu(alice, built_classifier, settings):
    from conch.errors import InvalidInput
    from deployments.services.placement import check_instance_kind

    # a local worker host with a GPU
    settings.CONCH_LOCAL_GPUS = "1"
    response = _post(alice, built_classifier, instance_kind="KIND_GPU")
    assert response.status_code == 201, response.content
    assert "kind: KIND_GPU" in response.json()["config_pbtxt"]
    # a pod with GPUs, whole or a MIG slice; a pod without is refused, naming the field
    assert check_instance_kind(runtime="kubernetes", instance_kind="KIND_GPU", gpu={"count": 1}) == "KIND_GPU"
    assert check_instance_kind(runtime="kubernetes", instance_kind="KIND_GPU", gpu={"mig_profile": "1g.10gb"})
    with pytest.raises(InvalidInput) as refused:
        check_instance_kind(runtime="kubernetes", instance_kind="KIND_GPU", gpu=None)
    assert refused.value.field == "instance_kind"
    assert refused.value.detail.startswith("instance_kind KIND_GPU needs GPUs in the pod")
    # CPU instances and the build's kind run anywhere; empty keeps the build's
    assert check_instance_kind(runtime="kubernetes", instance_kind="KIND_CPU", gpu=None) == "KIND_CPU"
    assert check_instance_kind(runtime="local", instance_kind="", gpu=None) is None
