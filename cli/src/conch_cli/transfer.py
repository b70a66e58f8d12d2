"""Resumable uploads of a model file (Conch's `/api/v1/models/{id}/uploads/` API, UPLOAD-API.md).

A new upload starts at once (filename and size) while a thread computes the file's sha256 beside the parts, and the
sha256 goes with the completion; the start carries the file's first bytes (`head`). When the model has an open
upload of a file of the same name, size and first bytes (a run that stopped), the sha256 is computed first and sent
with the start, which returns that upload, whose `parts` are those the store already has. The missing parts go up in
parallel (a thread pool; each worker streams its part from the file in 1 MiB pieces, so memory stays at one piece
per worker): with S3 storage to presigned URLs straight to the bucket, with folder storage to Conch. Parts share the
link, so the number in flight is kept to what the measured rate sends in about IN_FLIGHT_S seconds: parts are stored
one after another, and an interruption loses at most those seconds of sending. The progress counts stored parts
only, so it agrees with what an interruption says is kept. Then the upload is completed and the server checks the
joined file's size before it makes the model version; the version's build checks the sha256 on the file it reads (a
mismatch fails the build, naming `sha256`). Re-running the same upload after a crash or Ctrl-C sends only what the
store lacks. A part is not given up for taking long, only for standing still: its request fails when no byte has
gone out or come back for `stall_timeout_s` (STALL_TIMEOUT_S; `conch upload --stall-timeout`), and it is sent again
like any network failure.

A file that already is a live version of the model (its sha256) is refused by the server with 409 and
`existing_version`, at the start when the sha256 goes with it, else at the completion: `upload_file` then aborts the
upload it started (nothing stays reserved) and returns that version as a duplicate, so a pipeline that runs again
with the same file goes on with the version it made before. `allow_duplicate` asks for a new version anyway.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

try:
    # ISA-L's CRC32 (carry-less multiplication): the same CRC32 as zlib's, about ten times faster (0.011 s against
    # 0.11 s per 256 MiB on a 2-core test machine), so the parts' checksums take little CPU from the rest.
    from isal.isal_zlib import crc32
except ImportError:  # a platform without ISA-L's wheel
    from zlib import crc32

from conch_cli.api import CONNECT_TIMEOUT_S, ConchApi, error_from_response, unavailable
from conch_cli.errors import FAILED, INTERRUPTED, NOT_FOUND, UNAVAILABLE, USAGE, CliError

PIECE_BYTES = 1024 * 1024
#: Part numbers per request for part URLs (the API's limit).
URLS_PER_CALL = 100
#: With per-part CRC32s, the parts whose checksums are read ahead so that one call signs their URLs together (the
#: first call signs only the FIRST_IN_FLIGHT parts that start at once, so that the first part waits for no others).
CRC_AHEAD = 8
#: Tries per part before the upload gives up (network errors, 5xx, an expired URL, a stall).
PART_ATTEMPTS = 5
#: How many first bytes of the file the start carries (`head`, the server's builds.formats.HEAD_BYTES): the server
#: checks them and keeps their SHA-256 (`head_sha256`), so a start of another file of the same name and size never
#: takes this file's open upload over.
HEAD_BYTES = 512
#: Seconds a part's request may stand still (no byte sent or received) before it fails and is sent again. httpx
#: applies its write and read timeouts to each socket send and receive, not to the whole request, so a slow part
#: that moves is never cut.
STALL_TIMEOUT_S = 60.0
#: The per-part checksum `conch upload` asks for: the store checks each part's CRC32 as it arrives, and the header
#: that carries it (S3's `x-amz-checksum-crc32`: base64 of the 4 big-endian bytes).
PART_CHECKSUM_ALGORITHM = "CRC32"
CRC32_HEADER = "x-amz-checksum-crc32"
#: A part URL this close to its expiry is asked for again.
URL_MARGIN = timedelta(seconds=60)
OPEN_STATUSES = ("uploading", "completing")
#: Seconds of sending (at the rate measured over the last RATE_WINDOW_S) that the parts in flight may still need.
IN_FLIGHT_S = 2.0
RATE_WINDOW_S = 2.0
#: Parts in flight before the rate is known, and how often the sender looks again (s).
FIRST_IN_FLIGHT = 2
SCHEDULE_TICK_S = 0.1


def choose_part_size(bytes_per_second: float) -> int:
    """The part size (bytes, whole MiB from 5 to 16 MiB) for a sender limited to `bytes_per_second`: about two
    seconds of sending, so that a part is stored every two seconds or sooner."""
    mib = 1024 * 1024
    return max(5 * mib, min(16 * mib, int(2 * bytes_per_second) // mib * mib))


class UploadStopped(Exception):
    """Raised inside a part's body when the upload stops, so that the part's request ends at once."""

    def __init__(self, number: int) -> None:
        super().__init__(f"part {number} stopped")
        self.number = number


class Progress:
    """What an upload reports: `start(label, total_bytes)`, `advance(bytes)` (an upload advances by a part's size
    when the store has it), `finish()`. This base class reports nothing."""

    def start(self, label: str, total: int, done: int = 0) -> None:
        """A new task of `total` bytes begins, `done` of them already done."""

    def advance(self, count: int) -> None:
        """`count` more bytes are done (thread-safe)."""

    def finish(self) -> None:
        """The task ended."""


class RateLimit:
    """A shared byte rate limit (bytes/s) for every worker: each piece waits for its share of time."""

    def __init__(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, count: int) -> None:
        """Block until `count` more bytes may be sent."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + count / self.rate
        if start > now:
            time.sleep(start - now)


