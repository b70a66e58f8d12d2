"""Metrics: parsing Triton's Prometheus text, per-interval increases, window summaries and series, pruning.

The last test scrapes a real Triton across a restart of it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.utils import timezone

from builds.services import latest_config_pbtxt
from deployments import services, tasks
from deployments.models import Deployment, MetricSample
from deployments.observe import (
    FIELDS,
    Interval,
    Reading,
    bucket_intervals,
    interval_increase,
    prune_metric_samples,
    series_step_seconds,
    summarize,
    window_intervals,
)
from deployments.runtimes.local import LocalServerState
from tritonserving import server as triton_server
from tritonserving.metrics import parse_triton_metrics

TRITON_TEXT = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="classifier",version="1"} 10
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="classifier",reason="REJECTED",version="1"} 1
nv_inference_request_failure{model="classifier",reason="BACKEND",version="1"} 2
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="classifier",version="1"} 40
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="classifier",version="1"} 5
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="classifier",version="1"} 50000
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="classifier",version="1"} 10000
# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="classifier",version="1"} 1000
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="classifier",version="1"} 30000
# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="classifier",version="1"} 2000
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.5
"""


def test_parse_triton_metrics_sums_labels_per_model_version():
    [counters] = parse_triton_metrics(TRITON_TEXT)
    assert (counters.model_name, counters.model_version) == ("classifier", "1")
    assert counters.success_count == 10
    assert counters.failure_count == 3
    assert counters.inference_count == 40
    assert counters.execution_count == 5
    assert counters.request_duration_us == 50000
    assert counters.compute_infer_duration_us == 30000


SUMMARY_TEXT = """\
# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="classifier",version="1"} 10
nv_inference_request_summary_us_sum{model="classifier",version="1"} 50000
nv_inference_request_summary_us{model="classifier",version="1",quantile="0.5"} 4200
nv_inference_request_summary_us{model="classifier",version="1",quantile="0.9"} 8000
nv_inference_request_summary_us{model="classifier",version="1",quantile="0.99"} 9900
nv_inference_request_summary_us_count{model="idle",version="1"} 0
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="idle",version="1"} 0
nv_inference_request_summary_us_sum{model="idle",version="1"} 0
nv_inference_request_summary_us{model="idle",version="1",quantile="0.5"} NaN
nv_inference_request_summary_us{model="idle",version="1",quantile="0.99"} NaN
"""


def test_parse_triton_metrics_reads_the_latency_quantiles_of_the_summaries():
    classifier, idle = parse_triton_metrics(TRITON_TEXT + SUMMARY_TEXT)
    assert (classifier.model_name, classifier.request_p50_us, classifier.request_p99_us) == ("classifier", 4200, 9900)
    # the summary's count and sum are not taken for the request counter
    assert classifier.success_count == 10
    # a summary without requests (NaN) is no quantile, not zero
    assert (idle.model_name, idle.request_p50_us, idle.request_p99_us) == ("idle", None, None)


def test_parse_triton_metrics_without_summaries_has_no_quantiles():
    [counters] = parse_triton_metrics(TRITON_TEXT)
    assert (counters.request_p50_us, counters.request_p99_us) == (None, None)


@pytest.fixture
def deployment(built_classifier, alice):
    return Deployment.objects.create(
        team=alice.team,
        name="web",
        model_version=built_classifier,
        status="ready",
        config_pbtxt=latest_config_pbtxt(built_classifier),
    )


def _sample(deployment, seconds_ago, *, counters_since=None, now=None, **values):
    fields = {f: 0.0 for f in FIELDS}
    fields.update(values)
    return MetricSample.objects.create(
        deployment=deployment,
        scraped_at=(now or timezone.now()) - timedelta(seconds=seconds_ago),
        counters_since=counters_since,
        model_name="classifier",
        model_version="1",
        **fields,
    )


