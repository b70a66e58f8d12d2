"""Pure helpers for the build's verify step: sample requests, the batching proof, and the shape check.

The verify step runs real inferences on a scratch Triton because some models declare shapes their graph does not
produce, and because only running a model proves that joining requests along axis 0 gives each request its own
result. This module owns the pure halves of that step, and performs no I/O:

- sample inputs: generated from the model configuration, or given by the user (`UserSamples`: an `.npz` of named
  arrays, read by `read_sample_arrays`, and per-input values such as `sr=16000`, read by `parse_sample_values`);
- the batching proof: `join_samples` concatenates two samples on axis 0 and `compare_joined_outputs` requires the
  joined run to give each sample the outputs it gets alone, within a tolerance;
- the shape check: `check_output_shapes` compares what came back with what the configuration promises.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from builds.inspection import ModelSignature
from conch.errors import InvalidInput, PayloadTooLarge
from tritonserving.config import ModelConfig, datatype_name, numpy_of_datatype

__all__ = [
    "DEFAULT_DYNAMIC_SIZE",
    "MAX_SAMPLE_INPUTS_BYTES",
    "PROBE_DYNAMIC_SIZE",
    "SAMPLE_BYTES",
    "SAMPLE_INPUTS_FIELD",
    "SAMPLE_VALUES_FIELD",
    "BatchCheck",
    "ObservedShapes",
    "SampleLimits",
    "UserSamples",
    "VerificationError",
    "check_output_shapes",
    "check_sample_archive",
    "compare_joined_outputs",
    "describe_sample_arrays",
    "describe_sample_inputs",
    "join_samples",
    "make_sample_inputs",
    "merge_observed_shapes",
    "output_shape_mismatches",
    "parse_sample_values",
    "read_sample_arrays",
]

#: Size given to every dynamic (-1) axis of a generated sample input, except the batch axis of a batching
#: configuration (a batch of one). 64 is a multiple of 32, the total stride of detection backbones such as
#: PP-OCR's (smaller or odd sizes break their feature-pyramid additions), it is small enough for recognition models
#: whose height must pool down to 1, and it is a short valid sequence length for text models. Checked against every
#: model in DESIGN.md "Real models for demos and tests". Axes sharing a symbolic name get one size.
DEFAULT_DYNAMIC_SIZE = 64

#: Size given to every dynamic axis of the probe sample that verify runs when an output does not come back in the
#: shape the model file declares: it differs from DEFAULT_DYNAMIC_SIZE, so an output axis that follows an input's
#: dynamic axis shows that it varies (and becomes -1), and is a multiple of 32 for the reasons given there.
PROBE_DYNAMIC_SIZE = 96

#: Element used to fill BYTES (TYPE_STRING) inputs of the first sample; the second sample uses `_SECOND_BYTES`.
SAMPLE_BYTES = b"conch"
_SECOND_BYTES = b"triton"

#: Form fields of an upload (and of a rebuild) that carry sample inputs.
SAMPLE_INPUTS_FIELD = "sample_inputs"
SAMPLE_VALUES_FIELD = "sample_values"

#: Largest accepted `.npz` of sample inputs, in bytes (a sample is one or two requests, not a data set).
MAX_SAMPLE_INPUTS_BYTES = 32 * 1024 * 1024
_MAX_SAMPLE_ARRAYS = 256
#: Longest .npy header read (numpy's own default limit for `allow_pickle=False` loads).
_MAX_NPY_HEADER_BYTES = 10_000
_MAX_SAMPLE_VALUES_CHARS = 65_536
_NAME_RE = re.compile(r"[^\s=;]+")

# Tolerances of the batching proof (|joined - alone| <= atol * scale + rtol * |alone|, scale = max(1, max|alone|)):
# batched kernels may add in another order, which moves float32 results by ~1e-6 of their magnitude; data mixed
# between samples (a softmax or statistics over axis 0) moves them by far more.
_TOLERANCES: dict[str, tuple[float, float]] = {"f2": (1e-2, 1e-3), "f4": (1e-3, 1e-4), "f8": (1e-6, 1e-7)}


class VerificationError(InvalidInput):
    """A sample inference showed the model does not behave as its configuration says (HTTP 400, field "file")."""

    def __init__(self, detail: str, *, field: str = "file") -> None:
        super().__init__(detail, field=field)


@dataclass(frozen=True)
class UserSamples:
    """Sample inputs a user supplied with an upload or a rebuild; verify uses them instead of generated ones.

    Attributes:
        arrays: input name -> array in the shape the model itself takes (the ONNX input shape, as one would feed
            onnxruntime: a scalar input is a 0-d array), from the `.npz` of `read_sample_arrays`. With batching, a
            sample request takes one item of axis 0 (the first for the first sample, the second, if there is
            one, for the second sample).
        values: input name -> a JSON value from `parse_sample_values`: a number, bool or string fills the input's
            generated shape (a scalar input gets exactly it); a (nested) list is a whole array like `arrays`.
            A value wins over an array of the same name.
    """

    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)

    def origin(self, name: str) -> str:
        """Where input `name` of a sample comes from: "sample_values", "sample_inputs" or "generated"."""
        if name in self.values:
            return SAMPLE_VALUES_FIELD
        if name in self.arrays:
            return SAMPLE_INPUTS_FIELD
        return "generated"


@dataclass(frozen=True)
class BatchCheck:
    """Outcome of the batching proof: `problem` says which output differed and how ("" when none did).

    `max_difference` is the largest absolute difference seen between an output of the joined run and the same
    output alone (0.0 for exact types), for the build log.
    """

    problem: str
    max_difference: float


# --- user samples ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleLimits:
    """Limits of an `.npz` of sample inputs once unpacked (settings CONCH_MAX_SAMPLE_UNPACKED_BYTES and
    CONCH_MAX_SAMPLE_ARRAYS): the bytes of all its arrays together, and how many arrays (zip members) it holds."""

    max_unpacked_bytes: int
    max_arrays: int


@dataclass(frozen=True)
class _Member:
    """One array of an `.npz`, as its zip directory entry and its .npy header declare it."""

    info: zipfile.ZipInfo
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    header_bytes: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize


def check_sample_archive(data: bytes, *, limits: SampleLimits) -> dict[str, dict[str, Any]]:
    """Check an `.npz` of sample inputs without unpacking its arrays; return their description by input name.

    What the web process runs on an upload's or a rebuild's samples. Reads the zip central directory (member
    count, each member's declared unpacked size) and each member's .npy header (dtype, shape: a few hundred bytes
    unpacked), and refuses: more than `limits.max_arrays` members, declared sizes (directory or headers) past
    `limits.max_unpacked_bytes`, a header that disagrees with its directory entry (header + shape x itemsize ==
    declared size), a member that is not a .npy array of numbers, bools or text, a name given twice. The arrays'
    data is not unpacked here: the worker's `read_sample_arrays` reads it, within the same limits, and checks each
    member's end and CRC-32 (a file whose data is damaged fails the build's verify step, field "sample_inputs").

    Returns:
        {name: {"dtype": "float32", "shape": [1, 512]}}, as `describe_sample_arrays` gives for the read arrays.

    Raises:
        PayloadTooLarge: field "sample_inputs", naming the limit, its setting, and the array at fault (HTTP 413).
        InvalidInput: field "sample_inputs" for a file that is not a valid `.npz` of number, bool or text arrays.
    """
    archive, members = _open_sample_archive(data, limits)
    archive.close()
    return {m.name: {"dtype": str(m.dtype), "shape": list(m.shape)} for m in members}


def read_sample_arrays(data: bytes, *, limits: SampleLimits) -> dict[str, np.ndarray]:
    """Read the `.npz` of sample inputs (numpy.savez / savez_compressed), keyed by input name.

    Arrays must be numbers, bools or text (unicode or bytes strings); object arrays (pickles) are refused unread.
    At most MAX_SAMPLE_INPUTS_BYTES bytes packed. The limits of `check_sample_archive` are checked first, from
    the directory and headers, so no array past them is ever allocated; each array is then read into a buffer of
    the size its header declares, and the member must end there and match its CRC-32.

    Raises:
        PayloadTooLarge: field "sample_inputs", naming the limit and the array (HTTP 413).
        InvalidInput: field "sample_inputs", naming the problem and how to write a valid file.
    """
    archive, members = _open_sample_archive(data, limits)
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for member in members:
            with archive.open(member.info) as stream:
                _read_exactly(stream, member.header_bytes, member.name)
                buffer = bytearray(member.nbytes)
                view = memoryview(buffer)
                filled = 0
                while filled < member.nbytes:
                    got = _read_into(stream, view[filled:], member.name)
                    if not got:
                        raise _unreadable(member.name, "it ends before the size its header declares")
                    filled += got
                _expect_end(stream, member.name)
            array = np.frombuffer(buffer, dtype=member.dtype)
            order = "F" if member.fortran_order else "C"
            arrays[member.name] = array.reshape(member.shape, order=order)
    return arrays


_HOW_TO_WRITE = (
    "Write it with numpy: numpy.savez('samples.npz', input_name=array, ...), one array per model input, each "
    "in the shape the model takes (as you would pass it to onnxruntime)."
)


def _open_sample_archive(data: bytes, limits: SampleLimits) -> tuple[zipfile.ZipFile, list[_Member]]:
    """Open an `.npz` and check its directory and headers against `limits` before any array is unpacked."""
    if len(data) > MAX_SAMPLE_INPUTS_BYTES:
        raise _samples_error(
            f"The sample inputs file is {len(data):,} bytes; at most {MAX_SAMPLE_INPUTS_BYTES:,} are accepted. "
            "Send one or two requests' worth of inputs, not a data set."
        )
    if not data:
        raise _samples_error(f"The sample inputs file is empty. {_HOW_TO_WRITE}")
    if data.startswith(b"\x93NUMPY"):
        raise _samples_error(
            f"The sample inputs file holds a single .npy array, not a named .npz archive. {_HOW_TO_WRITE}"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise _samples_error(f"The sample inputs file is not a numpy .npz archive ({error}). {_HOW_TO_WRITE}") from None
    try:
        members = _read_members(archive, limits)
    except BaseException:
        archive.close()
        raise
    return archive, members


def _read_members(archive: zipfile.ZipFile, limits: SampleLimits) -> list[_Member]:
    infos = [info for info in archive.infolist() if not info.is_dir()]
    if not infos:
        raise _samples_error(f"The sample inputs file holds no arrays. {_HOW_TO_WRITE}")
    if len(infos) > limits.max_arrays:
        raise _samples_too_large(
            f"The sample inputs file holds {len(infos):,} arrays; at most {limits.max_arrays:,} are accepted "
            "(CONCH_MAX_SAMPLE_ARRAYS). Send one array per model input."
        )
    declared = sum(info.file_size for info in infos)
    if declared > limits.max_unpacked_bytes + len(infos) * _MAX_NPY_HEADER_BYTES:
        largest = max(infos, key=lambda info: info.file_size)
        raise _samples_too_large(
            f"The sample inputs file unpacks to {declared:,} bytes (its archive says so; "
            f"{_member_name(largest.filename)!r} alone is {largest.file_size:,}); at most "
            f"{limits.max_unpacked_bytes:,} are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES). {_ONE_OR_TWO}"
        )
    members = []
    total = 0
    for info in infos:
        member = _read_header(archive, info)
        total += member.nbytes
        if member.nbytes > limits.max_unpacked_bytes or total > limits.max_unpacked_bytes:
            raise _samples_too_large(
                f"Array {member.name!r} of the sample inputs file is {member.dtype} {list(member.shape)}, "
                f"{member.nbytes:,} bytes unpacked (all arrays up to it: {total:,}); at most "
                f"{limits.max_unpacked_bytes:,} are accepted (CONCH_MAX_SAMPLE_UNPACKED_BYTES). {_ONE_OR_TWO}"
            )
        if member.header_bytes + member.nbytes != info.file_size:
            raise _unreadable(
                member.name,
                f"its header declares {list(member.shape)} {member.dtype} ({member.nbytes:,} bytes) but the archive "
                f"declares {info.file_size - member.header_bytes:,} bytes of data",
            )
        members.append(member)
    names = [member.name for member in members]
    if len(set(names)) != len(names):
        raise _samples_error(f"The sample inputs file holds an array name twice. {_HOW_TO_WRITE}")
    return members


def _read_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Member:
    """Read a member's .npy header (magic, version, dict) from its first unpacked bytes; nothing more."""
    name = _member_name(info.filename)
    try:
        with archive.open(info) as stream:
            head = stream.read(10)
            if len(head) < 10 or not head.startswith(b"\x93NUMPY"):
                raise _samples_error(
                    f"The sample inputs file holds {name!r}, which is not a .npy array: a .npz archive holds only "
                    f"arrays. {_HOW_TO_WRITE}"
                )
            major = head[6]
            if major == 1:
                length, prefix = int.from_bytes(head[8:10], "little"), 10
            elif major in (2, 3):
                head += stream.read(2)
                length, prefix = int.from_bytes(head[8:12], "little"), 12
            else:
                raise _unreadable(name, f".npy format version {major} is not known")
            if length > _MAX_NPY_HEADER_BYTES:
                raise _unreadable(name, f"its header is {length:,} bytes long")
            text = stream.read(length)
            if len(text) != length:
                raise _unreadable(name, "it ends inside its header")
            fp = io.BytesIO(head[8:] + text)  # past the magic and version: what numpy's header readers take
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran_order, dtype = read_header(fp, max_header_size=_MAX_NPY_HEADER_BYTES)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as error:
        raise _unreadable(name, str(error)) from None
    if dtype.hasobject or dtype.kind not in "biufUS":
        raise _samples_error(
            f"Array {name!r} of the sample inputs file has dtype {dtype}; object arrays and pickled data are not "
            f"accepted: use numbers, bools or text. {_HOW_TO_WRITE}"
        )
    return _Member(
        info=info,
        name=name,
        dtype=dtype,
        shape=tuple(int(d) for d in shape),
        fortran_order=bool(fortran_order),
        header_bytes=prefix + length,
    )


