"""The control client of one Triton server: health, metadata, configuration, the model repository (load, unload,
index), statistics, the metrics port, and the small inferences Conch itself runs; plus the KServe v2 request
checks and the errors every Triton call in Conch raises.

Two ways, and only two, reach a Triton over HTTP in Conch:
- this `TritonClient`, synchronous, over one keep-alive `http.client` connection per thread, for control calls
  made by workers, runtimes and builds (and the metrics scrape, `fetch_metrics_text`). Its `infer_numpy` serves
  Conch's own inferences (the build's smoke inference, a hot update's warm-up), which are not a user's data path;
- `tritonserving.relay`, asynchronous and pooled, for users' inference: the gateway's and the REST API's `/infer`
  bodies go through it unchanged (`relay.infer_body`).

Talks the KServe v2 / Open Inference Protocol ("Health", "Model Ready", "Model Metadata", "Model Configuration",
"Inference") and Triton's extensions: "Model Repository" (load/unload with an optional configuration override),
"Statistics" and "Binary Tensor Data". Returns plain dicts and numpy arrays. A client built with `api_key=` sends
it in the `X-Conch-Key` header of every request, which the restricted endpoints of a server Conch started require
(Triton "Limit Endpoint Access"). Raises only our errors:

- `TritonUnavailable` (`Unavailable`, 503): connection refused/reset, timeout, or Triton answered 503;
  `TritonUnreachable` when no connection opened at all (nothing was sent).
- `TritonRequestError` (`InvalidInput`, 400): Triton rejected the request (bad shape, datatype, input name...)
  or the model failed on it; `detail` is Triton's own message, `status` the HTTP status Triton answered (400 for
  a rejected request, 500 for a model that failed while running), `field` the tensor Triton names, if any.
- `TritonModelNotFound` (`NotFound`, 404): the model is not loaded (or not in the repository).
- `ModelLoadError` (`InvalidInput`): Triton could not load a model; `detail` is Triton's message.
- `TritonAccessDenied` (`ConchError`, 500): Triton refused a restricted endpoint (HTTP 403) because the client's
  API key is missing or is not the server's (see `tritonserving.access`).
- `InvalidInput` naming the field: a malformed inference request, caught before anything is sent.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, urlsplit

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from conch.errors import ConchError, InvalidInput, NotFound, Unavailable
from tritonserving.access import API_KEY_HEADER, validate_api_key

DEFAULT_TIMEOUT_S = 10.0

# KServe v2 "Tensor Data Types" this adapter can carry as JSON (BF16 has no JSON/numpy form here).
JSON_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

#: Datatypes a binary tensor may have besides the JSON ones (KServe v2 "Tensor Data Types"; BF16 has no JSON form).
BINARY_ONLY_DATATYPES = ("BF16",)
#: Triton's header naming the length of the JSON part of a body that carries binary tensors (Triton "Binary Tensor
#: Data Extension"); an HTTP header, not a JSON field.
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class InferenceResponse:
    """Triton's answer to an inference request, byte for byte.

    `body`: the KServe v2 "Inference Response JSON Object", followed by the outputs' raw bytes when binary outputs
    were asked for. Triton writes non-finite floats as `NaN`, `Infinity` and `-Infinity` (not strict JSON; Python's
    `json.loads` and most KServe clients read them). `header_length`: the length in bytes of the JSON part when the
    body carries binary data (Triton's `Inference-Header-Content-Length` response header), else None.
    `content_type`: Triton's Content-Type (`application/json`, or `application/octet-stream` with binary data).
    """

    body: bytes
    content_type: str
    header_length: int | None = None


class TritonUnavailable(Unavailable):
    """Triton could not be reached, did not answer in time, or said it is unavailable (retry later)."""


#: Headers a gateway passes between clients and Triton (lower case): the body's type, encoding and, with
#: binary tensor data, the JSON header's length (Triton "Binary Tensor Data Extension").
RELAYED_HEADERS = frozenset({"content-type", "content-encoding", "accept-encoding", "inference-header-content-length"})


class TritonUnreachable(TritonUnavailable):
    """No connection to Triton could be opened (refused, no route, connect timeout): nothing was sent, so the
    request may safely go to another server."""


class TritonRequestError(InvalidInput):
    """Triton rejected a request or the model failed on it.

    `detail` is Triton's message; `status` the HTTP status Triton answered (400: the request breaks the model's
    configuration or the backend refused it; 500: the model failed while running).
    """

    def __init__(self, detail: str, *, status: int | None = None, field: str | None = None) -> None:
        super().__init__(detail, field=field)
        self.status = status


class TritonModelNotFound(NotFound):
    """The model is not loaded on the server (Triton: "Request for unknown model")."""


class ModelLoadError(InvalidInput):
    """Triton failed to load a model; `detail` is Triton's message (config error, backend error, missing file)."""


