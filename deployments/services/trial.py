"""Test inference from the console: a form generated from a deployment's signature, an image turned into the input
tensor (Pillow + numpy, on the server), and the answer shown readably (top-k for a classifier).

The request goes through the same `infer` service as the REST API (same role check, same Triton call); nothing
here talks to Triton itself.
"""

from __future__ import annotations

import io
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from conch.errors import InvalidInput
from deployments.services.inference import infer
from tenancy.services import TokenGrant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from deployments.models import Deployment

__all__ = [
    "IMAGE_FIELD",
    "MAX_IMAGE_BYTES",
    "InputField",
    "Preprocessing",
    "TrialResult",
    "inference_form",
    "parse_preprocessing",
    "preprocess_image",
    "run_trial_inference",
]

#: Form field of the uploaded image.
IMAGE_FIELD = "image"
#: Largest image accepted for a test inference (compressed bytes).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
#: Largest decoded image, in pixels: a bigger one is refused before it is decoded in full (a "decompression bomb").
MAX_IMAGE_PIXELS = 50_000_000
#: Example JSON data is written out for inputs up to this many elements; larger ones get an empty list to fill.
EXAMPLE_MAX_ELEMENTS = 4096
#: Classes shown for a classifier-shaped output.
TOP_K = 5
#: Values shown of any other output.
SHOWN_VALUES = 64
#: Size used for an image input whose height or width the model leaves dynamic.
DEFAULT_IMAGE_SIDE = 224


@dataclass(frozen=True)
class InputField:
    """One model input as the test form offers it.

    `shape`: the shape a request sends (the batch axis, and any other dynamic axis, as 1; an image's height and
    width as the model fixes them or DEFAULT_IMAGE_SIDE). `image_layout`: "NCHW" or "NHWC" for an image-shaped FP32
    input (rank 4 with 3 channels first or last), else "". `height`/`width`: the image size sent (0 if not an
    image). `example`: a JSON list for the editor (zeros; [] when the input is larger than EXAMPLE_MAX_ELEMENTS).
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]
    image_layout: str = ""
    height: int = 0
    width: int = 0
    example: list[Any] = field(default_factory=list)

    @property
    def dims_text(self) -> str:
        """The model's dims as a page shows them: `[?, 3, 224, 224]`, `?` for an axis sized per request (the batch
        axis among them)."""
        return "[" + ", ".join(str(size) if size >= 0 else "?" for size in self.dims) + "]"


def inference_form(deployment: Deployment) -> dict[str, Any]:
    """The test form of `deployment`, from its version's inspected signature.

    Returns {"inputs": [InputField], "outputs": [{"name", "datatype", "dims"}], "example_json": a KServe v2
    request body (text) with every input, "image_input": the name of the one image-shaped input when the model
    has exactly one input and it is image-shaped, else ""}.
    """
    signature = deployment.model_version.signature or {"inputs": [], "outputs": []}
    fields = [_input_field(spec) for spec in signature["inputs"]]
    example = {
        "inputs": [
            {"name": item.name, "shape": list(item.shape), "datatype": item.datatype, "data": item.example}
            for item in fields
        ]
    }
    image_input = fields[0].name if len(fields) == 1 and fields[0].image_layout else ""
    return {
        "inputs": fields,
        "outputs": [
            {"name": spec["name"], "datatype": spec["datatype"], "dims": list(spec["dims"])}
            for spec in signature["outputs"]
        ],
        "example_json": json.dumps(example, indent=2),
        "image_input": image_input,
    }


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes an input tensor: resized to `height` × `width` (bilinear), RGB values (0..255) times
    `scale`, then per channel (x - mean) / std, laid out as `layout` ("NCHW" or "NHWC") with a batch axis of 1."""

    layout: str
    height: int
    width: int
    scale: float = 1 / 255
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)


