"""Two teams, each with a member, an API token, a model, a built version with its build steps and a deployment,
made through the services (no Triton is started: a deployment's start task is queued on commit, and these tests
never commit)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from django.test import Client
from rest_framework.test import APIClient

from builds.models import CustomBackend, Pipeline
from builds.services import current_build
from builds.services.pipeline import reset_steps
from deployments import services as deployments
from deployments.models import GatewayUsage, TensorRTPlan
from deployments.services.clusters import register_cluster
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tenancy.choices import Role
from tenancy.services import create_api_token, ensure_membership
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.factories import UserFactory
from tests.tiny_models import add_constant
from uploads.services import start_resumable_upload


@dataclass
class TeamWorld:
    """One team's member (an admin of it), the member's token of the team with every scope, and its objects."""

    team: object
    user: object
    token: str
    token_id: int
    model: object
    version: object
    deployment: object
    upload: object
    #: A TensorRT plan of the version (a record only: no Job ran), set once a cluster is registered.
    plan: object = None
    #: A custom backend the team registered (a record; its files are not in the store).
    backend: object = None
    #: A pipeline of the team, with no version.
    pipeline: object = None

    def token_client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client

    def session_client(self) -> Client:
        client = Client()
        client.force_login(self.user)
        return client


def make_team_world(username: str, team_slug: str, folder) -> TeamWorld:
    """A team `team_slug` whose admin `username` has a token, a model `adder`, its built version 1 (with build step
    rows), a deployment `adder` of it (local runtime, queued), a day of gateway use of it by the token and an open
    resumable upload of the model."""
    caller = make_caller(username, team_slug, role=Role.ADMIN)
    version = write_built_version(caller.team, "adder", add_constant(folder / f"{team_slug}.onnx", 1.0))
    reset_steps(build=current_build(version))
    deployment = deployments.create_deployment(
        user=caller.user,
        request=DeploymentRequest(
            team_slug=team_slug, name="adder", model_version_id=version.pk, placement=PlacementRequest(runtime="local")
        ),
    )
    token_id = caller.user.api_tokens.get().pk
    # an open resumable upload of the next version (folder storage: its parts come through Conch)
    upload, _ = start_resumable_upload(
        user=caller.user, model=version.model, filename="next.onnx", size_bytes=6 * 1024 * 1024, sha256="c" * 64
    )
    # a day of its use through the inference gateway (listed to team admins and in the admin)
    GatewayUsage.objects.create(
        token_id=token_id, team=caller.team, deployment=deployment, day=dt.date(2026, 11, 30), requests=3
    )
    backend = CustomBackend.objects.create(
        team=caller.team,
        name="scaling",
        version="1",
        kind=CustomBackend.KIND_PYTHON,
        files_prefix=f"backends/{caller.team.pk}/scaling/1",
        files=["model.py"],
        report={"methods": ["execute"]},
    )
    pipeline = Pipeline.objects.create(team=caller.team, name="chain")
    return TeamWorld(
        team=caller.team,
        user=caller.user,
        token=caller.token,
        token_id=token_id,
        model=version.model,
        version=version,
        deployment=deployment,
        upload=upload,
        backend=backend,
        pipeline=pipeline,
    )


@dataclass
class TwoTeams:
    """`victim` (team acme) and `other` (team globex); `carol` is an admin of both, with `carol_token` bound to
    globex; `staff` is a platform admin; `cluster` is a registered cluster (clusters are shared by all teams)."""

    victim: TeamWorld
    other: TeamWorld
    carol: object
    carol_token: str
    staff: object
    cluster: object


@pytest.fixture
def two_teams(db, tmp_path) -> TwoTeams:
    victim = make_team_world("alice", "acme", tmp_path)
    other = make_team_world("bob", "globex", tmp_path)
    carol = UserFactory(username="carol")
    ensure_membership(team=victim.team, user=carol, role=Role.ADMIN)
    ensure_membership(team=other.team, user=carol, role=Role.ADMIN)
    carol_token = create_api_token(user=carol, team=other.team, name="globex only").secret
    staff = UserFactory(username="operator", is_staff=True, is_superuser=True)
    cluster, _ = register_cluster(name="shared", namespace="conch", in_cluster=True)
    for world in (victim, other):
        world.plan = TensorRTPlan.objects.create(
            team=world.team,
            model_version=world.version,
            build=current_build(world.version),
            cluster=cluster,
            gpu_product="NVIDIA-A10",
            tensorrt_version="10.7.0",
            image="nvcr.io/nvidia/tensorrt:24.10-py3",
            status="failed",
            message="a record for the sweeps",
        )
    return TwoTeams(victim=victim, other=other, carol=carol, carol_token=carol_token, staff=staff, cluster=cluster)