def file_head(path: Path) -> bytes:
    """The file's first HEAD_BYTES bytes (all of it when shorter)."""
    with path.open("rb") as handle:
        return handle.read(HEAD_BYTES)


def head_sha256(path: Path) -> str:
    """The hex SHA-256 of the file's first HEAD_BYTES bytes: what the server shows as an upload's `head_sha256`."""
    return hashlib.sha256(file_head(path)).hexdigest()


def file_sha256(path: Path, progress: Progress) -> str:
    """Return the hex sha256 of the file at `path`, reading it in 8 MiB pieces."""
    digest = hashlib.sha256()
    progress.start(f"sha256 {path.name}", path.stat().st_size)
    with path.open("rb") as handle:
        while piece := handle.read(8 * PIECE_BYTES):
            digest.update(piece)
            progress.advance(len(piece))
    progress.finish()
    return digest.hexdigest()


class BackgroundHash:
    """The sha256 of a file computed by a thread while the caller does other work (sends the file's parts).

    The thread reads the file once, in order, 8 MiB at a time; the parts are read by other threads, so the page
    cache usually serves one of the two reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds = 0.0
        self._digest: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="conch-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self._digest = file_sha256(self.path, Progress())
        except BaseException as error:  # given to the caller by result()
            self._error = error
        self.seconds = time.monotonic() - started

    def result(self) -> str:
        """Wait for the hash and return it (hex); raises what the thread raised (an OSError reading the file)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest


