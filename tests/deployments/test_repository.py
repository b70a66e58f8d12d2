"""A deployment's own repository: filled from the build it pins before its Triton starts, deleted when it stops.

Tasks run inline (eager Celery, on commit); the deployment is a real tritonserver process.
"""

from __future__ import annotations

import pytest

from builds.services import served_repository_prefix
from deployments import services
from deployments.models import Deployment
from deployments.runtimes.local import LocalServerState
from deployments.services.requests import DeploymentRequest
from models_registry.storage import get_object_store
from tests.flows import deploy_ready
from tritonserving import server as triton_server
from tritonserving.config import config_from_pbtxt, same_apart_from_versions

pytestmark = pytest.mark.django_db


@pytest.mark.triton
def test_a_deployment_serves_its_own_copy_of_the_pinned_build(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # when the classifier is deployed
    d = deploy_ready(alice, django_capture_on_commit_callbacks, built_classifier.pk)
    # then its Triton reads the deployment's own repository: the build's model file and the effective
    # configuration serving exactly version 1
    row = Deployment.objects.get(pk=d["id"])
    own = services.deployment_repository_prefix(row.pk)
    store = get_object_store()
    assert store.list_keys(own) == [f"{own}/classifier/1/model.onnx", f"{own}/classifier/config.pbtxt"]
    pinned = served_repository_prefix(built_classifier)
    assert d["repository_prefix"] == pinned
    assert store.read_bytes(f"{own}/classifier/1/model.onnx") == store.read_bytes(f"{pinned}/classifier/1/model.onnx")
    config = config_from_pbtxt(store.read_bytes(f"{own}/classifier/config.pbtxt").decode())
    assert list(config.version_policy.specific.versions) == [1]
    assert same_apart_from_versions(config, config_from_pbtxt(row.config_pbtxt))
    [running] = triton_server.find_servers(LocalServerState.from_state(row.runtime_state).server_id)
    assert running.repository == store.triton_repository_location(own)
    # when it is stopped
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.delete(f"/api/v1/deployments/{row.pk}/").status_code == 202
    # then its repository is gone and the pinned build stays
    assert store.list_keys(own) == []
    assert store.exists(f"{pinned}/classifier/config.pbtxt")


def test_garbage_collection_deletes_the_repositories_of_stopped_deployments_only(alice, built_classifier):
    # given two deployments with their repositories written, one of them stopped without its stop task
    kept = services.create_deployment(
        user=alice.user, request=DeploymentRequest(team_slug="acme", name="kept", model_version_id=built_classifier.pk)
    )
    gone = services.create_deployment(
        user=alice.user, request=DeploymentRequest(team_slug="acme", name="gone", model_version_id=built_classifier.pk)
    )
    for row in (kept, gone):
        services.ensure_deployment_repository(deployment=row)
    Deployment.objects.filter(pk=gone.pk).update(status="stopped", desired_state="stopped")
    # when the repository garbage collection runs
    services.collect_repository_garbage()
    # then only the stopped deployment's repository went
    store = get_object_store()
    assert store.list_keys(services.deployment_repository_prefix(gone.pk)) == []
    assert store.exists(f"{services.deployment_repository_prefix(kept.pk)}/classifier/config.pbtxt")
