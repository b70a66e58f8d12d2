"""Tensors for `conch infer`: .npy files to a KServe v2 / Open Inference Protocol request with binary tensor
data (Triton's binary tensor data extension: a JSON header, then each input's raw little-endian bytes), and the
JSON answer's outputs back to numpy arrays.

numpy is imported here only, so commands other than `infer` start without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conch_cli.errors import USAGE, CliError

#: numpy dtype name -> Triton datatype.
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
NUMPY_TYPES = {triton: name for name, triton in DATATYPES.items()}
#: The header naming the JSON part's length in a body with binary tensor data.
HEADER_LENGTH = "Inference-Header-Content-Length"


def parse_input_option(option: str) -> tuple[str, Path]:
    """Split `name=path.npy`; raises CliError (USAGE, field --input) when it is not that shape."""
    name, sep, path = option.partition("=")
    if not sep or not name or not path:
        raise CliError(f"--input takes NAME=FILE.npy, got {option!r}.", USAGE, field="--input")
    return name, Path(path)


def build_request(inputs: list[tuple[str, Path]]) -> tuple[bytes, int]:
    """Return (body, JSON header length) of an inference request with each input's array as binary data.

    Raises CliError (USAGE, naming the input) for a file numpy cannot read or a dtype Triton has no type for.
    """
    import numpy as np

    header: dict[str, Any] = {"inputs": []}
    blobs = []
    for name, path in inputs:
        try:
            with path.open("rb") as handle:
                head = handle.read(6)
        except OSError as exc:
            raise CliError(f"Cannot read {path} for input {name!r}: {exc.strerror or exc}", USAGE, field=name) from None
        if head != b"\x93NUMPY" and not head.startswith(b"PK\x03\x04"):  # neither .npy nor .npz
            # np.load would try it as a pickle and say so, which names nothing the user did.
            raise CliError(
                f"{path} is not a .npy file (input {name!r}): give an array saved with numpy.save, e.g. "
                f"numpy.save('{name}.npy', numpy.array([...], dtype='float32')).",
                USAGE,
                field=name,
            )
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CliError(f"Cannot read {path} as a .npy array for input {name!r}: {exc}", USAGE, field=name) from None
        if not isinstance(array, np.ndarray):
            raise CliError(f"{path} is an .npz archive; give one .npy file per input.", USAGE, field=name)
        datatype = DATATYPES.get(array.dtype.name)
        if datatype is None:
            raise CliError(
                f"Input {name!r} ({path}) has dtype {array.dtype.name}, which Triton has no datatype for; save it as "
                f"one of {', '.join(DATATYPES)}.",
                USAGE,
                field=name,
            )
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        header["inputs"].append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    head = json.dumps(header).encode()
    return head + b"".join(blobs), len(head)


def output_arrays(answer: dict) -> dict[str, Any]:
    """The outputs of a JSON inference answer as numpy arrays in their shapes, by name."""
    import numpy as np

    arrays = {}
    for output in answer.get("outputs") or []:
        dtype = NUMPY_TYPES.get(output.get("datatype"), "object")
        arrays[output["name"]] = np.array(output.get("data") or [], dtype=dtype).reshape(output["shape"])
    return arrays
