"""Deployment quotas: deployments, local model instances and Kubernetes GPUs, counted and checked atomically."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from builds.model_config import BuildOptions
from conch.errors import QuotaExceeded
from deployments import services
from deployments.models import Deployment
from deployments.services.quotas import count_team_gpus, gpu_request
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tenancy.quotas import set_quota, team_usage, teams_usage
from tests import real_models
from tests.deployments.conftest import write_built_version
from tests.factories import TeamFactory


def _body(caller, version, name: str, **extra) -> dict:
    return {"name": name, "team": caller.team.slug, "model_version": version.pk, "runtime": "local", **extra}


def _kubernetes_row(team, version, name: str, **fields) -> Deployment:
    """A Kubernetes deployment's row as create_deployment writes it (no cluster is needed to count it)."""
    return Deployment.objects.create(team=team, name=name, model_version=version, runtime="kubernetes", **fields)


@pytest.mark.django_db
def test_deployment_quota_refuses_the_next_deployment_with_409_and_the_quota(alice, built_classifier):
    # given
    set_quota(team=alice.team, limits={"deployments": 2})
    for name in ("one", "two"):
        response = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, name), format="json")
        assert response.status_code == 201, response.content
    # when
    response = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "three"), format="json")
    # then
    assert response.status_code == 409
    assert response.json() == {
        "detail": "Deployment quota exceeded: team 'acme' uses 2 of 2 deployments; this deployment needs 1",
        "field": "deployments",
        "quota": {"limit": 2, "used": 2, "requested": 1},
    }
    assert Deployment.objects.filter(team=alice.team).count() == 2


@pytest.mark.django_db
def test_a_stopped_deployment_no_longer_counts(alice, built_classifier):
    # given a team at its limit, whose deployment is then stopped (its workload gone)
    set_quota(team=alice.team, limits={"deployments": 1})
    first = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "one"), format="json").json()
    Deployment.objects.filter(pk=first["id"]).update(status="stopping", desired_state="stopped")
    refused = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "two"), format="json")
    assert refused.status_code == 409  # stopping: its Triton may still run
    Deployment.objects.filter(pk=first["id"]).update(status="stopped")
    # when
    response = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "two"), format="json")
    # then
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_the_default_limits_stop_eight_deployments_of_sixteen_instances(alice, built_classifier, settings):
    # given the defaults of a fresh installation
    assert (settings.CONCH_QUOTA_INSTANCES, settings.CONCH_QUOTA_DEPLOYMENTS) == (16, 10)
    # when a user asks for 8 deployments of 16 model instances each
    statuses = [
        alice.client.post(
            "/api/v1/deployments/", _body(alice, built_classifier, f"d{n}", instance_count=16), format="json"
        )
        for n in range(8)
    ]
    # then the first fits, the others are refused on model instances
    assert [response.status_code for response in statuses] == [201] + [409] * 7
    assert statuses[1].json() == {
        "detail": "Model instance quota exceeded: team 'acme' uses 16 of 16 model instances; this deployment needs 16",
        "field": "instances",
        "quota": {"limit": 16, "used": 16, "requested": 16},
    }


@pytest.mark.django_db
def test_instances_count_the_version_s_own_instance_groups(alice):
    # given a version built with 3 instances, deployed without an instance_count
    version = write_built_version(alice.team, "triple", real_models.classifier(), BuildOptions(instance_count=3))
    set_quota(team=alice.team, limits={"instances": 5})
    assert alice.client.post("/api/v1/deployments/", _body(alice, version, "a"), format="json").status_code == 201
    # when
    response = alice.client.post("/api/v1/deployments/", _body(alice, version, "b"), format="json")
    # then
    assert response.status_code == 409
    assert response.json()["quota"] == {"limit": 5, "used": 3, "requested": 3}


def test_gpu_request_counts_pods_times_gpus_autoscaling_at_its_maximum_and_mig_slices_per_profile():
    assert gpu_request(replicas=3, autoscaling=None, gpu={"count": 2, "product": "NVIDIA-A10"}) == {"nvidia.com/gpu": 6}
    assert gpu_request(replicas=1, autoscaling={"min_replicas": 1, "max_replicas": 4}, gpu={"count": 1}) == {
        "nvidia.com/gpu": 4
    }
    assert gpu_request(replicas=2, autoscaling=None, gpu={"mig_profile": "1g.10gb"}) == {"nvidia.com/mig-1g.10gb": 2}
    assert gpu_request(replicas=5, autoscaling=None, gpu=None) == {}


