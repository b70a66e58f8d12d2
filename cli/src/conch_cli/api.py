"""Conch's REST API (`/api/v1/`) over HTTP with httpx: requests, error bodies turned into `CliError`, pages,
and finding models, versions and deployments by name or id.

Every error of the API is `{"detail": ..., "field": ...}` (a quota refusal adds `quota`); the gateway's form
`{"error": ...}` is read too. Reads (GET) are retried on network errors, 429 and 5xx; writes are not.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import certifi
import httpx

from conch_cli import __version__
from conch_cli.errors import NOT_FOUND, UNAVAILABLE, USAGE, CliError, exit_code_for_status

#: Seconds: to connect, and to wait for an answer (reads and writes of JSON; part uploads set their own).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0
#: Attempts of a GET before giving up on a server that does not answer or answers 429/5xx.
GET_ATTEMPTS = 4
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


def error_from_response(response: httpx.Response, call: str) -> CliError:
    """Build the CliError for a refused request from the server's error body (any JSON or text)."""
    detail, field, extra = None, None, {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("error")
        field = body.get("field")
        extra = {k: v for k, v in body.items() if k not in ("detail", "field", "error")}
    content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if body is None and content_type == "text/html":
        # Not Conch's API (a web page: a wrong URL, a proxy's or another server's page): never print the page.
        where = f"{response.url.scheme}://{response.url.netloc.decode()}"
        detail = (
            f"{where} does not look like a Conch server (HTTP {response.status_code}, {content_type}); check the URL "
            "(conch login)"
        )
    if not detail:
        text = response.text.strip()
        detail = text[:500] if text else f"HTTP {response.status_code} {response.reason_phrase}"
    return CliError(
        str(detail),
        exit_code_for_status(response.status_code),
        field=field if isinstance(field, str) else None,
        status=response.status_code,
        call=call,
        extra=extra,
    )


def unavailable(exc: httpx.HTTPError, call: str, url: str) -> CliError:
    """The CliError (UNAVAILABLE) for a request that got no answer."""
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else f"failed ({exc.__class__.__name__}: {exc})"
    return CliError(f"{call} {kind}: is Conch running at {url}?", UNAVAILABLE, call=call)


class LazyTrustContext(ssl.SSLContext):
    """A client TLS context that checks the server's certificate and host name against the CAs httpx trusts by
    default (SSL_CERT_FILE, else SSL_CERT_DIR, else certifi's bundle), and loads those CAs at its first TLS
    connection rather than when it is made: loading them takes 20-35 ms of every command, which a Conch and a
    bucket reached over http:// never need. Make it with `LazyTrustContext(ssl.PROTOCOL_TLS_CLIENT)` (certificates
    required, host names checked)."""

    _lock = threading.Lock()

    def _load_trusted_cas(self) -> None:
        with self._lock:
            if getattr(self, "_cas_loaded", False):
                return
            if os.environ.get("SSL_CERT_FILE"):
                self.load_verify_locations(cafile=os.environ["SSL_CERT_FILE"])
            elif os.environ.get("SSL_CERT_DIR"):
                self.load_verify_locations(capath=os.environ["SSL_CERT_DIR"])
            else:
                self.load_verify_locations(cafile=certifi.where())
            self._cas_loaded = True

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        """ssl.SSLContext.wrap_socket, the trusted CAs loaded first."""
        self._load_trusted_cas()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        """ssl.SSLContext.wrap_bio, the trusted CAs loaded first."""
        self._load_trusted_cas()
        return super().wrap_bio(*args, **kwargs)


class ConchApi:
    """A client of one Conch installation with one API token. Use as a context manager (closes its connections)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        #: The TLS settings of this client and of the upload's storage client (httpx's trusted CAs, loaded once, at
        #: the first TLS connection).
        self.ssl_context = LazyTrustContext(ssl.PROTOCOL_TLS_CLIENT)
        self.http = httpx.Client(
            base_url=self.url,
            verify=self.ssl_context,
            headers={"Authorization": f"Bearer {token}", "User-Agent": f"conch-cli/{__version__}"},
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            follow_redirects=False,
        )

    def __enter__(self) -> ConchApi:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """Send one request to `path` (under the URL, or an absolute URL) and return the response.

        Raises CliError: for a status not in `expect` (exit code from the status, the server's detail and field),
        or UNAVAILABLE when no answer came (GETs are tried GET_ATTEMPTS times first, with backoff).
        """
        call = f"{method} {path if path.startswith('/') else httpx.URL(path).path}"
        attempts = GET_ATTEMPTS if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                if attempt == attempts:
                    raise unavailable(exc, call, self.url) from None
            else:
                if response.status_code in expect:
                    return response
                if response.status_code not in RETRYABLE_STATUSES or attempt == attempts:
                    raise error_from_response(response, call)
                retry_after = response.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    time.sleep(min(int(retry_after), 30))
                    continue
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def get(self, path: str, **kwargs: Any) -> Any:
        """GET `path` and return its JSON body."""
        return self.call("GET", path, **kwargs).json()

    def post(self, path: str, body: Any = None, *, expect: tuple[int, ...] = (200, 201, 202)) -> Any:
        """POST a JSON body to `path` and return the answer's JSON (None when it has no body)."""
        response = self.call("POST", path, json=body if body is not None else {}, expect=expect)
        return response.json() if response.content else None

    def pages(self, path: str, params: dict | None = None) -> Iterator[dict]:
        """Yield every item of a paged list (`{"count", "next", "previous", "results"}`), following `next`."""
        page = self.get(path, params={"limit": 1000, **(params or {})})
        while True:
            yield from page["results"]
            if not page.get("next"):
                return
            page = self.get(page["next"])

    # Finding things by name or id.

    def teams(self) -> list[dict]:
        """The teams the token may act in."""
        return list(self.pages("/api/v1/teams/"))

    def default_team(self, team: str | None) -> str:
        """Return `team`, or the token's only team when None. Raises CliError (USAGE, field team) when the token
        sees several teams and none was named."""
        if team:
            return team
        slugs = [t["slug"] for t in self.teams()]
        if len(slugs) == 1:
            return slugs[0]
        if not slugs:
            raise CliError("This token sees no team; ask a team admin to add you.", NOT_FOUND, field="team")
        raise CliError(f"Name the team with --team: you are in {', '.join(slugs)}.", USAGE, field="team")

    def find_model(self, ref: str, team: str | None = None) -> dict:
        """Return the model `ref` (its id, or its name; `team` narrows a name). Raises CliError (NOT_FOUND)."""
        if ref.isdigit():
            return self.get(f"/api/v1/models/{ref}/")
        found = [m for m in self.pages("/api/v1/models/") if m["name"] == ref and (team is None or m["team"] == team)]
        if not found:
            where = f" in team {team!r}" if team else ""
            raise CliError(
                f"No model named {ref!r}{where} is visible to this token. Register it with `conch models create "
                f"{ref}` (or let `conch upload` do it: --create-model).",
                NOT_FOUND,
                field="model",
            )
        if len(found) > 1:
            teams = ", ".join(m["team"] for m in found)
            raise CliError(f"Models named {ref!r} exist in {teams}; name the team with --team.", USAGE, field="team")
        return found[0]

    def model_versions(self, model_id: int) -> list[dict]:
        """The model's versions, oldest first."""
        return list(self.pages(f"/api/v1/models/{model_id}/versions/"))

    def find_deployment(self, ref: str, team: str | None = None) -> dict:
        """Return the deployment `ref`: its id, or the name of one that is not stopped (`team` narrows a name).

        Raises CliError (NOT_FOUND) when none matches, USAGE when a name is in several teams.
        """
        if ref.isdigit():
            return self.get(f"/api/v1/deployments/{ref}/")
        found = [
            d
            for d in self.pages("/api/v1/deployments/")
            if d["name"] == ref and d["status"] != "stopped" and (team is None or d["team"] == team)
        ]
        if not found:
            where = f" in team {team!r}" if team else ""
            raise CliError(
                f"No deployment named {ref!r}{where} that is not stopped is visible to this token.",
                NOT_FOUND,
                field="deployment",
            )
        if len(found) > 1:
            teams = ", ".join(d["team"] for d in found)
            raise CliError(f"Deployments named {ref!r} run in {teams}; name the team with --team.", USAGE)
        # A list leaves out what only a single GET shows (the log tail).
        return self.get(f"/api/v1/deployments/{found[0]['id']}/")
