"""Streaming upload handler (and the session authentication that leaves the body to it), driven by Django's real
multipart parser (and DRF's request on top of it)."""

from __future__ import annotations

import hashlib
import io
import random

import pytest
from django.http.multipartparser import MultiPartParser
from django.test import RequestFactory
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import MultiPartParser as DRFMultiPartParser
from rest_framework.request import Request

from conch.authentication import HeaderCsrfSessionAuthentication
from conch.errors import InvalidInput, PayloadTooLarge
from conch.upload_handlers import (
    MULTIPART_SLACK_BYTES,
    ObjectStoreUploadHandler,
    StoredUpload,
    check_content_length,
)
from models_registry.storage import FileObjectStore, ObjectStore, S3ObjectStore, StoredObject

MIB = 1024 * 1024
BOUNDARY = "conch-test-boundary-7d1f"
KEY = "models/1/versions/1/source/model.onnx"


def payload(size: int, seed: int = 3) -> bytes:
    return random.Random(seed).randbytes(size)


def multipart_body(*parts: tuple[str, str | None, bytes]) -> bytes:
    """Encode `(field, filename or None, content)` parts as multipart/form-data with BOUNDARY."""
    out = io.BytesIO()
    for field, filename, content in parts:
        out.write(f"--{BOUNDARY}\r\n".encode())
        if filename is None:
            out.write(f'Content-Disposition: form-data; name="{field}"\r\n\r\n'.encode())
        else:
            out.write(f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'.encode())
            out.write(b"Content-Type: application/octet-stream\r\n\r\n")
        out.write(content)
        out.write(b"\r\n")
    out.write(f"--{BOUNDARY}--\r\n".encode())
    return out.getvalue()


def parse(body: bytes, handler: ObjectStoreUploadHandler, *, content_length: int | None = None):
    """Run Django's MultiPartParser over `body` with only `handler`; return (POST, FILES, stream)."""
    meta = {
        "CONTENT_TYPE": f"multipart/form-data; boundary={BOUNDARY}",
        "CONTENT_LENGTH": str(len(body) if content_length is None else content_length),
    }
    stream = io.BytesIO(body)
    post, files = MultiPartParser(meta, stream, [handler], "utf-8").parse()
    return post, files, stream


def record_writes(store: ObjectStore) -> list[int]:
    """Make `store`'s writers record the size of every chunk written; return that list."""
    sizes: list[int] = []
    open_writer = store.open_writer

    def recording_open_writer(key):
        writer = open_writer(key)
        write = writer.write

        def recording_write(chunk):
            sizes.append(len(chunk))
            write(chunk)

        writer.write = recording_write
        return writer

    store.open_writer = recording_open_writer
    return sizes


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "file":
        return FileObjectStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


def leftovers(store: ObjectStore, request) -> dict[str, list]:
    """What the store holds after an upload: keys, plus pending multipart uploads (S3) or any file (folder)."""
    found: dict[str, list] = {"keys": store.list_keys()}
    if isinstance(store, S3ObjectStore):
        client = request.getfixturevalue("s3_client")
        found["pending"] = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    elif store.root.exists():
        found["pending"] = [path.name for path in store.root.rglob("*") if path.is_file()]
    else:
        found["pending"] = []
    return found


def test_streams_file_field_into_the_store(store):
    # given a 10 MiB model and two form fields
    data = payload(10 * MIB + 11)
    body = multipart_body(("max_batch_size", None, b"8"), ("file", "model.onnx", data), ("note", None, b"hi"))
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=64 * MIB)
    writes = record_writes(store)

    # when
    post, files, _ = parse(body, handler)

    # then the object is stored with exact size and hash, and the view sees it as FILES["file"]
    upload = files["file"]
    assert isinstance(upload, StoredUpload)
    assert upload.stored == StoredObject(key=KEY, size_bytes=len(data), sha256_hex=hashlib.sha256(data).hexdigest())
    assert (upload.name, upload.size, upload.content_type) == ("model.onnx", len(data), "application/octet-stream")
    assert post["max_batch_size"] == "8"
    assert post["note"] == "hi"
    assert store.list_keys() == [KEY]
    assert hashlib.sha256(store.read_bytes(KEY)).hexdigest() == upload.sha256_hex
    # and it arrived as a stream of chunks, never as one buffer
    assert sum(writes) == len(data)
    assert len(writes) >= 5
    assert max(writes) <= ObjectStoreUploadHandler.chunk_size