# --- the increase rule (pure) ---------------------------------------------------------

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _reading(seconds: float, since: float | None = 0.0, **values: float) -> Reading:
    counters = {f: 0.0 for f in FIELDS}
    counters.update(values)
    return Reading(
        at=T0 + timedelta(seconds=seconds),
        counters_since=None if since is None else T0 + timedelta(seconds=since),
        counters=counters,
    )


def test_increase_is_the_difference_while_the_model_stays_loaded():
    increase = interval_increase(
        _reading(0, success_count=10, request_duration_us=900), _reading(5, success_count=13, request_duration_us=1200)
    )
    assert increase["success_count"] == 3
    assert increase["request_duration_us"] == 300
    assert increase["failure_count"] == 0


def test_increase_counts_from_zero_when_a_counter_went_down():
    # Triton restarted: its counters began again at zero; the load time is not known here
    previous = _reading(0, since=None, success_count=500, request_duration_us=90000)
    current = _reading(5, since=None, success_count=4, request_duration_us=100000)
    increase = interval_increase(previous, current)
    assert increase["success_count"] == 4
    # every field of that interval counts from zero, not only the one that went down
    assert increase["request_duration_us"] == 100000


def test_increase_counts_from_zero_after_a_reload_even_when_counters_grew_past_the_old_values():
    previous = _reading(0, since=0, success_count=2, inference_count=2)
    current = _reading(5, since=3, success_count=3, inference_count=3)
    assert interval_increase(previous, current)["success_count"] == 3


def test_an_unknown_load_time_is_no_reason_to_count_from_zero():
    previous = _reading(0, since=None, success_count=2)
    current = _reading(5, since=3, success_count=3)
    assert interval_increase(previous, current)["success_count"] == 1


def test_a_first_sample_counts_from_zero_when_its_model_loaded_inside_the_window():
    start = T0 + timedelta(seconds=100)
    [interval] = window_intervals([_reading(130, since=120, success_count=7)], start=start)
    assert (interval.begin, interval.increase["success_count"]) == (T0 + timedelta(seconds=120), 7)


def test_a_first_sample_whose_model_loaded_before_the_window_is_only_a_baseline():
    # some of its 7 requests may have been answered before the window: none is counted
    start = T0 + timedelta(seconds=100)
    readings = [_reading(130, since=50, success_count=7), _reading(135, since=50, success_count=9)]
    [interval] = window_intervals(readings, start=start)
    assert interval.increase["success_count"] == 2
    assert window_intervals([_reading(130, since=None, success_count=7)], start=start) == []


def test_window_increases_add_up_across_restarts():
    # given a baseline before the window, then a restart that went unnoticed by the counters (3 >= 2)
    # and one where they went down
    start = T0 + timedelta(seconds=100)
    readings = [
        _reading(95, since=0, success_count=40),
        _reading(105, since=0, success_count=42),  # +2
        _reading(115, since=110, success_count=3),  # restarted at 110: +3
        _reading(125, since=110, success_count=5),  # +2
        _reading(135, since=None, success_count=1),  # restarted again (load time unknown): +1
    ]
    intervals = window_intervals(readings, start=start)
    assert [i.increase["success_count"] for i in intervals] == [2, 3, 2, 1]
    assert intervals[0].begin == T0 + timedelta(seconds=95)


@pytest.mark.parametrize(
    ("window", "interval", "step"),
    [(10, 5.0, 5.0), (300, 5.0, 5.0), (301, 5.0, 10.0), (3600, 5.0, 60.0), (86400, 5.0, 1440.0), (300, 7.0, 7.0)],
)
def test_series_step_is_a_sixtieth_of_the_window_in_whole_scrape_intervals(window, interval, step):
    assert series_step_seconds(window, interval) == step


