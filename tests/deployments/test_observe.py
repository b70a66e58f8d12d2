"""Metrics: parsing Triton's Prometheus text, window summaries from counter deltas, pruning."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from deployments.models import Deployment, MetricSample
from deployments.observe import prune_metric_samples, summarize
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


@pytest.fixture
def deployment(built_classifier, alice):
    return Deployment.objects.create(
        team=alice.team,
        name="web",
        model_version=built_classifier,
        status="ready",
        config_pbtxt=built_classifier.config_pbtxt,
    )


def _sample(deployment, seconds_ago, **values):
    fields = {
        f: 0.0
        for f in (
            "success_count",
            "failure_count",
            "inference_count",
            "execution_count",
            "request_duration_us",
            "queue_duration_us",
            "compute_input_duration_us",
            "compute_infer_duration_us",
            "compute_output_duration_us",
        )
    }
    fields.update(values)
    return MetricSample.objects.create(
        deployment=deployment,
        scraped_at=timezone.now() - timedelta(seconds=seconds_ago),
        model_name="classifier",
        model_version="1",
        **fields,
    )


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


@pytest.mark.django_db
def test_summary_restarts_deltas_after_a_counter_reset(deployment):
    _sample(deployment, 100, success_count=500, inference_count=500, execution_count=500)
    _sample(deployment, 0, success_count=4, inference_count=4, execution_count=2)
    [stats] = summarize(deployment=deployment, window_seconds=300)["models"]
    assert stats["inference_count"] == 4
    assert stats["average_batch_size"] == 2


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
