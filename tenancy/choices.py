"""Statuses and kinds owned by the tenancy app."""

from django.db import models


class Role(models.TextChoices):
    """A member's role in one team, weakest first (each role may do what the ones before it may)."""

    VIEWER = "viewer", "Viewer"
    DEVELOPER = "developer", "Developer"
    ADMIN = "admin", "Admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)


class Scope(models.TextChoices):
    """What an API token may be used for (on top of its user's role in the token's team)."""

    READ = "read", "Read"
    MODELS_WRITE = "models:write", "Register and upload models, rebuild versions"
    DEPLOYMENTS_WRITE = "deployments:write", "Create, change and stop deployments"
    INFER = "infer", "Send inference requests"


class AuditAction(models.TextChoices):
    """What an audit entry records (`tenancy.audit.record_audit`): `<object>.<what happened>`, past tense.

    Not a database `choices=` (a new action needs no migration); `record_audit` refuses a name missing here.
    """

    TEAM_CREATED = "team.created", "Team created"
    TEAM_PICKLES_CHANGED = "team.pickled_models_changed", "Pickled models allowed or refused"
    MEMBERSHIP_CHANGED = "membership.changed", "Member added or role changed"
    MEMBERSHIP_REMOVED = "membership.removed", "Member removed"
    USER_CREATED = "user.created", "User created"
    USER_CHANGED = "user.changed", "User's password or staff status changed"
    TOKEN_CREATED = "token.created", "API token created"
    TOKEN_REVOKED = "token.revoked", "API token revoked"
    TOKEN_RATE_LIMIT_CHANGED = "token.rate_limit_changed", "API token's gateway rate limit changed"
    QUOTA_CHANGED = "quota.changed", "Quota limits changed"
    MODEL_CREATED = "model.created", "Model registered"
    MODEL_DELETED = "model.deleted", "Model deleted"
    UPLOAD_STARTED = "upload.started", "Resumable upload started"
    UPLOAD_COMPLETION_REQUESTED = "upload.completion_requested", "Resumable upload's check queued"
    UPLOAD_COMPLETED = "upload.completed", "Resumable upload checked (version made)"
    UPLOAD_FAILED = "upload.failed", "Resumable upload failed its check"
    UPLOAD_ABORTED = "upload.aborted", "Resumable upload aborted"
    VERSION_CREATED = "version.created", "Version upload started"
    VERSION_UPLOADED = "version.uploaded", "Version uploaded (build queued)"
    VERSION_DISCARDED = "version.discarded", "Unfinished upload discarded"
    VERSION_REBUILD_REQUESTED = "version.rebuild_requested", "Rebuild queued"
    VERSION_DELETED = "version.deleted", "Version deleted"
    BUILD_STARTED = "build.started", "Build started"
    BUILD_SUCCEEDED = "build.succeeded", "Build succeeded"
    BUILD_FAILED = "build.failed", "Build failed"
    BUILD_REQUEUED = "build.requeued", "Build queued again after its worker stopped"
    DEPLOYMENT_CREATED = "deployment.created", "Deployment created"
    DEPLOYMENT_STOP_REQUESTED = "deployment.stop_requested", "Deployment stop requested"
    DEPLOYMENT_RESCALED = "deployment.rescaled", "Deployment scaled"
    DEPLOYMENT_VERSION_UPDATE_REQUESTED = "deployment.version_update_requested", "Version update queued"
    DEPLOYMENT_VERSION_UPDATED = "deployment.version_updated", "Version update succeeded"
    DEPLOYMENT_VERSION_UPDATE_FAILED = "deployment.version_update_failed", "Version update failed"
    DEPLOYMENT_FAILED = "deployment.failed", "Deployment failed"
    DEPLOYMENT_DEGRADED = "deployment.degraded", "Deployment degraded"
    DEPLOYMENT_RECOVERED = "deployment.recovered", "Deployment ready again"
    DEPLOYMENT_RESTARTED = "deployment.restarted", "Failed deployment restarted"
    CLUSTER_REGISTERED = "cluster.registered", "Cluster registered or updated"
    PIPELINE_CREATED = "pipeline.created", "Pipeline created"
    PIPELINE_VERSION_CREATED = "pipeline.version_created", "Pipeline version checked and made"
    BACKEND_REGISTERED = "backend.registered", "Custom backend registered"
    BACKEND_DELETED = "backend.deleted", "Custom backend deleted"
    PLAN_REQUESTED = "tensorrt_plan.requested", "TensorRT plan asked for"
    PLAN_SUCCEEDED = "tensorrt_plan.succeeded", "TensorRT plan built and verified"
    PLAN_FAILED = "tensorrt_plan.failed", "TensorRT plan failed"
    PLAN_DELETED = "tensorrt_plan.deleted", "TensorRT plan deleted"
    ADMIN_ADDED = "admin.added", "Added in the admin"
    ADMIN_CHANGED = "admin.changed", "Changed in the admin"
    ADMIN_DELETED = "admin.deleted", "Deleted in the admin"


class AuditSource(models.TextChoices):
    """Where a mutation came from."""

    API = "api", "REST API"
    CONSOLE = "console", "Console page"
    ADMIN = "admin", "Admin"
    COMMAND = "command", "Management command"
    TASK = "task", "Celery task (worker or beat)"
    SYSTEM = "system", "Other (shell, startup)"
