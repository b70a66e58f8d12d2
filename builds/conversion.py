"""Converting an uploaded model and running its source framework, each in the build's sandbox.

Both run untrusted files through large framework parsers, so they run in the sandbox child (`builds.sandbox`): a
fresh process with CPU, memory and wall-clock limits, no inherited secrets. The format's own code
(`ModelFormat.convert`, `ModelFormat.run_source`) runs there, chosen by its key.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from builds.formats import NO_HINTS, Conversion, ConversionHints, ModelFormat, format_by_key
from builds.sandbox import SandboxLimits, cut_network, run_in_sandbox

__all__ = ["convert_in_sandbox", "inspect_source_in_sandbox", "run_source_in_sandbox"]


def convert_in_sandbox(
    model_format: ModelFormat,
    source: Path,
    target: Path,
    *,
    hints: ConversionHints = NO_HINTS,
    limits: SandboxLimits | None = None,
) -> Conversion:
    """Convert the file `source` (of `model_format`) into an ONNX model at `target`, with the user's interface
    `hints` (`ModelFormat.convert`); return what was done.

    Raises InvalidInput (field "file") with the tool's reason and the fix when the model cannot be converted, or
    when the child crashed or ran past a limit (`limits`, default `SandboxLimits.from_settings()`); SandboxError
    for an internal failure.
    """
    with tempfile.TemporaryDirectory(prefix="conch-convert-") as work:
        job = Path(work) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "format": model_format.key,
                    "source": str(Path(source).resolve()),
                    "target": str(Path(target).resolve()),
                    "hints": hints.to_dict(),
                }
            ),
            encoding="utf-8",
        )
        value = run_in_sandbox(f"{__name__}:_convert_job", job, limits=limits or SandboxLimits.from_settings())
    return Conversion.from_dict(value)


def inspect_source_in_sandbox(
    model_format: ModelFormat,
    source: Path,
    *,
    specs: Mapping[str, tuple[str, Sequence[int]]],
    from_samples: bool,
    limits: SandboxLimits | None = None,
) -> tuple[dict[str, Any], Conversion]:
    """The signature (`ModelSignature.to_dict()`) and report of a model served as uploaded by a backend other than
    onnxruntime (a TorchScript model), read by its own framework (`ModelFormat.inspect_source`), the inputs'
    datatypes and shapes from `specs` (name -> (Triton datatype, full shape)) where the file does not record them.

    Raises what `convert_in_sandbox` raises.
    """
    with tempfile.TemporaryDirectory(prefix="conch-inspect-") as work:
        job = Path(work) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "format": model_format.key,
                    "source": str(Path(source).resolve()),
                    "specs": {name: [datatype, list(dims)] for name, (datatype, dims) in specs.items()},
                    "from_samples": from_samples,
                }
            ),
            encoding="utf-8",
        )
        value = run_in_sandbox(f"{__name__}:_inspect_job", job, limits=limits or SandboxLimits.from_settings())
    return value["signature"], Conversion.from_dict(value["report"])


def run_source_in_sandbox(
    model_format: ModelFormat,
    source: Path,
    inputs: Mapping[str, np.ndarray],
    *,
    hints: ConversionHints = NO_HINTS,
    limits: SandboxLimits | None = None,
) -> dict[str, np.ndarray]:
    """Run `inputs` (input name -> full array, batch axis included) through the source framework on the file
    `source`; return its outputs keyed by the converted model's output names (`ModelFormat.run_source`).

    Raises what `convert_in_sandbox` raises.
    """
    with tempfile.TemporaryDirectory(prefix="conch-reference-") as work:
        folder = Path(work)
        np.savez(folder / "inputs.npz", **{name: np.asarray(array) for name, array in inputs.items()})
        job = folder / "job.json"
        job.write_text(
            json.dumps(
                {
                    "format": model_format.key,
                    "source": str(Path(source).resolve()),
                    "inputs": str(folder / "inputs.npz"),
                    "hints": hints.to_dict(),
                    "outputs": str(folder / "outputs.npz"),
                }
            ),
            encoding="utf-8",
        )
        run_in_sandbox(f"{__name__}:_reference_job", job, limits=limits or SandboxLimits.from_settings())
        with np.load(folder / "outputs.npz", allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}


# --- the sandbox child -------------------------------------------------------------------------------------------


def _format_of(job: dict[str, Any]) -> ModelFormat:
    """The job's format; for one whose loading runs code from the file, the child's network is cut first (or the
    job refused: `cut_network`)."""
    model_format = format_by_key(job["format"])
    if model_format.runs_code:
        cut_network()
    return model_format


def _convert_job(job_path: Path) -> dict[str, Any]:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    hints = ConversionHints.from_dict(job.get("hints"))
    conversion = _format_of(job).convert(Path(job["source"]), Path(job["target"]), hints)
    return conversion.to_dict()


def _inspect_job(job_path: Path) -> dict[str, Any]:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    specs = {name: (str(datatype), tuple(int(d) for d in dims)) for name, (datatype, dims) in job["specs"].items()}
    signature, report = _format_of(job).inspect_source(
        Path(job["source"]), specs, from_samples=bool(job["from_samples"])
    )
    return {"signature": signature, "report": report.to_dict()}


def _reference_job(job_path: Path) -> dict[str, Any]:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    with np.load(job["inputs"], allow_pickle=False) as stored:
        inputs = {name: stored[name] for name in stored.files}
    outputs = _format_of(job).run_source(Path(job["source"]), inputs, ConversionHints.from_dict(job.get("hints")))
    np.savez(job["outputs"], **outputs)
    return {"outputs": sorted(outputs)}