def test_buckets_hold_the_intervals_that_end_in_them():
    start = T0
    counters = {f: 0.0 for f in FIELDS}

    def closed_at(seconds, requests, duration):
        increase = {**counters, "success_count": requests, "inference_count": requests, "request_duration_us": duration}
        return Interval(begin=T0, end=T0 + timedelta(seconds=seconds), increase=increase)

    points = bucket_intervals(
        [closed_at(5, 1, 100), closed_at(7, 2, 500), closed_at(10, 1, 300)], start=start, step_seconds=10, buckets=3
    )
    assert [p["request_count"] for p in points] == [4, 0, 0]
    assert [p["samples"] for p in points] == [3, 0, 0]
    assert points[0]["throughput_inferences_per_second"] == pytest.approx(0.4)
    assert points[0]["average_request_latency_us"] == pytest.approx(225)
    # a step without samples has no data, which is not zero traffic
    assert points[1]["throughput_inferences_per_second"] is None
    assert points[1]["average_request_latency_us"] is None
    assert points[2]["time"] == (T0 + timedelta(seconds=30)).isoformat()


@pytest.mark.django_db
def test_summary_uses_counter_deltas_over_the_window(deployment):
    # given a sample before the window and two inside it
    _sample(deployment, 400, success_count=100, inference_count=100, execution_count=100)
    _sample(
        deployment,
        200,
        success_count=110,
        inference_count=140,
        execution_count=105,
        request_duration_us=5000,
        queue_duration_us=1000,
        compute_infer_duration_us=3000,
    )
    _sample(
        deployment,
        0,
        success_count=120,
        inference_count=180,
        execution_count=110,
        request_duration_us=10000,
        queue_duration_us=2000,
        compute_input_duration_us=200,
        compute_infer_duration_us=6000,
        compute_output_duration_us=300,
        failure_count=2,
    )
    # when
    [stats] = summarize(deployment=deployment, window_seconds=300)["models"]
    # then deltas run from the sample at 400 s ago to now
    assert stats["inference_count"] == 80
    assert stats["request_count"] == 20
    assert stats["throughput_inferences_per_second"] == pytest.approx(80 / 400, rel=1e-3)
    assert stats["requests_per_second"] == pytest.approx(20 / 400, rel=1e-3)
    assert stats["average_request_latency_us"] == pytest.approx(500)
    assert stats["average_queue_time_us"] == pytest.approx(100)
    assert stats["average_compute_time_us"] == pytest.approx(325)
    assert stats["average_batch_size"] == pytest.approx(8)
    assert stats["failures"] == 2


def test_series_points_carry_queue_compute_batch_and_the_highest_quantiles(deployment):
    # given a baseline, then two samples in one 5 s step (two pods' worth of quantiles) and one in a later step
    now = timezone.now()
    _sample(deployment, 100, now=now)
    _sample(
        deployment,
        52,
        now=now,
        success_count=4,
        inference_count=12,
        execution_count=3,
        request_duration_us=4000,
        queue_duration_us=400,
        compute_infer_duration_us=2000,
        request_p50_us=900,
        request_p99_us=1500,
    )
    _sample(
        deployment,
        51,
        now=now,
        success_count=6,
        inference_count=16,
        execution_count=4,
        request_duration_us=6000,
        queue_duration_us=1000,
        compute_infer_duration_us=3000,
        compute_input_duration_us=100,
        compute_output_duration_us=100,
        request_p50_us=800,
        request_p99_us=2500,
    )
    # when the series is read
    points = summarize(deployment=deployment, window_seconds=300)["series"][0]["points"]
    [busy] = [p for p in points if p["samples"] and p["request_count"]]
    # then the step's averages come from its counter increases, its quantiles are the highest it saw
    assert busy["request_count"] == 6
    assert busy["average_queue_time_us"] == pytest.approx(1000 / 6)
    assert busy["average_compute_time_us"] == pytest.approx(3200 / 6)
    assert busy["average_batch_size"] == pytest.approx(16 / 4)
    assert (busy["request_p50_us"], busy["request_p99_us"]) == (900, 2500)
    # and a step without samples has no value, not zero
    empty = points[0]
    assert empty["samples"] == 0
    assert [empty[k] for k in ("average_queue_time_us", "average_batch_size", "request_p50_us")] == [None] * 3