def test_stored_upload_reads_back_from_the_store(store):
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    _, files, _ = parse(multipart_body(("file", "m.onnx", b"\x08\x01onnx")), handler)
    upload = files["file"]

    with upload.open() as opened:
        content = opened.read()

    assert content == b"\x08\x01onnx"
    assert upload.closed


def test_over_limit_raises_and_leaves_nothing(store, request):
    # given a limit of 20 MiB (two 8 MiB parts reach S3 before the limit trips) and a bigger file;
    # the declared length is within limit + slack, so only the streaming check can catch it
    limit = 20 * MIB
    body = multipart_body(("file", "model.onnx", payload(limit + MIB // 2)))
    assert len(body) < limit + MULTIPART_SLACK_BYTES
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=limit)

    # when / then
    with pytest.raises(PayloadTooLarge) as raised:
        parse(body, handler)

    assert raised.value.field == "file"
    assert f"{limit} bytes" in raised.value.detail
    assert "CONCH_MAX_UPLOAD_BYTES" in raised.value.detail
    assert leftovers(store, request) == {"keys": [], "pending": []}


def test_file_of_exactly_the_limit_is_accepted(store):
    data = payload(MIB)
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)

    _, files, _ = parse(multipart_body(("file", "model.onnx", data)), handler)

    assert files["file"].size == MIB


def test_declared_length_over_limit_is_refused_before_reading(tmp_path):
    store = FileObjectStore(tmp_path)
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    body = multipart_body(("file", "model.onnx", b"tiny"))

    with pytest.raises(PayloadTooLarge):
        parse(body, handler, content_length=MIB + MULTIPART_SLACK_BYTES + 1)

    assert store.list_keys() == []


def test_check_content_length_uses_the_declared_body_size():
    factory = RequestFactory()
    small = factory.post("/upload", data=b"x" * 10, content_type="multipart/form-data; boundary=b")
    large = factory.post("/upload", data=b"", content_type="multipart/form-data; boundary=b")
    large.META["CONTENT_LENGTH"] = str(MIB + MULTIPART_SLACK_BYTES + 1)
    garbled = factory.post("/upload", data=b"", content_type="multipart/form-data; boundary=b")
    garbled.META["CONTENT_LENGTH"] = "not-a-number"

    check_content_length(small, MIB)
    check_content_length(garbled, MIB)
    check_content_length(Request(small), MIB)
    with pytest.raises(PayloadTooLarge) as raised:
        check_content_length(large, MIB)
    assert raised.value.field == "file"
    with pytest.raises(PayloadTooLarge):
        check_content_length(Request(large), MIB)


def test_empty_file_is_stored_with_size_zero(store):
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)

    _, files, _ = parse(multipart_body(("file", "model.onnx", b"")), handler)

    assert files["file"].stored == StoredObject(key=KEY, size_bytes=0, sha256_hex=hashlib.sha256(b"").hexdigest())
    assert store.size(KEY) == 0


def test_body_ending_inside_the_file_aborts_the_writer(store, request):
    # given a body cut off in the middle of the file (the client went away)
    body = multipart_body(("file", "model.onnx", payload(18 * MIB)))
    truncated = body[: 17 * MIB]
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=64 * MIB)

    # when
    _, files, _ = parse(truncated, handler)

    # then Django signals upload_interrupted, no file is returned and nothing is left
    assert "file" not in files
    assert leftovers(store, request) == {"keys": [], "pending": []}


def test_file_in_another_field_is_refused(tmp_path):
    store = FileObjectStore(tmp_path)
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)

    with pytest.raises(InvalidInput) as raised:
        parse(multipart_body(("model", "model.onnx", b"abc")), handler)

    assert raised.value.field == "model"
    assert store.list_keys() == []


def test_second_file_is_refused_and_discarded_by_the_context_manager(tmp_path):
    store = FileObjectStore(tmp_path)
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    body = multipart_body(("file", "a.onnx", b"first"), ("file", "b.onnx", b"second"))

    with pytest.raises(InvalidInput, match="exactly one file"), handler:
        parse(body, handler)

    assert store.list_keys() == []


def test_error_after_the_file_discards_the_committed_object(store, request, settings):
    # given a form field after the file that is over Django's DATA_UPLOAD_MAX_MEMORY_SIZE
    from django.core.exceptions import RequestDataTooBig

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = multipart_body(("file", "model.onnx", payload(9 * MIB)), ("note", None, b"n" * 5000))
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=64 * MIB)

    # when the view parses inside `with handler:`
    with pytest.raises(RequestDataTooBig), handler:
        parse(body, handler)

    # then the already committed object is deleted
    assert leftovers(store, request) == {"keys": [], "pending": []}


