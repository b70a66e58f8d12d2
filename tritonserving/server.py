"""Adapter for local `tritonserver` processes (the embedded runtime of DESIGN.md, "What runs on this machine").

Owns: finding the Triton 2.51 installation inside the `nvidia-pytriton` wheel, building the backend directory our
servers use (Triton's Python backend plus our Python-based backends from `triton_backends/`), starting a server
detached from Conch under a watcher parent that records how it ends (`exit_watch`, `exit_status`), waiting for it,
telling whether it still runs, stopping it, and finding servers left running by an earlier Conch process (by id
prefix and, to tell installations apart, by backend directory). It talks to the operating system (processes, ports,
files) and to Triton's health endpoints (`/v2/health/ready`, KServe v2 "Health" API). Inference and model loading
live in `tritonserving.client`.

Every server is locked down: its repository, config, shared-memory, statistics, trace and logging endpoints answer
only to requests carrying its key (`tritonserving.access`, Triton "Limit Endpoint Access"), and its environment
(which its Python backend stubs inherit) is built from an allow-list, never copied from Conch's, so no database
URL, broker URL or Django secret reaches a process that runs uploaded models.

Errors: `TritonNotInstalled` (the wheel or a part of it is missing), `TritonStartError` (the process exited or
never became ready; carries the last log lines), `TritonStopError` (a process survived SIGKILL). All subclass
`conch.errors.Unavailable` or `InvalidInput`; psutil and OS exceptions do not escape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from conch.errors import InvalidInput, Unavailable
from tritonserving.access import api_key_from_flags, restricted_api_flags
from tritonserving.client import TritonClient
from tritonserving.metrics import LATENCY_SUMMARIES

# Our Python-based backends (`<name>/model.py`), copied into every backend directory we build.
BACKENDS_SOURCE = Path(__file__).resolve().parent.parent / "triton_backends"

BINARY_NAME = "tritonserver"
LOG_TAIL_LINES = 40
# Two process start times (psutil, seconds since the epoch) closer than this are the same process.
_CREATE_TIME_TOLERANCE_S = 0.01

# The watcher (`exit_watch`, the server's parent) of each server this Conch process started, by the server's pid:
# polling a watcher reaps it once its server has ended.
_CHILDREN: dict[int, subprocess.Popen] = {}
_EXIT_WATCH = Path(__file__).resolve().parent / "exit_watch.py"
# The line `exit_watch` appends to a server's log when the server ends, and the one Triton logs when a signal asks
# it to shut down (it then exits with code 0).
_ENDED = re.compile(
    r"# conch: tritonserver pid (\d+) (?:was stopped by signal .+? \((\d+)\)|exited with code (-?\d+))$"
)
_SIGNAL_RECEIVED = re.compile(r"^Signal \((\d+)\) received\.")


class TritonNotInstalled(Unavailable):
    """The `tritonserver` binary or a part of the Python backend is missing from this environment."""


class TritonStartError(Unavailable):
    """A server exited during start-up or was not ready in time; `log_lines` holds the end of its log."""

    def __init__(self, detail: str, *, log_lines: list[str]) -> None:
        tail = "\n".join(log_lines)
        super().__init__(f"{detail}\nLast lines of the Triton log:\n{tail}" if log_lines else detail)
        self.log_lines = log_lines


class TritonStopError(Unavailable):
    """A server (or one of its backend stubs) survived SIGTERM and SIGKILL."""


@dataclass(frozen=True)
class TritonInstallation:
    """Where the parts of the Triton installation shipped in the `nvidia-pytriton` wheel lie.

    `python_stub` is the Python backend stub built for `python_version` ("3.11"): it must match the interpreter
    whose packages (numpy, onnxruntime) the backends import.
    """

    binary: Path
    libs_dir: Path
    python_backend_library: Path
    python_backend_utils: Path
    python_stub: Path
    python_version: str


@dataclass(frozen=True)
class ServerProcess:
    """A running `tritonserver`, identified by `pid` plus `create_time` (psutil, seconds since the epoch).

    The pair guards against PID reuse: store both, pass both to `is_alive` / `stop_server`. `log_path` is None
    only for a server found by `find_servers` whose stdout cannot be read back. `api_key` is the key its restricted
    endpoints answer to (`tritonserving.access`); None for a found server started without one (by an older Conch).
    """

    server_id: str
    pid: int
    create_time: float
    http_port: int
    grpc_port: int
    metrics_port: int
    bind_address: str
    repository: str
    log_path: Path | None
    api_key: str | None = dataclasses.field(default=None, repr=False)

    @property
    def host(self) -> str:
        """Address a client on this machine reaches the server on (loopback when bound to all interfaces)."""
        return "127.0.0.1" if self.bind_address in {"", "0.0.0.0", "::"} else self.bind_address

    @property
    def http_url(self) -> str:
        """Base URL of the KServe v2 HTTP API, e.g. `http://127.0.0.1:8000`."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """`host:port` of the gRPC API."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus text endpoint, e.g. `http://127.0.0.1:8002/metrics`."""
        return f"http://{self.host}:{self.metrics_port}/metrics"