@pytest.mark.django_db
def test_summary_restarts_deltas_after_a_counter_reset(deployment):
    _sample(deployment, 100, success_count=500, inference_count=500, execution_count=500)
    _sample(deployment, 0, success_count=4, inference_count=4, execution_count=2)
    [stats] = summarize(deployment=deployment, window_seconds=300)["models"]
    assert stats["inference_count"] == 4
    assert stats["average_batch_size"] == 2


def _created(deployment, seconds_ago: float, now):
    Deployment.objects.filter(pk=deployment.pk).update(created_at=now - timedelta(seconds=seconds_ago))
    deployment.refresh_from_db()


@pytest.mark.django_db
def test_the_api_rate_of_a_burst_then_a_stop_is_over_the_whole_window(alice, deployment, settings):
    # given a deployment created an hour ago that served 100 inferences in 10 s, fourteen minutes ago, then stopped
    # (no sample after it): 10 inf/s over the stretch its samples cover
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    now = timezone.now()
    _created(deployment, 3600, now)
    _sample(deployment, 890, now=now)
    _sample(deployment, 880, now=now, success_count=50, inference_count=100, execution_count=50)
    # when the API is asked for the last 15 minutes
    response = alice.client.get(f"/api/v1/deployments/{deployment.pk}/metrics?window=900")
    assert response.status_code == 200
    [model] = response.json()["models"]
    # then the 100 inferences are spread over the 900 s of the window, not the 10 s between the samples
    assert model["inference_count"] == 100
    assert model["window_seconds"] == pytest.approx(900, abs=1)
    assert model["throughput_inferences_per_second"] == pytest.approx(100 / 900, rel=1e-3)
    assert model["requests_per_second"] == pytest.approx(50 / 900, rel=1e-3)


@pytest.mark.django_db
def test_the_rate_across_a_triton_restart_counts_both_loads_over_the_window(deployment, settings):
    # given a baseline before the window, 100 inferences, then Triton restarted (its counters start from zero),
    # served 20 more and was not scraped again
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    now = timezone.now()
    _created(deployment, 3600, now)
    first, second = now - timedelta(seconds=2000), now - timedelta(seconds=510)
    _sample(deployment, 910, now=now, counters_since=first, inference_count=500)
    _sample(deployment, 800, now=now, counters_since=first, inference_count=600)
    _sample(deployment, 500, now=now, counters_since=second, inference_count=20)
    # when
    [stats] = summarize(deployment=deployment, window_seconds=900)["models"]
    # then both loads count, over the span from the baseline (its interval is counted whole) to now
    assert stats["inference_count"] == 120
    assert stats["window_seconds"] == pytest.approx(910, abs=1)
    assert stats["throughput_inferences_per_second"] == pytest.approx(120 / 910, rel=1e-3)


@pytest.mark.django_db
def test_a_deployment_younger_than_the_window_has_its_rate_over_its_age(deployment, settings):
    # given a deployment created a minute ago, loaded 5 s later, that served 30 inferences and was scraped twice
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    now = timezone.now()
    _created(deployment, 60, now)
    loaded = now - timedelta(seconds=55)
    _sample(deployment, 50, now=now, counters_since=loaded, inference_count=5)
    _sample(deployment, 30, now=now, counters_since=loaded, inference_count=30)
    # when 15 minutes are asked for
    [stats] = summarize(deployment=deployment, window_seconds=900)["models"]
    # then the rate is over the minute it existed: not over 900 s, nor the 25 s its samples cover
    assert stats["inference_count"] == 30
    assert stats["window_seconds"] == pytest.approx(60, abs=1)
    assert stats["throughput_inferences_per_second"] == pytest.approx(30 / 60, rel=1e-2)


