"""The CLI's error and its exit codes: what a pipeline branches on.

| code | meaning                                                                  | HTTP statuses            |
|------|--------------------------------------------------------------------------|--------------------------|
| 0    | done                                                                     | 2xx                      |
| 1    | usage: a bad option or argument, or input the server refused             | 400, 415                 |
| 2    | authentication or permission: no/invalid/expired token, missing scope/role | 401, 403               |
| 3    | not found (or not visible to the token's team)                           | 404                      |
| 4    | conflict or limit: a name in use, a quota or size limit refused          | 409, 413                 |
| 5    | the job ran and failed: upload check, build or deployment failed          |                          |
| 6    | server unavailable: no answer, a timeout, 5xx, rate limited              | 429, 5xx, network errors |
| 130  | interrupted (Ctrl-C)                                                     |                          |

A missing URL or token (no `conch login`, no CONCH_URL/CONCH_TOKEN) is a usage error (1).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

OK = 0
USAGE = 1
AUTH = 2
NOT_FOUND = 3
CONFLICT = 4
FAILED = 5
UNAVAILABLE = 6
INTERRUPTED = 130


def exit_code_for_status(status: int) -> int:
    """Map an HTTP status of a refused request to the CLI's exit code (see the module's table)."""
    if status in (401, 403):
        return AUTH
    if status == 404:
        return NOT_FOUND
    if status in (409, 413):
        return CONFLICT
    if status == 429 or status >= 500:
        return UNAVAILABLE
    return USAGE


@dataclass
class CliError(Exception):
    """A failure to report and exit with: `detail` is a sentence to act on, `field` the input at fault.

    `status` is the HTTP status when the server refused a request, `call` the request ("POST /api/v1/models/"),
    `extra` more of the server's error body (a quota's limit, used and requested).
    """

    detail: str
    exit_code: int = USAGE
    field: str | None = None
    status: int | None = None
    call: str | None = None
    extra: dict = dataclass_field(default_factory=dict)

    def __str__(self) -> str:
        text = f"error: {self.detail}"
        if self.field:
            text += f" (field: {self.field})"
        if self.status is not None and self.call:
            text += f" [HTTP {self.status} from {self.call}]"
        others = self.extra.get("errors")
        if isinstance(others, list) and len(others) > 1:
            # the server refused several fields at once: the first is above, the rest follow, one per line
            for other in others[1:]:
                if isinstance(other, dict):
                    line = f"error: {other.get('detail')}"
                    text += f"\n{line} (field: {other['field']})" if other.get("field") else f"\n{line}"
        return text

    def as_json(self) -> dict:
        """The error as `--json` prints it: `{"error": {detail, field, status, exit_code, ...}}`; `status` (the
        HTTP status) only when the server answered one."""
        body: dict = {"detail": self.detail, "field": self.field}
        if self.status is not None:
            body["status"] = self.status
        body["exit_code"] = self.exit_code
        body.update(self.extra)
        return {"error": body}