def drf_request(body: bytes, **extra) -> Request:
    django_request = RequestFactory().generic(
        "POST",
        "/api/v1/models/1/versions",
        data=body,
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
        **extra,
    )
    return Request(django_request, parsers=[DRFMultiPartParser()])


def test_drf_request_data_streams_through_the_handler(store):
    data = payload(3 * MIB)
    request = drf_request(multipart_body(("file", "model.onnx", data), ("instance_count", None, b"2")))
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=8 * MIB)

    request._request.upload_handlers = [handler]
    with handler:
        upload = request.data.get("file")

    assert isinstance(upload, StoredUpload)
    assert upload.stored.sha256_hex == hashlib.sha256(data).hexdigest()
    assert request.data["instance_count"] == "2"
    assert request.FILES["file"] is upload
    assert store.list_keys() == [KEY]


def test_payload_too_large_propagates_out_of_drf_request_data(store, request):
    drf = drf_request(multipart_body(("file", "model.onnx", payload(2 * MIB))))
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    drf._request.upload_handlers = [handler]

    with pytest.raises(PayloadTooLarge):
        drf.data  # noqa: B018 - parsing happens on access

    assert leftovers(store, request) == {"keys": [], "pending": []}


def test_other_exceptions_inside_the_handler_propagate_out_of_drf_request_data(tmp_path):
    # given a store whose writer breaks with a non-Conch error
    store = FileObjectStore(tmp_path)
    open_writer = store.open_writer

    def broken_open_writer(key):
        writer = open_writer(key)

        def write(chunk):
            raise RuntimeError("disk on fire")

        writer.write = write
        return writer

    store.open_writer = broken_open_writer
    drf = drf_request(multipart_body(("file", "model.onnx", b"abc")))
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    drf._request.upload_handlers = [handler]

    # when / then: DRF re-raises it unchanged, and the handler cleans up
    with pytest.raises(RuntimeError, match="disk on fire"), handler:
        drf.data  # noqa: B018

    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


class ActiveUser:
    is_active = True
    is_authenticated = True


def session_request(body: bytes, *, csrf_header: bool):
    from django.conf import settings

    secret = "a" * 32
    extra = {"HTTP_COOKIE": f"{settings.CSRF_COOKIE_NAME}={secret}"}
    if csrf_header:
        extra[settings.CSRF_HEADER_NAME] = secret
    drf = drf_request(body, **extra)
    drf._request.user = ActiveUser()
    return drf


def test_plain_session_csrf_check_would_parse_the_body_first():
    from rest_framework.authentication import SessionAuthentication

    drf = session_request(multipart_body(("file", "model.onnx", b"abc")), csrf_header=True)

    SessionAuthentication().authenticate(drf)

    with pytest.raises(AttributeError, match="upload handlers"):
        drf._request.upload_handlers = [ObjectStoreUploadHandler(None, KEY, max_bytes=MIB)]


def test_header_csrf_session_authentication_leaves_the_body_unread(tmp_path):
    store = FileObjectStore(tmp_path)
    drf = session_request(multipart_body(("file", "model.onnx", b"abc")), csrf_header=True)

    user, _ = HeaderCsrfSessionAuthentication().authenticate(drf)

    assert isinstance(user, ActiveUser)
    assert not hasattr(drf._request, "_files")
    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB)
    drf._request.upload_handlers = [handler]
    assert drf.data["file"].size == 3
    assert store.read_bytes(KEY) == b"abc"


def test_header_csrf_session_authentication_requires_the_header():
    drf = session_request(multipart_body(("file", "model.onnx", b"abc")), csrf_header=False)

    with pytest.raises(PermissionDenied, match="CSRF"):
        HeaderCsrfSessionAuthentication().authenticate(drf)

    assert not hasattr(drf._request, "_files")


@pytest.mark.parametrize(("interval_s", "expected_beats"), [(0.0, 5), (3600.0, 1)], ids=["every-chunk", "throttled"])
def test_heartbeat_is_called_as_chunks_arrive_and_throttled(tmp_path, interval_s, expected_beats):
    # given a file of five chunks
    store = FileObjectStore(tmp_path / "store")
    beats: list[int] = []
    handler = ObjectStoreUploadHandler(
        store,
        KEY,
        max_bytes=64 * MIB,
        heartbeat=lambda: beats.append(handler._received_bytes),
        heartbeat_interval_s=interval_s,
    )
    data = payload(5 * ObjectStoreUploadHandler.chunk_size)
    # when
    _post, files, _stream = parse(multipart_body(("file", "model.onnx", data)), handler)
    # then every chunk beats (as its bytes arrive), or only the first one within the interval
    assert files["file"].stored.size_bytes == len(data)
    if expected_beats == 1:
        assert len(beats) == 1 and 0 < beats[0] <= ObjectStoreUploadHandler.chunk_size
    else:
        assert len(beats) >= expected_beats
        assert beats == sorted(set(beats)) and beats[-1] == len(data)