class TritonAccessDenied(ConchError):
    """Triton answered 403 to a restricted endpoint: the client sent no API key or not the server's key.

    Not the user's fault and not transient: the server was started with another key (e.g. after
    DJANGO_SECRET_KEY changed); restarting the server with the current key fixes it.
    """


# Triton prefixes request errors with "[request id: <id_unknown>] " when the client sent no id.
_REQUEST_ID_PREFIX = re.compile(r"^\[request id: [^\]]*\]\s*")


# The tensor a Triton 2.51 request error is about. Core messages quote it ("inference input 'x' data-type is ...",
# "unexpected shape for input 'x' ...", "unexpected inference input 'z' ...", "unexpected inference output 'o' ...",
# "input 'x' already exists in request", "input byte size mismatch for input 'x' ...", "unexpected size for input
# 'x' ..."); two do not ("invalid datatype for input x", and the missing-input message, which lists names).
_QUOTED_TENSOR = re.compile(r"\b(?:input|output)(?: tensors)? '([^']+)'")
_UNQUOTED_TENSOR = re.compile(r"\b(?:invalid datatype for input|Please use the binary data format for input) (\S+)")
# "expected 3 inputs but got 2 inputs for model 'm'. Got input(s) ['a','b'], but missing required input(s)
# ['c']. Please provide all required input(s)." The missing list is empty when an unknown input took its place.
_MISSING_INPUTS = re.compile(r"missing required input\(s\) \[?([^\]]*)\]")


# Triton 2.51's shape refusal for a model with max_batch_size > 0 ends in advice about editing the model
# configuration ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be
# prepended ... try setting max_batch_size to zero ..."), which Conch wrote, not the caller: `explained_message`
# replaces it with what the caller should send.
_BATCHED_SHAPE_REFUSAL = re.compile(
    r"(?P<head>unexpected shape for input '(?P<name>[^']+)' for model '(?P<model>[^']+)'\. "
    r"Expected \[(?P<expected>[-0-9, ]*)\], got \[(?P<got>[-0-9, ]*)\]\.)"
    r" NOTE: Setting a non-zero max_batch_size in the model config.*?(?:more info on max_batch_size\.|$)",
    re.DOTALL,
)


def _dims(text: str) -> list[int]:
    return [int(item) for item in text.replace(" ", "").split(",") if item]


def _shape_text(dims: Sequence[int | str]) -> str:
    return "[" + ",".join(str(item) for item in dims) + "]"


def _batched_shape_advice(found: re.Match[str]) -> str:
    expected, got = _dims(found.group("expected")), _dims(found.group("got"))
    per_sample = expected[1:]
    fits = len(got) == len(per_sample) and all(want in (-1, have) for want, have in zip(per_sample, got, strict=True))
    if fits:
        advice = (
            f"The model batches requests: the first dimension of input '{found.group('name')}' is the batch size, "
            f"so send shape {_shape_text([1, *got])} for one sample (or {_shape_text(['N', *got])} for N)."
        )
    else:
        advice = (
            f"The first dimension of input '{found.group('name')}' is the batch size (N samples, up to the model's "
            f"max_batch_size) and the dimensions after it must be {_shape_text(per_sample)} (-1: any length)."
        )
    return f"{found.group('head')} {advice}"


# Triton 2.51's refusal of a request larger than the model's max_batch_size: "inference request batch-size must be
# <= 8 for 'm'".
_BATCH_TOO_LARGE = re.compile(
    r"inference request batch-size must be <= (?P<limit>\d+) for '(?P<model>[^']+)'(?!\. Send)"
)


def _batch_too_large_advice(found: re.Match[str]) -> str:
    limit = found.group("limit")
    return (
        f"{found.group(0)}. Send at most {limit} samples per request (split a larger batch), or rebuild the model "
        "version with a larger max_batch_size build option"
    )


def explained_message(message: str) -> str:
    """Triton's error `message` with the advice meant for the author of a model configuration replaced by advice
    for the caller of the model (Conch writes the configuration): a shape refused by a model whose
    `max_batch_size` is non-zero says which shape to send ("send shape [1,4] for one sample"), and a batch larger
    than `max_batch_size` says how to send it. Other messages are returned unchanged. Source: Triton's model
    configuration docs, "Maximum Batch Size" (the batch dimension is not listed in `dims`; requests carry it
    first)."""
    return _BATCH_TOO_LARGE.sub(_batch_too_large_advice, _BATCHED_SHAPE_REFUSAL.sub(_batched_shape_advice, message))