def parse_preprocessing(fields: Mapping[str, Any], *, default: InputField) -> Preprocessing:
    """Read the preprocessing form fields (`layout`, `height`, `width`, `scale`, `mean`, `std`) of an image input.

    `scale` is a number or a fraction ("1/255"); `mean` and `std` three numbers separated by commas or spaces (one
    number stands for all three). A field left empty takes `default`'s layout and size, scale 1/255, mean 0, std 1.
    Raises InvalidInput naming the field.
    """
    layout = str(fields.get("layout") or default.image_layout).strip().upper()
    if layout not in ("NCHW", "NHWC"):
        raise InvalidInput("layout must be NCHW (channels first) or NHWC (channels last).", field="layout")
    height = _side(fields.get("height"), "height", default.height)
    width = _side(fields.get("width"), "width", default.width)
    h_axis, w_axis = (2, 3) if layout == "NCHW" else (1, 2)
    for name, axis, chosen in (("height", h_axis, height), ("width", w_axis, width)):
        fixed = default.dims[axis] if len(default.dims) == 4 else -1
        if fixed > 0 and chosen != fixed:
            raise InvalidInput(
                f"{name} must be {fixed}: the model's input {default.name!r} in layout {layout} has a fixed {name} "
                f"of {fixed}.",
                field=name,
            )
    scale = _number(fields.get("scale"), "scale", 1 / 255)
    mean = _triple(fields.get("mean"), "mean", 0.0)
    std = _triple(fields.get("std"), "std", 1.0)
    if any(value == 0 for value in std):
        raise InvalidInput("std must not contain 0: each channel is divided by its std.", field="std")
    return Preprocessing(layout=layout, height=height, width=width, scale=scale, mean=mean, std=std)


def preprocess_image(data: bytes, preprocessing: Preprocessing) -> np.ndarray:
    """Decode an image (any format Pillow reads), convert to RGB, resize and scale it into an FP32 input tensor.

    Returns a float32 array of shape [1, 3, H, W] (NCHW) or [1, H, W, 3] (NHWC): Pillow's bilinear resize to
    (width, height), then `x * scale`, then `(x - mean[c]) / std[c]` per channel. Raises InvalidInput (field
    `image`) for an empty, oversized, undecodable or too large (pixels) image.
    """
    if not data:
        raise InvalidInput("Choose an image file to send.", field=IMAGE_FIELD)
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidInput(
            f"The image is {len(data)} bytes; send one of at most {MAX_IMAGE_BYTES // (1024 * 1024)} MiB.",
            field=IMAGE_FIELD,
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise InvalidInput(
                    f"The image is {image.width}×{image.height} pixels; send one of at most {MAX_IMAGE_PIXELS} pixels.",
                    field=IMAGE_FIELD,
                )
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidInput(
            f"The file is not an image Pillow can read ({type(exc).__name__}); send a PNG, JPEG, WebP or BMP.",
            field=IMAGE_FIELD,
        ) from None
    resized = rgb.resize((preprocessing.width, preprocessing.height), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.float32) * np.float32(preprocessing.scale)  # [H, W, 3]
    pixels = (pixels - np.asarray(preprocessing.mean, dtype=np.float32)) / np.asarray(preprocessing.std, np.float32)
    if preprocessing.layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels[np.newaxis], dtype=np.float32)


@dataclass(frozen=True)
class TrialResult:
    """A test inference's answer, readable: per output its name, datatype, shape, and either `top` (for a
    classifier-shaped output [1, K], K >= 2: the TOP_K classes with score and probability, and `softmax`: whether
    the probabilities are the softmax of the scores or the scores themselves) or `values`
    (the first SHOWN_VALUES values) with `summary` (min, max, mean). `request`: what was sent, per input
    {name, shape, datatype}."""

    outputs: list[dict[str, Any]]
    request: list[dict[str, Any]]


