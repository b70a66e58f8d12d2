"""Call an inference server with KServe's own REST client (`kserve.InferenceRESTClient`, protocol v2), unchanged.

Run by tests/deployments/test_gateway_kserve.py under `.venv-kserve/bin/python` (requirements-kserve.txt: kserve
cannot share Conch's .venv), so it imports nothing of Conch's:

    .venv-kserve/bin/python tests/deployments/kserve_client_script.py BASE_URL < calls.json

stdin holds a JSON list of calls, each `{"call": C, "token": T, "model": M, ...}` where C is one of
`is_server_live`, `is_server_ready`, `is_model_ready` (needs `model`) or `infer` (needs `model`, `input`
`{"name", "data"}` with `data` an FP32 tensor as a nested list, `output` (a name), and `binary`: send the input and ask
for the output as binary tensor data, else as JSON). `token` null sends no Authorization header. stdout gets a
JSON list with one result per call: `{"value": …}` (what the client returned; for `infer`,
`{"outputs": {name: nested list}, "sent_header_length": …, "answer_header_length": …}`, the two
Inference-Header-Content-Length values, null when that side was JSON only), or `{"status": …, "error": …}`
when the client raised `httpx.HTTPStatusError` (its message is the text it shows users).
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

HEADER_LENGTH = "inference-header-content-length"


async def _infer(client: InferenceRESTClient, base: str, call: dict, headers: dict[str, str]) -> dict:
    spec = call["input"]
    array = np.array(spec["data"], dtype=np.float32)
    tensor = InferInput(spec["name"], list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=call["binary"])
    request = InferRequest(
        model_name=call["model"],
        infer_inputs=[tensor],
        request_outputs=[RequestedOutput(call["output"], parameters={"binary_data": call["binary"]})],
    )
    answer_headers: dict[str, str] = {}
    # The client writes Inference-Header-Content-Length into the `headers` dict it is given when it sends binary
    # data (kserve/inference_client.py, InferenceRESTClient.infer), which shows what went on the wire.
    response = await client.infer(
        base, request, model_name=call["model"], headers=headers, response_headers=answer_headers
    )
    return {
        "outputs": {output.name: output.as_numpy().tolist() for output in response.outputs},
        "sent_header_length": headers.get(HEADER_LENGTH),
        "answer_header_length": httpx.Headers(answer_headers).get(HEADER_LENGTH),
    }


async def _one(client: InferenceRESTClient, base: str, call: dict) -> dict:
    headers = {"Authorization": f"Bearer {call['token']}"} if call.get("token") is not None else {}
    try:
        if call["call"] == "is_server_live":
            value = await client.is_server_live(base, headers=headers)
        elif call["call"] == "is_server_ready":
            value = await client.is_server_ready(base, headers=headers)
        elif call["call"] == "is_model_ready":
            value = await client.is_model_ready(base, call["model"], headers=headers)
        elif call["call"] == "infer":
            value = await _infer(client, base, call, headers)
        else:
            raise ValueError(f"unknown call {call['call']!r}")
    except httpx.HTTPStatusError as exc:
        return {"status": exc.response.status_code, "error": str(exc)}
    return {"value": value}


async def main(base: str, calls: list[dict]) -> list[dict]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    try:
        return [await _one(client, base, call) for call in calls]
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], json.load(sys.stdin)))))
