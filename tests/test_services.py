"""`python -m tests.services`: keep answering services, start and stop throwaway PostgreSQL and Redis otherwise."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dj_database_url
import psutil
import pytest

from tests import services

REPOSITORY = Path(__file__).resolve().parents[1]

# Run by the wrapper: use both services, report where they are and their server pids, exit with argv[1].
CHILD = r"""
import json, os, sys, time
import dj_database_url, psycopg, redis

database = dj_database_url.parse(os.environ["DATABASE_URL"])
broker = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
found = {"database_url": os.environ["DATABASE_URL"], "broker_url": os.environ["CELERY_BROKER_URL"]}
if sys.argv[2] == "use":
    where = {"host": database["HOST"], "port": database["PORT"], "user": database["USER"]}
    with psycopg.connect(**where, dbname="postgres", autocommit=True) as c:
        c.execute("CREATE DATABASE " + database["NAME"])
    with psycopg.connect(**where, dbname=database["NAME"]) as c:
        found["database_answer"] = c.execute("SELECT 41 + 1").fetchone()[0]
        # (the data folder holds postmaster.pid; a long folder path gets its socket elsewhere, under /tmp)
        data_directory = c.execute("SHOW data_directory").fetchone()[0]
    broker.set("conch", "yes")
    found["broker_answer"] = broker.get("conch").decode()
    postmaster_pid = os.path.join(data_directory, "postmaster.pid")
    found["pids"] = [int(open(postmaster_pid).read().split()[0]), broker.info("server")["process_id"]]
print(json.dumps(found), flush=True)
if sys.argv[2] == "use":
    time.sleep(3600 if sys.argv[1] == "wait" else 0)