@pytest.mark.django_db
def test_one_sample_of_a_model_loaded_inside_the_window_is_a_rate_over_the_window(deployment, settings):
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    now = timezone.now()
    _created(deployment, 3600, now)
    _sample(deployment, 90, now=now, counters_since=now - timedelta(seconds=100), inference_count=9)
    [stats] = summarize(deployment=deployment, window_seconds=300)["models"]
    assert stats["inference_count"] == 9
    assert stats["throughput_inferences_per_second"] == pytest.approx(9 / 300, rel=1e-3)


@pytest.mark.django_db
def test_one_sample_of_a_model_loaded_before_the_window_has_an_unknown_rate(alice, deployment, settings):
    # given a single sample in the window, its model loaded before it, and no sample before the window
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    now = timezone.now()
    _created(deployment, 3600, now)
    _sample(deployment, 90, now=now, counters_since=now - timedelta(seconds=1000), inference_count=9)
    # when
    [model] = alice.client.get(f"/api/v1/deployments/{deployment.pk}/metrics?window=300").json()["models"]
    # then nothing is known of the window's traffic: no rate (not a rate of zero), and nothing counted
    assert model["inference_count"] == 0
    assert (model["throughput_inferences_per_second"], model["requests_per_second"]) == (None, None)
    assert model["window_seconds"] is None


@pytest.mark.django_db
def test_a_window_without_samples_lists_no_model(deployment):
    _sample(deployment, 4000, inference_count=9)
    assert summarize(deployment=deployment, window_seconds=300)["models"] == []


@pytest.mark.django_db
def test_summary_totals_equal_the_sums_over_a_downsampled_series(deployment, settings):
    # given an hour of samples every 5 s, with traffic, failures and two Triton restarts
    settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = 5.0
    rng = random.Random(7)
    now = timezone.now()
    since = now - timedelta(seconds=4000)
    values = dict.fromkeys(FIELDS, 0.0)
    _sample(deployment, 3602, counters_since=since, now=now, **values)  # baseline, before the window
    expected = dict.fromkeys(("success_count", "inference_count", "failure_count"), 0.0)
    for seconds_ago in range(3598, 0, -5):
        if seconds_ago in (2398, 698):  # Triton restarted just before this sample
            since = now - timedelta(seconds=seconds_ago + 1)
            values = dict.fromkeys(FIELDS, 0.0)
        requests = rng.randint(0, 4)
        failures = rng.randint(0, 1)
        values["success_count"] += requests
        values["inference_count"] += 2 * requests
        values["execution_count"] += requests
        values["failure_count"] += failures
        values["request_duration_us"] += 1000.0 * requests
        expected["success_count"] += requests
        expected["inference_count"] += 2 * requests
        expected["failure_count"] += failures
        _sample(deployment, seconds_ago, counters_since=since, now=now, **values)
    # when an hour is summarized
    summary = summarize(deployment=deployment, window_seconds=3600)
    [stats] = summary["models"]
    [series] = summary["series"]
    points = series["points"]
    # then 720 samples come back as 60 one-minute steps
    assert summary["step_seconds"] == 60
    assert len(points) == 60
    assert sum(p["samples"] for p in points) == 720
    # and the summary holds every request, restarts included, as do the steps added up
    assert stats["request_count"] == expected["success_count"]
    assert stats["inference_count"] == expected["inference_count"]
    assert stats["failures"] == expected["failure_count"]
    assert sum(p["request_count"] for p in points) == stats["request_count"]
    assert sum(p["inference_count"] for p in points) == stats["inference_count"]
    assert sum(p["execution_count"] for p in points) == stats["execution_count"]
    assert sum(p["failures"] for p in points) == stats["failures"]
    busy = [p for p in points if p["request_count"]]
    assert all(p["average_request_latency_us"] == pytest.approx(1000) for p in busy)


