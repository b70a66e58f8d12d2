"""Deployments (a model version served by a Triton server) and the metric samples scraped from them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from deployments.choices import DeploymentStatus, DesiredState, Runtime


class Deployment(models.Model):
    """What to serve (a built model version), where (runtime) and how (instances, batching).

    `config_pbtxt` is the effective model configuration: the version's, with this
    deployment's overrides; it is sent with Triton's repository load request, so the
    stored repository itself is never changed. For the local runtime, `pid` and
    `process_create_time` identify the running `tritonserver` (guarding against PID reuse).
    """

    team = models.ForeignKey("tenancy.Team", on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=63)
    model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="deployments"
    )
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.LOCAL)
    instance_count = models.PositiveIntegerField(default=1)
    max_batch_size = models.PositiveIntegerField(null=True, blank=True)
    max_queue_delay_microseconds = models.PositiveIntegerField(null=True, blank=True)
    config_pbtxt = models.TextField(blank=True)
    desired_state = models.CharField(max_length=16, choices=DesiredState.choices, default=DesiredState.RUNNING)
    status = models.CharField(max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.PENDING)
    error = models.TextField(blank=True)
    last_failure = models.TextField(blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    server_id = models.CharField(max_length=100, blank=True)
    host = models.CharField(max_length=255, blank=True)
    http_port = models.PositiveIntegerField(null=True, blank=True)
    grpc_port = models.PositiveIntegerField(null=True, blank=True)
    metrics_port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    process_create_time = models.FloatField(null=True, blank=True)
    log_path = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name"],
                condition=~Q(status="stopped"),
                name="deployment_unique_active_team_name",
            )
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"

    @property
    def model_name(self) -> str:
        return self.model_version.model.name

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}" if self.http_port else ""

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}" if self.grpc_port else ""

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else ""


class MetricSample(models.Model):
    """Triton's cumulative counters for one model at one scrape (Triton "Metrics" doc: inference request metrics).

    Durations are microseconds, summed over requests; counts are totals since the model loaded.
    `counters_since` is when that load finished (the deployment's `ready_at` at the scrape):
    two samples with different values come from different loads, so the later one counts
    from zero; null on samples whose load time is unknown.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="metric_samples")
    scraped_at = models.DateTimeField(db_index=True)
    counters_since = models.DateTimeField(null=True, blank=True)
    model_name = models.CharField(max_length=63)
    model_version = models.CharField(max_length=20, blank=True)
    success_count = models.FloatField(default=0)
    failure_count = models.FloatField(default=0)
    inference_count = models.FloatField(default=0)
    execution_count = models.FloatField(default=0)
    request_duration_us = models.FloatField(default=0)
    queue_duration_us = models.FloatField(default=0)
    compute_input_duration_us = models.FloatField(default=0)
    compute_infer_duration_us = models.FloatField(default=0)
    compute_output_duration_us = models.FloatField(default=0)

    class Meta:
        ordering = ["deployment_id", "scraped_at"]
        indexes = [models.Index(fields=["deployment", "scraped_at"], name="metricsample_dep_time")]
