"""Triton servers that load one model and run smoke inferences on it (the build's verify step).

Two kinds, behind one entry point (`run_smoke_inference`):

- `ScratchServer`: a throwaway `tritonserver` per verification. It starts on the build's own repository (a folder or
  `s3://`), loads the model, runs the inferences and stops. Simple, but every build pays a server start and stop.
- `VerifyServer`: one warm, long-lived server per process (`get_verify_server`), kept between builds. Each
  verification copies the model directory into the server's own scratch repository under a name used once
  (`<model>--<label>-<n>`), loads it with its `config.pbtxt` sent as the load's `config` parameter (Triton "Model
  Repository Extension" -> "Load"), infers, and asks for the unload; the unload finishes (about 2 s for a Python
  backend stub on this machine) and the copy is deleted in a background thread, off the build's path. A server that
  misbehaves (exited, does not answer, could not be reached during a load or an inference, or a model that will not
  unload) is stopped and replaced by a fresh one, and the verification is tried once more on it.

Talks to a `tritonserver` it starts itself (`tritonserving.server`) over the KServe v2 HTTP API, through the
control client (`tritonserving.client.TritonClient`) only, smoke inferences included: they are Conch's own
requests on a server no user reaches, not a user's data path (that is `tritonserving.relay`), and the control
client's synchronous `infer_numpy` is what a build step running on a Celery worker needs. No Django: the caller
passes the folders, ids and timeouts it wants. Every server here is
locked down like every server Conch starts (`tritonserving.access`): only requests carrying its key (random per
server; only the owning process knows it) may load or unload models, and it gets no copy of Conch's environment. The
warm server gets no storage credentials at all: it reads only its local scratch repository. Like every
server Conch starts (`tritonserving.server.start_server`), both take model configurations as given
(`--disable-auto-complete-config`), which keeps a Python-backend model load at about 0.2 s here.

Process rules of the warm server: it belongs to the process that started it (its id is
`<server_id_prefix><owner pid>-<hex>`, so a periodic sweep can stop servers whose owner is gone); a forked child
never reuses its parent's server object (`os.register_at_fork`, and a pid check); `stop_verify_server` (also run
at interpreter exit) stops it.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conch.errors import ConchError, InvalidInput, Unavailable
from tritonserving import server as triton_server
from tritonserving.client import (
    ModelLoadError,
    TritonAccessDenied,
    TritonClient,
    TritonModelNotFound,
    TritonRequestError,
    TritonUnavailable,
)
from tritonserving.config import config_from_pbtxt, config_to_json

__all__ = [
    "ScratchServer",
    "VerifyServer",
    "VerifyServerSettings",
    "current_verify_server",
    "get_verify_server",
    "run_smoke_inference",
    "stop_verify_server",
    "warm_up_verify_server",
]

logger = logging.getLogger(__name__)

#: Seconds a health check of the warm server may take before it counts as not answering.
HEALTH_TIMEOUT_S = 5.0
#: Seconds a server being replaced because it misbehaves gets to exit on SIGTERM before SIGKILL.
MISBEHAVING_STOP_GRACE_S = 2.0
#: Lines of the Triton log shown with a failed load.
LOAD_LOG_LINES = 15
#: Model states (repository index) that mean a model still occupies the server.
_BUSY_STATES = frozenset({"LOADING", "READY", "UNLOADING"})
#: Folder (under `work_dir`) that holds one scratch repository per warm server.
_SCRATCH_FOLDER = "verify"


@dataclass(frozen=True)
class ScratchServer:
    """Where and how a throwaway scratch server runs.

    `work_dir` holds `backends/` and `logs/`; `server_id` tags the process (`--id`, see
    `tritonserving.server.find_servers`); `start_timeout_s` bounds the wait for readiness (seconds). `api_key` is
    the key of the server's restricted endpoints; None (the default) makes a random one for this run, which only
    this process knows: no one else needs to talk to a throwaway server.
    """

    work_dir: Path
    server_id: str
    bind_address: str = "127.0.0.1"
    start_timeout_s: float = 120.0
    api_key: str | None = dataclasses.field(default=None, repr=False)
    #: Custom backends the server must have: name -> (identity, local folder of its files); the server then runs on
    #: a backend directory of its own with them (`tritonserving.server.ensure_backend_set`).
    backends: Mapping[str, tuple[str, Path]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class VerifyServerSettings:
    """How the warm verify server of a process runs; a process keeps one server per settings value.

    `work_dir` holds `backends/`, `logs/<server id>.log` and `verify/<server id>/` (the scratch repository).
    `server_id_prefix` starts the server id; the server appends `<owner pid>-<12 hex digits>` (a new suffix per
    start). `start_timeout_s`: seconds to wait for readiness; `load_timeout_s`: seconds a load or an inference may
    take; `unload_timeout_s`: seconds an unload may take to finish before the server counts as stuck.
    """

    work_dir: Path
    server_id_prefix: str
    bind_address: str = "127.0.0.1"
    start_timeout_s: float = 120.0
    load_timeout_s: float = 300.0
    unload_timeout_s: float = 60.0


class _ServerMisbehaved(Exception):
    """The warm server, not the model, failed: replace it and try once more."""


def run_smoke_inference(
    *,
    scratch: ScratchServer | VerifyServer,
    repository: str,
    environment: Mapping[str, str],
    model_name: str,
    input_sets: Sequence[Mapping[str, np.ndarray]],
    log: Callable[[str], None],
    stage: Callable[[Path], None] | None = None,
    label: str = "",
) -> list[dict[str, np.ndarray]]:
    """Load `model_name` of `repository` into a Triton and run one inference per input set.

    `input_sets`: each a mapping input name -> array (shape and dtype as a Triton client sends them).
    Returns, per input set and in order, output name -> array.

    With a `ScratchServer`, a new server starts on `repository` (a folder or an `s3://` URL, read with
    `environment`) and is stopped before returning; `stage` and `label` are not used.
    With a `VerifyServer` (warm), the model directory is copied into the server's scratch repository: by
    `stage(target)` when given (it must write the directory's files, `config.pbtxt` and `<version>/...`, into the
    existing empty folder `target`), else from the local folder `<repository>/<model_name>`; `label` goes into the
    name the copy is loaded under; `environment` is not needed (the copy is local). See `VerifyServer.run`.

    Raises InvalidInput (field `file`) when Triton refuses to load the model or an inference fails (the
    message shows what was sent), Unavailable when no server starts (or the warm one failed twice).
    """
    if isinstance(scratch, VerifyServer):
        return scratch.run(
            model_name=model_name,
            repository=repository,
            stage=stage,
            input_sets=input_sets,
            log=log,
            label=label,
        )
    return _run_on_scratch_server(
        scratch=scratch,
        repository=repository,
        environment=environment,
        model_name=model_name,
        input_sets=input_sets,
        log=log,
    )


def _run_on_scratch_server(
    *,
    scratch: ScratchServer,
    repository: str,
    environment: Mapping[str, str],
    model_name: str,
    input_sets: Sequence[Mapping[str, np.ndarray]],
    log: Callable[[str], None],
) -> list[dict[str, np.ndarray]]:
    work_dir = Path(scratch.work_dir)
    (work_dir / "logs").mkdir(parents=True, exist_ok=True)
    backend_root = (
        triton_server.ensure_backend_set(work_dir, scratch.backends)
        if scratch.backends
        else triton_server.ensure_backend_directory(work_dir / "backends")
    )
    log_path = work_dir / "logs" / f"{scratch.server_id}.log"
    http_port, grpc_port, metrics_port = triton_server.allocate_ports(3)
    api_key = scratch.api_key or secrets.token_hex(32)
    process = triton_server.start_server(
        server_id=scratch.server_id,
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=log_path,
        backend_root=backend_root,
        env=dict(environment),
        api_key=api_key,
        bind_address=scratch.bind_address,
    )
    try:
        log(f"started tritonserver pid {process.pid} on {repository}")
        try:
            triton_server.wait_until_ready(process, timeout_s=scratch.start_timeout_s)
        except ConchError as exc:
            raise Unavailable(f"The verification Triton server did not start: {exc.detail}") from exc
        # Closed before the stop: Triton waits for open client connections (up to --exit-timeout-secs) on SIGTERM.
        with TritonClient(process.http_url, timeout_s=300, api_key=api_key) as client:
            try:
                client.load_model(model_name)
            except ModelLoadError as exc:
                for line in triton_server.tail_log(log_path, lines=LOAD_LOG_LINES):
                    log(f"triton: {line}")
                raise InvalidInput(f"Triton could not load the model: {exc.detail}", field="file") from exc
            log(f"Triton loaded model {model_name}")
            return [_infer(client, model_name, inputs) for inputs in input_sets]
    finally:
        triton_server.stop_server(process.pid, process.create_time)
        log_path.unlink(missing_ok=True)


def _infer(client: TritonClient, name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One smoke inference; a request Triton or the model rejects becomes InvalidInput naming what was sent."""
    try:
        return client.infer_numpy(name, dict(inputs))
    except TritonRequestError as exc:
        sent = ", ".join(f"{key} {array.dtype} {list(array.shape)}" for key, array in inputs.items())
        raise InvalidInput(f"The smoke inference failed in Triton: {exc.detail} (sent: {sent})", field="file") from exc