@dataclass(frozen=True)
class PartUrl:
    """Where to send one part: method, URL, headers to add, and until when the URL holds (UTC)."""

    method: str
    url: str
    headers: dict
    expires_at: datetime | None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class PartSender:
    """Sends the missing parts of one upload from a file with a pool of `parallel` threads.

    Part n covers bytes [(n - 1) * part_size, n * part_size) of the file (the last one shorter). Part URLs are
    asked for in batches of up to 100, just before they are needed, so none expires while others are sent. A part
    whose request stands still for `stall_timeout_s` seconds (nothing sent or received) fails and is sent again.
    For an upload with `part_checksum_algorithm` CRC32 a part's URL is asked for with its CRC32 (the URL signs it):
    one call takes the part and the next CRC_AHEAD - 1 pending ones, whose CRC32s are read then (each part's bytes
    are read once for it, `_crc_for`). The part goes with the URL's checksum headers; the store refuses bytes that
    do not match (S3 BadDigest, Conch 400 naming `parts[n]`), and the part is sent again.
    """

    def __init__(
        self,
        api: ConchApi,
        upload: dict,
        path: Path,
        *,
        parallel: int,
        progress: Progress,
        rate_limit: RateLimit | None = None,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        self.api = api
        self.upload = upload
        self.path = path
        self.parallel = parallel
        self.progress = progress
        self.rate_limit = rate_limit
        self.base = f"/api/v1/models/{upload['model']}/uploads/{upload['id']}/"
        # An upload started without the algorithm (by another client, or before Conch had it) takes no checksums.
        self.crc32 = upload.get("part_checksum_algorithm") == PART_CHECKSUM_ALGORITHM
        self._crcs: dict[int, str] = {}  # part number -> its CRC32, read ahead for a batch of URLs
        self._urls: dict[int, PartUrl] = {}
        self._lock = threading.Lock()
        self._pending: list[int] = []
        # Set when the upload stops (a part failed for good, Ctrl-C): parts in flight end at their next piece.
        self._stop = threading.Event()
        self.etags: dict[int, str] = {}
        #: Bytes of part bodies read out to the network so far (parts sent again count again): the rate's measure.
        self.sent_bytes = 0
        self._sent_lock = threading.Lock()
        self.storage = httpx.Client(
            # Per socket operation: a part fails after stall_timeout_s without progress, however long it takes.
            timeout=httpx.Timeout(stall_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel),
            headers={"User-Agent": api.http.headers["User-Agent"]},
            verify=api.ssl_context,
        )

    def part_size(self, number: int) -> int:
        """The size in bytes of part `number` (1-based)."""
        size, step = self.upload["size_bytes"], self.upload["part_size_bytes"]
        return min(step, size - (number - 1) * step)

    def missing(self) -> list[int]:
        """Part numbers the store does not have (or has with the wrong size), in order."""
        stored = {p["number"]: p for p in self.upload.get("parts") or []}
        return [
            n
            for n in range(1, self.upload["part_count"] + 1)
            if n not in stored or stored[n].get("size_bytes") != self.part_size(n)
        ]

    def _crc_for(self, number: int) -> str:
        """Part `number`'s CRC32 (`_part_crc32`), read once: kept from a batch that read it ahead."""
        known = self._crcs.get(number)
        if known is None:
            known = self._crcs[number] = self._part_crc32(number)
        return known

    def _part_crc32(self, number: int) -> str:
        """The CRC32 of part `number`'s bytes in the file, as `x-amz-checksum-crc32` takes it (base64 of the 4
        big-endian bytes), read in PIECE_BYTES pieces."""
        crc = 0
        with self.path.open("rb") as handle:
            handle.seek((number - 1) * self.upload["part_size_bytes"])
            left = self.part_size(number)
            while left > 0 and (piece := handle.read(min(PIECE_BYTES, left))):
                crc = crc32(piece, crc)
                left -= len(piece)
        return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")

    def _url(self, number: int, *, fresh: bool = False, checksum: str = "") -> PartUrl:
        with self._lock:
            known = self._urls.get(number)
            if known and not fresh and known.headers.get(CRC32_HEADER, "") == checksum:
                if known.expires_at is None or known.expires_at - URL_MARGIN > datetime.now(UTC):
                    return known
            # Ask for this part and the next pending ones that have no URL yet; with checksums, the next
            # CRC_AHEAD - 1 of them (FIRST_IN_FLIGHT - 1 on the first call), whose CRC32s are read now (each part's
            # file bytes are read once for it).
            others = [n for n in self._pending if n != number and n not in self._urls]
            ahead = (CRC_AHEAD if self._urls else FIRST_IN_FLIGHT) if checksum else URLS_PER_CALL
            batch = [number] + others[: ahead - 1]
            request: dict = {"numbers": batch}
            if checksum:
                request["checksums"] = {str(number): checksum, **{str(n): self._crc_for(n) for n in batch[1:]}}
            answer = self.api.post(self.base + "parts/", request, expect=(200,))
            for item in answer["parts"]:
                self._urls[item["number"]] = PartUrl(
                    method=item.get("method") or "PUT",
                    url=item["url"],
                    headers=dict(item.get("headers") or {}),
                    expires_at=_parse_time(item.get("expires_at")),
                )
            if number not in self._urls:
                raise CliError(f"Conch gave no URL for part {number}.", UNAVAILABLE, field=f"parts[{number}]")
            return self._urls[number]

    def _body(self, number: int, sent: list[int]) -> Iterator[bytes]:
        """The part's bytes, read from the file in pieces (counted into `sent` and the progress)."""
        offset = (number - 1) * self.upload["part_size_bytes"]
        left = self.part_size(number)
        with self.path.open("rb") as handle:
            handle.seek(offset)
            while left > 0:
                if self._stop.is_set():
                    raise UploadStopped(number)
                piece = handle.read(min(PIECE_BYTES, left))
                if not piece:
                    raise CliError(
                        f"{self.path} got shorter while uploading (part {number}); start again.",
                        USAGE,
                        field="file",
                    )
                if self.rate_limit:
                    self.rate_limit.take(len(piece))
                left -= len(piece)
                yield piece
                sent[0] += len(piece)
                with self._sent_lock:
                    self.sent_bytes += len(piece)

    def send_part(self, number: int) -> str:
        """PUT part `number` (retrying network errors, a stall, 5xx, an expired URL and the store's refusal of bytes
        that do not match the part's CRC32) and return its ETag."""
        size = self.part_size(number)
        fresh = False
        checksum = self._crc_for(number) if self.crc32 else ""
        for attempt in range(1, PART_ATTEMPTS + 1):
            target = self._url(number, fresh=fresh, checksum=checksum)
            url = target.url
            headers = {**target.headers, "Content-Length": str(size)}
            if self.upload.get("transport") == "conch" or url.startswith("/"):
                # Folder storage: the part goes to Conch itself, with the token (never to a bucket's URL).
                url = self.api.url + url if url.startswith("/") else url
                headers["Authorization"] = f"Bearer {self.api.token}"
            sent = [0]
            call = f"{target.method} part {number}"
            try:
                response = self.storage.request(target.method, url, content=self._body(number, sent), headers=headers)
            except httpx.HTTPError as exc:
                if attempt == PART_ATTEMPTS or self._stop.is_set():
                    raise unavailable(exc, call, url.split("?", 1)[0]) from None
                time.sleep(0.5 * 2**attempt)
                continue
            if response.status_code < 300:
                etag = response.headers.get("ETag", "")
                if not etag and response.headers.get("content-type", "").startswith("application/json"):
                    etag = response.json().get("etag", "")
                self.progress.advance(size)
                return etag
            error = error_from_response(response, call)
            if "<Error>" in error.detail:  # S3's XML error: keep its code and message
                error.detail = _s3_message(error.detail)
            # An expired or refused signature, or S3's BadDigest: ask for a new URL; 5xx, or Conch's refusal of bytes
            # that do not match the CRC32 (400 naming the part): try again; any other 4xx: give up.
            if response.status_code in (400, 403) and "<Error>" in response.text:
                fresh = True
            elif response.status_code < 500 and response.status_code != 429 and error.field != f"parts[{number}]":
                error.detail = f"Part {number} was refused: {error.detail}"
                error.field = error.field or f"parts[{number}]"
                raise error
            if attempt == PART_ATTEMPTS:
                if error.field == f"parts[{number}]" or "BadDigest" in error.detail:
                    error.exit_code = UNAVAILABLE  # the bytes kept arriving damaged: a network's fault, not input
                error.detail = f"Part {number} failed {PART_ATTEMPTS} times: {error.detail}"
                error.field = error.field or f"parts[{number}]"
                raise error
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def send_missing(self) -> int:
        """Send every missing part; return how many bytes were sent. Raises the first part's CliError.

        At most `parallel` parts are in flight, and fewer while the bytes they still need would take longer than
        IN_FLIGHT_S at the rate measured over the last RATE_WINDOW_S (FIRST_IN_FLIGHT parts before it is known):
        on a slow or limited link the parts finish one after another instead of all together at the end.
        """
        missing = self.missing()
        self._pending = list(missing)
        total = self.upload["size_bytes"]
        self.progress.start(f"upload {self.path.name}", total, total - sum(self.part_size(n) for n in missing))
        futures: dict = {}
        try:
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="conch-part") as pool:
                try:
                    self._schedule(pool, missing, futures)
                except BaseException:
                    # Parts not started are dropped and parts in flight end now; the store keeps the finished ones
                    # (counted in `etags`, so an interruption can say how many are stored).
                    self._stop.set()
                    for future in futures:
                        future.cancel()
                    for future, number in futures.items():
                        if future.done() and not future.cancelled() and future.exception() is None:
                            self.etags[number] = future.result()
                    raise
                for future, number in futures.items():
                    self.etags[number] = future.result()
        finally:
            self.progress.finish()
            self.storage.close()
        return sum(self.part_size(n) for n in missing)

    def _schedule(self, pool: ThreadPoolExecutor, missing: list[int], futures: dict) -> None:
        """Submit the parts of `missing` to `pool` (recorded in `futures`) as the in-flight budget allows, and wait
        for all; raises the first part's error."""
        queue = list(missing)
        running: set = set()
        samples = [(time.monotonic(), 0)]  # (when, sent_bytes)
        while queue or running:
            now = time.monotonic()
            samples.append((now, self.sent_bytes))
            while len(samples) > 2 and samples[1][0] <= now - RATE_WINDOW_S:
                samples.pop(0)
            span = now - samples[0][0]
            rate = (samples[-1][1] - samples[0][1]) / span if span >= 0.5 else None
            left_in_flight = sum(self.part_size(futures[f]) for f in running) - self._sent_of(running, futures)
            while queue and len(running) < self.parallel:
                budget_full = (
                    len(running) >= FIRST_IN_FLIGHT
                    if rate is None
                    else left_in_flight + self.part_size(queue[0]) > rate * IN_FLIGHT_S
                )
                if running and budget_full:
                    break
                number = queue.pop(0)
                future = pool.submit(self.send_part, number)
                futures[future] = number
                running.add(future)
                left_in_flight += self.part_size(number)
            done, _ = wait(running, timeout=SCHEDULE_TICK_S, return_when=FIRST_EXCEPTION)
            for future in done:
                running.discard(future)
                if future.exception() is not None:
                    raise future.exception()

    def _sent_of(self, running: set, futures: dict) -> int:
        """Bytes already sent of the parts in `running` (an estimate: what all parts sent minus finished ones)."""
        finished = sum(self.part_size(n) for f, n in futures.items() if f not in running)
        return max(0, min(self.sent_bytes - finished, sum(self.part_size(futures[f]) for f in running)))


