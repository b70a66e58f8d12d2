"""Shared fixtures: isolated storage and Triton folders, users/teams/tokens, API clients, Celery modes.

The suite runs in parallel under pytest-xdist (`make test`: `-n 3 --dist loadgroup`), each worker a process of its
own. What a worker holds is its own: its test database (pytest-django appends the worker id, `test_conch_gw1`),
its Redis database (`worker_redis_url` below), its tmp folders, its Tritons (their ids carry the worker's pid) and
its session-wide servers (the verify Triton, Chromium, the S3 server). The tests on the local Kubernetes test
cluster (`kube`) all go to one worker, which starts the one cluster (`xdist_group("kube")`). A new session-scoped
fixture must therefore be safe to run once per worker; a test that needs to be alone on the machine (a process
sweep, a fixed port) does not fit here.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from rest_framework.test import APIClient

from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytest_plugins = ["tests.s3_server", "tests.kube.fixtures", "tests.gateway_server"]


#: Marks of the tiers `make test-fast` leaves out; a test marked so may start a tritonserver without `triton`.
SLOW_TIER_MARKS = ("triton", "e2e", "kube")

#: Redis has databases 0-15 unless configured otherwise.
REDIS_DATABASES = 16


def worker_index(worker: str | None) -> int:
    """Return the number of the pytest-xdist worker `worker` (`gw0` -> 0, `gw2` -> 2); 0 outside xdist (None, "")."""
    return int(worker.removeprefix("gw")) if worker and worker.startswith("gw") else 0


def worker_redis_url(url: str, worker: str | None) -> str:
    """Return `url` (redis://host:port/db) on the database of xdist worker `worker`: db + its index, modulo 16.

    A worker's Celery tasks, its in-process and subprocess Celery workers and its gateway rate limits then never
    meet another worker's (test database ids repeat across workers). Other URLs, and `url` outside xdist, come back
    unchanged.
    """
    parts = urlsplit(url)
    index = worker_index(worker)
    if parts.scheme not in ("redis", "rediss") or index == 0:
        return url
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(base + index) % REDIS_DATABASES}"))


def _use_worker_redis() -> str:
    """Point this xdist worker's broker (settings, Celery's config and the environment its subprocesses inherit)
    at its own Redis database; return the broker URL the run was given. Runs when this conftest is imported: after
    Django read its settings, before any Celery connection."""
    from django.conf import settings

    from conch.celery import app

    configured = settings.CELERY_BROKER_URL
    url = worker_redis_url(configured, os.environ.get("PYTEST_XDIST_WORKER"))
    if url != configured:
        settings.CELERY_BROKER_URL = url
        app.conf.broker_url = url
        os.environ["CELERY_BROKER_URL"] = url
        # The cache follows the broker (CONCH_CACHE_URL unset in `make test`): it moves with it.
        if settings.CACHES["default"].get("LOCATION") == configured:
            settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": url}}
    return configured


#: The broker URL the run was given (this worker's own is `worker_redis_url` of it).
CONFIGURED_BROKER_URL = _use_worker_redis()


#: Fixture scopes a worker would set up again for each module's tests it runs: tests sharing one stay together.
_SHARED_SCOPES = ("package", "module", "class")


def xdist_group_of(item: pytest.Item) -> str | None:
    """Return the pytest-xdist group `item` must run in, or None when any worker may run it alone.

    `kube` tests: "kube" (one worker, one test cluster; a cluster per worker would cost a start each and twice the
    CPU). A test using a module-, class- or package-scoped fixture: its module's path, so the module's tests run on
    one worker, in file order, on one set-up (the embedded demo's tests share one running demo and build on each
    other's steps).
    """
    if item.get_closest_marker("kube") is not None:
        return "kube"
    if item.get_closest_marker("xdist_group") is not None:
        return None  # the test names its group itself
    fixture_info = getattr(item, "_fixtureinfo", None)
    definitions = fixture_info.name2fixturedefs.values() if fixture_info is not None else ()
    if any(definition.scope in _SHARED_SCOPES for chain in definitions for definition in chain):
        return item.nodeid.split("::", 1)[0]
    return None


def pytest_collection_modifyitems(config, items):
    """Mark each test with its xdist group (`xdist_group_of`); `--dist loadgroup` sends a group to one worker, the
    slow tiers' groups first (`_slow_groups_first`). Without xdist the mark does nothing and the order is kept."""
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # collected in an xdist worker
        _slow_groups_first(items)
        _suffix_group_ids(items)


#: Tier marks by how long their tests take, longest first: the order an xdist run hands their groups out in.
_TIERS_BY_COST = ("kube", "e2e", "triton")


def _tier_rank(item: pytest.Item) -> int:
    """Return the index in `_TIERS_BY_COST` of the first tier `item` is marked with; len(_TIERS_BY_COST) if none."""
    return next(
        (rank for rank, mark in enumerate(_TIERS_BY_COST) if item.get_closest_marker(mark) is not None),
        len(_TIERS_BY_COST),
    )


def _slow_groups_first(items: list[pytest.Item]) -> None:
    """Order `items` (in place) so that an xdist run starts the slow tiers first: the kube group, then the groups
    with an e2e test, then those with a triton test, then the rest; the largest group first within a tier, and
    collection order otherwise (so a group's tests keep their file order).

    The controller hands the groups out in this order (`pytest_configure` below turns off xdist's own order, by
    group size alone: with it the API fuzz test, minutes long but a group of one, was handed out last and ran
    minutes after the other workers had finished). Slowest first, the quick tests fill the workers' ends.
    """
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(_group_name(item) or item.nodeid, []).append(item)
    ordered = sorted(groups.values(), key=lambda group: (min(map(_tier_rank, group)), -len(group)))
    items[:] = [item for group in ordered for item in group]


def pytest_configure(config):
    """Under xdist, hand the groups out in collection order (`_slow_groups_first`), not by group size."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _suffix_group_ids(items: list[pytest.Item]) -> None:
    """Give each item marked `xdist_group` the id `<nodeid>@<group>` that `--dist loadgroup` schedules by.

    pytest-xdist 3.8.0 writes that suffix into `item._nodeid`, which pytest 9 no longer reads (its node id is
    `item._id`, a `NodeId`): without this the groups' tests spread over all workers. An id that already ends in
    its suffix is left alone.
    """
    from _pytest.nodeid import NodeId

    for item in items:
        name = _group_name(item)
        if name is not None and not item.nodeid.endswith("@" + name):
            item._id = NodeId.parse(f"{item.nodeid}@{name}")


def _group_name(item: pytest.Item) -> str | None:
    """Return the xdist group `item` is marked with (xdist joins several with `_`), or None when unmarked."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


@dataclass
class _TritonUse:
    """How many times this process started a tritonserver or verified a model on its warm one."""

    count: int = 0


@pytest.fixture(scope="session")
def _triton_use() -> object:
    """Count the tritonservers this process starts (`tritonserving.server.start_server` records each in
    `_CHILDREN`) and the verifications on a warm verify server (`VerifyServer.run`, which may start none: the
    session shares one)."""
    from tritonserving import server as triton_server
    from tritonserving import smoke

    use = _TritonUse()
    run = smoke.VerifyServer.run

    class CountedChildren(dict):
        # start_server records every tritonserver it starts here (pid -> Popen), however it was imported.
        def __setitem__(self, pid, child):
            use.count += 1
            super().__setitem__(pid, child)

    def counted_run(self, **kwargs):
        use.count += 1
        return run(self, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_server, "_CHILDREN", CountedChildren(triton_server._CHILDREN))
        patch.setattr(smoke.VerifyServer, "run", counted_run)
        yield use


@pytest.fixture(autouse=True)
def _triton_marked(request, _triton_use):
    """Fail a test that starts or uses a tritonserver in this process without the `triton` mark (or e2e/kube):
    `make test-fast` leaves those out, and relies on the mark to do so. A server that a module- or session-scoped
    fixture starts is counted before this check looks: mark the tests that share it (see tests/tritonserving)."""
    before = _triton_use.count
    yield
    if _triton_use.count > before and not any(request.node.get_closest_marker(m) for m in SLOW_TIER_MARKS):
        pytest.fail(f"{request.node.nodeid} starts or uses a tritonserver: mark it @pytest.mark.triton (pytest.ini)")


@pytest.fixture(scope="session")
def _session_verify_dir(tmp_path_factory) -> Path:
    """Work folder of the session's warm verify Triton; the server is stopped at the end of the session."""
    from tritonserving import smoke

    yield tmp_path_factory.mktemp("verify-triton")
    smoke.stop_verify_server()


def _share_verify_server(monkeypatch, work_dir: Path) -> None:
    """Builds of this test verify on the session's warm verify Triton (a cold start costs seconds per build test):
    the same server while the verify settings stay the same. Its id starts `<instance id>shared.verify.`, which
    neither this test's server sweeps (`<instance id>.`) nor `stop_verify_servers` match."""
    from django.conf import settings

    from builds.services import verify_servers

    own_settings = verify_servers._verify_server_settings

    def shared_settings():
        prefix = f"{settings.CONCH_INSTANCE_ID}shared{verify_servers.SERVER_ID_INFIX_VERIFY}"
        return dataclasses.replace(own_settings(), work_dir=work_dir, server_id_prefix=prefix)

    monkeypatch.setattr(verify_servers, "_verify_server_settings", shared_settings)


@pytest.fixture(autouse=True)
def _isolated_conch(request, settings, tmp_path_factory, monkeypatch):
    """Each test gets its own object-store folder; Tritons it starts carry a test-only id. Builds verify on the
    session's warm verify Triton, except in tests marked `own_verify_server` (about that server's start, crash or
    replacement), which get one of their own under their own folder."""
    base = tmp_path_factory.mktemp("conch")
    settings.CONCH_STORAGE_URL = (base / "storage").as_uri()
    settings.CONCH_TRITON_DIR = base / "triton"
    settings.CONCH_INSTANCE_ID = f"conchtest{os.getpid()}"
    if request.node.get_closest_marker("own_verify_server") is None:
        _share_verify_server(monkeypatch, request.getfixturevalue("_session_verify_dir"))
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


class SetClock:
    """A clock (seconds since the epoch) that moves only when a test sets `now`; it starts 10 s into a minute, so
    no rate-limit window ends during a test unless the test moves it."""

    def __init__(self) -> None:
        self.now = 1_800_000_010.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inference_edge(db, monkeypatch):
    """A fresh `InferenceEdge` (the REST API's inference path: relay, rate limiter, usage meter) for this test, its
    rate limiter on a `SetClock` (`edge.clock`); closed, with its usage written, before the database goes."""
    from deployments.services import inference

    clock = SetClock()
    edge = inference.InferenceEdge(clock=clock)
    edge.clock = clock
    monkeypatch.setattr(inference, "_edge", edge)
    yield edge
    edge.close()


@pytest.fixture(scope="session")
def live_server(live_server):
    """pytest-django's `live_server`, its connections with TCP_NODELAY (as uvicorn's, the real web server's).

    Django's test server writes a response's head and body in two sends; with Nagle's algorithm the body waits
    for the ACK of the head, which the client delays (40 ms on Linux): every request took 44 ms here instead of
    4, which was most of the API fuzz test's minutes (thousands of requests).
    """
    from django.core.servers.basehttp import WSGIRequestHandler

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WSGIRequestHandler, "disable_nagle_algorithm", True)
        yield live_server


@pytest.fixture(scope="session", autouse=True)
def _close_the_inference_edge():
    """Close the process's inference edge (if a test started one) while the session's output is still captured:
    its usage is written then, not at interpreter exit after the test database is gone."""
    yield
    from deployments.services import inference

    if inference._edge is not None:
        inference._edge.close()