class VerifyServer:
    """A warm, locked-down `tritonserver` of this process that verifies one model after another.

    Created by `get_verify_server` (not started); `start()` or the first `run()` starts it. Its model control
    mode is explicit (Triton "Model Management"): nothing loads unless `run` asks. Calls are serialized by a lock,
    so a threaded caller verifies one model at a time. Not to be used from another process (`owner_pid`).
    """

    def __init__(self, settings: VerifyServerSettings) -> None:
        self.settings = settings
        self.owner_pid = os.getpid()
        self._lock = threading.RLock()
        self._process: triton_server.ServerProcess | None = None
        self._api_key: str | None = None
        self._scratch: Path | None = None
        # (server, why) when a model would not unload from that server: the next start() replaces it.
        self._broken: tuple[triton_server.ServerProcess, str] | None = None
        self._loads = itertools.count(1)
        self._cleanups: list[threading.Thread] = []

    # --- state -------------------------------------------------------------------------------------------------

    @property
    def process(self) -> triton_server.ServerProcess | None:
        """The running server (id, pid, ports, key), or None before the start and after a stop."""
        return self._process

    @property
    def scratch_repository(self) -> Path | None:
        """The folder the server's `--model-repository` points at, or None when it does not run."""
        return self._scratch

    def _problem(self, process: triton_server.ServerProcess) -> str | None:
        """Why `process` cannot take the next model (exited, marked broken, not live), or None when it can."""
        if not triton_server.is_alive(process.pid, process.create_time):
            return "it exited"
        broken = self._broken
        if broken is not None and broken[0] is process:
            return broken[1]
        if triton_server.is_stopped(process.pid):
            # A stopped process cannot answer; waiting on its TCP backlog would only delay the replacement.
            return f"it did not answer its liveness check within {HEALTH_TIMEOUT_S:g} s (the process is stopped)"
        if not _is_live(process):
            return f"it did not answer its liveness check within {HEALTH_TIMEOUT_S:g} s"
        return None

    # --- start and stop ----------------------------------------------------------------------------------------

    def start(self, log: Callable[[str], None] = lambda line: None) -> triton_server.ServerProcess:
        """Return the running server, started (or replaced) first when it is not there or does not answer.

        Raises Unavailable (the server did not start within `start_timeout_s`, or Triton is not installed),
        InvalidInput (bad settings).
        """
        with self._lock:
            process = self._process
            if process is not None:
                problem = self._problem(process)
                if problem is None:
                    return process
                log(f"verify server {process.server_id} (pid {process.pid}) is replaced: {problem}")
                self._discard(grace_s=MISBEHAVING_STOP_GRACE_S)
            return self._start(log)

    def _start(self, log: Callable[[str], None]) -> triton_server.ServerProcess:
        settings = self.settings
        if os.getpid() != self.owner_pid:
            raise RuntimeError("a VerifyServer belongs to the process that created it; use get_verify_server()")
        work_dir = Path(settings.work_dir)
        server_id = f"{settings.server_id_prefix}{self.owner_pid}-{secrets.token_hex(6)}"
        backend_root = triton_server.ensure_backend_directory(work_dir / "backends")
        _remove_abandoned_scratch(work_dir, settings.server_id_prefix)
        scratch = work_dir / _SCRATCH_FOLDER / server_id
        scratch.mkdir(parents=True)
        http_port, grpc_port, metrics_port = triton_server.allocate_ports(3)
        api_key = secrets.token_hex(32)
        started = time.monotonic()
        try:
            process = triton_server.start_server(
                server_id=server_id,
                repository=scratch,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                log_path=work_dir / "logs" / f"{server_id}.log",
                backend_root=backend_root,
                env={},
                api_key=api_key,
                bind_address=settings.bind_address,
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        # Recorded before the wait: whatever interrupts the wait, a later stop() still finds the process.
        self._process, self._api_key, self._scratch, self._broken = process, api_key, scratch, None
        try:
            triton_server.wait_until_ready(process, timeout_s=settings.start_timeout_s)
        except ConchError as exc:
            self._discard()
            raise Unavailable(f"The verification Triton server did not start: {exc.detail}") from exc
        log(f"started verify server {server_id} (pid {process.pid}) in {time.monotonic() - started:.2f} s")
        logger.info(
            "verify_server.started", extra={"server_id": server_id, "pid": process.pid, "owner_pid": self.owner_pid}
        )
        return process

    def stop(self) -> None:
        """Stop the server (with its backend stubs) and delete its scratch repository and log; a no-op when it
        does not run. Raises nothing: a server that survives SIGKILL is logged (`verify_server.stop_failed`)."""
        with self._lock:
            self._discard()

    def _discard(self, grace_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after `grace_s` seconds), delete its scratch repository and log."""
        process, scratch = self._process, self._scratch
        self._process, self._api_key, self._scratch, self._broken = None, None, None, None
        if process is None:
            return
        was_running = triton_server.is_alive(process.pid, process.create_time)
        try:
            triton_server.stop_server(process.pid, process.create_time, timeout_s=grace_s)
        except ConchError as exc:
            logger.warning("verify_server.stop_failed", extra={"server_id": process.server_id, "error": exc.detail})
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if process.log_path is not None:
            process.log_path.unlink(missing_ok=True)
        if was_running:
            logger.info("verify_server.stopped", extra={"server_id": process.server_id, "pid": process.pid})

    # --- verification ------------------------------------------------------------------------------------------

    def run(
        self,
        *,
        model_name: str,
        input_sets: Sequence[Mapping[str, np.ndarray]],
        log: Callable[[str], None],
        repository: str = "",
        stage: Callable[[Path], None] | None = None,
        label: str = "",
    ) -> list[dict[str, np.ndarray]]:
        """Verify one model: copy its directory in, load it, run one inference per input set, unload it.

        The copy comes from `stage(target)` or, without `stage`, from the local folder `<repository>/<model_name>`
        (see `run_smoke_inference`). It is loaded as `<model_name>--<label>-<n>` (n counts this server's loads) with
        its own `config.pbtxt` as the load's `config` parameter, only the name changed: the bytes and configuration
        verified are those of the repository. Returns, per input set and in order, output name -> array. The
        unload is asked for before returning; it finishes, and the copy is deleted, in a background thread.

        When the server, not the model, fails (it exited, does not answer, a load or an inference could not reach
        it, an earlier model would not unload), the server is replaced and the verification runs once more.
        Raises InvalidInput (field `file`: Triton refused to load the model, an inference failed; field `config`:
        the copy has no valid `config.pbtxt`), Unavailable (no server starts, or the server failed twice).
        """
        if stage is None and (not repository or repository.startswith("s3://")):
            raise InvalidInput(
                "a warm verify server copies the model from a local folder: pass stage= for other repositories",
                field="repository",
            )
        with self._lock:
            for attempt in (1, 2):
                process = self.start(log)
                try:
                    return self._run_once(process, model_name, repository, stage, label, input_sets, log)
                except _ServerMisbehaved as exc:
                    for line in _log_lines_since(process, 0)[-LOAD_LOG_LINES:]:
                        log(f"triton: {line}")
                    self._discard(grace_s=MISBEHAVING_STOP_GRACE_S)
                    if attempt == 2:
                        raise Unavailable(
                            f"The verification Triton server failed twice in a row: {exc}. Check the worker's "
                            "resources (memory, processes); the build is retried."
                        ) from None
                    log(f"{exc}; starting a fresh verify server and trying once more")
        raise AssertionError("unreachable")

    def _run_once(
        self,
        process: triton_server.ServerProcess,
        model_name: str,
        repository: str,
        stage: Callable[[Path], None] | None,
        label: str,
        input_sets: Sequence[Mapping[str, np.ndarray]],
        log: Callable[[str], None],
    ) -> list[dict[str, np.ndarray]]:
        assert self._scratch is not None and self._api_key is not None
        load_name = f"{model_name}--{label}-{next(self._loads)}" if label else f"{model_name}--{next(self._loads)}"
        target = self._scratch / load_name
        target.mkdir()
        asked_unload = False
        try:
            if stage is not None:
                stage(target)
            else:
                _copy_tree(Path(repository) / model_name, target)
            config_json = _load_config_json(target, load_name)
            log(f"copied {repository.rstrip('/')}/{model_name} into verify server {process.server_id} as {load_name}")
            log_offset = _log_size(process)
            started = time.monotonic()
            with TritonClient(
                process.http_url, timeout_s=self.settings.load_timeout_s, api_key=self._api_key
            ) as client:
                try:
                    client.load_model(load_name, config_json=config_json)
                except ModelLoadError as exc:
                    if not triton_server.is_alive(process.pid, process.create_time) or not _is_live(process):
                        raise _ServerMisbehaved(
                            f"the verify server stopped while it loaded the model ({exc.detail})"
                        ) from None
                    for line in _log_lines_since(process, log_offset)[-LOAD_LOG_LINES:]:
                        log(f"triton: {line}")
                    raise InvalidInput(f"Triton could not load the model: {exc.detail}", field="file") from exc
                except (TritonUnavailable, TritonAccessDenied) as exc:
                    raise _ServerMisbehaved(
                        f"the verify server failed while it loaded the model: {exc.detail}"
                    ) from None
                log(f"Triton loaded model {load_name} in {time.monotonic() - started:.2f} s")
                try:
                    results = [_infer(client, load_name, inputs) for inputs in input_sets]
                except (TritonUnavailable, TritonModelNotFound, TritonAccessDenied) as exc:
                    raise _ServerMisbehaved(
                        f"the verify server failed during the smoke inference: {exc.detail}"
                    ) from None
                asked_unload = self._ask_unload(client, process, load_name)
            return results
        finally:
            self._clean_up_later(process, load_name, target, asked_unload)

    def _ask_unload(self, client: TritonClient, process: triton_server.ServerProcess, load_name: str) -> bool:
        try:
            client.unload_model(load_name)
        except ConchError as exc:
            self._broken = (process, f"the unload of {load_name} failed: {exc.detail}")
            return False
        return True

    def _clean_up_later(
        self, process: triton_server.ServerProcess, load_name: str, target: Path, asked_unload: bool
    ) -> None:
        thread = threading.Thread(
            target=self._clean_up,
            args=(process, load_name, target, asked_unload),
            name=f"conch-verify-cleanup-{load_name}",
            daemon=True,
        )
        self._cleanups = [t for t in self._cleanups if t.is_alive()] + [thread]
        thread.start()

    def _clean_up(self, process: triton_server.ServerProcess, load_name: str, target: Path, asked_unload: bool) -> None:
        """Unload `load_name` (if not asked yet), wait until Triton has, then delete its copy.

        A model still loading, ready or unloading after `unload_timeout_s` marks the server broken: the next `run`
        replaces it. Errors of a server that was replaced meanwhile are ignored.
        """
        deadline = time.monotonic() + self.settings.unload_timeout_s
        problem = None
        try:
            api_key = self._api_key if self._process is process else None
            if api_key is None:
                return  # replaced or stopped: the whole scratch repository went with it
            with TritonClient(process.http_url, timeout_s=self.settings.unload_timeout_s, api_key=api_key) as client:
                if not asked_unload:
                    client.unload_model(load_name)
                while True:
                    state = next(
                        (entry.get("state") for entry in client.repository_index() if entry.get("name") == load_name),
                        None,
                    )
                    if state not in _BUSY_STATES:
                        break
                    if time.monotonic() > deadline:
                        problem = (
                            f"model {load_name} was still {state} {self.settings.unload_timeout_s:g} s after its unload"
                        )
                        break
                    time.sleep(0.05)
        except ConchError as exc:
            problem = f"the unload of {load_name} failed: {exc.detail}"
        finally:
            shutil.rmtree(target, ignore_errors=True)
        if problem is not None and self._process is process:
            self._broken = (process, problem)
            logger.warning("verify_server.unload_failed", extra={"server_id": process.server_id, "error": problem})

    def wait_idle(self, timeout_s: float = 120.0) -> bool:
        """Wait (at most `timeout_s` seconds in all) for the background unloads and deletions; return whether they
        all finished."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._cleanups):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._cleanups)


def _is_live(process: triton_server.ServerProcess) -> bool:
    """Whether the server answers `GET /v2/health/live` with 200 (KServe v2 "Health") within HEALTH_TIMEOUT_S.

    Liveness, not readiness: with Triton's default strict readiness a server is not "ready" while one of its models
    is unloading or failed to load, which is the normal state of a verify server between two builds.
    """
    with TritonClient(process.http_url, timeout_s=HEALTH_TIMEOUT_S) as client:
        return client.is_live()


def _copy_tree(source: Path, target: Path) -> None:
    """Copy the files under folder `source` into the existing folder `target`: a hard link where the file system
    allows it (the store replaces files by rename, never in place), else a copy. Raises InvalidInput when `source`
    is not a folder."""
    if not source.is_dir():
        raise InvalidInput(f"model folder {source} does not exist", field="repository")
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, destination)
        except OSError:
            shutil.copy2(path, destination)


def _load_config_json(model_dir: Path, load_name: str) -> str:
    """The load's `config` parameter: the copy's own `config.pbtxt`, with `name` set to the folder's name (Triton
    requires the two to agree)."""
    path = model_dir / "config.pbtxt"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the model directory has no readable config.pbtxt: {exc}", field="config") from None
    config = config_from_pbtxt(text)
    config.name = load_name
    return config_to_json(config)


def _log_size(process: triton_server.ServerProcess) -> int:
    try:
        return process.log_path.stat().st_size if process.log_path is not None else 0
    except OSError:
        return 0


def _log_lines_since(process: triton_server.ServerProcess, offset: int) -> list[str]:
    """Lines the server logged after byte `offset` of its log (the last LOAD_LOG_LINES * 4 at most)."""
    if process.log_path is None:
        return []
    try:
        with process.log_path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - 64 * 1024))
            data = handle.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-LOAD_LOG_LINES * 4 :]