def _s3_message(xml: str) -> str:
    """`Code: Message` out of an S3 XML error body (the whole text when it has neither)."""

    def tag(name: str) -> str:
        start = xml.find(f"<{name}>")
        end = xml.find(f"</{name}>")
        return xml[start + len(name) + 2 : end] if 0 <= start < end else ""

    code, message = tag("Code"), tag("Message")
    return f"the object store answered {code}: {message}" if code else xml[:300]


@dataclass
class UploadResult:
    """What `upload_file` did: the finished upload, the new version, bytes sent now and whether it resumed.

    `duplicate`: the file already was `version` of the model, so no version was made; `upload` is then the upload
    that was aborted (None when the start was refused)."""

    upload: dict | None
    version: dict
    sent_bytes: int
    resumed_parts: int
    duplicate: bool = False
    #: Seconds spent sending parts, then waiting for the sha256 computed beside them (0 when it was done first), then
    #: for the server's check (complete -> completed).
    parts_s: float = 0.0
    hash_wait_s: float = 0.0
    check_s: float = 0.0


def upload_file(
    api: ConchApi,
    model_id: int,
    path: Path,
    *,
    sha256: str | BackgroundHash,
    build_options: dict,
    parallel: int,
    part_size: int | None,
    progress: Progress,
    rate_limit: RateLimit | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    timeout_s: float,
    say: Callable[[str], None],
    allow_duplicate: bool = False,
) -> UploadResult:
    """Upload `path` as the next version of model `model_id`, resuming the open upload of the same file.

    `sha256` is the file's hex SHA-256, sent with the start (so the server finds the open upload of the same file),
    or a BackgroundHash still computing it: the upload then starts without it and sends it with the completion.
    Returns when the server has checked the size and made the version (its build is queued; the build checks
    the sha256: the version's `source.sha256_checked` says whether it has yet). A part's request that stands still
    for `stall_timeout_s` seconds (no byte sent or received) fails and the part is sent again.
    A file that already is a live version of the model (409 with `existing_version`, at the start or the
    completion) makes no new version unless `allow_duplicate`: the upload is aborted and the result carries that
    version with `duplicate` True.
    Raises CliError: NOT_FOUND when the server has no upload API, FAILED when the server's check failed
    (the upload's `error` and `error_field`), UNAVAILABLE on a timeout, or what the API refused.
    """
    base = f"/api/v1/models/{model_id}/uploads/"
    # Every part with its CRC32, checked by the store as it arrives (a server without the field ignores it).
    body = {
        "filename": path.name,
        "size_bytes": path.stat().st_size,
        "head": base64.b64encode(file_head(path)).decode(),
        "part_checksum_algorithm": PART_CHECKSUM_ALGORITHM,
    }
    if isinstance(sha256, str):
        body["sha256"] = sha256
    if not part_size and rate_limit:
        # A limited link: parts of about two seconds each, so one is stored every two seconds or sooner.
        part_size = choose_part_size(rate_limit.rate)
    if part_size:
        body["part_size_bytes"] = part_size
    if build_options:
        body["build_options"] = build_options
    if allow_duplicate:
        body["allow_duplicate"] = True
    response = api.call("POST", base, json=body, expect=(200, 201, 404, 409))
    if response.status_code == 404:
        check_upload_api(api, model_id, path)
        raise error_from_response(response, f"POST {base}")
    existing = _existing_version(response, f"POST {base}")
    if existing is not None:
        return UploadResult(
            upload=None, version=api.get(f"/api/v1/versions/{existing}/"), sent_bytes=0, resumed_parts=0, duplicate=True
        )
    upload = response.json()
    resumed = 0
    if response.status_code == 200:
        # The open upload of this very file: ask what the store holds now, and send the rest.
        upload = api.get(f"{base}{upload['id']}/")
        resumed = len(upload.get("parts") or [])
        say(f"resuming upload {upload['id']}: {resumed} of {upload['part_count']} parts already stored")
    sent = 0
    started = time.monotonic()
    if upload["status"] == "uploading":
        sender = PartSender(
            api,
            upload,
            path,
            parallel=parallel,
            progress=progress,
            rate_limit=rate_limit,
            stall_timeout_s=stall_timeout_s,
        )
        try:
            sent = sender.send_missing()
        except KeyboardInterrupt:
            stored = upload["part_count"] - len(sender.missing()) + len(sender.etags)
            raise CliError(
                f"interrupted; run the same command again to resume ({stored} of {upload['part_count']} parts stored)",
                INTERRUPTED,
            ) from None
        except CliError as error:
            upload = _finished_elsewhere(api, f"{base}{upload['id']}/", error, say)
    sent_at = time.monotonic()
    hash_wait_s = 0.0
    if upload["status"] == "uploading":
        parts = [{"number": n, "etag": e} for n, e in sorted(sender.etags.items()) if e]
        complete: dict = {"parts": parts} if parts else {}
        if isinstance(sha256, BackgroundHash):
            complete["sha256"] = sha256.result()
        hash_wait_s = time.monotonic() - sent_at
        if allow_duplicate:
            complete["allow_duplicate"] = True
        completing = f"{base}{upload['id']}/complete"
        response = api.call("POST", completing, json=complete, expect=(200, 202, 409))
        try:
            existing = _existing_version(response, f"POST {completing}")
        except CliError as error:
            upload = _finished_elsewhere(api, f"{base}{upload['id']}/", error, say)
            response, existing = None, None
        if existing is not None:
            # The upload stays open on the server for a client that wants another version anyway: not this one.
            api.call("DELETE", f"{base}{upload['id']}/", expect=(204,))
            upload = api.get(f"{base}{upload['id']}/")
            return UploadResult(
                upload=upload,
                version=api.get(f"/api/v1/versions/{existing}/"),
                sent_bytes=sent,
                resumed_parts=resumed,
                duplicate=True,
                parts_s=sent_at - started,
                hash_wait_s=hash_wait_s,
            )
        if response is not None:
            upload = response.json()
    upload = wait_for_upload(api, upload, timeout_s=timeout_s)
    version = api.get(f"/api/v1/versions/{upload['version']}/")
    return UploadResult(
        upload=upload,
        version=version,
        sent_bytes=sent,
        resumed_parts=resumed,
        parts_s=sent_at - started,
        hash_wait_s=hash_wait_s,
        check_s=time.monotonic() - sent_at - hash_wait_s,
    )