def explained_error_body(body: bytes) -> bytes:
    """Triton's HTTP error answer `body` (`{"error": "<message>"}`) with its message worded for the caller
    (`explained_message`); any other body, or a message left as it is, is returned unchanged (the same bytes)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict) or not isinstance(parsed.get("error"), str):
        return body
    explained = explained_message(parsed["error"])
    if explained == parsed["error"]:
        return body
    return json.dumps({**parsed, "error": explained}).encode()


def _named_tensor(message: str) -> str | None:
    """Return the tensor Triton's error `message` names, or None (e.g. a batch-size error names none)."""
    missing = _MISSING_INPUTS.search(message)
    if missing:
        names = re.findall(r"'([^']+)'", missing.group(1))
        return names[0] if names else None
    for pattern in (_QUOTED_TENSOR, _UNQUOTED_TENSOR):
        found = pattern.search(message)
        if found:
            return found.group(1)
    return None


def error_from_answer(
    status: int,
    body: bytes,
    *,
    model_name: str,
    where: str,
    known_inputs: Sequence[str] | None = None,
    sent_inputs: Sequence[str] = (),
) -> ConchError:
    """The error for Triton's non-200 answer (`status`, `body` `{"error": "<message>"}`) to a request on
    `model_name` at `where` (the server's URL, for the message).

    404, or a message about an unknown model: `TritonModelNotFound`; 503: `TritonUnavailable`; 403:
    `TritonAccessDenied`; anything else `TritonRequestError` with Triton's message and, as `field`, the tensor it
    names. When Triton only says required inputs are missing without naming one (an unknown input took its
    place), `field` is the first of `sent_inputs` not among `known_inputs` (the model's inputs, when known).
    """
    message = _error_text(body)
    if status == 403:
        return TritonAccessDenied(
            f"Triton at {where} refused the request: {message}. The server was started with another key; restart it "
            "so it gets the current one."
        )
    if status == 404 or "unknown model" in message:
        return TritonModelNotFound(f"model '{model_name}' is not loaded on {where}: {message}")
    if status == 503:
        return TritonUnavailable(f"Triton at {where} is unavailable: {message}")
    field = _named_tensor(message)
    if field is None and known_inputs is not None and _MISSING_INPUTS.search(message):
        field = next((name for name in sent_inputs if name not in set(known_inputs)), None)
    return TritonRequestError(message, status=status, field=field)


def names_no_missing_input(body: bytes) -> bool:
    """Whether Triton's error answer `body` says required inputs are missing without naming one (an unknown input
    took its place): only the model's inputs (`input_names` of its metadata) tell which input was wrong."""
    missing = _MISSING_INPUTS.search(_error_text(body))
    return missing is not None and not re.findall(r"'([^']+)'", missing.group(1))


