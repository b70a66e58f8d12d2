"""Who may use the privileged parts of a Triton server Conch starts (Triton docs, "Limit Endpoint Access").

Every `tritonserver` Conch starts restricts the endpoint categories that change or reveal what the server runs:
`model-repository` (load/unload/index; a load accepts file overrides, which run code through the Python
backend), `model-config`, `shared-memory`, `statistics`, `trace` and `logging`. Those answer only to a request
that carries the server's key in a header; health, metadata and inference stay open, so users keep calling the
endpoints Conch shows them. On HTTP the header is `X-Conch-Key`; on gRPC Triton itself prefixes the configured
key with `triton-grpc-protocol-`, so a gRPC client sends `triton-grpc-protocol-x-conch-key` (checked on Triton
2.51: the server answers `UNAVAILABLE: This protocol is restricted, expecting header
'triton-grpc-protocol-x-conch-key'` otherwise).

The key of a server is derived from a secret the caller holds (Conch passes Django's SECRET_KEY) and the
server's id, so every Conch process that knows both (the worker that started the server, a worker that adopts
it after a restart, the web process) computes the same key without storing it. The key travels on the
server's command line: local users who may list the processes of Conch's user can read it; network clients
cannot. No Django here: the secret comes in as a parameter.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from conch.errors import InvalidInput

__all__ = [
    "API_KEY_HEADER",
    "GRPC_API_KEY_HEADER",
    "RESTRICTED_CATEGORIES",
    "api_key_from_flags",
    "derive_api_key",
    "restricted_api_flags",
    "restricted_api_flags_for",
    "validate_api_key",
]

#: HTTP header that carries a server's key (Triton matches header names case-insensitively on HTTP).
API_KEY_HEADER = "X-Conch-Key"
#: gRPC metadata key a client sends: Triton prefixes the configured key with "triton-grpc-protocol-" and gRPC
#: metadata keys are lower case.
GRPC_API_KEY_HEADER = "triton-grpc-protocol-" + API_KEY_HEADER.lower()

#: Endpoint categories that answer only with the key (Triton "Limit Endpoint Access": `--http-restricted-api`,
#: `--grpc-restricted-protocol`). Not restricted: `health`, `metadata`, `inference`.
RESTRICTED_CATEGORIES: tuple[str, ...] = (
    "model-repository",
    "model-config",
    "shared-memory",
    "statistics",
    "trace",
    "logging",
)

# Triton parses `<categories>:<key>=<value>`; keep the value to characters that cannot end a part of it.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,256}")
_DERIVATION_LABEL = b"conch.triton.api-key.v1:"


def derive_api_key(secret: str | bytes, server_id: str) -> str:
    """Return the key of server `server_id`: HMAC-SHA256 of the id under `secret`, as 64 lower-case hex digits.

    The same (`secret`, `server_id`) always gives the same key; another id or secret gives an unrelated one.
    Raises `InvalidInput` when `secret` or `server_id` is empty.
    """
    if not secret:
        raise InvalidInput("a secret is required to derive a Triton API key", field="secret")
    if not server_id:
        raise InvalidInput("a server id is required to derive a Triton API key", field="server_id")
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    return hmac.new(key, _DERIVATION_LABEL + server_id.encode(), hashlib.sha256).hexdigest()


def validate_api_key(api_key: str) -> str:
    """Return `api_key` when it can be put on Triton's command line: 16-256 letters, digits, '_' or '-'.

    Raises `InvalidInput` (field `api_key`) otherwise; the message never repeats the key.
    """
    if not isinstance(api_key, str) or not _KEY_PATTERN.fullmatch(api_key):
        raise InvalidInput(
            "the Triton API key must be 16-256 letters, digits, '_' or '-' (use derive_api_key)", field="api_key"
        )
    return api_key


def restricted_api_flags(api_key: str) -> list[str]:
    """Return the `tritonserver` arguments that restrict `RESTRICTED_CATEGORIES` to requests carrying `api_key`.

    `--http-restricted-api=<categories>:X-Conch-Key=<key>` and
    `--grpc-restricted-protocol=<categories>:x-conch-key=<key>` (Triton "Limit Endpoint Access").
    Raises `InvalidInput` for a key `validate_api_key` refuses.
    """
    return restricted_api_flags_for(validate_api_key(api_key))


def restricted_api_flags_for(key_expression: str) -> list[str]:
    """Like `restricted_api_flags`, for a key given as an expression another program expands, unchecked.

    E.g. `$(CONCH_TRITON_API_KEY)` in a Kubernetes container's args, which the kubelet replaces with the
    container's environment variable of that name (Kubernetes "Define a Command and Arguments for a Container").
    """
    categories = ",".join(RESTRICTED_CATEGORIES)
    return [
        f"--http-restricted-api={categories}:{API_KEY_HEADER}={key_expression}",
        f"--grpc-restricted-protocol={categories}:{API_KEY_HEADER.lower()}={key_expression}",
    ]


def api_key_from_flags(flags: dict[str, str]) -> str | None:
    """Return the key in a parsed `--http-restricted-api` flag (`{"--flag": "value"}`), or None when absent."""
    value = flags.get("--http-restricted-api", "")
    _, _, assignment = value.partition(":")
    header, _, key = assignment.partition("=")
    if header.lower() != API_KEY_HEADER.lower() or not key:
        return None
    return key