def _finished_elsewhere(api: ConchApi, path: str, error: CliError, say: Callable[[str], None]) -> dict:
    """The upload at `path` when another client sending the same file completed it while this one was sending
    (two pipelines uploading one file at once both resume the same open upload; the server then refuses the later
    one's parts or completion with 409 naming `status`), for this one to wait for the same version; else `error`
    is raised again."""
    if error.status != 409:
        raise error
    upload = api.get(path)
    if upload["status"] not in ("completing", "completed"):
        raise error
    say(f"upload {upload['id']} was completed meanwhile by another client sending the same file: using its version")
    return upload


def _existing_version(response: httpx.Response, call: str) -> int | None:
    """The id of the version a 409 says the file already is (`existing_version`); None for a 2xx. Any other 409
    (a quota, a model being deleted) raises its CliError."""
    if response.status_code != 409:
        return None
    try:
        existing = response.json().get("existing_version")
    except (ValueError, AttributeError):
        existing = None
    if not isinstance(existing, dict) or not isinstance(existing.get("id"), int):
        raise error_from_response(response, call)
    return existing["id"]


def check_model_file(api: ConchApi, path: Path, *, model_id: int | None = None, team: str | None = None) -> None:
    """Ask the server whether Conch can build the file at `path` (POST /api/v1/uploads/check/ with its name and
    first HEAD_BYTES bytes), before a byte is hashed or sent or a model registered. The rules are the server's only;
    with `model_id` (the model the file is for) or else `team` (a slug) the team's rules apply too (pickles).

    Raises CliError (USAGE, field `file`) naming `path` with the server's reason (what the file looks like and what
    to do), or for an empty file. A server without the check (an older Conch: 404) is not asked; its upload's start
    applies the same rules.
    """
    head = file_head(path)
    if not head:
        raise CliError(f"{path} is empty (0 bytes): there is no model in it to upload.", USAGE, field="file")
    body: dict = {"filename": path.name, "head": base64.b64encode(head).decode(), "size_bytes": path.stat().st_size}
    if model_id is not None:
        body["model"] = model_id
    elif team:
        body["team"] = team
    try:
        api.call("POST", "/api/v1/uploads/check/", json=body, expect=(200, 404))
    except CliError as error:
        if error.status != 400:
            raise
        raise CliError(f"{path}: {error.detail}", USAGE, field="file", status=400, call=error.call) from None


