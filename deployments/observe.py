"""Observation services: scrape Triton's metrics, store samples, prune them, summarize a window.

Rates come from counter deltas between two samples (Triton's counters are cumulative),
so a summary over `window` seconds needs a sample at or before the window's start and
the latest one. A counter that went down (Triton restarted) restarts the delta from zero.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from conch.errors import ConchError, InvalidInput
from deployments.choices import DeploymentStatus
from deployments.models import Deployment, MetricSample
from deployments.services import internal_url
from tritonserving.client import TritonClient
from tritonserving.metrics import COUNTERS, parse_triton_metrics

log = logging.getLogger(__name__)
FIELDS = list(COUNTERS.values())


def scrape_deployment(*, deployment: Deployment) -> int:
    """Fetch one deployment's /metrics and store a sample per model; returns how many.

    Raises Unavailable when Triton's metrics port does not answer.
    """
    text = TritonClient.fetch_metrics_text(internal_url(deployment, "metrics", "/metrics"), timeout_s=5)
    now = timezone.now()
    counters = parse_triton_metrics(text)
    MetricSample.objects.bulk_create(
        [
            MetricSample(
                deployment=deployment,
                scraped_at=now,
                model_name=c.model_name,
                model_version=c.model_version,
                **{f: getattr(c, f) for f in FIELDS},
            )
            for c in counters
        ]
    )
    return len(counters)


def scrape_deployment_or_log(*, deployment: Deployment) -> int:
    """Like scrape_deployment, but a Triton that does not answer is logged and 0 returned."""
    try:
        return scrape_deployment(deployment=deployment)
    except ConchError as exc:
        log.warning("metrics.scrape.failed", extra={"deployment_id": deployment.pk, "error": exc.detail})
        return 0


def refresh_samples(*, deployment: Deployment) -> None:
    """Scrape a ready deployment now, so a metrics read counts every inference answered so far.

    Always scrapes: skipping when the last sample was recent lost the inferences answered since
    it (e.g. a read right after the baseline sample taken when the deployment became ready).
    An unreachable Triton is logged; the stored samples are still summarized.
    """
    if deployment.status == DeploymentStatus.READY:
        scrape_deployment_or_log(deployment=deployment)


def scrape_ready_deployments() -> int:
    """Scrape every ready deployment; a failing one is logged and skipped. Returns samples stored."""
    ready = Deployment.objects.filter(status=DeploymentStatus.READY)
    return sum(scrape_deployment_or_log(deployment=deployment) for deployment in ready)


def prune_metric_samples(*, older_than_seconds: int | None = None) -> int:
    """Delete samples older than the retention (CONCH_METRICS_RETENTION_SECONDS); returns how many."""
    seconds = older_than_seconds if older_than_seconds is not None else settings.CONCH_METRICS_RETENTION_SECONDS
    cutoff = timezone.now() - timedelta(seconds=seconds)
    deleted, _ = MetricSample.objects.filter(scraped_at__lt=cutoff).delete()
    return deleted


@dataclass(frozen=True)
class ModelWindowStats:
    """What one model did during a window.

    throughput: inferences/s (an inference is one batch element); requests_per_second;
    latency and queue/compute times: average microseconds per request; average_batch_size:
    inferences per model execution; failures: failed requests in the window.
    """

    model_name: str
    model_version: str
    window_seconds: float
    inference_count: float
    request_count: float
    execution_count: float
    throughput_inferences_per_second: float
    requests_per_second: float
    average_request_latency_us: float
    average_queue_time_us: float
    average_compute_time_us: float
    average_compute_infer_time_us: float
    average_batch_size: float
    failures: float


def _delta(new: float, old: float) -> float:
    return new - old if new >= old else new


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def summarize(*, deployment: Deployment, window_seconds: int) -> dict:
    """Per-model throughput, latency, queue/compute time and batch size over the last `window_seconds`.

    Returns {"window_seconds", "models": [ModelWindowStats as dict], "series": [...]} where
    `series` lists, per model, points between consecutive samples: time (ISO 8601),
    throughput (inferences/s) and average request latency (µs). Raises InvalidInput
    (field `window`) for a window outside 10..86400 s.
    """
    if not 10 <= window_seconds <= 86400:
        raise InvalidInput("window must be between 10 and 86400 seconds.", field="window")
    now = timezone.now()
    start = now - timedelta(seconds=window_seconds)
    samples = list(deployment.metric_samples.filter(scraped_at__gte=start).order_by("scraped_at"))
    before = {}
    for s in deployment.metric_samples.filter(scraped_at__lt=start).order_by("-scraped_at")[:50]:
        before.setdefault((s.model_name, s.model_version), s)
    by_model: dict[tuple[str, str], list[MetricSample]] = {}
    for s in samples:
        by_model.setdefault((s.model_name, s.model_version), []).append(s)
    models, series = [], []
    for key, rows in sorted(by_model.items()):
        first = before.get(key, rows[0])
        last = rows[-1]
        elapsed = max((last.scraped_at - first.scraped_at).total_seconds(), 1e-9)
        d = {f: _delta(getattr(last, f), getattr(first, f)) for f in FIELDS}
        requests = d["success_count"]
        compute = d["compute_input_duration_us"] + d["compute_infer_duration_us"] + d["compute_output_duration_us"]
        stats = ModelWindowStats(
            model_name=key[0],
            model_version=key[1],
            window_seconds=round(elapsed, 3) if last is not first else 0.0,
            inference_count=d["inference_count"],
            request_count=requests,
            execution_count=d["execution_count"],
            throughput_inferences_per_second=d["inference_count"] / elapsed if last is not first else 0.0,
            requests_per_second=requests / elapsed if last is not first else 0.0,
            average_request_latency_us=_ratio(d["request_duration_us"], requests),
            average_queue_time_us=_ratio(d["queue_duration_us"], requests),
            average_compute_time_us=_ratio(compute, requests),
            average_compute_infer_time_us=_ratio(d["compute_infer_duration_us"], requests),
            average_batch_size=_ratio(d["inference_count"], d["execution_count"]),
            failures=d["failure_count"],
        )
        models.append(asdict(stats))
        points = []
        chain = ([before[key]] if key in before else []) + rows
        for prev, cur in zip(chain, chain[1:], strict=False):
            dt = (cur.scraped_at - prev.scraped_at).total_seconds()
            if dt <= 0:
                continue
            n = _delta(cur.success_count, prev.success_count)
            points.append(
                {
                    "time": cur.scraped_at.isoformat(),
                    "throughput_inferences_per_second": _delta(cur.inference_count, prev.inference_count) / dt,
                    "average_request_latency_us": (
                        _delta(cur.request_duration_us, prev.request_duration_us) / n if n else 0.0
                    ),
                }
            )
        series.append({"model_name": key[0], "model_version": key[1], "points": points})
    return {"window_seconds": window_seconds, "models": models, "series": series}