@pytest.mark.django_db
def test_metrics_api_rejects_a_bad_window(alice, deployment):
    for window in ("abc", "5", "100000"):
        response = alice.client.get(f"/api/v1/deployments/{deployment.pk}/metrics?window={window}")
        assert response.status_code == 400
        assert response.json()["field"] == "window"


@pytest.mark.django_db
def test_prune_deletes_only_old_samples(deployment, settings):
    settings.CONCH_METRICS_RETENTION_SECONDS = 3600
    _sample(deployment, 7200)
    keep = _sample(deployment, 60)
    assert prune_metric_samples() == 1
    assert list(MetricSample.objects.values_list("pk", flat=True)) == [keep.pk]


@pytest.mark.django_db
def test_deployment_page_requires_login_and_shows_status(client, alice, deployment):
    response = client.get(f"/deployments/{deployment.pk}/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    client.force_login(alice.user)
    response = client.get(f"/deployments/{deployment.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "web" in html and "ready" in html and "max_batch_size: 8" in html
    assert "chart-throughput" in html
    # a session-authenticated browser can read the metrics the chart draws
    assert client.get(f"/api/v1/deployments/{deployment.pk}/metrics?window=300").status_code == 200


@pytest.mark.django_db
def test_deployment_page_of_another_team_is_404(client, bob, deployment):
    client.force_login(bob.user)
    assert client.get(f"/deployments/{deployment.pk}/").status_code == 404


def _wait_until_dead(pid: int, create_time: float) -> None:
    deadline = time.monotonic() + 30
    while triton_server.is_alive(pid, create_time) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.triton
@pytest.mark.django_db
def test_metrics_window_across_a_real_triton_restart_counts_every_request(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given a ready deployment on a real Triton
    body = {"name": "web", "team": alice.team.slug, "model_version": built_classifier.pk, "runtime": "local"}
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post("/api/v1/deployments/", body, format="json")
    row = Deployment.objects.get(pk=response.json()["id"])
    assert row.status == "ready", row.error
    x = np.zeros((1, 3, 224, 224), dtype=np.float32)
    request = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    url = f"/api/v1/deployments/{row.pk}/"

    def infer(times: int) -> None:
        for _ in range(times):
            assert alice.client.post(url + "infer", request, format="json").status_code == 200

    def window_requests() -> float:
        [stats] = alice.client.get(url + "metrics?window=300").json()["models"]
        return stats["request_count"]

    # when it answers 2 requests and the periodic scrape runs
    infer(2)
    assert tasks.scrape_metrics() == 1
    assert window_requests() == 2
    # then a metrics read only reads: the request answered since that scrape is not stored by it
    infer(1)
    stored = MetricSample.objects.count()
    assert window_requests() == 2
    assert MetricSample.objects.count() == stored
    # when its Triton dies and is started again, answers 4 more requests and is scraped
    tasks.scrape_metrics()
    server = LocalServerState.from_state(row.runtime_state)
    os.kill(server.pid, signal.SIGKILL)
    _wait_until_dead(server.pid, server.create_time)
    with django_capture_on_commit_callbacks(execute=True):  # reconcile sees it dead and restarts it
        assert services.reconcile_deployments()["failed"] == 1
    row.refresh_from_db()
    assert row.status == "ready", row.error
    infer(4)
    assert tasks.scrape_metrics() == 1
    # then the window holds all 7, although the new Triton's counter (4) is above the old one (3)
    summary = alice.client.get(url + "metrics?window=300").json()
    [stats] = summary["models"]
    assert (stats["request_count"], stats["inference_count"]) == (7, 7)
    assert sum(p["request_count"] for p in summary["series"][0]["points"]) == 7
    # and the Triton Conch started keeps latency summaries: the scrape stored a p50 and a p99
    latest = MetricSample.objects.filter(deployment=row).latest("scraped_at")
    assert 0 < latest.request_p50_us <= latest.request_p99_us
    services.stop_deployment(deployment_id=row.pk)