def check_upload_api(api: ConchApi, model_id: int, path: Path) -> list[dict]:
    """Return the model's open uploads (the first page); raise CliError (NOT_FOUND) saying so when the server has
    no resumable upload API (an older Conch): the model exists but its uploads list answers 404. Cheap, so
    `conch upload` asks before hashing a large file."""
    base = f"/api/v1/models/{model_id}/uploads/"
    response = api.call("GET", base, expect=(200, 404))
    if response.status_code == 200:
        listed = response.json()
        return listed.get("results", []) if isinstance(listed, dict) else listed
    if api.call("GET", f"/api/v1/models/{model_id}/", expect=(200, 404)).status_code == 200:
        raise CliError(
            f"This Conch server ({api.url}) has no resumable upload API (GET {base} answered 404). Upgrade "
            f"Conch, or upload with curl: curl -H 'Authorization: Bearer …' -F file=@{path.name} "
            f"{api.url}/api/v1/models/{model_id}/versions/",
            NOT_FOUND,
            status=404,
            call=f"GET {base}",
        )


#: Seconds each GET of a completing upload asks the server to wait for the end of its check (`?wait=`, a long
#: poll: the answer comes as soon as the check ends, the server waiting at most 10 s a request).
CHECK_WAIT_S = 10.0
#: A server that answers a waiting GET at once (one without `wait`) is polled instead: every POLL_FIRST_S for the
#: first POLL_FAST_FOR_S seconds (a check of a few GiB joins its parts in seconds, and a pipeline waits for each of
#: them), then less often (up to every POLL_MAX_S) for a long check.
POLL_FIRST_S = 0.1
POLL_FAST_FOR_S = 30.0
POLL_MAX_S = 1.0


