"""Which versions of a model one running Triton serves: load a set of versions, and warm one up.

Talks to one `tritonserver` in `--model-control-mode=explicit` over its HTTP API (`tritonserving.client`). What
Triton does, from the "Model Management" doc ("Model Control Mode EXPLICIT") and Triton 2.51 as run here:

- A load of a model that is already loaded is a reload: "if the reload fails for any reason the already loaded
  model will be unchanged and will remain loaded. If the reload succeeds, the newly loaded model will replace the
  already loaded model without any loss in availability for the model."
- The versions loaded are the ones the configuration's version policy names (Triton "Model Configuration" ->
  "Version Policy"); a version that is loaded and whose files did not change keeps serving through a load whose
  configuration differs only in its version policy (no new model instance: core `ModelLifeCycle::AsyncLoad`
  updates it in place), and versions the policy no longer names are unloaded once the load has succeeded, their
  in-flight requests finishing first.
- A request that names no version goes to the highest version that is ready (core `ModelLifeCycle::GetModel`).
- With `--strict-readiness` (every server Conch starts), the server is not ready while a version unloads (core
  `ModelLifeCycle::LiveModelStates`: a live version that is not READY), about 2 s for a Python-backend model here.

No Django; the caller passes the client, the configuration and the inputs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import numpy as np

from conch.errors import InvalidInput
from tritonserving.client import TritonClient, TritonRequestError, TritonUnavailable
from tritonserving.config import ModelConfig, config_to_json, serving_versions

__all__ = ["load_versions", "wait_until_ready_again", "warm_up_version"]


def load_versions(client: TritonClient, config: ModelConfig, versions: Iterable[int]) -> None:
    """Load model `config.name` with `config`, serving exactly `versions` (its `version_policy` replaced by
    `specific`), and return once Triton has finished the load.

    The version directories must be in the server's repository. Raises `ModelLoadError` with Triton's message
    (the versions served before stay served), `TritonAccessDenied`, `TritonUnavailable`.
    """
    client.load_model(config.name, config_json=config_to_json(serving_versions(config, versions)))


def warm_up_version(client: TritonClient, name: str, version: int, inputs: Mapping[str, np.ndarray]) -> None:
    """Run one inference of `inputs` (input name -> array, as a client sends them) on version `version` of model
    `name` (`POST /v2/models/<name>/versions/<version>/infer`): the model's first request pays its lazy set-up,
    and a model that loads but cannot run fails here.

    Raises `InvalidInput` (field `model_version`) when the model fails on the inputs, showing what was sent;
    `TritonModelNotFound` when the version is not loaded; `TritonUnavailable`.
    """
    try:
        client.infer_numpy(name, dict(inputs), version=version)
    except TritonRequestError as exc:
        sent = ", ".join(f"{key} {array.dtype} {list(array.shape)}" for key, array in inputs.items())
        raise InvalidInput(
            f"version {version} failed its warm-up inference: {exc.detail} (sent: {sent})", field="model_version"
        ) from exc


def wait_until_ready_again(client: TritonClient, *, timeout_s: float, poll_interval_s: float = 0.1) -> None:
    """Wait until the server answers `GET /v2/health/ready` with 200 again (after a load that unloads a version).

    Raises `TritonUnavailable` when it is not ready within `timeout_s` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while not client.is_ready():
        if time.monotonic() >= deadline:
            raise TritonUnavailable(f"Triton at {client.http_url} was not ready again within {timeout_s:g} s")
        time.sleep(poll_interval_s)