def locate_installation(python_version: str | None = None) -> TritonInstallation:
    """Find the `tritonserver` binary, its libraries and the Python backend in the `nvidia-pytriton` wheel.

    `python_version` ("3.11") picks the backend stub; it defaults to the running interpreter's version.
    Raises `TritonNotInstalled` naming the missing part and how to get it.
    """
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotInstalled(
            "the nvidia-pytriton package is not installed; install the pinned requirements "
            "(`pip install -r requirements.txt`) to get the tritonserver binary"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    server_dir = package_dir / "tritonserver"
    installation = TritonInstallation(
        binary=server_dir / "bin" / BINARY_NAME,
        libs_dir=package_dir.parent / "nvidia_pytriton.libs",
        python_backend_library=server_dir / "backends" / "python" / "libtriton_python.so",
        python_backend_utils=server_dir / "backends" / "python" / "triton_python_backend_utils.py",
        python_stub=server_dir / "python_backend_stubs" / version / "triton_python_backend_stub",
        python_version=version,
    )
    for part in (
        installation.binary,
        installation.python_backend_library,
        installation.python_backend_utils,
        installation.python_stub,
    ):
        if not part.is_file():
            raise TritonNotInstalled(
                f"{part} is missing from the nvidia-pytriton installation (Python {version}); "
                "reinstall the pinned nvidia-pytriton wheel"
            )
    if not installation.libs_dir.is_dir():
        raise TritonNotInstalled(
            f"{installation.libs_dir} is missing; tritonserver cannot load its shared libraries without it; "
            "reinstall the pinned nvidia-pytriton wheel"
        )
    return installation


def _sync_file(source: Path, target: Path) -> bool:
    """Make `target` a byte-for-byte copy of `source` (mode included); return whether it had to be written."""
    if target.is_file() and target.stat().st_size == source.stat().st_size:
        with source.open("rb") as a, target.open("rb") as b:
            if a.read() == b.read():
                return False
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target then rename: a running server keeps its mapping of the old .so/stub intact.
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(handle)
    try:
        shutil.copy2(source, temporary)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def ensure_backend_directory(root: Path, *, installation: TritonInstallation | None = None) -> Path:
    """Build (idempotently) the folder passed to `tritonserver --backend-directory`; return it.

    Layout (Triton docs, Python backend, "Python-based Backends"):
    `<root>/python/{libtriton_python.so, triton_python_backend_stub, triton_python_backend_utils.py}` and
    `<root>/<name>/model.py` for each of our backends in `triton_backends/` (`onnxruntime`, ...). Files are only
    rewritten when their bytes differ, atomically; a server picks up a refreshed `model.py` on the next model load.
    Raises `TritonNotInstalled` when the wheel is missing.
    """
    installation = installation or locate_installation()
    root = Path(root).resolve()
    python_dir = root / "python"
    _sync_file(installation.python_backend_library, python_dir / "libtriton_python.so")
    _sync_file(installation.python_stub, python_dir / "triton_python_backend_stub")
    _sync_file(installation.python_backend_utils, python_dir / "triton_python_backend_utils.py")
    for backend_file in sorted(BACKENDS_SOURCE.glob("*/model.py")):
        _sync_file(backend_file, root / backend_file.parent.name / "model.py")
    return root


#: The folder, beside an installation's backend directory, holding the backend directories that add custom backends.
BACKEND_SETS = "backend-sets"


def ensure_backend_set(
    root: Path, custom: Mapping[str, tuple[str, Path]], *, installation: TritonInstallation | None = None
) -> Path:
    """Build (idempotently) a backend directory with Triton's and Conch's backends (`ensure_backend_directory`) and
    the custom backends `custom` (name -> (identity, local folder holding its files: `libtriton_<name>.so` and its
    libraries, or a Python-based backend's `model.py`)); return it.

    The directory is `<root>/backend-sets/<digest>/`, `root` being the folder whose `backends/` is the
    installation's own: one per set of (name, identity) pairs, so servers that load different versions of a
    backend, or different teams' backends of the same name, never share a folder (Triton loads a backend once per
    server, by name, from `<backend-dir>/<name>/`). `find_servers` takes servers on such a directory for this
    installation's. Raises `TritonNotInstalled`; `InvalidInput` (field "backend") for a name of Conch's own
    backends.
    """
    digest = hashlib.sha256(json.dumps(sorted((n, i) for n, (i, _) in custom.items())).encode()).hexdigest()[:16]
    target = Path(root).resolve() / BACKEND_SETS / digest
    ensure_backend_directory(target, installation=installation)
    own = {"python", *(path.parent.name for path in BACKENDS_SOURCE.glob("*/model.py"))}
    for name, (_, folder) in sorted(custom.items()):
        if name in own:
            raise InvalidInput(f"backend {name!r} is one of Conch's own backends", field="backend")
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                _sync_file(path, target / name / path.relative_to(folder))
    return target


def allocate_ports(count: int, *, host: str = "127.0.0.1") -> tuple[int, ...]:
    """Return `count` distinct TCP ports on `host` that were free a moment ago.

    The sockets are held until all ports are chosen, so the ports differ; another process may still take one
    before Triton binds it (start-up then fails with "address already in use" in the log).
    Raises `InvalidInput` when `count` < 1, `Unavailable` when the OS refuses.
    """
    if count < 1:
        raise InvalidInput(f"count must be at least 1, got {count}", field="count")
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return tuple(sock.getsockname()[1] for sock in sockets)
    except OSError as exc:
        raise Unavailable(f"cannot reserve {count} TCP ports on {host}: {exc}") from None
    finally:
        for sock in sockets:
            sock.close()


#: Variables a server inherits from Conch's environment when set there: what any process needs (locale, home, temp
#: folder, time zone) and which GPUs it may use. Nothing that can hold a secret.
INHERITED_VARIABLES: tuple[str, ...] = (
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
#: Variables a caller may add (`start_server(env=...)`): the inherited ones above and the credentials Triton's
#: cloud storage clients read (Triton "Model Repository", "Cloud Storage with Environment variables": `AWS_*` for
#: S3, `GOOGLE_APPLICATION_CREDENTIALS` for GCS, `AZURE_STORAGE_*` for Azure, `TRITON_CLOUD_CREDENTIAL_PATH`).
_EXTRA_VARIABLE = re.compile(
    r"AWS_[A-Z0-9_]+|AZURE_STORAGE_[A-Z0-9_]+|GOOGLE_APPLICATION_CREDENTIALS|TRITON_CLOUD_CREDENTIAL_PATH"
)


def server_environment(installation: TritonInstallation, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build the environment of a `tritonserver` (and so of its backend stubs) from an allow-list.

    PATH starts with this interpreter's `bin` folder: the Python backend stub finds the interpreter, and so the
    venv's numpy and onnxruntime, through PATH (DESIGN.md, "What runs on this machine"). LD_LIBRARY_PATH starts
    with the wheel's `nvidia_pytriton.libs`. `INHERITED_VARIABLES` come from Conch's environment when set; `extra`
    (e.g. the object store's `triton_environment()`) may set those and cloud storage credentials (`AWS_*`, ...).
    Everything else in Conch's environment (DATABASE_URL, DJANGO_SECRET_KEY, CELERY_BROKER_URL...) stays out.
    Raises `InvalidInput` (field `env`) naming an `extra` variable outside the allow-list.
    """
    env = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
    venv_bin = str(Path(sys.prefix) / "bin")
    inherited_path = os.environ.get("PATH") or os.defpath
    env["PATH"] = os.pathsep.join(part for part in (venv_bin, inherited_path) if part)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        part for part in (str(installation.libs_dir), os.environ.get("LD_LIBRARY_PATH", "")) if part
    )
    for name, value in (extra or {}).items():
        name = str(name)
        if name not in INHERITED_VARIABLES and not _EXTRA_VARIABLE.fullmatch(name):
            raise InvalidInput(
                f"environment variable {name} may not be passed to tritonserver; allowed are "
                f"{', '.join(INHERITED_VARIABLES)} and cloud storage credentials (AWS_*, AZURE_STORAGE_*, "
                "GOOGLE_APPLICATION_CREDENTIALS, TRITON_CLOUD_CREDENTIAL_PATH)",
                field="env",
            )
        env[name] = str(value)
    return env


def start_server(
    *,
    server_id: str,
    repository: str | Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_path: Path,
    backend_root: Path,
    api_key: str,
    env: Mapping[str, str] | None = None,
    bind_address: str = "127.0.0.1",
    exit_timeout_s: int = 5,
    installation: TritonInstallation | None = None,
) -> ServerProcess:
    """Start `tritonserver` detached from Conch (own session) and return at once; then call `wait_until_ready`.

    `repository` is a local folder or an `s3://http://host:port/bucket/prefix` URL (Triton docs, "Model
    Repository", "Cloud Storage with Environment variables"); for S3 pass `AWS_ACCESS_KEY_ID`,
    `AWS_SECRET_ACCESS_KEY` and `AWS_DEFAULT_REGION` in `env`. The server's environment is `server_environment`
    (an allow-list plus `env`), never a copy of Conch's. Its repository, config, shared-memory, statistics, trace
    and logging endpoints answer only to requests carrying `api_key` (`tritonserving.access`; derive it with
    `derive_api_key`, send it with `TritonClient(api_key=...)`). Models load on request only
    (`--model-control-mode=explicit`, "Model Management"). `--id=<server_id>` marks the process so that
    `find_servers` can adopt it after a Conch restart. stdout and stderr are appended to `log_path`.
    `backend_root` must have been built by `ensure_backend_directory`. On SIGTERM the server waits up to
    `exit_timeout_s` seconds for in-flight requests and open client connections (`--exit-timeout-secs`; Triton's
    own default of 30 s would outlast `stop_server`'s patience whenever a client keeps a connection alive).
    Raises `InvalidInput` (bad id, ports, repository, backend folder, api key, env variable), `TritonNotInstalled`,
    `TritonStartError` (the process could not be spawned or died at once).
    """
    if not server_id or any(ch.isspace() for ch in server_id):
        raise InvalidInput("server id must be non-empty and contain no whitespace", field="server_id")
    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    for field, port in ports.items():
        if not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidInput(f"{field} must be a TCP port number (1-65535), got {port!r}", field=field)
    if not isinstance(exit_timeout_s, int) or exit_timeout_s < 0:
        message = f"exit_timeout_s must be a whole number >= 0, got {exit_timeout_s!r}"
        raise InvalidInput(message, field="exit_timeout_s")
    if len(set(ports.values())) != len(ports):
        raise InvalidInput(f"the HTTP, gRPC and metrics ports must differ, got {sorted(ports.values())}", field="ports")
    repository_text = str(repository)
    if not repository_text.startswith("s3://"):
        local = Path(repository_text).resolve()
        if not local.is_dir():
            raise InvalidInput(f"model repository folder {local} does not exist", field="repository")
        repository_text = str(local)
    backend_root = Path(backend_root).resolve()
    if not (backend_root / "python" / "libtriton_python.so").is_file():
        raise InvalidInput(
            f"{backend_root} is not a backend directory; build it with ensure_backend_directory()",
            field="backend_root",
        )
    restriction = restricted_api_flags(api_key)
    installation = installation or locate_installation()
    environment = server_environment(installation, env)
    log_path = Path(log_path).resolve()
    log_path.parent.mkdir(parents=True, exist_ok=True)

    command = [
        str(installation.binary),
        f"--id={server_id}",
        f"--model-repository={repository_text}",
        "--model-control-mode=explicit",
        # Conch writes complete configurations; with auto-complete on, Triton's C++ onnxruntime backend would raise
        # an explicit `max_batch_size: 0` back to its default for a model whose axis 0 is dynamic. It also spares
        # the Python backend one extra stub start per model load (a load takes ~0.2 s here instead of ~1.4 s).
        "--disable-auto-complete-config",
        f"--backend-directory={backend_root}",
        f"--http-address={bind_address}",
        f"--http-port={http_port}",
        f"--grpc-address={bind_address}",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        f"--metrics-address={bind_address}",
        f"--metrics-port={metrics_port}",
        # Request latency quantiles (p50, p99) per model as Prometheus summaries (`nv_inference_request_summary_us`);
        # off by default ("Metrics" doc, "Summaries").
        f"--metrics-config={LATENCY_SUMMARIES}",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
    with log_path.open("ab") as log:
        # Users read this log: name the restriction flags, not the key they carry.
        restricted = " ".join(flag.split("=", 1)[0] + "=<restricted>" for flag in restriction)
        log.write(f"# conch: starting {' '.join(command)} {restricted}\n".encode())
        log.flush()
        read_fd, write_fd = os.pipe()
        try:
            # The server's parent is a watcher that records how it ends (`exit_watch`, `exit_status`); the server
            # itself leads a session of its own, as before.
            watcher = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_EXIT_WATCH), str(write_fd), *command, *restriction],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                # A fixed, existing cwd: the server and its backend stubs inherit it, and Conch's own cwd may go away.
                cwd=backend_root,
                start_new_session=True,
                close_fds=True,
                pass_fds=(write_fd,),
            )
        except OSError as exc:
            os.close(read_fd)
            raise TritonStartError(f"cannot run {sys.executable}: {exc}", log_lines=[]) from None
        finally:
            os.close(write_fd)
    report = _read_report(read_fd, timeout_s=30.0)
    if not report.isdigit():
        watcher.poll()
        detail = report.removeprefix("error ") or f"the watcher exited (code {watcher.returncode})"
        raise TritonStartError(f"cannot run {installation.binary}: {detail}", log_lines=tail_log(log_path))
    pid = int(report)
    _CHILDREN[pid] = watcher
    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        raise TritonStartError(
            f"tritonserver '{server_id}' exited right after start ({_ending(log_path, pid)})",
            log_lines=tail_log(log_path),
        ) from None
    return ServerProcess(
        server_id=server_id,
        pid=pid,
        create_time=create_time,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        bind_address=bind_address,
        repository=repository_text,
        log_path=log_path,
        api_key=api_key,
    )


def _probe_ready(http_url: str, timeout_s: float) -> bool:
    with TritonClient(http_url, timeout_s=timeout_s) as client:
        return client.is_ready()


def wait_until_ready(process: ServerProcess, *, timeout_s: float, poll_interval_s: float = 0.05) -> None:
    """Poll `GET /v2/health/ready` (KServe v2 "Health") until it answers 200 or `timeout_s` seconds pass.

    Fails fast when the process exits. Raises `TritonStartError` carrying the last log lines in both cases; the
    process is left as it is (call `stop_server` to clean up after a timeout). A server with nothing to load is
    ready about 0.1 s after its start here, hence the short default poll (a probe is one local HTTP request).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if not is_alive(process.pid, process.create_time):
            ended = wait_for_exit_status(process, timeout_s=1.0)
            if ended is None:
                how = "exited during start-up"
            elif ended.returncode > 0:
                how = f"exited during start-up with code {ended.returncode}"
            else:
                how = f"{ended.description} during start-up"
            raise TritonStartError(f"tritonserver '{process.server_id}' {how}", log_lines=_tail_or_empty(process))
        remaining = deadline - time.monotonic()
        if _probe_ready(process.http_url, timeout_s=max(0.05, min(1.0, remaining))):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TritonStartError(
                f"tritonserver '{process.server_id}' was not ready on {process.http_url} after {timeout_s:g} s",
                log_lines=_tail_or_empty(process),
            )
        time.sleep(min(poll_interval_s, remaining))


def _tail_or_empty(process: ServerProcess) -> list[str]:
    return tail_log(process.log_path) if process.log_path is not None else []


def _read_report(read_fd: int, *, timeout_s: float) -> str:
    """The watcher's one line on the pipe `read_fd` (the server's pid, or `error <reason>`); "" when it wrote
    nothing before closing the pipe or within `timeout_s` seconds. Closes `read_fd`."""
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([read_fd], [], [], remaining)[0]:
                break
            chunk = os.read(read_fd, 256)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    return data.decode(errors="replace").strip()


@dataclass(frozen=True)
class ServerExit:
    """How a server ended, as its watcher saw it: `returncode` is Popen's (negative: killed by that signal's
    number); `signal_received` is the signal Triton logged it shut down on ("Signal (15) received.") when it then
    exited by itself, else None."""

    pid: int
    returncode: int
    signal_received: int | None = None

    @property
    def description(self) -> str:
        """E.g. "was stopped by signal SIGKILL (9)", "shut down on signal SIGTERM (15)", "exited with code 1"."""
        if self.returncode < 0:
            return f"was stopped by signal {_signal_name(-self.returncode)}"
        if self.signal_received is not None and self.returncode == 0:
            return f"shut down on signal {_signal_name(self.signal_received)}"
        return f"exited with code {self.returncode}"


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return f"{number}"


def exit_status(process: ServerProcess) -> ServerExit | None:
    """How `process` ended, read from the line its watcher appended to its log (`tritonserving.exit_watch`).

    None while it runs, when it has no log, or when nothing recorded its end: a server started by a Conch older
    than the watcher, or whose watcher was killed. Reads only the end of the log. Never raises.
    """
    if process.log_path is None:
        return None
    lines = tail_log(process.log_path, lines=200)
    for index in range(len(lines) - 1, -1, -1):
        match = _ENDED.match(lines[index])
        if match is None or int(match.group(1)) != process.pid:
            continue
        returncode = -int(match.group(2)) if match.group(2) is not None else int(match.group(3))
        received = None
        for line in reversed(lines[:index]):
            if line.startswith("# conch: starting "):
                break  # what came before is an earlier server's
            signalled = _SIGNAL_RECEIVED.match(line)
            if signalled is not None:
                received = int(signalled.group(1))
                break
        return ServerExit(pid=process.pid, returncode=returncode, signal_received=received)
    return None


def wait_for_exit_status(process: ServerProcess, *, timeout_s: float) -> ServerExit | None:
    """`exit_status`, waiting up to `timeout_s` seconds for it while the watcher may still be writing it (the
    server is gone a moment before its watcher has reaped it and written the line). None when nothing came."""
    if process.log_path is None:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        ended = exit_status(process)
        if ended is not None or time.monotonic() >= deadline:
            return ended
        time.sleep(0.02)


def _ending(log_path: Path, pid: int) -> str:
    """How server `pid` that logged to `log_path` ended, for a message ("exited with code 1")."""
    process = ServerProcess(
        server_id="",
        pid=pid,
        create_time=0.0,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        bind_address="",
        repository="",
        log_path=log_path,
    )
    ended = wait_for_exit_status(process, timeout_s=1.0)
    return ended.description if ended is not None else "its exit status was not recorded"


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None:
        child.poll()
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its parent (or init) reaps it
        pass


def _forget(pid: int) -> None:
    """Drop the watcher of server `pid`, which has ended; reap the watcher once it has written the server's end."""
    watcher = _CHILDREN.pop(pid, None)
    if watcher is not None:
        try:
            watcher.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass  # subprocess reaps it later (its list of unfinished children)


def _matches(proc: psutil.Process, create_time: float) -> bool:
    """Whether `proc` is the process that started at `create_time` and has not exited (zombies have)."""
    try:
        if abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(proc.pid)
            return False
        return True
    except psutil.NoSuchProcess:  # ZombieProcess included
        _reap(proc.pid)
        return False
    except psutil.AccessDenied:
        return True  # it exists; we just may not look inside


def is_alive(pid: int, create_time: float) -> bool:
    """Whether the process `pid` that started at `create_time` still runs.

    A different process that reuses the pid is not ours (False); a zombie counts as dead and, when it is our own
    child, is reaped here. Never raises.
    """
    child = _CHILDREN.get(pid)
    if child is not None:
        child.poll()  # reaps our own exited child, so psutil below sees it gone
    try:
        return _matches(psutil.Process(pid), create_time)
    except psutil.Error:
        return False


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, or held by a tracer): it exists but runs no code, so it cannot
    answer a request however long one waits. False when there is no such process."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists on this host (any process: the pid may have been reused)."""
    return psutil.pid_exists(pid)


def _still_running(procs: list[tuple[psutil.Process, float]]) -> list[tuple[psutil.Process, float]]:
    return [(proc, started) for proc, started in procs if is_alive(proc.pid, started)]


def _wait_for_exit(procs: list[tuple[psutil.Process, float]], timeout_s: float) -> list[tuple[psutil.Process, float]]:
    deadline = time.monotonic() + timeout_s
    alive = _still_running(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _still_running(alive)
    return alive


def _signal_all(pid: int, procs: list[tuple[psutil.Process, float]], signum: int) -> None:
    try:
        group = os.getpgid(pid)
    except OSError:
        group = None
    # Signal the whole group (server + backend stubs) only when the server leads its own group, as start_server
    # makes it; never our own group.
    if group == pid and group != os.getpgrp():
        try:
            os.killpg(group, signum)
        except OSError:
            pass
    for proc, _ in procs:
        try:
            proc.send_signal(signum)
        except psutil.Error:
            pass


def stop_server(pid: int, create_time: float, *, timeout_s: float = 10.0) -> None:
    """Stop a server and its backend stubs: SIGTERM, wait up to `timeout_s` seconds, then SIGKILL.

    A no-op when the process is already gone or the pid now belongs to another process. On return every process
    of the server has exited, so its ports are free. Raises `TritonStopError` if one survives SIGKILL for 5 s.
    """
    try:
        server = psutil.Process(pid)
    except psutil.Error:
        _forget(pid)
        return
    if not _matches(server, create_time):
        _forget(pid)
        return
    procs = [(server, create_time)]
    try:
        for stub in server.children(recursive=True):
            try:
                procs.append((stub, stub.create_time()))
            except psutil.Error:
                pass
    except psutil.Error:
        pass

    _signal_all(pid, procs, signal.SIGTERM)
    alive = _wait_for_exit(procs, timeout_s)
    if alive:
        _signal_all(pid, alive, signal.SIGKILL)
        alive = _wait_for_exit(alive, 5.0)
    if not alive:
        _forget(pid)
        return
    raise TritonStopError(f"processes {[proc.pid for proc, _ in alive]} of tritonserver {pid} survived SIGKILL")


def _parse_flags(arguments: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument.startswith("--"):
            if "=" in argument:
                key, value = argument.split("=", 1)
            elif index + 1 < len(arguments) and not arguments[index + 1].startswith("--"):
                key, value = argument, arguments[index + 1]
                index += 1
            else:
                key, value = argument, ""
            flags[key] = value
        index += 1
    return flags


def _stdout_path(pid: int) -> Path | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    return Path(target) if target.startswith("/") else None


def find_servers(server_id_prefix: str, *, backend_root: Path | None = None) -> list[ServerProcess]:
    """List running `tritonserver` processes whose `--id` starts with `server_id_prefix`, oldest first.

    Used after a Conch restart to adopt or stop servers an earlier process started. With `backend_root`, only
    servers started with that backend directory (`--backend-directory`) are listed: each installation builds its
    own under its own data folder (`ensure_backend_directory`), so that folder, not a name anyone may choose,
    proves which installation started a server (a backend directory with custom backends, `ensure_backend_set`,
    lies beside it, under `backend-sets/`, and counts too). Pass it before stopping what is found. Ports, bind address,
    repository and API key come from the command line (Triton's defaults 8000/8001/8002 when a flag is absent);
    `log_path` from the process's stdout when readable. Raises `InvalidInput` for an empty prefix (it would match
    servers Conch does not own).
    """
    if not server_id_prefix:
        raise InvalidInput("a server id prefix is required", field="server_id_prefix")
    wanted_backends = str(Path(backend_root).resolve()) if backend_root is not None else None
    found: list[ServerProcess] = []
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        try:
            info = proc.info
            cmdline = info.get("cmdline") or []
            if not cmdline or Path(cmdline[0]).name != BINARY_NAME or info.get("status") == psutil.STATUS_ZOMBIE:
                continue
            flags = _parse_flags(cmdline[1:])
            server_id = flags.get("--id", "")
            if not server_id.startswith(server_id_prefix):
                continue
            given = flags.get("--backend-directory", "")
            if (
                wanted_backends is not None
                and given != wanted_backends
                and str(Path(given).parent) != str(Path(wanted_backends).parent / BACKEND_SETS)
            ):
                continue
            found.append(
                ServerProcess(
                    server_id=server_id,
                    pid=proc.pid,
                    create_time=info["create_time"],
                    http_port=int(flags.get("--http-port") or 8000),
                    grpc_port=int(flags.get("--grpc-port") or 8001),
                    metrics_port=int(flags.get("--metrics-port") or 8002),
                    bind_address=flags.get("--http-address", "0.0.0.0"),
                    repository=flags.get("--model-repository", ""),
                    log_path=_stdout_path(proc.pid),
                    api_key=api_key_from_flags(flags),
                )
            )
        except (psutil.Error, ValueError):
            continue
    return sorted(found, key=lambda server: server.create_time)


def tail_log(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """Return the last `lines` lines of a log file (without line ends); [] when the file does not exist.

    Reads backwards in blocks, so a large log costs only its tail. Undecodable bytes become U+FFFD.
    """
    if lines <= 0:
        return []
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            position = handle.tell()
            data = b""
            while position > 0 and data.count(b"\n") <= lines:
                step = min(8192, position)
                position -= step
                handle.seek(position)
                data = handle.read(step) + data
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]
