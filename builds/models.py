"""Build attempts of a model version, their steps (each with its status and log lines) and the repositories they
wrote."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from builds.choices import OPEN_BUILD_STATUSES, BuildStatus, StepName, StepStatus


class Build(models.Model):
    """One build attempt of a model version: numbered 1, 2, 3… per version, never reused, never rewritten by another.

    A version's history is its attempts. The version's current build is its highest attempt; the build it serves
    is its latest `succeeded` one (`repository_prefix`: `<prefix>/<model name>/config.pbtxt`,
    `<prefix>/<model name>/<number>/model.onnx`). `options` are the build options this attempt used
    (`builds.model_config.parse_build_options` reads them; "samples" describes stored sample inputs).

    `heartbeat_at` is the last sign of life: while `queued`, when it was queued (or sent again); while
    `building`, the worker's last heartbeat; once over, when it ended. The sweeper
    (`builds.services.sweep_stalled_versions`) acts on open attempts whose heartbeat is too old.
    `lost_attempts` counts the attempts lost in a row just before this one (their worker stopped mid-build,
    status `lost`); a user's build or rebuild starts again from 0. An attempt the sweeper failed because its worker
    stopped once too often counts itself too (CONCH_BUILD_MAX_ATTEMPTS). `worker` names the Celery worker that claimed
    it (host and process id). `config_pbtxt` is the Triton model configuration its configure step generated (and
    verify may have corrected); `error`/`error_field` say why it failed. `source_format` is the uploaded file's
    format as the inspect step told it (`builds.formats.FORMATS` keys: "onnx", "lightgbm"…); `conversion`, for a
    converted format, the conversion report: `builds.formats.Conversion.to_dict()` plus, once verify compared the
    served model with the source framework, "comparison" (`builds.comparison.OutputComparison.to_dict()` per output).
    """

    version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE, related_name="builds")
    attempt = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=BuildStatus.choices, default=BuildStatus.QUEUED)
    options = models.JSONField(default=dict, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    lost_attempts = models.PositiveSmallIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    repository_prefix = models.CharField(max_length=500, blank=True)
    config_pbtxt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    error_field = models.CharField(max_length=100, blank=True)
    source_format = models.CharField(max_length=32, blank=True)
    conversion = models.JSONField(null=True, blank=True)
    # A Python model's execution environment (builds.services.environments): {"key", "size_bytes", "reused",
    # "target", "pins": [{"name", "version", "sha256", "filename"}]}; null for every other model.
    environment = models.JSONField(null=True, blank=True)
    # The custom backend a model of a registered backend was built with: {"name", "version", "kind", "id"}; null
    # for models served by Triton's own backends.
    backend = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["version_id", "attempt"]
        constraints = [models.UniqueConstraint(fields=["version", "attempt"], name="build_unique_version_attempt")]
        # The sweeper's query: attempts in one status whose heartbeat is older than a bound.
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="build_status_heartbeat")]

    def __str__(self) -> str:
        return f"{self.version} attempt {self.attempt}: {self.status}"

    @property
    def is_open(self) -> bool:
        """Whether a worker has this attempt or will (`queued` or `building`)."""
        return self.status in OPEN_BUILD_STATUSES


class BuildStep(models.Model):
    """One of the four steps of a build attempt (inspect, configure, write repository, verify) and its log."""

    build = models.ForeignKey(Build, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=32, choices=StepName.choices)
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    log = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["build_id", "position"]
        constraints = [models.UniqueConstraint(fields=["build", "name"], name="buildstep_unique_build_name")]

    def __str__(self) -> str:
        return f"{self.build} {self.name}: {self.status}"


class BuildRepository(models.Model):
    """The Triton model repository one build attempt wrote to the object store, and its size in bytes.

    A row is written (storage reserved against the team's quota) just before the attempt writes its objects
    under `prefix`, and deleted once those objects are gone (garbage collection of unused attempts, or the
    version's deletion): the team's storage counts it all that time (`builds.services.storage`).
    """

    version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.CASCADE, related_name="build_repositories"
    )
    attempt = models.PositiveIntegerField()
    prefix = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField()
    written_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["version_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["version", "attempt"], name="buildrepository_unique_version_attempt")
        ]

    def __str__(self) -> str:
        return f"{self.prefix} ({self.size_bytes} bytes)"


class CustomBackend(models.Model):
    """A Triton backend a team registered (Triton "Backends"; Tencent's TNN backend is one), served to the team's
    models whose configuration names it (`backend: "<name>"`).

    `kind` is "python" for a Python-based backend (a folder with `model.py`, Python backend README "Python-based
    Backends") or "library" for a shared library `libtriton_<name>.so` with the libraries it needs
    (`builds.backend_library` checked it). Its files lie in the object store under `files_prefix`
    (`backends/<team id>/<name>/<version>/`); `size_bytes` is their sum. `report` is what the checks found
    (entry points, needed libraries, the Triton backend API version it was checked against). A model built with it
    records the version it used (`Build.backend`), so registering a newer version changes no built model.
    """

    KIND_PYTHON = "python"
    KIND_LIBRARY = "library"
    KINDS = ((KIND_PYTHON, "Python-based backend (model.py)"), (KIND_LIBRARY, "Shared library (libtriton_<name>.so)"))

    team = models.ForeignKey("tenancy.Team", on_delete=models.CASCADE, related_name="custom_backends")
    name = models.CharField(max_length=63)
    version = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=KINDS)
    files_prefix = models.CharField(max_length=300)
    files = models.JSONField(default=list)
    size_bytes = models.PositiveBigIntegerField(default=0)
    report = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name", "version"], name="custombackend_unique_team_name_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


class Pipeline(models.Model):
    """A team's pipeline: a Triton ensemble of steps, each a built model version (Triton "Ensemble Models"). Its
    `name` is the ensemble's model name, a DNS label like a model's. Versions (`PipelineVersion`) hold what was
    checked and generated."""

    team = models.ForeignKey("tenancy.Team", on_delete=models.CASCADE, related_name="pipelines")
    name = models.CharField(max_length=63)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="pipeline_unique_team_name")]

    def __str__(self) -> str:
        return self.name


class PipelineVersion(models.Model):
    """One version of a pipeline, checked as a graph when it was made (`builds.ensembles.check_pipeline`).

    `spec` is what the caller gave: {"inputs": {name: {"datatype", "dims"}}, "outputs": [name], "max_batch_size",
    "steps": [{"name", "model_version": id, "inputs": {model input: tensor}, "outputs": {model output: tensor}}]};
    `graph` what the check found: {"order": [step names], "tensors": {name: {"datatype", "dims", "producer"}}};
    `config_pbtxt` the ensemble's generated model configuration (`platform: "ensemble"`).
    """

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    graph = models.JSONField()
    config_pbtxt = models.TextField()
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pipeline_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "number"], name="pipelineversion_unique_pipeline_number")
        ]