sys.exit(0 if sys.argv[1] == "wait" else int(sys.argv[1]))
"""


@pytest.fixture
def closed_ports() -> Iterator[tuple[int, int]]:
    """Two loopback ports that refuse connections: bound (so nothing else takes them), never listening."""
    held = [socket.socket(), socket.socket()]
    for sock in held:
        sock.bind(("127.0.0.1", 0))
    yield tuple(sock.getsockname()[1] for sock in held)
    for sock in held:
        sock.close()


def _wrapper(command: list[str], database_url: str, broker_url: str, var: Path, **kwargs) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    environ.update({"DATABASE_URL": database_url, "CELERY_BROKER_URL": broker_url, "CONCH_VAR_DIR": str(var)})
    return subprocess.Popen(
        [sys.executable, "-m", "tests.services", "--", *command],
        cwd=REPOSITORY,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _child(exit_with: str, mode: str = "use") -> list[str]:
    return [sys.executable, "-c", CHILD, exit_with, mode]


def _servers_alive(pids: list[int], var: Path) -> list[int]:
    """The given pids and any process naming `var` that still run (a zombie waiting for its parent does not)."""
    candidates = [pid for pid in pids if psutil.pid_exists(pid)]
    candidates += [p.pid for p in psutil.process_iter(["cmdline"]) if str(var) in " ".join(p.info["cmdline"] or ())]
    alive = []
    for pid in candidates:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_answers_only_where_something_listens(closed_ports):
    # given a listening socket and a port that refuses
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        # then only the listening one answers, for either kind of URL
        assert services.answers(f"postgres://postgres@127.0.0.1:{port}/conch", 5432) is True
        assert services.answers(f"redis://127.0.0.1:{port}/14", 6379) is True
    assert services.answers(f"postgres://postgres@127.0.0.1:{closed_ports[0]}/conch", 5432) is False
    assert services.answers(f"redis://127.0.0.1:{closed_ports[1]}/14", 6379) is False


def test_answers_on_a_postgres_socket_folder(tmp_path):
    # given a unix socket named as PostgreSQL names it, in a folder given both ways libpq accepts
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / ".s.PGSQL.5433"))
        listening.listen()
        encoded = services.postgres_url_on_socket("postgres://postgres@127.0.0.1/conch", tmp_path, 5433)
        assert services.answers(encoded, 5432) is True
        assert services.answers(f"postgresql://postgres:@/conch?host={tmp_path}&port=5433", 5432) is True
        # then another port in the same folder does not answer
        assert services.answers(services.postgres_url_on_socket("postgres://x@y/conch", tmp_path, 5434), 5432) is False


def test_a_throwaway_postgres_url_is_what_django_reads_as_that_socket():
    # given a socket folder with upper-case letters and a configured URL with a password
    configured = "postgres://conch:secret@127.0.0.1:5432/conch_fresh"
    url = services.postgres_url_on_socket(configured, Path("/tmp/Run-1/pg"), 5432)
    # then Django gets the folder as HOST, the port, the database name, and user postgres without a password
    parsed = dj_database_url.parse(url)
    assert (parsed["HOST"], parsed["PORT"], parsed["NAME"], parsed["USER"], parsed["PASSWORD"]) == (
        "/tmp/Run-1/pg",
        5432,
        "conch_fresh",
        "postgres",
        "",
    )
    assert services.redis_url_on_port("redis://:pw@127.0.0.1:6379/14", 40001) == "redis://127.0.0.1:40001/14"


def test_only_hosts_on_this_machine_are_replaced():
    assert services.is_local("postgres://postgres@127.0.0.1:5432/conch") is True
    assert services.is_local("postgres://postgres@localhost/conch") is True
    assert services.is_local("redis://[::1]:6379/0") is True
    assert services.is_local("postgres://postgres@%2Fvar%2Frun%2Fpostgresql/conch") is True
    assert services.is_local("postgres://postgres@db.internal:5432/conch") is False
    assert services.is_local("redis://10.0.0.5:6379/0") is False


def test_services_that_answer_are_used_as_configured(tmp_path):
    # given something listening on both configured ports
    with socket.socket() as database, socket.socket() as broker:
        for sock in (database, broker):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        database_url = f"postgres://postgres@127.0.0.1:{database.getsockname()[1]}/conch_fresh"
        broker_url = f"redis://127.0.0.1:{broker.getsockname()[1]}/2"
        # when a command runs under the wrapper
        wrapper = _wrapper(_child("0", mode="report"), database_url, broker_url, tmp_path)
        out, err = wrapper.communicate(timeout=60)
    # then it saw the configured URLs and nothing was started
    assert wrapper.returncode == 0, err
    found = json.loads(out)
    assert (found["database_url"], found["broker_url"]) == (database_url, broker_url)
    assert "started a throwaway" not in err
    assert not (tmp_path / "services").exists()


def test_nothing_answering_starts_throwaways_then_stops_them_and_keeps_the_exit_status(tmp_path, closed_ports):
    # given nothing answering on the configured ports
    database_url = f"postgres://postgres@127.0.0.1:{closed_ports[0]}/conch_fresh"
    broker_url = f"redis://127.0.0.1:{closed_ports[1]}/2"
    # when a command that uses both and then fails runs under the wrapper
    wrapper = _wrapper(_child("3"), database_url, broker_url, tmp_path)
    out, err = wrapper.communicate(timeout=120)
    # then it got a working PostgreSQL on a socket in the scratch folder and a Redis on loopback
    assert wrapper.returncode == 3, err
    found = json.loads(out)
    # (in the scratch folder; pgserver puts the socket of a data folder whose path is too long for one in /tmp)
    socket_folder = dj_database_url.parse(found["database_url"])["HOST"]
    assert socket_folder.startswith((str(tmp_path / "services" / "run-"), "/tmp/runtime-"))
    assert found["broker_url"].startswith("redis://127.0.0.1:") and found["broker_url"].endswith("/2")
    assert (found["database_answer"], found["broker_answer"]) == (42, "yes")
    # and both servers are gone, with their folder
    assert _servers_alive(found["pids"], tmp_path) == []
    assert list((tmp_path / "services").iterdir()) == []
    assert services.answers(found["broker_url"], 6379) is False


def test_sigterm_stops_the_command_then_the_throwaways(tmp_path, closed_ports):
    # given a command that holds both throwaways open
    database_url = f"postgres://postgres@127.0.0.1:{closed_ports[0]}/conch_fresh"
    broker_url = f"redis://127.0.0.1:{closed_ports[1]}/2"
    wrapper = _wrapper(_child("wait"), database_url, broker_url, tmp_path)
    found = json.loads(wrapper.stdout.readline())
    # when the wrapper gets SIGTERM (make passes a CI timeout's SIGTERM on to it)
    wrapper.send_signal(signal.SIGTERM)
    _, err = wrapper.communicate(timeout=120)
    # then the command was interrupted by SIGINT (a KeyboardInterrupt, so pytest tears down), its status passed on
    # as a shell gives it (128 + 2), and nothing is left
    assert "KeyboardInterrupt" in err
    assert wrapper.returncode == 128 + signal.SIGINT
    assert _servers_alive(found["pids"], tmp_path) == []
    assert list((tmp_path / "services").iterdir()) == []


def test_the_next_run_stops_what_a_killed_run_left(tmp_path, closed_ports):
    # given a run whose wrapper and command were SIGKILLed while both throwaways ran
    database_url = f"postgres://postgres@127.0.0.1:{closed_ports[0]}/conch_fresh"
    broker_url = f"redis://127.0.0.1:{closed_ports[1]}/2"
    killed = _wrapper(_child("wait"), database_url, broker_url, tmp_path, start_new_session=True)
    found = json.loads(killed.stdout.readline())
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=60)
    assert all(psutil.pid_exists(pid) for pid in found["pids"])
    # when the next run needs throwaways
    wrapper = _wrapper(_child("0", mode="report"), database_url, broker_url, tmp_path)
    _, err = wrapper.communicate(timeout=120)
    # then the old servers were stopped and every run folder is gone
    assert wrapper.returncode == 0, err
    assert f"run-{killed.pid}" in err
    assert _servers_alive(found["pids"], tmp_path) == []
    assert list((tmp_path / "services").iterdir()) == []
