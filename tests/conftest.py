"""Shared fixtures: isolated storage and Triton folders, users/teams/tokens, API clients, Celery modes."""

from __future__ import annotations

import copy
import os
import uuid
from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytest_plugins = ["tests.s3_server", "tests.kube.fixtures", "tests.gateway_server"]


@pytest.fixture(autouse=True)
def _isolated_conch(settings, tmp_path_factory):
    """Each test gets its own object-store folder; Tritons it starts carry a test-only id."""
    base = tmp_path_factory.mktemp("conch")
    settings.CONCH_STORAGE_URL = (base / "storage").as_uri()
    settings.CONCH_TRITON_DIR = base / "triton"
    settings.CONCH_INSTANCE_ID = f"conchtest{os.getpid()}"
    yield
    # A failed test must not leave its Tritons running for the next one.
    from tritonserving import server as triton_server

    for server in triton_server.find_servers(settings.CONCH_INSTANCE_ID + "."):
        triton_server.stop_server(server.pid, server.create_time)


@pytest.fixture(autouse=True)
def _own_cache_keys(settings):
    """Each test counts API rate limits under a key prefix of its own: the cache (Redis in `make test`) outlives a
    test, and token and user ids repeat across runs, so no test may spend the budget another one left."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"test-{uuid.uuid4().hex}"
    settings.CACHES = caches


@pytest.fixture
def eager_tasks():
    """Run Celery tasks inline when queued (on commit), propagating their errors."""
    from conch.celery import app

    # Services queue tasks by name; a worker imports the task modules at start, tests do it here.
    app.loader.import_default_modules()
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield app
    app.conf.task_always_eager = False


@dataclass
class Caller:
    user: object
    team: object
    token: str
    client: APIClient


def make_caller(username: str, team_slug: str, *, role: str = "developer", scopes: list[str] | None = None) -> Caller:
    """A user with `role` in team `team_slug` and a client sending a token of that team (every scope unless
    `scopes` says which). The token is made while the user is a developer and the role set after it, as for a
    member demoted since: a viewer's own token could only read, and the tests of the role checks need one that
    gets past the scope checks."""
    from tenancy.services import create_api_token

    user = UserFactory(username=username)
    team = TeamFactory(slug=team_slug)
    membership = MembershipFactory(user=user, team=team, role="developer")
    token = create_api_token(user=user, team=team, name="tests", scopes=scopes).secret
    if role != membership.role:
        membership.role = role
        membership.save(update_fields=["role"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return Caller(user=user, team=team, token=token, client=client)


@pytest.fixture
def alice(db) -> Caller:
    """A developer in team `acme` with an API client authenticated by bearer token."""
    return make_caller("alice", "acme")


@pytest.fixture
def bob(db) -> Caller:
    """A developer in another team, `globex`."""
    return make_caller("bob", "globex")