def _read_exactly(stream: Any, size: int, name: str) -> bytes:
    try:
        data = stream.read(size)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise _unreadable(name, str(error)) from None
    if len(data) != size:
        raise _unreadable(name, "it ends before the size its header declares")
    return data


def _read_into(stream: Any, view: memoryview, name: str) -> int:
    try:
        return stream.readinto(view)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise _unreadable(name, str(error)) from None


def _expect_end(stream: Any, name: str) -> None:
    """Read past the member's last byte: zipfile checks the CRC-32 when its declared size is reached."""
    try:
        extra = stream.read(1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise _unreadable(name, str(error)) from None
    if extra:
        raise _unreadable(name, "it holds more bytes than its header declares")


def _member_name(filename: str) -> str:
    return filename[:-4] if filename.endswith(".npy") else filename


def _unreadable(name: str, why: str) -> InvalidInput:
    return _samples_error(
        f"Array {name!r} of the sample inputs file cannot be read ({why}); object arrays and pickled data are not "
        f"accepted. {_HOW_TO_WRITE}"
    )


def _samples_too_large(detail: str) -> PayloadTooLarge:
    return PayloadTooLarge(detail, field=SAMPLE_INPUTS_FIELD)


_ONE_OR_TWO = "Send one or two requests' worth of inputs, not a data set."


def describe_sample_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Return a JSON-ready description {name: {"dtype": "float32", "shape": [1, 512]}} of sample arrays."""
    return {name: {"dtype": str(array.dtype), "shape": [int(d) for d in array.shape]} for name, array in arrays.items()}


def parse_sample_values(raw: Any) -> dict[str, Any]:
    """Parse per-input sample values: text such as "sr=16000; lang=en" or a JSON object {"sr": 16000}.

    Text: `name=value` entries separated by `;`, newlines, or commas outside brackets; each value is read as JSON
    (16000, 0.5, true, [[1, 2]], "text") and, when it is not JSON, kept as text. Empty text gives {}.

    Returns:
        input name -> JSON value (numbers, bools, strings, nested lists of them).

    Raises:
        InvalidInput: field "sample_values", showing the entry at fault and the expected form.
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, str):
        if len(raw) > _MAX_SAMPLE_VALUES_CHARS:
            raise _values_error(f"sample_values is {len(raw):,} characters long; at most {_MAX_SAMPLE_VALUES_CHARS:,}.")
        items = []
        for entry in _split_entries(raw):
            name, sep, text = entry.partition("=")
            if not sep or not name.strip():
                raise _values_error(
                    f"sample_values entry {entry.strip()!r} is not of the form name=value; write for example "
                    "sr=16000; several entries are separated by ';'."
                )
            text = text.strip()
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            items.append((name.strip(), value))
    else:
        raise _values_error(
            f"sample_values must be text such as 'sr=16000' or a JSON object such as {{\"sr\": 16000}}; got "
            f"{type(raw).__name__}."
        )
    if len(items) > _MAX_SAMPLE_ARRAYS:
        raise _values_error(f"sample_values gives {len(items)} inputs; at most {_MAX_SAMPLE_ARRAYS}.")
    values: dict[str, Any] = {}
    for name, value in items:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _values_error(f"sample_values names an input {name!r}; input names have no spaces, '=' or ';'.")
        if name in values:
            raise _values_error(f"sample_values gives input {name!r} more than once; give each input once.")
        if not _is_json_tensor_value(value):
            raise _values_error(
                f"sample_values gives input {name!r} the value {value!r}; use a number, true/false, text, or a "
                "nested list of them."
            )
        values[name] = value
    return values