def run_trial_inference(
    *,
    user: User,
    deployment: Deployment,
    token: TokenGrant | None = None,
    request_json: str | None = None,
    image: bytes | None = None,
    preprocessing_fields: Mapping[str, Any] | None = None,
) -> TrialResult:
    """Send one test inference to `deployment` through `infer` and return its answer readably.

    Either `request_json` (a KServe v2 request body as text, as the form's JSON editor holds it) or `image` with
    `preprocessing_fields` (for a model whose one input is image-shaped; see `parse_preprocessing`). The image
    tensor goes as binary tensor data (Triton "Binary Tensor Data Extension"); outputs come back as JSON. Raises
    InvalidInput naming the field (`request`, `image` — also when `image` is empty: no image chosen —, a
    preprocessing field, or Triton's own complaint), plus
    what `infer` raises (Forbidden, Conflict when not ready, Unavailable).
    """
    form = inference_form(deployment)
    if image is not None:
        if not form["image_input"]:
            raise InvalidInput(
                "This model does not take one image-shaped input; send the request as JSON.", field=IMAGE_FIELD
            )
        spec = form["inputs"][0]
        if not image:
            raise InvalidInput(f"Choose an image for input {spec.name!r}.", field=IMAGE_FIELD)
        array = preprocess_image(image, parse_preprocessing(preprocessing_fields or {}, default=spec))
        payload = array.tobytes()
        header = {
            "inputs": [
                {
                    "name": spec.name,
                    "shape": list(array.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
        head = json.dumps(header).encode()
        answer = infer(user=user, deployment=deployment, body=head + payload, header_length=len(head), token=token)
        sent = [{"name": spec.name, "shape": list(array.shape), "datatype": "FP32"}]
    else:
        body = _request_body(request_json)
        answer = infer(user=user, deployment=deployment, body=body, token=token)
        sent = [
            {"name": item.get("name"), "shape": item.get("shape"), "datatype": item.get("datatype")}
            for item in json.loads(body)["inputs"]
        ]
    return TrialResult(outputs=[_readable(output) for output in _response_outputs(answer.body)], request=sent)


# --- helpers -------------------------------------------------------------------------------------------------


def _input_field(spec: Mapping[str, Any]) -> InputField:
    dims = tuple(int(d) for d in spec["dims"])
    datatype = str(spec["datatype"])
    layout = ""
    if datatype == "FP32" and len(dims) == 4:
        if dims[1] == 3 and dims[3] != 3:
            layout = "NCHW"
        elif dims[3] == 3:
            layout = "NHWC"
    shape = [1 if d < 0 else d for d in dims]
    height = width = 0
    if layout:
        h_axis, w_axis = (2, 3) if layout == "NCHW" else (1, 2)
        height = dims[h_axis] if dims[h_axis] > 0 else DEFAULT_IMAGE_SIDE
        width = dims[w_axis] if dims[w_axis] > 0 else DEFAULT_IMAGE_SIDE
        shape[h_axis], shape[w_axis] = height, width
    count = math.prod(shape)
    example: list[Any] = []
    # JSON carries every number datatype but BF16 (binary only: Triton "HTTP/REST and GRPC Protocol")
    if datatype not in ("BYTES", "BF16") and count <= EXAMPLE_MAX_ELEMENTS:
        zero: Any = False if datatype == "BOOL" else (0.0 if datatype.startswith("FP") else 0)
        example = [zero] * count
    elif datatype == "BYTES" and count <= EXAMPLE_MAX_ELEMENTS:
        example = [""] * count
    return InputField(
        name=str(spec["name"]),
        datatype=datatype,
        dims=dims,
        shape=tuple(shape),
        image_layout=layout,
        height=height,
        width=width,
        example=example,
    )


def _side(raw: Any, name: str, default: int) -> int:
    if raw in (None, ""):
        return default
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 4096:
        raise InvalidInput(f"{name} must be a whole number of pixels from 1 to 4096; got {raw!r}.", field=name)
    return int(text)


def _number(raw: Any, name: str, default: float) -> float:
    if raw in (None, ""):
        return default
    text = str(raw).strip()
    try:
        if "/" in text:
            top, _, bottom = text.partition("/")
            value = float(top) / float(bottom)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise InvalidInput(
            f"{name} must be a number such as 0.0039 or a fraction such as 1/255; got {raw!r}.", field=name
        ) from None
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number; got {raw!r}.", field=name)
    return value


def _triple(raw: Any, name: str, default: float) -> tuple[float, float, float]:
    if raw in (None, ""):
        return (default, default, default)
    parts = [part for part in re.split(r"[\s,]+", str(raw).strip()) if part]
    if len(parts) == 1:
        parts = parts * 3
    if len(parts) != 3:
        raise InvalidInput(
            f"{name} must be one number or three (for R, G and B) separated by commas, such as 0.485, 0.456, 0.406; "
            f"got {raw!r}.",
            field=name,
        )
    values = tuple(_number(part, name, default) for part in parts)
    return values  # type: ignore[return-value]


def _request_body(text: str | None) -> bytes:
    if not text or not text.strip():
        raise InvalidInput('Write the request in the JSON editor: {"inputs": [...]}.', field="request")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"The request is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).", field="request"
        ) from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("inputs"), list) or not parsed["inputs"]:
        raise InvalidInput(
            'The request must be a JSON object with a non-empty "inputs" list (KServe v2).', field="request"
        )
    for index, item in enumerate(parsed["inputs"]):
        if not isinstance(item, dict):
            raise InvalidInput(f"inputs[{index}] must be an object with name, shape, datatype, data.", field="request")
    return json.dumps(parsed).encode()


def _response_outputs(body: bytes) -> list[dict[str, Any]]:
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidInput("Triton's answer was not JSON.", field="request") from None
    outputs = parsed.get("outputs") if isinstance(parsed, dict) else None
    return outputs if isinstance(outputs, list) else []


def _readable(output: Mapping[str, Any]) -> dict[str, Any]:
    shape = [int(d) for d in output.get("shape") or []]
    datatype = str(output.get("datatype") or "")
    data = output.get("data") or []
    readable: dict[str, Any] = {"name": output.get("name"), "datatype": datatype, "shape": shape}
    if datatype.startswith("FP") and len(shape) == 2 and shape[0] == 1 and shape[1] >= 2 and len(data) == shape[1]:
        readable["top"] = top_classes(data, TOP_K)
        readable["softmax"] = not are_probabilities(data)
        return readable
    numbers = data if datatype != "BYTES" else []
    readable["values"] = list(data[:SHOWN_VALUES])
    readable["truncated"] = len(data) > SHOWN_VALUES
    if numbers:
        array = np.asarray(numbers, dtype=np.float64)
        readable["summary"] = {
            "min": float(array.min()),
            "max": float(array.max()),
            "mean": float(array.mean()),
        }
    return readable


def are_probabilities(scores: Sequence[float]) -> bool:
    """True when one row of scores already is a probability distribution: each in [0, 1], summing to 1 (±1e-3)."""
    values = np.asarray(scores, dtype=np.float64)
    return bool(values.min() >= 0 and values.max() <= 1 and abs(values.sum() - 1) < 1e-3)


def top_classes(scores: Sequence[float], k: int) -> list[dict[str, float]]:
    """The `k` highest-scoring classes of one row of scores: [{"index", "score", "probability"}], best first.

    `probability` is the softmax of the scores (computed stably); when the scores already are probabilities
    (each in [0, 1], summing to 1 within 1e-3), they are shown as they are.
    """
    values = np.asarray(scores, dtype=np.float64)
    if are_probabilities(scores):
        probabilities = values
    else:
        shifted = np.exp(values - values.max())
        probabilities = shifted / shifted.sum()
    order = np.argsort(-values, kind="stable")[:k]
    return [{"index": int(i), "score": float(values[i]), "probability": float(probabilities[i])} for i in order]
