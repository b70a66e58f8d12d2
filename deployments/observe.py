"""Observation services: scrape Triton's metrics, store samples, prune them, summarize a window.

Only the periodic scrape (beat task `deployments.scrape_metrics`) writes samples; reads only
summarize what is stored. Triton's counters are cumulative since the model loaded (Triton
"Metrics" doc, "Inference Request Metrics"), so a window's figures are sums of per-interval
increases between consecutive samples of a model. An interval in which Triton restarted or
reloaded the model (its `counters_since` changed, or a counter went down) counts from zero,
so a restart mid-window never undercounts. The series buckets those same increases with a
fixed step, so the summary's totals are the sums over the series. A window's rates (inferences/s,
requests/s) divide those totals by the time the deployment could have served in the window
(`rate_span_seconds`), not by the stretch its samples happen to cover: a burst followed by silence
(or by a stop) is a low rate over the window, as the console's overview shows it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from conch.errors import ConchError, InvalidInput, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment, MetricSample
from deployments.services import serving_servers
from tritonserving.client import TritonClient
from tritonserving.metrics import COUNTERS, QUANTILES, parse_triton_metrics

log = logging.getLogger(__name__)
FIELDS = list(COUNTERS.values())
#: Gauge fields of a sample (latency quantiles): read as they are, never subtracted.
QUANTILE_FIELDS = list(QUANTILES.values())
# A chart needs about this many points; longer windows get a longer step (downsampled).
MAX_POINTS = 60
MIN_WINDOW_SECONDS = 10
MAX_WINDOW_SECONDS = 86400


# --- scraping (the only writer of samples) -----------------------------------------


def scrape_deployment(*, deployment: Deployment) -> int:
    """Fetch the /metrics of every ready Triton of a deployment (its local server, or each ready pod) and store
    a sample per server and model; returns how many.

    A local deployment's samples record `counters_since` = the deployment's `ready_at` (when the model load that
    Triton's counters count from finished); when the deployment restarted or left `ready` while the text was
    being fetched, the text could belong to either load, so nothing is stored and 0 returned. A pod's samples
    carry the pod's name in `server` and no `counters_since`: a restarted pod's counters go down, which starts
    its series again (`interval_increase`). A pod whose metrics port does not answer is logged and skipped.
    Raises Unavailable when no server answers (or the runtime cannot list them).
    """
    counters_since = deployment.ready_at
    servers = serving_servers(deployment)
    if not servers and deployment.runtime != "local":
        return 0  # no pod ready now (scaled to 0, or all restarting): nothing to scrape, nothing wrong with Conch
    if not servers:
        raise Unavailable(f"Deployment {deployment.pk} has no ready Triton to scrape.")
    several = deployment.runtime != "local"
    texts, failures = [], []
    for server in servers:
        try:
            texts.append(
                (server.name if several else "", TritonClient.fetch_metrics_text(server.metrics_url, timeout_s=5))
            )
        except ConchError as exc:
            failures.append(exc)
            log.warning("metrics.scrape.failed", extra={"deployment_id": deployment.pk, "server": server.name})
    if failures and not texts:
        raise failures[0]
    now = timezone.now()
    if not several:
        current = Deployment.objects.filter(pk=deployment.pk).values("status", "ready_at").first()
        if current != {"status": DeploymentStatus.READY, "ready_at": counters_since}:
            log.info("metrics.scrape.skipped", extra={"deployment_id": deployment.pk, "reason": "restarted"})
            return 0
    samples = [
        MetricSample(
            deployment=deployment,
            scraped_at=now,
            counters_since=None if several else counters_since,
            server=server_name,
            model_name=c.model_name,
            model_version=c.model_version,
            **{f: getattr(c, f) for f in FIELDS + QUANTILE_FIELDS},
        )
        for server_name, text in texts
        for c in parse_triton_metrics(text)
    ]
    MetricSample.objects.bulk_create(samples)
    return len(samples)


def scrape_deployment_or_log(*, deployment: Deployment) -> int:
    """Like scrape_deployment, but a Triton that does not answer is logged and 0 returned."""
    try:
        return scrape_deployment(deployment=deployment)
    except ConchError as exc:
        log.warning("metrics.scrape.failed", extra={"deployment_id": deployment.pk, "error": exc.detail})
        return 0


def scrape_ready_deployments() -> int:
    """Scrape every ready deployment; a failing one is logged and skipped. Returns samples stored."""
    ready = Deployment.objects.filter(status__in=(DeploymentStatus.READY, DeploymentStatus.DEGRADED))
    return sum(scrape_deployment_or_log(deployment=deployment) for deployment in ready)


def prune_metric_samples(*, older_than_seconds: int | None = None) -> int:
    """Delete samples older than the retention (CONCH_METRICS_RETENTION_SECONDS); returns how many."""
    seconds = older_than_seconds if older_than_seconds is not None else settings.CONCH_METRICS_RETENTION_SECONDS
    cutoff = timezone.now() - timedelta(seconds=seconds)
    deleted, _ = MetricSample.objects.filter(scraped_at__lt=cutoff).delete()
    return deleted


# --- increases (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One stored sample of one model: taken `at`; counters (FIELDS, cumulative) counted since `counters_since`.

    `counters_since` is None when the load time is unknown (samples stored before it was recorded).
    """

    at: datetime
    counters_since: datetime | None
    counters: dict[str, float]
    #: Latency quantiles at the sample (QUANTILE_FIELDS; a value is None when Triton had none).
    quantiles: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Interval:
    """What a model did between `begin` and `end` (the sample that closes it): counter increases by field, and
    the closing sample's latency quantiles."""

    begin: datetime
    end: datetime
    increase: dict[str, float]
    quantiles: dict[str, float | None] = field(default_factory=dict)


def interval_increase(previous: Reading, current: Reading) -> dict[str, float]:
    """Increase of every counter from `previous` to the next sample `current` of the same model.

    `current - previous` per field; but when Triton restarted or reloaded the model in between
    (both loads are known and differ, or any counter went down, since Triton's counters only
    grow while a model stays loaded), the interval counts from zero: `current`'s own values.
    """
    reloaded = (
        previous.counters_since is not None
        and current.counters_since is not None
        and current.counters_since != previous.counters_since
    )
    if reloaded or any(current.counters[f] < previous.counters[f] for f in FIELDS):
        return dict(current.counters)
    return {f: current.counters[f] - previous.counters[f] for f in FIELDS}


def window_intervals(readings: list[Reading], *, start: datetime) -> list[Interval]:
    """The intervals closed inside the window that starts at `start`, with their increases.

    `readings`: one model's samples, oldest first; the first may be the latest sample at or
    before `start` (a baseline: it only opens the first interval). Each later sample closes
    the interval since the one before it. A first sample without an earlier one counts from
    zero (an interval from its `counters_since`) when its model loaded inside the window;
    when it loaded earlier, or when is unknown, part of its counts may predate the window,
    so it is only a baseline.
    """
    intervals = []
    for i, current in enumerate(readings):
        if current.at <= start:
            continue
        if i == 0:
            since = current.counters_since
            if since is not None and start <= since <= current.at:
                intervals.append(
                    Interval(begin=since, end=current.at, increase=dict(current.counters), quantiles=current.quantiles)
                )
            continue
        previous = readings[i - 1]
        intervals.append(
            Interval(
                begin=previous.at,
                end=current.at,
                increase=interval_increase(previous, current),
                quantiles=current.quantiles,
            )
        )
    return intervals


def series_step_seconds(window_seconds: float, scrape_interval_seconds: float) -> float:
    """The series' step: window / MAX_POINTS rounded up to a whole number of scrape intervals (at least one).

    A finer step would leave buckets without a sample; a coarser one downsamples long windows.
    """
    intervals = math.ceil(window_seconds / MAX_POINTS / scrape_interval_seconds - 1e-9)
    return scrape_interval_seconds * max(1, intervals)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def rate_span_seconds(
    intervals: list[Interval], *, start: datetime, end: datetime, created_at: datetime | None
) -> float | None:
    """Seconds a window's rates are over: from the window's `start`, or from `created_at` (when the deployment
    was created) when that is later, to the window's `end`; but never starting later than the first counted
    interval's begin, whose whole increase is in the totals (a baseline sample before `start`, or a load before
    `created_at`, stretches the span back to it). Time the deployment sat idle, was down between a Triton's
    restart and its next sample, or has been stopped counts: it served nothing then.

    `intervals`: the model's counted intervals (`window_intervals`), any order. Returns None when there is none
    (no two samples to subtract, and no load inside the window): nothing is known of the window's traffic, so
    its rates are unknown rather than zero. The console's overview shows this same rate (the API's
    `throughput_inferences_per_second`), so the page and the API agree.
    """
    if not intervals:
        return None
    begin = max(start, created_at) if created_at is not None else start
    begin = min(begin, min(interval.begin for interval in intervals))
    return max(0.0, (end - begin).total_seconds())


def window_rate(count: float, span_seconds: float | None) -> float | None:
    """`count` per second over `span_seconds` (`rate_span_seconds`); None when the span is unknown, 0.0 for an
    empty span (samples all at the window's end)."""
    if span_seconds is None:
        return None
    return _ratio(count, span_seconds)


def _totals(intervals: list[Interval]) -> dict[str, float]:
    return {f: sum(interval.increase[f] for interval in intervals) for f in FIELDS}


def bucket_intervals(intervals: list[Interval], *, start: datetime, step_seconds: float, buckets: int) -> list[dict]:
    """Sum `intervals` into `buckets` consecutive buckets of `step_seconds` after `start`.

    An interval belongs to the bucket holding its end (bucket i is (start + i·step,
    start + (i+1)·step]). Each point: `time` (bucket end, ISO 8601), `samples` (intervals
    closed in it), the counts (inferences, requests, executions, failures), throughput
    (inferences/s) and requests/s over the step, average request latency, queue time and compute
    time (µs per request: duration increases / request increase), average batch size (inferences
    per execution), and request latency p50 and p99 (µs: the highest of the quantiles its samples
    carry, as a quantile of several samples or pods cannot be added up). Rates are null in a bucket
    without samples (no data, not zero traffic); averages are null in one without requests, batch
    size without executions, the quantiles without a sample that has them.
    """
    members: list[list[Interval]] = [[] for _ in range(buckets)]
    for interval in intervals:
        index = math.ceil((interval.end - start).total_seconds() / step_seconds) - 1
        members[min(max(index, 0), buckets - 1)].append(interval)
    points = []
    for i, group in enumerate(members):
        t = _totals(group)
        requests = t["success_count"]
        points.append(
            {
                "time": (start + timedelta(seconds=(i + 1) * step_seconds)).isoformat(),
                "samples": len(group),
                "inference_count": t["inference_count"],
                "request_count": requests,
                "execution_count": t["execution_count"],
                "failures": t["failure_count"],
                "throughput_inferences_per_second": t["inference_count"] / step_seconds if group else None,
                "requests_per_second": requests / step_seconds if group else None,
                "average_request_latency_us": t["request_duration_us"] / requests if requests else None,
                "average_queue_time_us": t["queue_duration_us"] / requests if requests else None,
                "average_compute_time_us": (
                    (t["compute_input_duration_us"] + t["compute_infer_duration_us"] + t["compute_output_duration_us"])
                    / requests
                    if requests
                    else None
                ),
                "average_batch_size": (t["inference_count"] / t["execution_count"] if t["execution_count"] else None),
                **{name: _highest(group, name) for name in QUANTILE_FIELDS},
            }
        )
    return points


def _highest(intervals: list[Interval], name: str) -> float | None:
    values = [interval.quantiles.get(name) for interval in intervals]
    present = [value for value in values if value is not None]
    return max(present) if present else None


# --- summaries (read only) -------------------------------------------------------------


@dataclass(frozen=True)
class ModelWindowStats:
    """What one model did during a window: the sums of its interval increases.

    window_seconds: the seconds its rates are over (`rate_span_seconds`: the window, from the deployment's
    creation when that is later; null with no interval); throughput: inferences/s over it (an inference is one
    batch element), and requests_per_second; both null when the window holds no interval (fewer than two
    samples of a model loaded before the window). Latency and queue/compute times: average microseconds per
    request; average_batch_size: inferences per model execution; failures: failed requests.
    """

    model_name: str
    model_version: str
    window_seconds: float | None
    inference_count: float
    request_count: float
    execution_count: float
    throughput_inferences_per_second: float | None
    requests_per_second: float | None
    average_request_latency_us: float
    average_queue_time_us: float
    average_compute_time_us: float
    average_compute_infer_time_us: float
    average_batch_size: float
    failures: float


def _model_stats(
    key: tuple[str, str], intervals: list[Interval], *, start: datetime, end: datetime, created_at: datetime | None
) -> ModelWindowStats:
    d = _totals(intervals)
    span = rate_span_seconds(intervals, start=start, end=end, created_at=created_at)
    requests = d["success_count"]
    compute = d["compute_input_duration_us"] + d["compute_infer_duration_us"] + d["compute_output_duration_us"]
    return ModelWindowStats(
        model_name=key[0],
        model_version=key[1],
        window_seconds=None if span is None else round(span, 3),
        inference_count=d["inference_count"],
        request_count=requests,
        execution_count=d["execution_count"],
        throughput_inferences_per_second=window_rate(d["inference_count"], span),
        requests_per_second=window_rate(requests, span),
        average_request_latency_us=_ratio(d["request_duration_us"], requests),
        average_queue_time_us=_ratio(d["queue_duration_us"], requests),
        average_compute_time_us=_ratio(compute, requests),
        average_compute_infer_time_us=_ratio(d["compute_infer_duration_us"], requests),
        average_batch_size=_ratio(d["inference_count"], d["execution_count"]),
        failures=d["failure_count"],
    )


_COLUMNS = ("model_name", "model_version", "server", "scraped_at", "counters_since", *FIELDS, *QUANTILE_FIELDS)


def _reading(row: tuple) -> Reading:
    counters_end = 5 + len(FIELDS)
    return Reading(
        at=row[3],
        counters_since=row[4],
        counters=dict(zip(FIELDS, row[5:counters_end], strict=True)),
        quantiles=dict(zip(QUANTILE_FIELDS, row[counters_end:], strict=True)),
    )


def summarize(*, deployment: Deployment, window_seconds: int) -> dict:
    """Per-model totals and averages over the last `window_seconds`, and a fixed-step series.

    Reads stored samples only. The window is rounded up to whole steps (see
    series_step_seconds; the step is CONCH_METRICS_SCRAPE_INTERVAL_SECONDS or a multiple).
    Returns {"window_seconds", "step_seconds", "start", "end" (ISO 8601), "models":
    [ModelWindowStats as dict], "series": [{"model_name", "model_version", "points":
    [bucket_intervals point]}], "servers": [{"server", "models": [ModelWindowStats as dict]}]}; each model's
    counts equal the sums over its points and over its servers. A model's rates are over `rate_span_seconds`
    (its `window_seconds`): the window from `start` to `end`, or from the deployment's creation when later.
    `servers` breaks a deployment with several Tritons (Kubernetes pods) down by pod; it is [] for a local
    deployment.
    Raises InvalidInput (field `window`) for a window outside 10..86400 s.
    """
    if not MIN_WINDOW_SECONDS <= window_seconds <= MAX_WINDOW_SECONDS:
        raise InvalidInput(
            f"window must be between {MIN_WINDOW_SECONDS} and {MAX_WINDOW_SECONDS} seconds.", field="window"
        )
    step = series_step_seconds(window_seconds, settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS)
    buckets = math.ceil(window_seconds / step - 1e-9)
    end = timezone.now()
    start = end - timedelta(seconds=buckets * step)
    samples = deployment.metric_samples.all()
    by_series: dict[tuple[str, str, str], list[Reading]] = {}
    rows = samples.filter(scraped_at__gt=start, scraped_at__lte=end).order_by(
        "model_name", "model_version", "server", "scraped_at", "pk"
    )
    for row in rows.values_list(*_COLUMNS):
        by_series.setdefault((row[0], row[1], row[2]), []).append(_reading(row))
    # Each server's counters are a chain of their own; a model's figures add up its servers' intervals.
    by_model: dict[tuple[str, str], list[Interval]] = {}
    by_server: dict[str, dict[tuple[str, str], list[Interval]]] = {}
    for key, readings in sorted(by_series.items()):
        baseline = (
            samples.filter(model_name=key[0], model_version=key[1], server=key[2], scraped_at__lte=start)
            .order_by("-scraped_at", "-pk")
            .values_list(*_COLUMNS)
            .first()
        )
        chain = ([_reading(baseline)] if baseline else []) + readings
        intervals = window_intervals(chain, start=start)
        by_model.setdefault(key[:2], []).extend(intervals)
        by_server.setdefault(key[2], {}).setdefault(key[:2], []).extend(intervals)
    bounds = {"start": start, "end": end, "created_at": deployment.created_at}
    models, series = [], []
    for key, intervals in sorted(by_model.items()):
        intervals.sort(key=lambda interval: interval.end)
        models.append(asdict(_model_stats(key, intervals, **bounds)))
        points = bucket_intervals(intervals, start=start, step_seconds=step, buckets=buckets)
        series.append({"model_name": key[0], "model_version": key[1], "points": points})
    servers = [
        {
            "server": name,
            "models": [
                asdict(_model_stats(key, sorted(intervals, key=lambda interval: interval.end), **bounds))
                for key, intervals in sorted(per_model.items())
            ],
        }
        for name, per_model in sorted(by_server.items())
        if name
    ]
    return {
        "window_seconds": window_seconds,
        "step_seconds": step,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "models": models,
        "series": series,
        "servers": servers,
    }
