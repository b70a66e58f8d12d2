"""The build pipeline: inspect -> configure -> write repository -> verify.

`run_build` turns a version's uploaded ONNX file into a Triton model repository in the
object store and proves it serves. Each step has a `BuildStep` row with its status and
log lines. A build is idempotent: it is keyed by (version, attempt), writes only under
its attempt's own repository prefix (an earlier attempt's repository, which a deployment
may serve, is never deleted or changed), and a redelivered task simply does the same work again.

No build stays stuck: a running build writes a heartbeat (at each step and from a small thread
in between), and `sweep_stalled_versions` (a periodic task) starts the next attempt of a build
whose heartbeat stopped (its worker died), of a queued build no worker claimed (its message was
lost), and aborts version uploads whose bytes stopped arriving (resumable uploads are the `uploads` app's).
`collect_repository_garbage` deletes the repositories of attempts nothing uses any more.
"""

from builds.services.pipeline import (
    BuildHeartbeat,
    BuildSuperseded,
    StepLog,
    fail_build_after_retries,
    reset_steps,
    run_build,
)
from builds.services.recovery import collect_repository_garbage, sweep_stalled_versions
from builds.services.samples import make_version_sample
from builds.services.state import (
    builds_of,
    current_build,
    current_error,
    current_options,
    custom_backends_of,
    gpu_requirement,
    history,
    latest_config_pbtxt,
    served_build,
    served_config_pbtxt,
    served_repository_prefix,
    with_builds,
)
from builds.services.submission import queue_build, request_rebuild, start_first_build, submit_upload
from builds.services.verify_servers import (
    SERVER_ID_INFIX_VERIFY,
    stop_verify_servers,
    stop_warm_verify_server,
    warm_up_verify_server,
)

__all__ = [
    "SERVER_ID_INFIX_VERIFY",
    "BuildHeartbeat",
    "BuildSuperseded",
    "StepLog",
    "builds_of",
    "current_build",
    "current_error",
    "current_options",
    "custom_backends_of",
    "gpu_requirement",
    "history",
    "latest_config_pbtxt",
    "served_build",
    "served_config_pbtxt",
    "served_repository_prefix",
    "with_builds",
    "collect_repository_garbage",
    "fail_build_after_retries",
    "make_version_sample",
    "queue_build",
    "request_rebuild",
    "reset_steps",
    "run_build",
    "start_first_build",
    "stop_verify_servers",
    "stop_warm_verify_server",
    "submit_upload",
    "sweep_stalled_versions",
    "warm_up_verify_server",
]
