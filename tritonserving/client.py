"""Adapter for one Triton server's HTTP API, over `tritonclient.http` (and urllib for the metrics port).

Talks the KServe v2 / Open Inference Protocol ("Health", "Model Ready", "Model Configuration", "Inference") and
Triton's extensions: "Model Repository" (load/unload with an optional configuration override) and "Binary Tensor
Data". Returns plain dicts, numpy arrays, or (`infer_request_body`) Triton's own response bytes. A client built
with `api_key=` sends it in the `X-Conch-Key` header of every request, which the restricted endpoints of a server
Conch started require (Triton "Limit Endpoint Access"). Raises only our errors:

- `TritonUnavailable` (`Unavailable`, 503): connection refused/reset, timeout, or Triton answered 503.
- `TritonRequestError` (`InvalidInput`, 400): Triton rejected the request (bad shape, datatype, input name...)
  or the model failed on it; `detail` is Triton's own message, `status` the HTTP status Triton answered (400 for
  a rejected request, 500 for a model that failed while running), `field` the tensor Triton names, if any.
- `TritonModelNotFound` (`NotFound`, 404): the model is not loaded (or not in the repository).
- `ModelLoadError` (`InvalidInput`): Triton could not load a model; `detail` is Triton's message.
- `TritonAccessDenied` (`ConchError`, 500): Triton refused a restricted endpoint (HTTP 403) because the client's
  API key is missing or is not the server's (see `tritonserving.access`).
- `InvalidInput` naming the field: a malformed JSON inference request, caught before anything is sent.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar
from urllib.parse import quote

import gevent
import numpy as np
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

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

_Result = TypeVar("_Result")


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


def _status(exc: InferenceServerException) -> int | None:
    try:
        return int(exc.status())
    except (TypeError, ValueError):
        return None


# Triton prefixes request errors with "[request id: <id_unknown>] " when the client sent no id.
_REQUEST_ID_PREFIX = re.compile(r"^\[request id: [^\]]*\]\s*")


def _message(exc: InferenceServerException) -> str:
    return _REQUEST_ID_PREFIX.sub("", exc.message() or str(exc))


# The tensor a Triton 2.51 request error is about. Core messages quote it ("inference input 'x' data-type is ...",
# "unexpected shape for input 'x' ...", "unexpected inference input 'z' ...", "unexpected inference output 'o' ...",
# "input 'x' already exists in request", "input byte size mismatch for input 'x' ...", "unexpected size for input
# 'x' ..."); two do not ("invalid datatype for input x", and the missing-input message, which lists names).
_QUOTED_TENSOR = re.compile(r"\b(?:input|output)(?: tensors)? '([^']+)'")
_UNQUOTED_TENSOR = re.compile(r"\b(?:invalid datatype for input|Please use the binary data format for input) (\S+)")
# "expected 3 inputs but got 2 inputs for model 'm'. Got input(s) ['a','b'], but missing required input(s)
# ['c']. Please provide all required input(s)." The missing list is empty when an unknown input took its place.
_MISSING_INPUTS = re.compile(r"missing required input\(s\) \[?([^\]]*)\]")


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


class TritonClient:
    """Client for one Triton server's HTTP endpoint, e.g. `TritonClient("http://127.0.0.1:8000", timeout_s=5)`.

    `timeout_s` (seconds) bounds connecting and each network read/write of every call. `api_key` (the server's key,
    `tritonserving.access.derive_api_key`) is sent as the `X-Conch-Key` header of every request; without it the
    restricted endpoints (load, unload, index, config, statistics...) of a server Conch started answer 403 and
    raise `TritonAccessDenied`, while health and inference work. Safe to share between threads: each thread gets
    its own `tritonclient.http` connection (that client is not thread-safe).
    Raises `InvalidInput` for a non-positive timeout or a malformed key.
    """

    def __init__(self, http_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None) -> None:
        if timeout_s <= 0:
            raise InvalidInput(f"timeout_s must be positive, got {timeout_s}", field="timeout_s")
        self._headers = {API_KEY_HEADER: validate_api_key(api_key)} if api_key is not None else None
        url = http_url.strip().rstrip("/")
        self._ssl = url.startswith("https://")
        self._address = url.split("://", 1)[1] if "://" in url else url
        if not self._address:
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
        client = getattr(self._local, "client", None)
        if client is not None:
            self._local.client = None
            try:
                client.close()
            except (OSError, http.client.HTTPException, InferenceServerException):
                return  # the connection was already broken; dropping it is all closing means

    def _client(self) -> triton_http.InferenceServerClient:
        client = getattr(self._local, "client", None)
        if client is None:
            try:
                client = triton_http.InferenceServerClient(
                    self._address,
                    connection_timeout=self.timeout_s,
                    network_timeout=self.timeout_s,
                    ssl=self._ssl,
                )
            except (InferenceServerException, ValueError, OSError) as exc:
                raise InvalidInput(f"cannot use Triton URL {self.http_url}: {exc}", field="http_url") from None
            self._local.client = client
        return client

    def _call(self, action: str, call: Callable[[triton_http.InferenceServerClient], _Result]) -> _Result:
        """Run one tritonclient call; turn transport failures into `TritonUnavailable`, a 403 into `TritonAccessDenied`.

        Any other `InferenceServerException` is re-raised as is for the caller to classify.
        """
        try:
            return call(self._client())
        except InferenceServerException as exc:
            if _status(exc) == 403:
                key_note = "the key Conch sent is not this server's" if self._headers else "Conch sent no API key"
                raise TritonAccessDenied(
                    f"Triton at {self.http_url} refused {action}: {_message(exc)} ({key_note}). The server was "
                    "started with another key; restart it so it gets the current one."
                ) from None
            raise
        except (OSError, http.client.HTTPException, gevent.Timeout) as exc:
            self.close()  # the connection may be half-used; start clean next time
            kind = "timed out" if isinstance(exc, (TimeoutError, gevent.Timeout)) else "failed"
            raise TritonUnavailable(f"Triton at {self.http_url} {kind} while {action}: {exc}") from None

    def _translate(self, exc: InferenceServerException, model_name: str, sent_inputs: Sequence[str] = ()) -> ConchError:
        return self._error_for(_status(exc), _message(exc), model_name, sent_inputs)

    def _error_for(
        self, status: int | None, message: str, model_name: str, sent_inputs: Sequence[str] = ()
    ) -> ConchError:
        """Classify Triton's answer `status`/`message` to a request on `model_name` that sent `sent_inputs`."""
        if status == 404 or "unknown model" in message:
            return TritonModelNotFound(f"model '{model_name}' is not loaded on {self.http_url}: {message}")
        if status == 503:
            return TritonUnavailable(f"Triton at {self.http_url} is unavailable: {message}")
        field = _named_tensor(message)
        if field is None and _MISSING_INPUTS.search(message):
            field = self._unknown_input(model_name, sent_inputs)
        return TritonRequestError(message, status=status, field=field)

    def _unknown_input(self, model_name: str, sent_inputs: Sequence[str]) -> str | None:
        """The first of `sent_inputs` the model does not have (model metadata, KServe v2 "Model Metadata")."""
        try:
            metadata = self._call(f"reading the metadata of '{model_name}'", lambda c: c.get_model_metadata(model_name))
        except (TritonUnavailable, InferenceServerException):
            return None
        known = {item.get("name") for item in metadata.get("inputs", [])}
        return next((name for name in sent_inputs if name not in known), None)

    def is_ready(self) -> bool:
        """Whether the server answers `GET /v2/health/ready` with 200 (KServe v2 "Health"); False when unreachable."""
        try:
            return bool(self._call("checking readiness", lambda client: client.is_server_ready(headers=self._headers)))
        except (TritonUnavailable, InferenceServerException):
            return False

    def model_ready(self, name: str) -> bool:
        """Whether model `name` is loaded and ready (`GET /v2/models/<name>/ready`). Raises `TritonUnavailable`."""
        try:
            return bool(
                self._call(
                    f"checking model '{name}'", lambda client: client.is_model_ready(name, headers=self._headers)
                )
            )
        except InferenceServerException:
            return False

    def load_model(self, name: str, *, config_json: str | None = None) -> None:
        """Load (or reload) model `name` from the server's repository and wait until Triton has done so.

        `config_json` (JSON text of a ModelConfig) replaces the repository's `config.pbtxt` for this load
        (Triton "Model Repository" extension, "Load", parameter `config`).
        A restricted endpoint: needs the server's `api_key`. Raises `ModelLoadError` with Triton's message,
        `InvalidInput` for config text that is not JSON, `TritonAccessDenied`, `TritonUnavailable`.
        """
        if config_json is not None:
            try:
                json.loads(config_json)
            except ValueError as exc:
                raise InvalidInput(f"config_json is not valid JSON: {exc}", field="config_json") from None
        try:
            self._call(
                f"loading model '{name}'",
                lambda client: client.load_model(name, config=config_json, headers=self._headers),
            )
        except InferenceServerException as exc:
            if _status(exc) == 503:
                raise TritonUnavailable(f"Triton at {self.http_url} is unavailable: {_message(exc)}") from None
            raise ModelLoadError(_message(exc)) from None

    def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Ask Triton to unload model `name` (Triton "Model Repository" extension, "Unload").

        Triton answers once the unload has started; `model_ready` is False from then on, while in-flight
        requests finish. Unloading a model that is not loaded succeeds. A restricted endpoint: needs the server's
        `api_key`. Raises `TritonRequestError`, `TritonAccessDenied`, `TritonUnavailable`.
        """
        try:
            self._call(
                f"unloading model '{name}'",
                lambda client: client.unload_model(name, unload_dependents=unload_dependents, headers=self._headers),
            )
        except InferenceServerException as exc:
            raise self._translate(exc, name) from None

    def model_config(self, name: str) -> dict[str, Any]:
        """Return the configuration Triton serves model `name` with, as JSON (the filled-in ModelConfig).

        A restricted endpoint: needs the server's `api_key`. Raises `TritonModelNotFound`, `TritonAccessDenied`,
        `TritonUnavailable`.
        """
        try:
            return self._call(
                f"reading the config of '{name}'", lambda client: client.get_model_config(name, headers=self._headers)
            )
        except InferenceServerException as exc:
            raise self._translate(exc, name) from None

    def repository_index(self) -> list[dict[str, Any]]:
        """List the models in the server's repository (Triton "Model Repository" extension, "Index").

        Returns `[{"name": str, "version"?: str, "state"?: "READY"|"UNAVAILABLE"|..., "reason"?: str}]` as Triton
        answers it. A restricted endpoint: needs the server's `api_key`. Raises `TritonAccessDenied`,
        `TritonRequestError`, `TritonUnavailable`.
        """
        try:
            return list(
                self._call(
                    "listing the model repository",
                    lambda client: client.get_model_repository_index(headers=self._headers),
                )
            )
        except InferenceServerException as exc:
            raise self._translate(exc, "") from None

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

    def infer_json(self, name: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """Run one KServe v2 JSON inference request body on model `name`; return Triton's response body.

        `request`: `{"id"?: str, "inputs": [{"name", "shape": [int...], "datatype": "FP32"|..., "data": [...]}],
        "outputs"?: [{"name", "parameters"?: {"classification": int}}]}` with `data` flat or nested in row-major
        order ("Inference Request JSON Object"). Request-level `parameters` are not forwarded. Tensors travel as
        binary data; the response comes back as `{"model_name", "model_version", "id"?, "outputs": [{"name",
        "datatype", "shape", "data"}]}` with `data` a flat JSON list (BYTES as UTF-8 text).
        Raises `InvalidInput` naming the malformed field (e.g. `inputs[0].shape`), `TritonRequestError` (Triton's
        message), `TritonModelNotFound`, `TritonUnavailable`.
        """
        inputs, outputs, request_id = _parse_json_request(request)
        try:
            result = self._call(
                f"running model '{name}'",
                lambda client: client.infer(
                    name, inputs, outputs=outputs or None, request_id=request_id, headers=self._headers
                ),
            )
        except InferenceServerException as exc:
            raise self._translate(exc, name, [tensor.name() for tensor in inputs]) from None
        response = dict(result.get_response())
        converted = []
        for output in response.get("outputs", []):
            item = {key: value for key, value in output.items() if key != "parameters"}
            parameters = {k: v for k, v in (output.get("parameters") or {}).items() if k != "binary_data_size"}
            if parameters:
                item["parameters"] = parameters
            item["data"] = _numpy_to_json(result.as_numpy(output["name"]))
            converted.append(item)
        response["outputs"] = converted
        return response

    def infer_numpy(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run model `name` on numpy tensors sent as binary data; return the outputs by name.

        The Triton datatype follows each array's dtype (float32 -> FP32, int64 -> INT64, bool -> BOOL, object /
        bytes / str -> BYTES). `outputs` picks outputs by name (None: all the model's outputs). `version` sends
        the request to that version (`/v2/models/<name>/versions/<version>/infer`); None lets Triton pick (the
        highest ready version, KServe v2 "Inference"). Returned arrays are read-only views of the response body
        (BYTES come back as object arrays of `bytes`).
        Raises `InvalidInput` (unsupported dtype), `TritonRequestError`, `TritonModelNotFound`, `TritonUnavailable`.
        """
        infer_inputs = []
        for input_name, value in inputs.items():
            array = np.asarray(value)
            if array.dtype.kind == "U":
                encoded = [text.encode("utf-8") for text in array.ravel()]
                array = np.array(encoded, dtype=np.object_).reshape(array.shape)
            datatype = np_to_triton_dtype(array.dtype)
            if datatype is None or datatype == "BF16":
                message = f"input '{input_name}': dtype {array.dtype} has no Triton datatype"
                raise InvalidInput(message, field=input_name)
            tensor = triton_http.InferInput(input_name, list(array.shape), datatype)
            try:
                tensor.set_data_from_numpy(array, binary_data=True)
            except InferenceServerException as exc:
                raise InvalidInput(f"input '{input_name}': {_message(exc)}", field=input_name) from None
            infer_inputs.append(tensor)
        requested = [triton_http.InferRequestedOutput(output, binary_data=True) for output in outputs or ()]
        try:
            result = self._call(
                f"running model '{name}'",
                lambda client: client.infer(
                    name,
                    infer_inputs,
                    model_version="" if version is None else str(version),
                    outputs=requested or None,
                    headers=self._headers,
                ),
            )
        except InferenceServerException as exc:
            raise self._translate(exc, name, list(inputs)) from None
        return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response().get("outputs", [])}

    def infer_request_body(self, name: str, body: bytes, *, header_length: int | None = None) -> InferenceResponse:
        """Send an inference request body to model `name` as the client wrote it; return Triton's answer unchanged.

        `body` is a KServe v2 "Inference Request JSON Object" (`header_length` None), or, with Triton's "Binary
        Tensor Data Extension", that JSON header followed by the raw bytes of the inputs that declare
        `parameters.binary_data_size` (`header_length`: the header's length in bytes, the client's
        `Inference-Header-Content-Length`; 0 is Triton's raw request: the body is the one input's bytes). Outputs
        come back as Triton writes them: JSON `data` (non-finite floats as `NaN`/`Infinity`), or binary when the
        request asks (`parameters.binary_data` on an output, `binary_data_output` on the request).
        The header is checked before anything is sent (Triton answers 500 to a malformed one): `InvalidInput`
        names the field (`inputs[0].shape`, `inputs[1].parameters.binary_data_size`, `Inference-Header-Content-
        Length`, ...). Shared-memory parameters are refused: clients of Conch cannot register regions.
        Raises `InvalidInput`, `TritonRequestError` (Triton's message; `field` the tensor it names),
        `TritonModelNotFound`, `TritonUnavailable`.
        """
        sent_inputs = _check_request_body(body, header_length)
        headers = {"Content-Type": "application/json"}
        if header_length is not None:
            headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
        status, response_headers, answer = self._post(
            f"/v2/models/{quote(name, safe='')}/infer", body, headers, action=f"running model '{name}'"
        )
        if status == 200:
            raw_length = response_headers.get(HEADER_LENGTH)
            return InferenceResponse(
                body=answer,
                content_type=response_headers.get("Content-Type", "application/json"),
                header_length=int(raw_length) if raw_length and raw_length.isascii() and raw_length.isdigit() else None,
            )
        raise self._error_for(status, _error_text(answer), name, sent_inputs)

    def _post(
        self, path: str, body: bytes, headers: Mapping[str, str], *, action: str
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """POST `body` to `path` on a fresh connection; return (status, headers, body) (see `_exchange`).

        tritonclient has no call that sends a request body as is, so this one speaks HTTP/1.1 itself.
        """
        return self._exchange("POST", path, body, dict(headers), action=action)

    def _exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str], *, action: str
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request on a fresh connection; return (status, headers, body). Raises `TritonUnreachable` when no
        connection opens (nothing was sent), `TritonUnavailable` when it fails after that."""
        connection_class = http.client.HTTPSConnection if self._ssl else http.client.HTTPConnection
        connection = connection_class(self._address, timeout=self.timeout_s)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise TritonUnreachable(f"Triton at {self.http_url} cannot be reached while {action}: {exc}") from None
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        except (OSError, http.client.HTTPException) as exc:
            kind = "timed out" if isinstance(exc, TimeoutError) else "failed"
            raise TritonUnavailable(f"Triton at {self.http_url} {kind} while {action}: {exc}") from None
        finally:
            connection.close()

    @staticmethod
    def fetch_metrics_text(metrics_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Return the Prometheus text exposition served at `metrics_url` (e.g. `http://127.0.0.1:8002/metrics`).

        Triton serves it on its own metrics port (Triton docs, "Metrics"), apart from the HTTP API, hence a
        static method: `TritonClient.fetch_metrics_text(url, timeout_s=5)`. `timeout_s` bounds connecting and
        reading (seconds). Raises `TritonUnavailable` on any connection error, timeout or non-200 answer.
        """
        try:
            with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
                return response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise TritonUnavailable(f"Triton metrics at {metrics_url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            raise TritonUnavailable(f"Triton metrics at {metrics_url} cannot be read: {exc}") from None


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


def _check_request_body(body: bytes, header_length: int | None) -> list[str]:
    """Check an inference request body before it goes to Triton; return the names of the inputs it sends.

    `header_length` None: `body` is JSON. A number: the JSON header's length, binary tensor data follows, and
    the inputs' `binary_data_size` must add up to the bytes after the header. 0: Triton's raw binary request
    (no header; the body is the model's single input), left to Triton to check.
    Raises `InvalidInput` naming the field.
    """
    if header_length == 0:
        return []
    return [tensor.name for tensor in _check_request_start(body, header_length, len(body))[0]]


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


def _parse_json_request(
    request: Mapping[str, Any],
) -> tuple[list[triton_http.InferInput], list[triton_http.InferRequestedOutput], str]:
    """Validate a KServe v2 JSON request body and build tritonclient inputs/outputs from it."""
    checked_inputs, checked_outputs, request_id = _check_request_header(request, binary_part=False)
    inputs = []
    for checked in checked_inputs:
        tensor = triton_http.InferInput(checked.name, checked.shape, checked.datatype)
        tensor.set_data_from_numpy(checked.array, binary_data=True)
        inputs.append(tensor)
    outputs = [
        triton_http.InferRequestedOutput(checked.name, binary_data=True, class_count=checked.class_count)
        for checked in checked_outputs
    ]
    return inputs, outputs, request_id


def _error_text(body: bytes) -> str:
    """Triton's error message from an error response body `{"error": "<message>"}`, without the request-id prefix."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        text = parsed["error"]
    return _REQUEST_ID_PREFIX.sub("", text.strip()) or "Triton answered with an empty error"


def _numpy_to_json(array: np.ndarray | None) -> list[Any]:
    if array is None:
        return []
    if array.dtype == np.object_:
        return [
            item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item) for item in array.ravel()
        ]
    return array.ravel().tolist()