def _remove_abandoned_scratch(work_dir: Path, server_id_prefix: str) -> None:
    """Delete scratch repositories (and logs) of warm servers whose owner process is gone (a killed worker)."""
    root = work_dir / _SCRATCH_FOLDER
    if not root.is_dir():
        return
    for folder in root.iterdir():
        if not folder.name.startswith(server_id_prefix):
            continue
        owner = folder.name[len(server_id_prefix) :].split("-", 1)[0]
        if not owner.isdigit() or triton_server.process_exists(int(owner)):
            continue
        if triton_server.find_servers(folder.name, backend_root=work_dir / "backends"):
            continue  # its server still runs; the periodic sweep stops it first
        shutil.rmtree(folder, ignore_errors=True)
        (work_dir / "logs" / f"{folder.name}.log").unlink(missing_ok=True)


# --- the process's warm server ----------------------------------------------------------------------------------

_registry_lock = threading.Lock()
_server: VerifyServer | None = None


def get_verify_server(settings: VerifyServerSettings) -> VerifyServer:
    """Return this process's warm verify server for `settings` (created, not started, on first use).

    A different `settings` value stops the previous server and creates a new one. A server created by another
    process (the parent of a fork) is never returned nor stopped here: it belongs to that process.
    """
    global _server
    previous = None
    with _registry_lock:
        current = _server
        if current is not None and current.owner_pid == os.getpid() and current.settings == settings:
            return current
        if current is not None and current.owner_pid == os.getpid():
            previous = current
        _server = created = VerifyServer(settings)
    if previous is not None:
        previous.stop()
    return created


def current_verify_server() -> VerifyServer | None:
    """Return this process's warm verify server, or None when it has none."""
    current = _server
    return current if current is not None and current.owner_pid == os.getpid() else None


def warm_up_verify_server(settings: VerifyServerSettings) -> threading.Thread:
    """Start this process's warm verify server in a daemon thread and return the thread (at once).

    For a worker process that should have the server ready before its first build (Celery's
    `worker_process_init`). A failed start is logged (`verify_server.warm_up_failed`); the first build tries again.
    """
    server = get_verify_server(settings)

    def start() -> None:
        try:
            server.start()
        except ConchError as exc:
            logger.warning("verify_server.warm_up_failed", extra={"error": exc.detail})

    thread = threading.Thread(target=start, name="conch-verify-warm-up", daemon=True)
    thread.start()
    return thread


def stop_verify_server() -> None:
    """Stop this process's warm verify server, if it has one (at worker shutdown and interpreter exit)."""
    server = current_verify_server()
    if server is not None:
        server.stop()


def _forget_after_fork() -> None:
    # The child must not share the parent's server (nor a lock a parent thread may have held while forking).
    global _registry_lock, _server
    _registry_lock = threading.Lock()
    _server = None


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(stop_verify_server)