def describe_sample_inputs(inputs: Mapping[str, np.ndarray], samples: UserSamples | None = None) -> list[str]:
    """Describe a sample request for logs and messages: one "name dtype [shape] (origin)" text per input."""
    samples = samples or UserSamples()
    lines = []
    for name, array in inputs.items():
        origin = samples.origin(name)
        if origin == "generated":
            origin = "generated: " + _generated_values(array)
        lines.append(f"{name} {array.dtype} {list(array.shape)} ({origin})")
    return lines


# --- sample requests ------------------------------------------------------------------------------------------


def make_sample_inputs(
    config: ModelConfig,
    *,
    signature: ModelSignature | None = None,
    samples: UserSamples | None = None,
    item: int = 0,
    dynamic_size: int = DEFAULT_DYNAMIC_SIZE,
    seed: int = 0,
    rows: int = 1,
) -> dict[str, np.ndarray]:
    """Build one valid request's inputs from a model configuration, keyed by input name, in config order.

    Shapes are what a Triton client sends for this configuration: `[1, *dims]` when max_batch_size > 0 (a batch
    of one, Triton "Model Configuration" -> "Maximum Batch Size"), else `dims`. A dynamic axis of a generated
    input is 1 on the batch axis, else `dynamic_size`, except that axes sharing a symbolic name (from
    `signature`, e.g. MiniLM's "sequence") get one size, taken from a user array when one fixes it.

    User samples (`samples`) are given in the model's own shapes and are checked against them: the rank, every
    fixed axis, and the datatype (numbers are converted when no value is lost in kind: ints to floats, int32 to
    int64; text to BYTES). A scalar input is sent as `[1]` (Triton's dims for a scalar), a `[batch]` input with
    an empty reshape as `[n, 1]`.

    Generated values: floats uniform in [0, 1) from a generator seeded with (`seed`, `item`), so two calls give
    equal arrays; integers 1 (item 0) or 0 (item 1), valid token ids, masks, indexes and byte values for the
    models here; BOOL True/False; BYTES `SAMPLE_BYTES` / b"triton". `item` 1 makes a second, different sample
    for the batching proof. `rows` > 1 (a batching configuration only) makes a batch of that many samples instead
    of one: generated inputs get `rows` on axis 0, user arrays give their first `rows` samples (all they have when
    fewer).

    Raises:
        InvalidInput: field "sample_inputs" or "sample_values" when a user sample names no input of the model, or
            has the wrong rank, size or datatype.
        ValueError: dynamic_size < 1, item not 0 or 1, rows < 1, or an input with a datatype the config schema lacks.
    """
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    if dynamic_size < 1:
        raise ValueError(f"dynamic_size must be at least 1, got {dynamic_size}")
    if item not in (0, 1):
        raise ValueError(f"item must be 0 or 1, got {item}")
    samples = samples or UserSamples()
    batching = config.max_batch_size > 0
    names = [tensor.name for tensor in config.input]
    for source, given in ((SAMPLE_INPUTS_FIELD, samples.arrays), (SAMPLE_VALUES_FIELD, samples.values)):
        unknown = [name for name in given if name not in names]
        if unknown:
            raise InvalidInput(
                f"{source} names {', '.join(repr(n) for n in unknown)}, which the model does not take; its inputs "
                f"are {', '.join(repr(n) for n in names)}.",
                field=source,
            )
    specs = {spec.name: spec for spec in signature.inputs} if signature is not None else {}
    generator = np.random.default_rng((seed, item))

    # Model shapes (-1 = dynamic) and the sizes user arrays fix for named axes.
    shapes: dict[str, list[int]] = {}
    given: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}
    for tensor in config.input:
        dtype = _numpy_type(tensor)
        shapes[tensor.name] = _model_shape(tensor, batching, specs.get(tensor.name))
        source, raw = _given(samples, tensor.name)
        if raw is None:
            continue
        array = _convert(np.asarray(raw), dtype, tensor, source)
        if array.ndim == 0 and shapes[tensor.name]:
            continue  # a single value that fills the generated shape; set below
        _check_shape(array, shapes[tensor.name], tensor.name, source, batching)
        if batching:
            index = item if array.shape[0] > item and rows == 1 else 0
            array = array[index : index + rows]
        given[tensor.name] = array
        spec = specs.get(tensor.name)
        for axis, dim_name in enumerate(spec.dim_names if spec is not None else ()):
            if dim_name and shapes[tensor.name][axis] == -1:
                sizes.setdefault(dim_name, int(array.shape[axis]))

    result: dict[str, np.ndarray] = {}
    for tensor in config.input:
        dtype = _numpy_type(tensor)
        array = given.get(tensor.name)
        if array is None:
            spec = specs.get(tensor.name)
            shape = []
            for axis, dim in enumerate(shapes[tensor.name]):
                dim_name = spec.dim_names[axis] if spec is not None and axis < len(spec.dim_names) else None
                if dim != -1:
                    shape.append(dim)
                elif batching and axis == 0:
                    shape.append(rows)
                elif dim_name:
                    shape.append(sizes.setdefault(dim_name, dynamic_size))
                else:
                    shape.append(dynamic_size)
            source, raw = _given(samples, tensor.name)
            if raw is not None:
                array = np.full(shape, _convert(np.asarray(raw), dtype, tensor, source).item(), dtype=dtype)
            else:
                array = _sample(dtype, tuple(shape), generator, item)
        result[tensor.name] = _to_request_shape(array, tensor, batching)
    return result