@pytest.mark.django_db
def test_team_gpu_usage_sums_kubernetes_deployments_that_are_not_stopped(alice, bob, built_classifier):
    # given
    team = alice.team
    _kubernetes_row(team, built_classifier, "a", replicas=2, gpu={"count": 2})
    _kubernetes_row(team, built_classifier, "b", autoscaling={"min_replicas": 1, "max_replicas": 3}, gpu={"count": 1})
    _kubernetes_row(team, built_classifier, "c", replicas=3, gpu={"mig_profile": "1g.10gb"})
    _kubernetes_row(team, built_classifier, "d", replicas=1, gpu={"mig_profile": "2g.20gb"}, status="failed")
    _kubernetes_row(team, built_classifier, "e", replicas=4, gpu=None)
    _kubernetes_row(team, built_classifier, "f", replicas=8, gpu={"count": 1}, status="stopped")
    other = write_built_version(bob.team, "other", real_models.classifier())
    _kubernetes_row(bob.team, other, "x", replicas=8, gpu={"count": 1})
    # when
    usage = count_team_gpus(team)
    # then
    assert usage == {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.10gb": 3, "nvidia.com/mig-2g.20gb": 1}
    lines = {line["unit"]: line for line in alice.client.get("/api/v1/teams/acme/usage").json()["quotas"]}
    assert lines["nvidia.com/mig-1g.10gb"] == {
        "field": "gpu",
        "unit": "nvidia.com/mig-1g.10gb",
        "limit": 8,
        "used": 3,
        "is_default": True,
    }


@pytest.mark.django_db
def test_usage_of_many_teams_at_once_is_each_teams_own(alice, bob, built_classifier):
    # given acme: 2 Kubernetes deployments (2 x 2 GPUs, 3 MIG slices), a local one of 2 instances, a stopped
    # one; globex: one Kubernetes deployment of 8 GPUs; initech: nothing at all
    set_quota(team=alice.team, limits={"gpu": 9})
    _kubernetes_row(alice.team, built_classifier, "a", replicas=2, gpu={"count": 2})
    _kubernetes_row(alice.team, built_classifier, "c", replicas=3, gpu={"mig_profile": "1g.10gb"})
    _kubernetes_row(alice.team, built_classifier, "f", replicas=8, gpu={"count": 1}, status="stopped")
    config = 'name: "m"\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'
    Deployment.objects.create(team=alice.team, name="l", model_version=built_classifier, config_pbtxt=config)
    other = write_built_version(bob.team, "other", real_models.classifier())
    _kubernetes_row(bob.team, other, "x", replicas=8, gpu={"count": 1})
    idle = TeamFactory(slug="initech")
    # when
    usage = teams_usage(teams=[alice.team, bob.team, idle])
    # then
    used = {
        team_id: {(line.field, line.unit): (line.used, line.limit) for line in lines}
        for team_id, lines in usage.items()
    }
    classifier_bytes = built_classifier.source_size_bytes
    assert used[alice.team.pk] == {
        ("gpu", "nvidia.com/gpu"): (4, 9),
        ("gpu", "nvidia.com/mig-1g.10gb"): (3, 9),
        ("instances", "model instances"): (2, 16),
        ("storage_bytes", "bytes of storage"): (classifier_bytes, 50 * 1024**3),
        ("models", "models"): (1, 20),
        ("deployments", "deployments"): (3, 10),
    }
    assert used[bob.team.pk][("gpu", "nvidia.com/gpu")] == (8, 8)
    assert used[bob.team.pk][("deployments", "deployments")] == (1, 10)
    assert set(used[idle.pk].values()) == {(0, 8), (0, 16), (0, 50 * 1024**3), (0, 20), (0, 10)}
    # and each team's line is the one its own usage shows (the API's and the quota check's count)
    for team in (alice.team, bob.team, idle):
        assert usage[team.pk] == team_usage(team=team)
        assert count_team_gpus(team) == {
            line.unit: line.used for line in usage[team.pk] if line.field == "gpu" and line.used
        }


@pytest.mark.django_db
def test_scaling_up_past_the_gpu_quota_is_refused_and_scaling_down_is_not(alice, built_classifier):
    # given 6 GPUs in use of 8, 2 of them by web
    set_quota(team=alice.team, limits={"gpu": 8})
    _kubernetes_row(alice.team, built_classifier, "other", replicas=4, gpu={"count": 1})
    web = _kubernetes_row(alice.team, built_classifier, "web", replicas=1, gpu={"count": 2}, status="ready")
    # when web asks for 3 replicas of 2 GPUs (6, of which it holds 2)
    response = alice.client.patch(f"/api/v1/deployments/{web.pk}/", {"replicas": 3}, format="json")
    # then
    assert response.status_code == 409
    assert response.json() == {
        "detail": "GPU quota exceeded: team 'acme' uses 4 of 8 nvidia.com/gpu; this scaling needs 6",
        "field": "gpu",
        "quota": {"limit": 8, "used": 4, "requested": 6},
    }
    web.refresh_from_db()
    assert web.replicas == 1
    # when within the quota, and then down under a lowered limit
    assert alice.client.patch(f"/api/v1/deployments/{web.pk}/", {"replicas": 2}, format="json").status_code == 202
    set_quota(team=alice.team, limits={"gpu": 1})
    down = alice.client.patch(f"/api/v1/deployments/{web.pk}/", {"replicas": 1}, format="json")
    assert down.status_code == 202, down.content
    # and autoscaling counts at its maximum
    up = alice.client.patch(
        f"/api/v1/deployments/{web.pk}/",
        {"autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_cpu_percent": 70}},
        format="json",
    )
    assert up.status_code == 409
    assert up.json()["quota"] == {"limit": 1, "used": 4, "requested": 4}


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_creations_against_a_limit_of_five_create_exactly_five(alice):
    # given a limit of 5 deployments, on PostgreSQL
    assert connection.vendor == "postgresql"
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    set_quota(team=alice.team, limits={"deployments": 5})
    barrier = threading.Barrier(20)
    created: list[int] = []
    refused: list[QuotaExceeded] = []
    errors: list[BaseException] = []

    def create(n: int) -> None:
        try:
            barrier.wait()
            deployment = services.create_deployment(
                user=alice.user,
                request=DeploymentRequest(
                    team_slug="acme",
                    name=f"d{n}",
                    model_version_id=version.pk,
                    placement=PlacementRequest(runtime="local"),
                ),
            )
            created.append(deployment.pk)
        except QuotaExceeded as exc:
            refused.append(exc)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    # when 20 threads, each with its own connection, create deployments at once
    threads = [threading.Thread(target=create, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then exactly 5 were created and 15 refused with the quota
    assert errors == []
    assert (len(created), len(refused)) == (5, 15)
    assert Deployment.objects.filter(team=alice.team).count() == 5
    assert {(exc.field, str(exc.quota)) for exc in refused} == {
        ("deployments", str({"limit": 5, "used": 5, "requested": 1}))
    }
