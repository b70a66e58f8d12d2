"""The suite's parallel run (pytest-xdist, tests/conftest.py): each worker's own Redis database, and the groups
that keep a cluster's tests, and a module's tests sharing a set-up, on one worker."""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from tests import conftest
from tests.conftest import worker_index, worker_redis_url, xdist_group_of


@pytest.mark.parametrize(("worker", "index"), [(None, 0), ("", 0), ("gw0", 0), ("gw2", 2), ("gw11", 11)])
def test_worker_index_reads_the_xdist_worker_id(worker, index):
    assert worker_index(worker) == index


def test_each_worker_gets_its_own_redis_database_from_the_configured_one():
    assert worker_redis_url("redis://127.0.0.1:6379/7", None) == "redis://127.0.0.1:6379/7"
    assert worker_redis_url("redis://127.0.0.1:6379/7", "gw0") == "redis://127.0.0.1:6379/7"
    assert worker_redis_url("redis://127.0.0.1:6379/7", "gw2") == "redis://127.0.0.1:6379/9"
    assert worker_redis_url("redis://:pw@10.0.0.1:6380", "gw1") == "redis://:pw@10.0.0.1:6380/1"
    # Redis has 16 databases: the numbers wrap around
    assert worker_redis_url("redis://127.0.0.1:6379/14", "gw2") == "redis://127.0.0.1:6379/0"
    # other brokers are not Redis: unchanged
    assert worker_redis_url("filesystem://", "gw1") == "filesystem://"


def test_this_worker_uses_its_own_redis_database():
    # the settings, Celery and the environment of subprocesses agree on the worker's database
    from conch.celery import app

    expected = worker_redis_url(conftest.CONFIGURED_BROKER_URL, os.environ.get("PYTEST_XDIST_WORKER"))
    assert settings.CELERY_BROKER_URL == app.conf.broker_url == os.environ["CELERY_BROKER_URL"] == expected


@pytest.fixture(scope="module")
def shared_by_the_module():
    return object()


def test_a_test_sharing_a_module_fixture_runs_with_its_module(request, shared_by_the_module):
    # (collection put the mark on it: the group a worker runs it in)
    assert request.node.get_closest_marker("xdist_group").args == ("tests/test_parallel.py",)


def test_a_test_without_a_shared_set_up_may_run_anywhere(request, settings):
    assert xdist_group_of(request.node) is None


@pytest.mark.kube
def test_a_kube_test_runs_on_the_cluster_worker(request):
    assert xdist_group_of(request.node) == "kube"


class _Item:
    """As much of a collected test as the ordering reads: its node id and marks."""

    def __init__(self, nodeid: str, *marks: pytest.MarkDecorator) -> None:
        self.nodeid = nodeid
        self.marks = [mark.mark for mark in marks]

    def get_closest_marker(self, name):
        return next((mark for mark in self.marks if mark.name == name), None)

    def iter_markers(self, name):
        return (mark for mark in self.marks if mark.name == name)


def test_an_xdist_run_hands_out_the_slow_tiers_groups_first_and_keeps_each_groups_order():
    # given quick tests collected before a module group with one triton test, a long e2e test alone, and kube tests
    quick = _Item("tests/test_a.py::test_quick")
    grouped = [
        _Item("tests/test_b.py::test_first", pytest.mark.xdist_group("tests/test_b.py")),
        _Item("tests/test_b.py::test_second", pytest.mark.xdist_group("tests/test_b.py"), pytest.mark.triton),
    ]
    alone = _Item("tests/test_c.py::test_long", pytest.mark.e2e)
    kube = [_Item(f"tests/test_d.py::test_{n}", pytest.mark.kube, pytest.mark.xdist_group("kube")) for n in "xy"]
    items = [quick, *grouped, kube[0], alone, kube[1]]
    # when ordered for an xdist run
    conftest._slow_groups_first(items)
    # then kube's group comes first, then the e2e test, then the group with a triton test (in file order), then the rest
    assert items == [*kube, alone, *grouped, quick]