def input_names(metadata: Mapping[str, Any]) -> list[str]:
    """The input names of a KServe v2 "Model Metadata Response JSON Object" (`{"inputs": [{"name", ...}]}`)."""
    inputs = metadata.get("inputs")
    return [item["name"] for item in inputs or [] if isinstance(item, Mapping) and isinstance(item.get("name"), str)]


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class TritonClient:
    """Control client for one Triton server's HTTP endpoint, e.g. `TritonClient("http://127.0.0.1:8000", timeout_s=5)`.

    `timeout_s` (seconds) bounds connecting and each network read/write of every call. `api_key` (the server's key,
    `tritonserving.access.derive_api_key`) is sent as the `X-Conch-Key` header of every request; without it the
    restricted endpoints (load, unload, index, config, statistics...) of a server Conch started answer 403 and
    raise `TritonAccessDenied`, while health, metadata and inference work. Safe to share between threads: each
    thread keeps its own keep-alive connection (`close()` closes the calling thread's).
    Raises `InvalidInput` for a non-positive timeout, a URL that is not http(s)://host[:port], or a malformed key.
    """

    def __init__(self, http_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None) -> None:
        if timeout_s <= 0:
            raise InvalidInput(f"timeout_s must be positive, got {timeout_s}", field="timeout_s")
        self._headers = {API_KEY_HEADER: validate_api_key(api_key)} if api_key is not None else {}
        url = http_url.strip().rstrip("/")
        self._ssl = url.startswith("https://")
        self._address = url.split("://", 1)[1] if "://" in url else url
        try:
            parts = urlsplit(f"//{self._address}")
            self._host, self._port = parts.hostname, parts.port
        except ValueError:
            self._host = None
        if not self._host or "/" in self._address:
            raise InvalidInput(f"not a Triton HTTP URL: {http_url!r}", field="http_url")
        self.http_url = f"{'https' if self._ssl else 'http'}://{self._address}"
        self.timeout_s = float(timeout_s)
        self._local = threading.local()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the calling thread's connection (others close when their thread's client is collected)."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    # --- transport ----------------------------------------------------------------------------------------------

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """The calling thread's connection and whether it was used before; a new one is connected here. Raises
        `TritonUnreachable` when none opens."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        kind = http.client.HTTPSConnection if self._ssl else http.client.HTTPConnection
        connection = kind(self._host or "", self._port, timeout=self.timeout_s)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise TritonUnreachable(f"Triton at {self.http_url} cannot be reached: {exc}") from None
        self._local.connection = connection
        return connection, False

    def _request(
        self, method: str, path: str, *, action: str, body: bytes | None = None, headers: Mapping[str, str] = {}
    ) -> _Answer:
        """One exchange on the thread's keep-alive connection; return Triton's answer, whatever its status.

        A reused connection the server closed meanwhile (nothing came back) is replaced and the request sent again
        once. Raises `TritonUnreachable` (no connection opened), `TritonUnavailable` (it failed or timed out after
        that), `TritonAccessDenied` (403 on a restricted endpoint).
        """
        sent = {**self._headers, **headers}
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        while True:
            connection, reused = self._connection()
            try:
                connection.request(method, path, body=body, headers=sent)
                response = connection.getresponse()
                answer = _Answer(response.status, response.headers, response.read())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if reused:
                    continue  # the server had closed the idle connection: once more on a fresh one
                raise TritonUnavailable(f"Triton at {self.http_url} failed while {action}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()  # the connection may be half-used; start clean next time
                kind = "timed out" if isinstance(exc, TimeoutError) else "failed"
                raise TritonUnavailable(f"Triton at {self.http_url} {kind} while {action}: {exc}") from None
            if response.will_close:
                self.close()
            if answer.status == 403:
                key_note = "the key Conch sent is not this server's" if self._headers else "Conch sent no API key"
                raise TritonAccessDenied(
                    f"Triton at {self.http_url} refused {action}: {_error_text(answer.body)} ({key_note}). The server "
                    "was started with another key; restart it so it gets the current one."
                )
            return answer

    def _json(self, method: str, path: str, *, action: str, model_name: str = "", body: Any = None) -> Any:
        """`_request` with a JSON body (None: no body) whose 200 answer is JSON; any other answer raises its error
        (`error_from_answer`)."""
        payload = None if body is None else json.dumps(body).encode()
        answer = self._request(method, path, action=action, body=payload)
        if answer.status != 200:
            raise error_from_answer(answer.status, answer.body, model_name=model_name, where=self.http_url)
        if not answer.body:
            return {}
        try:
            return json.loads(answer.body)
        except ValueError:
            raise TritonUnavailable(f"Triton at {self.http_url} answered {action} with no JSON") from None

    # --- health and metadata ------------------------------------------------------------------------------------

    def is_live(self) -> bool:
        """Whether the server answers `GET /v2/health/live` with 200 (KServe v2 "Health"); False when unreachable.
        Liveness, not readiness: a server whose model is loading or failed to load is live, not ready."""
        return self._health("/v2/health/live", "checking liveness")

    def is_ready(self) -> bool:
        """Whether the server answers `GET /v2/health/ready` with 200 (KServe v2 "Health"); False when unreachable."""
        return self._health("/v2/health/ready", "checking readiness")

    def _health(self, path: str, action: str) -> bool:
        try:
            return self._request("GET", path, action=action).status == 200
        except (TritonUnavailable, TritonAccessDenied):
            return False

    def model_ready(self, name: str) -> bool:
        """Whether model `name` is loaded and ready (`GET /v2/models/<name>/ready`). Raises `TritonUnavailable`."""
        return self._request("GET", f"{_model_path(name)}/ready", action=f"checking model '{name}'").status == 200

    def model_metadata(self, name: str) -> dict[str, Any]:
        """Model `name`'s metadata (KServe v2 "Model Metadata": `{"name", "versions", "platform", "inputs":
        [{"name", "datatype", "shape"}], "outputs": [...]}`). Raises `TritonModelNotFound`, `TritonUnavailable`."""
        return dict(self._json("GET", _model_path(name), action=f"reading the metadata of '{name}'", model_name=name))

    def model_config(self, name: str) -> dict[str, Any]:
        """Return the configuration Triton serves model `name` with, as JSON (the filled-in ModelConfig).

        A restricted endpoint: needs the server's `api_key`. Raises `TritonModelNotFound`, `TritonAccessDenied`,
        `TritonUnavailable`.
        """
        path = f"{_model_path(name)}/config"
        return dict(self._json("GET", path, action=f"reading the config of '{name}'", model_name=name))

    def model_statistics(self, name: str) -> dict[str, Any]:
        """Model `name`'s inference statistics (Triton "Statistics Extension": `{"model_stats": [{"name",
        "version", "inference_count", "execution_count", "inference_stats": {...}}]}`; times in ns).

        A restricted endpoint: needs the server's `api_key`. Raises `TritonModelNotFound`, `TritonAccessDenied`,
        `TritonUnavailable`.
        """
        path = f"{_model_path(name)}/stats"
        return dict(self._json("GET", path, action=f"reading the statistics of '{name}'", model_name=name))

    # --- model repository -------------------------------------------------------------------------------------

    def load_model(self, name: str, *, config_json: str | None = None) -> None:
        """Load (or reload) model `name` from the server's repository and wait until Triton has done so.

        `config_json` (JSON text of a ModelConfig) replaces the repository's `config.pbtxt` for this load
        (Triton "Model Repository" extension, "Load", parameter `config`).
        A restricted endpoint: needs the server's `api_key`. Raises `ModelLoadError` with Triton's message,
        `InvalidInput` for config text that is not JSON, `TritonAccessDenied`, `TritonUnavailable`.
        """
        body: dict[str, Any] = {}
        if config_json is not None:
            try:
                json.loads(config_json)
            except ValueError as exc:
                raise InvalidInput(f"config_json is not valid JSON: {exc}", field="config_json") from None
            body = {"parameters": {"config": config_json}}
        answer = self._request(
            "POST",
            f"/v2/repository/models/{quote(name, safe='')}/load",
            action=f"loading model '{name}'",
            body=json.dumps(body).encode(),
        )
        if answer.status == 503:
            raise TritonUnavailable(f"Triton at {self.http_url} is unavailable: {_error_text(answer.body)}")
        if answer.status != 200:
            raise ModelLoadError(_error_text(answer.body))

    def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Ask Triton to unload model `name` (Triton "Model Repository" extension, "Unload").

        Triton answers once the unload has started; `model_ready` is False from then on, while in-flight
        requests finish. Unloading a model that is not loaded succeeds. A restricted endpoint: needs the server's
        `api_key`. Raises `TritonRequestError`, `TritonAccessDenied`, `TritonUnavailable`.
        """
        self._json(
            "POST",
            f"/v2/repository/models/{quote(name, safe='')}/unload",
            action=f"unloading model '{name}'",
            model_name=name,
            body={"parameters": {"unload_dependents": unload_dependents}},
        )

    def repository_index(self) -> list[dict[str, Any]]:
        """List the models in the server's repository (Triton "Model Repository" extension, "Index").

        Returns `[{"name": str, "version"?: str, "state"?: "READY"|"UNAVAILABLE"|..., "reason"?: str}]` as Triton
        answers it. A restricted endpoint: needs the server's `api_key`. Raises `TritonAccessDenied`,
        `TritonRequestError`, `TritonUnavailable`.
        """
        return list(self._json("POST", "/v2/repository/index", action="listing the model repository", body={}))

    def ready_versions(self, name: str) -> set[int]:
        """The versions of model `name` that are ready on the server now (from the repository index; a version
        that is loading or unloading is not). A restricted endpoint: needs the server's `api_key`. Raises
        `TritonAccessDenied`, `TritonRequestError`, `TritonUnavailable`.
        """
        return {
            int(entry["version"])
            for entry in self.repository_index()
            if entry.get("name") == name and entry.get("state") == "READY" and str(entry.get("version", "")).isdigit()
        }

    # --- Conch's own inferences ---------------------------------------------------------------------------------

    def infer_numpy(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run model `name` on numpy tensors sent as binary data; return the outputs by name.

        For Conch's own inferences (a build's smoke inference, a hot update's warm-up); users' requests go through
        `tritonserving.relay`. The Triton datatype follows each array's dtype (float32 -> FP32, int64 -> INT64,
        bool -> BOOL, object / bytes / str -> BYTES). `outputs` picks outputs by name (None: all the model's
        outputs). `version` sends the request to that version (`/v2/models/<name>/versions/<version>/infer`);
        None lets Triton pick (the highest ready version, KServe v2 "Inference"). Returned arrays are read-only
        views of the response body (BYTES come back as object arrays of `bytes`). Tensors travel as Triton's
        "Binary Tensor Data Extension" both ways.
        Raises `InvalidInput` (unsupported dtype), `TritonRequestError`, `TritonModelNotFound`, `TritonUnavailable`.
        """
        described, payloads = [], []
        for input_name, value in inputs.items():
            array = np.asarray(value)
            if array.dtype.kind == "U":
                encoded = [text.encode("utf-8") for text in array.ravel()]
                array = np.array(encoded, dtype=np.object_).reshape(array.shape)
            datatype = np_to_triton_dtype(array.dtype)
            if datatype is None or datatype == "BF16":
                raise InvalidInput(
                    f"input '{input_name}': dtype {array.dtype} has no Triton datatype", field=input_name
                )
            if datatype == "BYTES":
                try:
                    serialized = serialize_byte_tensor(array)
                except Exception as exc:  # noqa: BLE001 - tritonclient raises its own or numpy's on odd items
                    raise InvalidInput(f"input '{input_name}': {exc}", field=input_name) from None
                data = serialized.item() if serialized.size else b""
            else:
                data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            described.append(
                {
                    "name": input_name,
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(data)},
                }
            )
            payloads.append(data)
        request: dict[str, Any] = {"inputs": described}
        if outputs:
            request["outputs"] = [{"name": output, "parameters": {"binary_data": True}} for output in outputs]
        else:
            request["parameters"] = {"binary_data_output": True}
        header = json.dumps(request).encode()
        path = _model_path(name) + ("" if version is None else f"/versions/{version}") + "/infer"
        answer = self._request(
            "POST",
            path,
            action=f"running model '{name}'",
            body=b"".join([header, *payloads]),
            headers={"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))},
        )
        if answer.status != 200:
            known = self._known_inputs(name) if names_no_missing_input(answer.body) else None
            raise error_from_answer(
                answer.status,
                answer.body,
                model_name=name,
                where=self.http_url,
                known_inputs=known,
                sent_inputs=list(inputs),
            )
        return _binary_outputs(answer.body, answer.headers.get(HEADER_LENGTH), where=self.http_url)

    def _known_inputs(self, name: str) -> list[str] | None:
        try:
            return input_names(self.model_metadata(name))
        except ConchError:
            return None

    # --- the metrics port ---------------------------------------------------------------------------------------

    @staticmethod
    def fetch_metrics_text(metrics_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Return the Prometheus text exposition served at `metrics_url` (e.g. `http://127.0.0.1:8002/metrics`).

        Triton serves it on its own metrics port (Triton docs, "Metrics"), apart from the HTTP API, hence a
        static method: `TritonClient.fetch_metrics_text(url, timeout_s=5)`. `timeout_s` bounds connecting and
        reading (seconds). Raises `TritonUnavailable` on any connection error, timeout or non-200 answer.
        """
        parts = urlsplit(metrics_url)
        try:
            client = TritonClient(f"{parts.scheme}://{parts.netloc}", timeout_s=timeout_s)
        except InvalidInput:
            raise TritonUnavailable(f"Triton metrics at {metrics_url} cannot be read: not an HTTP URL") from None
        with client:
            try:
                answer = client._request("GET", parts.path or "/metrics", action="reading its metrics")
            except TritonUnavailable as exc:
                raise TritonUnavailable(f"Triton metrics at {metrics_url} cannot be read: {exc.detail}") from None
        if answer.status != 200:
            raise TritonUnavailable(f"Triton metrics at {metrics_url} answered HTTP {answer.status}")
        return answer.body.decode("utf-8", errors="replace")


def _model_path(name: str) -> str:
    return f"/v2/models/{quote(name, safe='')}"


def _binary_outputs(body: bytes, raw_length: str | None, *, where: str) -> dict[str, np.ndarray]:
    """The outputs of an inference answer whose outputs came as binary data (or, when Triton sent one as JSON,
    from its `data`), by name. Raises `TritonUnavailable` for an answer that does not add up."""
    try:
        header_length = int(raw_length) if raw_length is not None else len(body)
        response = json.loads(body[:header_length])
        found: dict[str, np.ndarray] = {}
        offset = header_length
        view = memoryview(body)
        for output in response.get("outputs", []):
            datatype, shape = output["datatype"], [int(dim) for dim in output["shape"]]
            size = (output.get("parameters") or {}).get("binary_data_size")
            if size is None:
                dtype = np.object_ if datatype == "BYTES" else triton_to_np_dtype(datatype)
                values = output.get("data", [])
                if datatype == "BYTES":
                    values = [item.encode("utf-8") if isinstance(item, str) else item for item in values]
                found[output["name"]] = np.array(values, dtype=dtype).reshape(shape)
                continue
            chunk = view[offset : offset + size]
            offset += size
            if datatype == "BYTES":
                array = deserialize_bytes_tensor(bytes(chunk)) if size else np.empty(0, dtype=np.object_)
            else:
                array = np.frombuffer(chunk, dtype=np.dtype(triton_to_np_dtype(datatype)).newbyteorder("<"))
            found[output["name"]] = array.reshape(shape)
        return found
    except (ValueError, KeyError, TypeError) as exc:
        raise TritonUnavailable(f"Triton at {where} sent an inference answer that cannot be read: {exc}") from None


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_to_numpy(data: Any, datatype: str, shape: list[int], field: str) -> np.ndarray:
    """Turn one input's JSON `data` into an array of `shape`; raise `InvalidInput` naming `field` when it can't."""
    values = _flatten(data)
    expected = math.prod(shape)
    if len(values) != expected:
        raise InvalidInput(f"{field} has {len(values)} values but shape {shape} needs {expected}", field=field)
    dtype = JSON_DATATYPES[datatype]
    if datatype == "BYTES":
        if not all(isinstance(value, str) for value in values):
            raise InvalidInput(f"{field} must hold strings for datatype BYTES", field=field)
        return np.array([value.encode("utf-8") for value in values], dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        if not all(isinstance(value, bool) for value in values):
            raise InvalidInput(f"{field} must hold true/false values for datatype BOOL", field=field)
        return np.array(values, dtype=np.bool_).reshape(shape)
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
        raise InvalidInput(f"{field} must hold numbers for datatype {datatype}", field=field)
    if dtype.kind in "iu":
        if not all(isinstance(value, int) or float(value).is_integer() for value in values):
            raise InvalidInput(f"{field} must hold whole numbers for datatype {datatype}", field=field)
        limits = np.iinfo(dtype)
        if values and not (limits.min <= min(values) and max(values) <= limits.max):
            raise InvalidInput(
                f"{field} holds a value outside {datatype}'s range [{limits.min}, {limits.max}]", field=field
            )
    try:
        return np.array(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError):
        raise InvalidInput(f"{field} holds a number too large for datatype {datatype}", field=field) from None


@dataclass(frozen=True)
class _CheckedInput:
    name: str
    shape: list[int]
    datatype: str
    array: np.ndarray | None  # the JSON `data`; None when the tensor travels as binary data
    binary_data_size: int | None


@dataclass(frozen=True)
class _CheckedOutput:
    name: str
    class_count: int
    binary_data: bool | None


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parameters(raw: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The `parameters` object of the request (`where` "") or of one of its tensors (`where` "inputs[0]"...)."""
    field = f"{where}.parameters" if where else "parameters"
    parameters = raw.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise InvalidInput(f"{field} must be an object", field=field)
    if "shared_memory_region" in parameters:
        raise InvalidInput(
            f"{field}.shared_memory_region: shared memory cannot be used through Conch; send the tensor as JSON "
            "data, or as binary data (Triton's binary tensor data extension)",
            field=f"{field}.shared_memory_region",
        )
    return parameters


