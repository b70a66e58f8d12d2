"""Adapter for Triton's Prometheus metrics text (the `/metrics` endpoint on the metrics port).

Parsed with `prometheus_client`'s text parser. Counter names and meanings come from
Triton's "Metrics" doc, section "Inference Request Metrics": counts are totals since the
model loaded; the `_duration_us` counters are cumulative microseconds over requests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from conch.errors import Unavailable

#: The `--metrics-config` value that turns on Triton's latency summaries (off by default; "Metrics" doc,
#: "Summaries"): per model, `nv_inference_request_summary_us{quantile="0.5"|"0.9"|"0.95"|"0.99"}` over a sliding
#: window of recent requests, NaN while it holds none.
LATENCY_SUMMARIES = "summary_latencies=true"
#: summary sample name and quantile label -> our field name (a gauge: the quantile now, not a cumulative counter)
QUANTILES = {
    ("nv_inference_request_summary_us", "0.5"): "request_p50_us",
    ("nv_inference_request_summary_us", "0.99"): "request_p99_us",
}

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
    #: Request latency quantiles (µs) of Triton's summary over its recent requests; None without summaries (the
    #: flag off) or while the summary holds no request.
    request_p50_us: float | None = None
    request_p99_us: float | None = None


def parse_triton_metrics(text: str) -> list[ModelCounters]:
    """Extract per-model inference counters from Prometheus text exposition.

    Samples of one (model, version) are summed across other labels (e.g. failure
    `reason`). Latency quantiles (QUANTILES) are read as they are, the highest where several series of one
    model carry one, and left out while NaN (no request in the summary's window). Raises Unavailable when the
    text is not Prometheus exposition format.
    """
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    quantiles: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if "model" not in sample.labels:
                    continue
                key = (sample.labels["model"], sample.labels.get("version", ""))
                quantile = QUANTILES.get((sample.name, sample.labels.get("quantile", "")))
                if quantile is not None:
                    if not math.isnan(sample.value):
                        quantiles[key][quantile] = max(float(sample.value), quantiles[key].get(quantile, 0.0))
                    continue
                field = COUNTERS.get(sample.name) or COUNTERS.get(sample.name.removesuffix("_total"))
                if field is None:
                    continue
                values[key][field] += float(sample.value)
    except ValueError as exc:
        raise Unavailable(f"Triton's /metrics answered text that is not Prometheus format: {exc}") from exc
    return [
        ModelCounters(model_name=m, model_version=v, **values.get((m, v), {}), **quantiles.get((m, v), {}))
        for m, v in sorted(set(values) | set(quantiles))
    ]