def test_failing_heartbeat_does_not_fail_the_upload(tmp_path):
    store = FileObjectStore(tmp_path / "store")

    def broken_heartbeat():
        raise RuntimeError("database is down")

    handler = ObjectStoreUploadHandler(store, KEY, max_bytes=MIB, heartbeat=broken_heartbeat, heartbeat_interval_s=0)

    _post, files, _stream = parse(multipart_body(("file", "model.onnx", b"onnx bytes")), handler)

    assert store.read_bytes(KEY) == b"onnx bytes"
    assert files["file"].stored.size_bytes == 10


def _format_checked_handler(store: ObjectStore) -> ObjectStoreUploadHandler:
    """A handler that refuses another format than ONNX by name and by first bytes, as the version upload's."""
    from builds.formats import HEAD_BYTES, check_model_filename, check_model_head

    return ObjectStoreUploadHandler(
        store,
        KEY,
        max_bytes=64 * MIB,
        check_name=lambda name: check_model_filename(name, field="file"),
        check_head=lambda head, size, name: check_model_head(head, size_bytes=size, field="file", filename=name),
        head_bytes=HEAD_BYTES,
    )


def test_a_file_whose_first_bytes_are_not_onnx_stops_the_upload_before_a_byte_is_stored(store, request):
    # given a 10 MiB PNG image sent under an .onnx name
    data = b"\x89PNG\r\n\x1a\n" + payload(10 * MIB)
    body = multipart_body(("file", "model.onnx", data))
    writes = record_writes(store)
    # when it is parsed by a handler that checks the format
    with pytest.raises(InvalidInput) as raised:
        parse(body, _format_checked_handler(store))
    # then it is refused naming the file and what it looks like, nothing was written or left pending
    assert raised.value.field == "file"
    assert raised.value.detail.startswith("This is not an ONNX model: it looks like a PNG image.")
    assert writes == []
    assert leftovers(store, request) == {"keys": [], "pending": []}


def test_the_format_check_reads_only_the_first_chunk_of_the_body(tmp_path):
    store = FileObjectStore(tmp_path / "store")
    body = multipart_body(("file", "model.onnx", b"PK\x03\x04" + payload(10 * MIB)))
    stream = io.BytesIO(body)
    meta = {"CONTENT_TYPE": f"multipart/form-data; boundary={BOUNDARY}", "CONTENT_LENGTH": str(len(body))}
    with pytest.raises(InvalidInput, match="a ZIP archive"):
        MultiPartParser(meta, stream, [_format_checked_handler(store)], "utf-8").parse()
    # the parser stopped after its first reads: most of the 10 MiB were never read
    assert stream.tell() <= 3 * MIB


def test_a_name_of_another_format_is_refused_before_the_store_is_touched(store, request):
    opened = []
    open_writer = store.open_writer
    store.open_writer = lambda key: opened.append(key) or open_writer(key)
    with pytest.raises(InvalidInput) as raised:
        parse(multipart_body(("file", "model.ckpt", b"\x08\x07" + payload(1000))), _format_checked_handler(store))
    assert raised.value.field == "file"
    assert (
        "'model.ckpt' is not a model file Conch builds" in raised.value.detail
        and "torch.jit.script(model).save" in raised.value.detail
    )
    assert opened == []
    assert leftovers(store, request) == {"keys": [], "pending": []}


@pytest.mark.parametrize("size", [2, 511, 512, 513, 3 * MIB])
def test_onnx_files_of_any_size_pass_the_format_check_whole(store, size):
    # a file that starts like ONNX (field 1, ir_version 8), shorter or longer than the bytes the check holds back
    data = (b"\x08\x08" + payload(size))[:size]
    _, files, _ = parse(multipart_body(("file", "model.ONNX", data)), _format_checked_handler(store))
    assert files["file"].stored.size_bytes == size
    assert store.read_bytes(KEY) == data


def test_an_empty_file_is_left_to_the_view_by_the_format_check(store):
    _, files, _ = parse(multipart_body(("file", "model.onnx", b"")), _format_checked_handler(store))
    assert files["file"].stored.size_bytes == 0