def _check_request_header(request: Any, *, binary_part: bool) -> tuple[list[_CheckedInput], list[_CheckedOutput], str]:
    """Check a KServe v2 "Inference Request JSON Object"; return its inputs, requested outputs and id.

    `binary_part`: whether binary tensor data follows the JSON (Triton "Binary Tensor Data Extension"); without
    it every input needs `data`. Raises `InvalidInput` naming the field (`inputs[0].shape`, ...).
    """
    if not isinstance(request, Mapping):
        raise InvalidInput("the request body must be a JSON object", field="request")
    request_parameters = _parameters(request, "")
    if not isinstance(request_parameters.get("binary_data_output", False), bool):
        raise InvalidInput("parameters.binary_data_output must be true or false", field="parameters.binary_data_output")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("inputs must be a non-empty list of tensors", field="inputs")
    inputs = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_inputs):
        where = f"inputs[{index}]"
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where} must be an object with name, shape, datatype and data", field=where)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{where}.name must be a non-empty string", field=f"{where}.name")
        if name in seen:
            raise InvalidInput(f"{where}.name '{name}' appears twice", field=f"{where}.name")
        seen.add(name)
        shape = raw.get("shape")
        if not isinstance(shape, list) or not all(_non_negative_int(dim) for dim in shape):
            raise InvalidInput(
                f"{where}.shape of '{name}' must be a list of non-negative integers", field=f"{where}.shape"
            )
        parameters = _parameters(raw, where)
        binary_data_size = parameters.get("binary_data_size")
        datatype = raw.get("datatype")
        allowed = sorted(JSON_DATATYPES) + (list(BINARY_ONLY_DATATYPES) if binary_data_size is not None else [])
        if datatype not in allowed:
            raise InvalidInput(
                f"{where}.datatype of '{name}' must be one of {allowed}, got {datatype!r}",
                field=f"{where}.datatype",
            )
        if binary_data_size is None:
            if "data" not in raw:
                raise InvalidInput(f"{where}.data of '{name}' is missing", field=f"{where}.data")
            array = _json_to_numpy(raw["data"], datatype, shape, f"{where}.data")
            inputs.append(_CheckedInput(name, shape, datatype, array, None))
            continue
        size_field = f"{where}.parameters.binary_data_size"
        if not _non_negative_int(binary_data_size):
            raise InvalidInput(f"{size_field} of '{name}' must be a non-negative integer", field=size_field)
        if "data" in raw:
            raise InvalidInput(
                f"{where} of '{name}' has both data and binary_data_size; send its values one way", field=size_field
            )
        if not binary_part:
            raise InvalidInput(
                f"{size_field}: '{name}' is binary data, so send the body with the header "
                f"{HEADER_LENGTH}: <length of the JSON part in bytes>",
                field=size_field,
            )
        inputs.append(_CheckedInput(name, shape, datatype, None, binary_data_size))

    raw_outputs = request.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise InvalidInput("outputs must be a list", field="outputs")
    outputs = []
    for index, raw in enumerate(raw_outputs):
        where = f"outputs[{index}]"
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{where}.name must be a non-empty string", field=f"{where}.name")
        parameters = _parameters(raw, where)
        class_count = parameters.get("classification", 0)
        if not _non_negative_int(class_count):
            raise InvalidInput(
                f"{where}.parameters.classification must be a non-negative integer",
                field=f"{where}.parameters.classification",
            )
        binary_data = parameters.get("binary_data")
        if binary_data is not None and not isinstance(binary_data, bool):
            raise InvalidInput(
                f"{where}.parameters.binary_data must be true or false", field=f"{where}.parameters.binary_data"
            )
        outputs.append(_CheckedOutput(name, class_count, binary_data))

    request_id = request.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput("id must be a string", field="id")
    return inputs, outputs, request_id