def join_samples(first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Concatenate two batching requests input by input along axis 0 (the batch axis), as Triton's batcher does.

    Raises:
        ValueError: the two requests have different inputs, or an input's non-batch axes differ.
    """
    if list(first) != list(second):
        raise ValueError(f"the samples have different inputs: {list(first)} and {list(second)}")
    return {name: np.concatenate([first[name], second[name]], axis=0) for name in first}


def compare_joined_outputs(
    config: ModelConfig, alone: Sequence[Mapping[str, np.ndarray]], joined: Mapping[str, np.ndarray]
) -> BatchCheck:
    """Check that running samples joined on axis 0 gave each sample the outputs it gets when run alone.

    `alone[i]` are the outputs of sample i run on its own (each a batch along axis 0); `joined` the outputs of
    the samples concatenated on axis 0, in the same order. For every output the configuration declares: axis 0
    of the joined output must be the sum of the samples' axis 0, its slice for each sample must have that
    sample's shape, and the values must agree, exactly for integers, bools and BYTES, and within a tolerance for
    floats (|joined - alone| <= atol * max(1, max|alone|) + rtol * |alone|; rtol/atol 1e-3/1e-4 for FP32,
    1e-2/1e-3 for FP16; NaN only where alone has NaN). Triton's dynamic batcher joins requests exactly this way
    (Triton "Dynamic Batcher"), so a difference means batching would change (mix) results.

    Returns:
        `BatchCheck` whose `problem` names each output that differed, the sample, where and by how much.
    """
    problems: list[str] = []
    largest = 0.0
    for tensor in config.output:
        name = tensor.name
        parts = [outputs.get(name) for outputs in alone]
        together = joined.get(name)
        if together is None or any(part is None for part in parts):
            problems.append(f"output {name!r} did not come back from every run")
            continue
        if together.ndim == 0 or any(part.ndim == 0 for part in parts):
            problems.append(f"output {name!r} has no axis 0 to split into the samples' results")
            continue
        expected_rows = sum(int(part.shape[0]) for part in parts)
        if together.shape[0] != expected_rows:
            problems.append(
                f"output {name!r} has {together.shape[0]} rows on axis 0 for the joined samples, but the samples "
                f"alone gave {' + '.join(str(part.shape[0]) for part in parts)}, so axis 0 of this output is not "
                "the batch axis"
            )
            continue
        start = 0
        for index, part in enumerate(parts, start=1):
            piece = together[start : start + part.shape[0]]
            start += part.shape[0]
            difference, detail = _difference(piece, part)
            largest = max(largest, difference)
            if detail:
                problems.append(f"output {name!r} of sample {index} {detail}")
                break
    return BatchCheck(problem="; ".join(problems), max_difference=largest)


def check_output_shapes(config: ModelConfig, outputs: Mapping[str, Sequence[int]], *, batch_size: int) -> None:
    """Check that each output the configuration declares came back, with a shape the configuration allows.

    Declared shape: `[batch_size, *dims]` when max_batch_size > 0, else `dims`; -1 matches any size, every other
    axis and the rank must match exactly. A tensor with a `reshape` may also come back in the reshape shape (as
    the model produces it), and a non-batching `dims: [1]` may come back as a scalar. Outputs the configuration
    does not declare are ignored (Triton only returns declared outputs).

    Args:
        config: the model configuration that was served.
        outputs: output name -> actual shape (e.g. `{name: array.shape}` from the inference result).
        batch_size: size of axis 0 of the sample request; only used when max_batch_size > 0.

    Raises:
        VerificationError: naming the tensor, the declared shape and the actual shape (or the missing output)
            and what to do.
        ValueError: batch_size < 1 while the configuration batches.
    """
    batching = config.max_batch_size > 0
    if batching and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    for tensor in config.output:
        if tensor.name not in outputs:
            returned = ", ".join(repr(name) for name in outputs) or "nothing"
            raise VerificationError(
                f"The sample inference did not return output {tensor.name!r}, which the configuration declares; it "
                f"returned {returned}. The model's outputs differ from what inspection found: upload the model "
                "again, and if this repeats, export it with fixed output names."
            )
        actual = tuple(int(dim) for dim in outputs[tensor.name])
        allowed = _allowed_shapes(tensor, batching, batch_size)
        if any(_matches(shape, actual) for shape in allowed):
            continue
        declared = allowed[0]
        rank_note = (
            f" (rank {len(actual)} produced, rank {len(declared)} declared)" if len(actual) != len(declared) else ""
        )
        batch_note = f", where the first axis is the batch of {batch_size}" if batching else ""
        raise VerificationError(
            f"Output {tensor.name!r} came back with shape {_text(actual)}, but the configuration declares "
            f"{_text(declared)}{batch_note}; -1 means any size{rank_note}. The model file declares the wrong "
            "shape for this output, so Triton would describe it wrongly to clients and may refuse it. Fix the "
            "output's declared shape in the ONNX graph (for example export again with correct dynamic_axes, or "
            "edit graph.output with the onnx package) and upload the model again."
        )


@dataclass(frozen=True)
class ObservedShapes:
    """The shapes outputs came back in over several sample runs, merged per output.

    Attributes:
        shapes: output name -> full shape (axis 0 included) where every run gave the same rank: an axis keeps its
            size where all runs agreed, and is -1 where they differed.
        problems: output name -> a description of the shapes, for an output whose rank differed between runs
            (no one config shape describes it).
    """

    shapes: dict[str, tuple[int, ...]]
    problems: dict[str, str]


def output_shape_mismatches(config: ModelConfig, outputs: Mapping[str, Sequence[int]], *, batch_size: int) -> list[str]:
    """Names of the outputs (in config order) that came back in a shape the configuration does not allow.

    The rules are `check_output_shapes`'s, which this calls per output.

    Raises:
        VerificationError: an output the configuration declares did not come back (as `check_output_shapes`).
    """
    mismatched = []
    for tensor in config.output:
        try:
            check_output_shapes(_only_output(config, tensor.name), outputs, batch_size=batch_size)
        except VerificationError:
            if tensor.name not in outputs:
                raise
            mismatched.append(tensor.name)
    return mismatched


def merge_observed_shapes(
    observations: Sequence[Mapping[str, Sequence[int]]], names: Sequence[str], *, batch_axis: bool = False
) -> ObservedShapes:
    """Merge the shapes outputs `names` came back in over several runs (each observation: name -> shape).

    Same rank in every run: the merged shape keeps an axis's size where every run agreed, -1 where they differed;
    with `batch_axis`, axis 0 is -1 whatever the runs gave (it is Triton's batch axis). Different ranks: a problem
    that lists each run's shape. Outputs missing from an observation are left out of it.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    problems: dict[str, str] = {}
    for name in names:
        seen = [tuple(int(d) for d in observation[name]) for observation in observations if name in observation]
        if not seen:
            continue
        if len({len(shape) for shape in seen}) > 1:
            problems[name] = ", ".join(_text(shape) for shape in seen)
            continue
        merged = [axis[0] if len(set(axis)) == 1 else -1 for axis in zip(*seen, strict=True)]
        if batch_axis and merged:
            merged[0] = -1
        shapes[name] = tuple(merged)
    return ObservedShapes(shapes=shapes, problems=problems)


# --- helpers --------------------------------------------------------------------------------------------------


def _only_output(config: ModelConfig, name: str) -> ModelConfig:
    """A copy of `config` that declares output `name` alone (for checking outputs one at a time)."""
    single = ModelConfig()
    single.CopyFrom(config)
    del single.output[:]
    single.output.add().CopyFrom(next(tensor for tensor in config.output if tensor.name == name))
    return single


def _samples_error(detail: str) -> InvalidInput:
    return InvalidInput(detail, field=SAMPLE_INPUTS_FIELD)


def _values_error(detail: str) -> InvalidInput:
    return InvalidInput(detail, field=SAMPLE_VALUES_FIELD)


def _split_entries(text: str) -> list[str]:
    """Split "a=1; b=[1, 2], c=x" into entries at ';', newlines, and commas outside brackets or quotes."""
    entries, current, depth, quoted = [], [], 0, False
    for char in text:
        if char == '"':
            quoted = not quoted
        elif not quoted and char in "[(":
            depth += 1
        elif not quoted and char in "])":
            depth -= 1
        if not quoted and (char in ";\n" or (char == "," and depth <= 0)):
            entries.append("".join(current))
            current = []
            continue
        current.append(char)
    entries.append("".join(current))
    return [entry for entry in entries if entry.strip()]


def _is_json_tensor_value(value: Any) -> bool:
    if isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return bool(value) and all(_is_json_tensor_value(item) for item in value)
    return False


def _given(samples: UserSamples, name: str) -> tuple[str, Any]:
    if name in samples.values:
        return SAMPLE_VALUES_FIELD, samples.values[name]
    if name in samples.arrays:
        return SAMPLE_INPUTS_FIELD, samples.arrays[name]
    return "", None


def _numpy_type(tensor: Any) -> Any:
    """The numpy dtype sample values of a config tensor are made in (`tritonserving.config.numpy_of_datatype`),
    except BF16, which numpy lacks: Triton clients send it from float32 arrays. Raises ValueError for a datatype
    with no sample value."""
    datatype = datatype_name(tensor.data_type)
    if datatype == "BF16":
        return np.dtype(np.float32)
    try:
        return numpy_of_datatype(datatype)
    except ValueError:
        raise ValueError(f"input {tensor.name!r} has datatype {datatype}, which has no sample value") from None


def _model_shape(tensor: Any, batching: bool, spec: Any) -> list[int]:
    """The shape the model itself takes for a config input (-1 = dynamic; the batch axis is -1 when batching)."""
    if spec is not None:
        return list(spec.dims)
    body = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    return [-1, *body] if batching else body


def _to_request_shape(array: np.ndarray, tensor: Any, batching: bool) -> np.ndarray:
    """Reshape a model-shaped array to what a client sends for `tensor` (Triton "Reshape": dims vs reshape)."""
    if batching:
        if tensor.HasField("reshape") and list(tensor.dims).count(-1) <= 1:
            return array.reshape((array.shape[0], *tensor.dims))
        return array
    if array.ndim == 0:
        return array.reshape((1,))  # a scalar travels as dims [1]
    return array


def _convert(array: np.ndarray, dtype: Any, tensor: Any, source: str) -> np.ndarray:
    """Convert a user array to the input's numpy type when nothing is lost in kind; else InvalidInput."""
    triton = _type_name(tensor.data_type).removeprefix("TYPE_")
    kind = array.dtype.kind

    def refuse(what: str) -> InvalidInput:
        return InvalidInput(
            f"{source} gives input {tensor.name!r} {what}, but the model takes {triton}; give it "
            f"{_WANTED.get(np.dtype(dtype).kind, 'values of that type')}.",
            field=source,
        )

    if dtype == np.object_:
        if kind not in "USO":
            raise refuse(f"{array.dtype} values")
        flat = [item.encode("utf-8") if isinstance(item, str) else item for item in array.ravel().tolist()]
        if not all(isinstance(item, bytes) for item in flat):
            raise refuse("values that are not text")
        result = np.empty(len(flat), dtype=np.object_)
        result[:] = flat
        return result.reshape(array.shape)
    target = np.dtype(dtype)
    if kind in "USO":
        raise refuse(f"the text {array.ravel()[0]!r}" if array.size else "text")
    if target.kind == "b":
        if kind != "b":
            raise refuse(f"{array.dtype} values")
        return array.astype(target)
    if target.kind in "iu":
        if kind not in "biu":
            raise refuse(f"{array.dtype} values")
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise refuse(f"values from {array.min()} to {array.max()}, outside {info.min}..{info.max}")
        return array.astype(target)
    return array.astype(target)


_WANTED = {"b": "true/false values", "i": "whole numbers", "u": "whole numbers >= 0", "f": "numbers", "O": "text"}


def _check_shape(array: np.ndarray, shape: Sequence[int], name: str, source: str, batching: bool) -> None:
    text = "[" + ", ".join("any" if d == -1 else str(d) for d in shape) + "]"
    problem = ""
    if array.ndim != len(shape):
        problem = f"{array.ndim} axes"
    elif any(d not in (-1, a) for d, a in zip(shape, array.shape, strict=True)):
        problem = "a different size on a fixed axis"
    elif batching and array.shape[0] < 1:
        problem = "no item on axis 0"
    if problem:
        raise InvalidInput(
            f"{source} gives input {name!r} shape {list(array.shape)} ({problem}), but the model takes shape "
            f"{text}; give the array in the shape the model itself takes (as you would pass it to onnxruntime).",
            field=source,
        )


def _sample(dtype: Any, shape: tuple[int, ...], generator: np.random.Generator, item: int) -> np.ndarray:
    if dtype == np.object_:
        array = np.empty(shape, dtype=np.object_)
        array.fill(SAMPLE_BYTES if item == 0 else _SECOND_BYTES)
        return array
    if dtype == np.bool_:
        return np.full(shape, item == 0, dtype=np.bool_)
    if np.issubdtype(dtype, np.floating):
        return generator.random(shape, dtype=np.float64).astype(dtype)
    return np.full(shape, 1 if item == 0 else 0, dtype=dtype)


def _generated_values(array: np.ndarray) -> str:
    if array.dtype == np.object_:
        return f"all {array.ravel()[0]!r}" if array.size else "empty"
    if array.dtype.kind == "f":
        return "random floats in [0, 1)"
    if array.size and (array == array.ravel()[0]).all():
        return f"all {_element(array.ravel()[0])!r}"
    return "generated values"


def _difference(piece: np.ndarray, part: np.ndarray) -> tuple[float, str]:
    """Largest |piece - part| and, when they disagree, a description of the first place they do."""
    if piece.shape != part.shape:
        return 0.0, f"has shape {list(piece.shape)} in the joined run but {list(part.shape)} alone"
    if piece.dtype.kind == "f" or part.dtype.kind == "f":
        a, b = part.astype(np.float64), piece.astype(np.float64)
        rtol, atol = _TOLERANCES.get(part.dtype.str[1:], _TOLERANCES["f4"])
        finite = np.isfinite(a)
        scale = max(1.0, float(np.abs(a[finite]).max())) if finite.any() else 1.0
        with np.errstate(invalid="ignore"):  # inf - inf is NaN; such places are settled just below
            gap = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(b - a))
        gap = np.where(np.isinf(a) & (a == b), 0.0, gap)
        gap = np.nan_to_num(gap, nan=np.inf)
        largest = float(gap.max()) if gap.size else 0.0
        over = gap > atol * scale + rtol * np.abs(np.nan_to_num(a))
        if over.any():
            where = tuple(int(i) for i in np.argwhere(over)[0])
            return largest, (
                f"differs: at index {list(where)} it is {b[where]:.6g} in the joined run but {a[where]:.6g} alone "
                f"(largest difference {largest:.3g}, allowed {atol * scale:.1g} + {rtol:.0e} x |value|)"
            )
        return largest, ""
    equal = np.asarray(piece == part, dtype=bool)
    if equal.shape != piece.shape:  # numpy compares object arrays of bytes elementwise; anything else: one verdict
        equal = np.full(piece.shape, bool(np.all(equal)))
    if not np.all(equal):
        where = tuple(int(i) for i in np.argwhere(~equal)[0])
        shown = f"{_element(piece[where])!r} in the joined run but {_element(part[where])!r} alone"
        return 0.0, f"differs: at index {list(where)} it is {shown}"
    return 0.0, ""


def _element(value: Any) -> Any:
    """A numpy element as Python shows it: a number's `.item()`, a BYTES element (bytes, str) as it is."""
    return value.item() if hasattr(value, "item") else value


def _type_name(data_type: int) -> str:
    try:
        return model_config_pb2.DataType.Name(data_type)
    except ValueError:
        return f"number {data_type}"


def _allowed_shapes(tensor: Any, batching: bool, batch_size: int) -> list[tuple[int, ...]]:
    prefix = [batch_size] if batching else []
    shapes = [tuple(prefix + list(tensor.dims))]
    if tensor.HasField("reshape"):
        shapes.append(tuple(prefix + list(tensor.reshape.shape)))
    if not batching and list(tensor.dims) == [1]:
        shapes.append(())
    return shapes


def _matches(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(d in (-1, a) for d, a in zip(declared, actual, strict=True))


def _text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]"
