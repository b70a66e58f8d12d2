"""Deployments (a model version served by a Triton server) and the metric samples scraped from them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from deployments.choices import DeploymentStatus, DesiredState, PlanStatus, RuntimeName, UpdateStatus

#: Triton image of Kubernetes pods: the release of the local binary (Triton 2.51 = NGC 24.10), so what a build
#: verified is what pods run (NVIDIA "Frameworks Support Matrix").
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"


class Cluster(models.Model):
    """A Kubernetes cluster deployments may run on, registered by an admin.

    `kubeconfig_encrypted` holds the kubeconfig (YAML) encrypted with `conch.crypto` and is never shown back;
    `context` picks one of its contexts (empty: its current context). With `in_cluster`, Conch uses the service
    account of the pod it runs in instead. Pods read the model repository through `s3_endpoint` (as the pods see
    it; empty: Conch's own) with the credentials in Secret `s3_secret_name` (empty: Conch writes one per
    deployment), or as service account `pod_service_account` with no credentials from Conch.
    """

    name = models.SlugField(max_length=63, unique=True)
    namespace = models.CharField(max_length=63)
    kubeconfig_encrypted = models.TextField(blank=True)
    context = models.CharField(max_length=253, blank=True)
    in_cluster = models.BooleanField(default=False)
    triton_image = models.CharField(max_length=300, default=DEFAULT_TRITON_IMAGE)
    # The TensorRT version the Triton image carries ("10.5.0.18"), for TensorRT plans; empty: Conch's table of NGC
    # releases (deployments.services.clusters.TENSORRT_OF_RELEASE).
    tensorrt_version = models.CharField(max_length=32, blank=True)
    image_pull_secrets = models.JSONField(default=list, blank=True)
    s3_endpoint = models.CharField(max_length=300, blank=True)
    s3_secret_name = models.CharField(max_length=253, blank=True)
    # Or: the service account pods run as, whose identity the object store trusts (e.g. IAM roles for service
    # accounts); pods then get no credentials from Conch.
    pod_service_account = models.CharField(max_length=253, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.namespace})"


class TensorRTPlan(models.Model):
    """A TensorRT plan of a built ONNX version: a variant of it for one GPU product on one cluster, built there by a
    Kubernetes Job (`deployments.services.plans`), run once on Conch's inputs and compared with the ONNX model.

    `build` is the version's build whose ONNX model the plan was made from; `tensorrt_version` the TensorRT of the
    cluster's Triton (what the plan runs on), `image` the TensorRT image it was built in. Once `succeeded`,
    `repository_prefix` holds a Triton repository (`<model>/config.pbtxt` with `config_pbtxt`, `<model>/<N>/model.plan`)
    of `plan_bytes` bytes, and deployments of the version on that cluster with that GPU product serve it.
    `message` says what the Job waits for or why the plan failed, in words a user can act on; `report` holds what
    was measured (`shapes`, `build_seconds`, `run_seconds`, `tensorrt`, `comparison`: one entry per output as
    `builds.comparison.OutputComparison.to_dict()` gives it).
    """

    team = models.ForeignKey("tenancy.Team", on_delete=models.CASCADE, related_name="tensorrt_plans")
    model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.CASCADE, related_name="tensorrt_plans"
    )
    build = models.ForeignKey("builds.Build", on_delete=models.CASCADE, related_name="tensorrt_plans")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="tensorrt_plans")
    gpu_product = models.CharField(max_length=253)
    tensorrt_version = models.CharField(max_length=32)
    image = models.CharField(max_length=300)
    fp16 = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=PlanStatus.choices, default=PlanStatus.PENDING)
    message = models.TextField(blank=True)
    job_name = models.CharField(max_length=63, blank=True)
    repository_prefix = models.CharField(max_length=500, blank=True)
    config_pbtxt = models.TextField(blank=True)
    # Bytes the plan takes in the store: reserved in the team's storage quota when asked for (the ONNX model's size),
    # then what was written; 0 once it is deleted or failed.
    plan_bytes = models.PositiveBigIntegerField(default=0)
    report = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["build", "cluster", "gpu_product", "fp16"],
                condition=~Q(status="failed"),
                name="tensorrtplan_unique_live_variant",
            )
        ]

    def __str__(self) -> str:
        return f"plan {self.pk} of version {self.model_version_id} for {self.gpu_product} on {self.cluster_id}"


class Deployment(models.Model):
    """What to serve (a built model version), where (runtime) and how (instances, batching).

    `config_pbtxt` is the effective model configuration: the version's, with this
    deployment's overrides; it is sent with Triton's repository load request and written
    (serving exactly the current version) into the deployment's own repository. `runtime_state` is what the deployment's
    runtime remembers of its workload (a local process's pid and ports, Kubernetes names).
    """

    team = models.ForeignKey("tenancy.Team", on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=63)
    model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="deployments"
    )
    runtime = models.CharField(max_length=16, choices=RuntimeName.choices, default=RuntimeName.LOCAL)
    # Kubernetes runtime only: where and how many pods. `autoscaling` is {"min_replicas", "max_replicas",
    # "target_queue_time_us"} or null (fixed `replicas`); `gpu` is {"count", "product"} or {"mig_profile"} or
    # null (CPU only); `cpu` and `memory` are Kubernetes quantities requested per pod ("" = the defaults).
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, null=True, blank=True, related_name="deployments")
    replicas = models.PositiveIntegerField(default=1)
    autoscaling = models.JSONField(null=True, blank=True)
    gpu = models.JSONField(null=True, blank=True)
    cpu = models.CharField(max_length=32, blank=True)
    memory = models.CharField(max_length=32, blank=True)
    instance_count = models.PositiveIntegerField(default=1)
    max_batch_size = models.PositiveIntegerField(null=True, blank=True)
    max_queue_delay_microseconds = models.PositiveIntegerField(null=True, blank=True)
    config_pbtxt = models.TextField(blank=True)
    # The model repository this deployment serves, pinned when it is created: a rebuild of the version writes a
    # new prefix and never changes what a running or restarting deployment loads.
    repository_prefix = models.CharField(max_length=500, blank=True)
    # The TensorRT plan of the version it serves instead of the ONNX model (a Kubernetes deployment on the plan's
    # cluster and GPU product), pinned like `repository_prefix`; null: the build's own model.
    tensorrt_plan = models.ForeignKey(
        TensorRTPlan, on_delete=models.PROTECT, null=True, blank=True, related_name="deployments"
    )
    # Bytes of the deployment's own repository in the object store (`deployments.services.repository`): reserved
    # in the team's storage quota when the deployment is created (and for a hot update's next version), then what
    # is measured there once written; 0 once the repository is deleted (after a stop).
    repository_bytes = models.PositiveBigIntegerField(default=0)
    desired_state = models.CharField(max_length=16, choices=DesiredState.choices, default=DesiredState.RUNNING)
    status = models.CharField(max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.PENDING)
    error = models.TextField(blank=True)
    # One line on what the runtime sees and what to do, e.g. "waiting for a GPU: 0/2 nodes have 3 free
    # nvidia.com/gpu"; replicas and pods as last observed (Kubernetes runtime).
    status_message = models.TextField(blank=True)
    observed = models.JSONField(default=dict, blank=True)
    last_failure = models.TextField(blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    # A failure restarting cannot fix (Triton refused the model): reconcile stops retrying.
    permanent_failure = models.BooleanField(default=False)
    # Written while a start task works on the deployment; a stale one means the task died.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The runtime's own record of the workload (see deployments.runtimes); opaque to everything else.
    runtime_state = models.JSONField(default=dict, blank=True)
    # A hot version update (deployments.services.updates): the version asked for, where it stands, and why it
    # failed (the server and Triton's message); the deployment keeps serving `model_version` until it succeeds.
    target_model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    update_status = models.CharField(max_length=16, choices=UpdateStatus.choices, blank=True, default=UpdateStatus.NONE)
    update_error = models.TextField(blank=True)
    # Written while an update task works on the deployment; a stale one means the task died.
    update_heartbeat_at = models.DateTimeField(null=True, blank=True)
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


class MetricSample(models.Model):
    """Triton's cumulative counters for one model at one scrape (Triton "Metrics" doc: inference request metrics).

    Durations are microseconds, summed over requests; counts are totals since the model loaded.
    `server` names the Triton scraped (a pod; "" for a local deployment's one server).
    `counters_since` is when that load finished (the deployment's `ready_at` at the scrape):
    two samples with different values come from different loads, so the later one counts
    from zero; null on samples whose load time is unknown.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="metric_samples")
    scraped_at = models.DateTimeField(db_index=True)
    counters_since = models.DateTimeField(null=True, blank=True)
    model_name = models.CharField(max_length=63)
    model_version = models.CharField(max_length=20, blank=True)
    # Which Triton of the deployment was scraped: a pod's name on Kubernetes, "" for the one local server. Each
    # server's counters are a series of their own; summaries add the series up.
    server = models.CharField(max_length=253, blank=True)
    success_count = models.FloatField(default=0)
    failure_count = models.FloatField(default=0)
    inference_count = models.FloatField(default=0)
    execution_count = models.FloatField(default=0)
    request_duration_us = models.FloatField(default=0)
    queue_duration_us = models.FloatField(default=0)
    compute_input_duration_us = models.FloatField(default=0)
    compute_infer_duration_us = models.FloatField(default=0)
    compute_output_duration_us = models.FloatField(default=0)
    # Request latency quantiles (µs) of Triton's summary at the scrape (gauges over its recent requests, not
    # counters); null while the summary held no request, or from a Triton without summaries.
    request_p50_us = models.FloatField(null=True, blank=True)
    request_p99_us = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["deployment_id", "scraped_at"]
        indexes = [models.Index(fields=["deployment", "scraped_at"], name="metricsample_dep_time")]


class GatewayUsage(models.Model):
    """Inference gateway use by one token on one deployment on one day (UTC), as the gateway counted it.

    `inferences`: batch items of infer requests (the first dimension of the first input of a batching model; 1
    per request otherwise); `errors`: answers with a status >= 400; `bytes_in` / `bytes_out`: request and answer
    bodies in bytes. Written in batches by the gateway (`deployments.services.gateway.record_gateway_usage`).
    """

    token = models.ForeignKey("tenancy.ApiToken", on_delete=models.CASCADE, related_name="gateway_usage")
    team = models.ForeignKey("tenancy.Team", on_delete=models.CASCADE, related_name="gateway_usage")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="gateway_usage")
    day = models.DateField()
    requests = models.PositiveBigIntegerField(default=0)
    inferences = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    bytes_in = models.PositiveBigIntegerField(default=0)
    bytes_out = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "deployment", "day"], name="gateway_usage_unique_token_day")
        ]
        indexes = [models.Index(fields=["team", "day"])]

    def __str__(self) -> str:
        return f"{self.token_id} on {self.deployment_id} {self.day}"