@dataclass(frozen=True)
class InferenceRequestSummary:
    """What a checked inference request asks for: its input `names` and `batch`, the first dimension of its first
    input's shape (None for a request without a JSON header, or whose first input is a scalar)."""

    names: list[str]
    batch: int | None
    #: The parsed JSON header (None without one) and the `binary_data_size` of each input that sends binary
    #: data after it, in order (bytes): what a gateway needs to hand those bytes over another way.
    request: Mapping[str, Any] | None = None
    binary_sizes: tuple[int, ...] = ()


def check_inference_header(header: bytes, header_length: int | None, body_length: int) -> InferenceRequestSummary:
    """Check the start of an inference request before the rest of it is read (a gateway streaming the body).

    `header`: the whole body when `header_length` is None (JSON), else at least its first `header_length` bytes
    (the JSON header of Triton's "Binary Tensor Data Extension"); `body_length`: the body's declared size in
    bytes (Content-Length), which the inputs' `binary_data_size` must add up to with the header. `header_length`
    0 is Triton's raw binary request (no header), left to Triton. Raises `InvalidInput` naming the field.
    """
    if header_length == 0:
        return InferenceRequestSummary(names=[], batch=None)
    inputs, request = _check_request_start(header, header_length, body_length)
    shape = inputs[0].shape if inputs else []
    return InferenceRequestSummary(
        names=[tensor.name for tensor in inputs],
        batch=shape[0] if shape else None,
        request=request,
        binary_sizes=tuple(tensor.binary_data_size for tensor in inputs if tensor.binary_data_size is not None),
    )


