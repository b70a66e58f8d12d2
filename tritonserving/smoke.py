"""A scratch Triton that loads one model and runs smoke inferences on it (the build's verify step).

Talks to a `tritonserver` it starts itself (`tritonserving.server`) over the KServe v2 HTTP API
(`tritonserving.client`). No Django: the caller passes the folders, ids and timeouts it wants. The scratch server is
locked down like every server Conch starts (`tritonserving.access`): only requests carrying its key may load or
unload models, and it gets no copy of Conch's environment.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conch.errors import ConchError, InvalidInput, Unavailable
from tritonserving import server as triton_server
from tritonserving.client import ModelLoadError, TritonClient, TritonRequestError

__all__ = ["ScratchServer", "run_smoke_inference"]


@dataclass(frozen=True)
class ScratchServer:
    """Where and how a scratch server runs.

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


def run_smoke_inference(
    *,
    scratch: ScratchServer,
    repository: str,
    environment: Mapping[str, str],
    model_name: str,
    input_sets: Sequence[Mapping[str, np.ndarray]],
    log: Callable[[str], None],
) -> list[dict[str, np.ndarray]]:
    """Load `model_name` from `repository` into a scratch Triton and run one inference per input set.

    `input_sets`: each a mapping input name -> array (shape and dtype as a Triton client sends them).
    Returns, per input set and in order, output name -> array. The server is stopped before returning.
    Raises InvalidInput (field `file`) when Triton refuses to load the model or an inference fails (the
    message shows what was sent), Unavailable when no server starts.
    """
    work_dir = Path(scratch.work_dir)
    (work_dir / "logs").mkdir(parents=True, exist_ok=True)
    backend_root = triton_server.ensure_backend_directory(work_dir / "backends")
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
        client = TritonClient(process.http_url, timeout_s=300, api_key=api_key)
        try:
            client.load_model(model_name)
        except ModelLoadError as exc:
            for line in triton_server.tail_log(log_path, lines=15):
                log(f"triton: {line}")
            raise InvalidInput(f"Triton could not load the model: {exc.detail}", field="file") from exc
        log(f"Triton loaded model {model_name}")
        results = []
        for inputs in input_sets:
            try:
                results.append(client.infer_numpy(model_name, dict(inputs)))
            except TritonRequestError as exc:
                sent = ", ".join(f"{name} {array.dtype} {list(array.shape)}" for name, array in inputs.items())
                raise InvalidInput(
                    f"The smoke inference failed in Triton: {exc.detail} (sent: {sent})", field="file"
                ) from exc
        return results
    finally:
        triton_server.stop_server(process.pid, process.create_time)
        log_path.unlink(missing_ok=True)