def wait_for_upload(api: ConchApi, upload: dict, *, timeout_s: float) -> dict:
    """Wait until the upload is completed (returned) or failed/aborted (CliError FAILED), at most `timeout_s`:
    each GET waits on the server for the check's end (CHECK_WAIT_S); an answer that came back early with the upload
    still open (a server that does not wait) is followed by a pause, as plain polling does."""
    path = f"/api/v1/models/{upload['model']}/uploads/{upload['id']}/"
    started = time.monotonic()
    deadline = started + timeout_s
    delay = POLL_FIRST_S
    while upload["status"] in OPEN_STATUSES:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CliError(
                f"Upload {upload['id']} is still {upload['status']!r} after {timeout_s:.0f} s; run the same command "
                "again to keep waiting.",
                UNAVAILABLE,
            )
        wait = min(CHECK_WAIT_S, left)
        asked = time.monotonic()
        upload = api.get(path, params={"wait": f"{wait:.3f}"})
        if upload["status"] in OPEN_STATUSES and time.monotonic() - asked < wait / 2:
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = POLL_FIRST_S if time.monotonic() - started < POLL_FAST_FOR_S else min(delay * 1.5, POLL_MAX_S)
    if upload["status"] != "completed":
        raise CliError(
            f"Upload {upload['id']} {upload['status']}: {upload.get('error') or 'no reason given'}",
            FAILED,
            field=upload.get("error_field") or None,
        )
    return upload