def _check_request_start(
    body: bytes, header_length: int | None, body_length: int
) -> tuple[list[_CheckedInput], Mapping[str, Any]]:
    if header_length is not None and not 0 < header_length <= body_length:
        raise InvalidInput(
            f"{HEADER_LENGTH} is {header_length}, but the body has {body_length} bytes; it must be the length of "
            "the JSON part at the start of the body",
            field=HEADER_LENGTH,
        )
    header = body if header_length is None else body[:header_length]
    try:
        # Python's json reads NaN/Infinity as Triton does, so requests Triton accepts pass.
        request = json.loads(header)
    except (ValueError, RecursionError) as exc:
        if header_length is None:
            where, field = "the body", "request"
        else:  # most likely the length is wrong, cutting the header short or taking in binary bytes
            where, field = f"the first {header_length} bytes of the body ({HEADER_LENGTH})", HEADER_LENGTH
        raise InvalidInput(
            f"{where} must be a KServe v2 inference request in JSON ({exc}); binary tensor data goes after a "
            f"JSON header whose length is sent as {HEADER_LENGTH}",
            field=field,
        ) from None
    inputs, _, _ = _check_request_header(request, binary_part=header_length is not None)
    if header_length is not None:
        declared = sum(tensor.binary_data_size or 0 for tensor in inputs)
        if declared != body_length - header_length:
            raise InvalidInput(
                f"the body holds {body_length - header_length} bytes after its {header_length}-byte JSON header, "
                f"but the inputs' binary_data_size add up to {declared}; check {HEADER_LENGTH} and each "
                "binary_data_size",
                field=HEADER_LENGTH,
            )
    return inputs, request


def _error_text(body: bytes) -> str:
    """Triton's error message from an error response body `{"error": "<message>"}`, without the request-id prefix."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        text = parsed["error"]
    return explained_message(_REQUEST_ID_PREFIX.sub("", text.strip())) or "Triton answered with an empty error"
