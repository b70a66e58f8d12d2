"""The program a TensorRT plan Job runs in NVIDIA's TensorRT image (`python3 -c`, the standard library only).

It reads its request (JSON) from `CONCH_PLAN_REQUEST`, which a Secret of the Job holds:
`{"trtexec": "trtexec", "model_files": [{"path": "model.onnx", "url": …}, …], "inputs": [{"name": …, "file":
"input0.bin", "url": …}, …], "build_args": [...], "run_args": [...], "plan_url": …, "outputs_url": …,
"report_url": …}`. Every URL is a presigned object-store URL (GET for the model's files and the inputs, PUT for
what it writes), so the pod holds no credentials.

1. downloads the ONNX model (with its external data files, at their paths) and the raw input tensors;
2. builds the plan: `trtexec --onnx=… --saveEngine=model.plan` plus `build_args` (shape ranges, `--fp16`);
3. runs it once on the inputs: `trtexec --loadEngine=model.plan --loadInputs=… --exportOutput=outputs.json` plus
   `run_args` (the inputs' shapes), trtexec's documented way to save output tensors as JSON;
4. PUTs the plan, the outputs and a report (trtexec's version line, seconds per step).

A step that fails prints `conch-plan: <step> failed` with the tool's last lines and exits 1: the pod's
termination message (policy FallbackToLogsOnError) then carries them to Conch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import NoReturn

_TAIL_LINES = 25


def _fail(step: str, text: str) -> NoReturn:
    lines = [line for line in text.splitlines() if line.strip()][-_TAIL_LINES:]
    print(f"conch-plan: {step} failed", flush=True)
    for line in lines:
        print(line, flush=True)
    sys.exit(1)


def _download(url: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(path, "wb") as out:
            while True:
                chunk = response.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
    except OSError as exc:
        _fail("download", f"{os.path.basename(path)}: {exc}")


def _upload(url: str, path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "rb") as body:
        # An explicit type: urllib would otherwise say form-encoded, which some S3 servers parse as a form.
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        request = urllib.request.Request(url, data=body, method="PUT", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                response.read()
        except OSError as exc:
            _fail("upload", f"{os.path.basename(path)}: {exc}")


def _trtexec(step: str, argv: list[str], log_path: str) -> tuple[float, str]:
    started = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            _fail(step, f"{argv[0]}: {exc}")
    with open(log_path, encoding="utf-8", errors="replace") as log:
        text = log.read()
    if code != 0:
        _fail(step, f"{text}\n{argv[0]} exited with status {code}")
    return time.monotonic() - started, text


def main() -> None:
    request = json.loads(os.environ["CONCH_PLAN_REQUEST"])
    work = tempfile.mkdtemp(prefix="conch-plan-")
    print(
        f"conch-plan: downloading {len(request['model_files'])} model file(s) and {len(request['inputs'])} input(s)",
        flush=True,
    )
    model_dir = os.path.join(work, "model")
    for item in request["model_files"]:
        _download(item["url"], os.path.join(model_dir, item["path"]))
    loads = []
    for item in request["inputs"]:
        path = os.path.join(work, "inputs", item["file"])
        _download(item["url"], path)
        loads.append(f"'{item['name']}':{path}")
    plan = os.path.join(work, "model.plan")
    outputs = os.path.join(work, "outputs.json")
    trtexec = request.get("trtexec", "trtexec")
    onnx = os.path.join(model_dir, request["model_files"][0]["path"])
    print("conch-plan: building the plan with trtexec", flush=True)
    build_seconds, build_log = _trtexec(
        "build",
        [trtexec, f"--onnx={onnx}", f"--saveEngine={plan}", *request["build_args"]],
        os.path.join(work, "build.log"),
    )
    run_argv = [trtexec, f"--loadEngine={plan}", f"--exportOutput={outputs}", *request["run_args"]]
    if loads:
        run_argv.append("--loadInputs=" + ",".join(loads))
    print(f"conch-plan: plan built in {build_seconds:.1f} s; running it once", flush=True)
    run_seconds, _ = _trtexec("inference", run_argv, os.path.join(work, "run.log"))
    version = next((line.strip() for line in build_log.splitlines() if "TensorRT version" in line), "")
    report = os.path.join(work, "report.json")
    with open(report, "w", encoding="utf-8") as out:
        json.dump({"build_seconds": build_seconds, "run_seconds": run_seconds, "tensorrt": version}, out)
    print("conch-plan: uploading the plan and its outputs", flush=True)
    _upload(request["plan_url"], plan)
    _upload(request["outputs_url"], outputs)
    _upload(request["report_url"], report)
    print(f"conch-plan: plan built in {build_seconds:.1f} s and run once in {run_seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
