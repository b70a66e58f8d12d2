"""Adapter for Triton's Prometheus metrics text (the `/metrics` endpoint on the metrics port).

Parsed with `prometheus_client`'s text parser. Counter names and meanings come from
Triton's "Metrics" doc, section "Inference Request Metrics": counts are totals since the
model loaded; the `_duration_us` counters are cumulative microseconds over requests.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from conch.errors import Unavailable

# sample name -> our field name
COUNTERS = {
    "nv_inference_request_success": "success_count",
    "nv_inference_request_failure": "failure_count",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "execution_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_input_duration_us": "compute_input_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
    "nv_inference_compute_output_duration_us": "compute_output_duration_us",
}


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative counters of one model version (counts, and durations in microseconds)."""

    model_name: str
    model_version: str
    success_count: float = 0.0
    failure_count: float = 0.0
    inference_count: float = 0.0
    execution_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0
    compute_input_duration_us: float = 0.0
    compute_infer_duration_us: float = 0.0
    compute_output_duration_us: float = 0.0


def parse_triton_metrics(text: str) -> list[ModelCounters]:
    """Extract per-model inference counters from Prometheus text exposition.

    Samples of one (model, version) are summed across other labels (e.g. failure
    `reason`). Raises Unavailable when the text is not Prometheus exposition format.
    """
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = COUNTERS.get(sample.name) or COUNTERS.get(sample.name.removesuffix("_total"))
                if field is None or "model" not in sample.labels:
                    continue
                key = (sample.labels["model"], sample.labels.get("version", ""))
                values[key][field] += float(sample.value)
    except ValueError as exc:
        raise Unavailable(f"Triton's /metrics answered text that is not Prometheus format: {exc}") from exc
    return [ModelCounters(model_name=m, model_version=v, **fields) for (m, v), fields in sorted(values.items())]
