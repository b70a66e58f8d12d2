"""Object-store adapter: both implementations against real backends (a tmp folder; moto's S3 server over HTTP)."""

from __future__ import annotations

import base64
import hashlib
import io
import random
import re
import socket
import threading
import time
import zlib
from pathlib import Path

import pytest
import requests

from conch.errors import ConchError, InvalidInput, NotFound, Unavailable
from models_registry import storage
from models_registry.storage import (
    FileObjectStore,
    ObjectStore,
    ObjectStoreConfigError,
    S3ObjectStore,
    StoredObject,
    build_object_store,
    get_object_store,
)
from models_registry.storage.s3 import _Pipe
from tests.s3_server import S3_STORE_PREFIX

MIB = 1024 * 1024
# Triton core, src/filesystem/implementations/s3.h: the S3 locations its parser accepts.
TRITON_S3_REGEX = re.compile(
    r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)(((/[0-9a-zA-Z.\-_]+)*)?)"
)


def payload(size: int, seed: int = 7) -> bytes:
    """Deterministic incompressible bytes."""
    return random.Random(seed).randbytes(size)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "file":
        return FileObjectStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


def pending_uploads(store: ObjectStore, request) -> list:
    """Multipart uploads the S3 server still holds for the store's bucket ([] for folders)."""
    if not isinstance(store, S3ObjectStore):
        return []
    client = request.getfixturevalue("s3_client")
    return client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


def started_uploads(store: ObjectStore, request, count: int) -> list:
    """The multipart uploads of the store's bucket once `count` of them exist ([] for folders): an S3 writer's
    transfer starts them in its own thread once a whole part was written."""
    if not isinstance(store, S3ObjectStore):
        return []
    deadline = time.monotonic() + 10
    while len(uploads := pending_uploads(store, request)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return uploads


def files_on_disk(store: ObjectStore) -> list[str]:
    """Every file under a FileObjectStore's root, temp files included."""
    if not isinstance(store, FileObjectStore) or not store.root.exists():
        return []
    return sorted(path.relative_to(store.root).as_posix() for path in store.root.rglob("*") if path.is_file())


def test_put_bytes_round_trip(store):
    # given / when
    stored = store.put_bytes("models/1/source/model.onnx", b"onnx bytes")

    # then
    assert stored == StoredObject(key="models/1/source/model.onnx", size_bytes=10, sha256_hex=sha256(b"onnx bytes"))
    assert store.read_bytes("models/1/source/model.onnx") == b"onnx bytes"
    assert store.exists("models/1/source/model.onnx") is True
    assert store.size("models/1/source/model.onnx") == 10
    assert store.list_keys() == ["models/1/source/model.onnx"]


def test_writer_small_object_in_several_writes(store):
    data = payload(300_000)

    with store.open_writer("small.bin") as writer:
        for start in range(0, len(data), 70_001):
            writer.write(data[start : start + 70_001])
        stored = writer.commit()

    assert stored == StoredObject(key="small.bin", size_bytes=300_000, sha256_hex=sha256(data))
    assert store.read_bytes("small.bin") == data


def test_writer_multipart_object_exact_hash_and_size(store, request):
    # given 20 MiB + 123 bytes (three 8 MiB parts on S3), written in uneven chunks
    data = payload(20 * MIB + 123)

    # when
    with store.open_writer("big/model.onnx") as writer:
        position = 0
        for size in [1, MIB - 1, 3 * MIB + 5, 9 * MIB, 17] * 3:
            writer.write(memoryview(data)[position : position + size])
            position += size
        writer.write(data[position:])
        stored = writer.commit()

    # then
    assert stored == StoredObject(key="big/model.onnx", size_bytes=len(data), sha256_hex=sha256(data))
    assert store.size("big/model.onnx") == len(data)
    assert sha256(store.read_bytes("big/model.onnx")) == sha256(data)
    assert pending_uploads(store, request) == []


def test_writer_empty_object(store):
    with store.open_writer("empty") as writer:
        stored = writer.commit()

    assert stored == StoredObject(key="empty", size_bytes=0, sha256_hex=sha256(b""))
    assert store.read_bytes("empty") == b""


def test_writer_replaces_existing_object(store):
    store.put_bytes("k", b"old content")

    store.put_bytes("k", b"new")

    assert store.read_bytes("k") == b"new"
    assert store.list_keys() == ["k"]


def test_abort_leaves_no_object_and_no_pending_upload(store, request):
    # given a writer that already pushed two full parts
    writer = store.open_writer("aborted/model.onnx")
    writer.write(payload(17 * MIB))

    # when
    writer.abort()
    writer.abort()  # idempotent

    # then
    assert store.exists("aborted/model.onnx") is False
    assert store.list_keys() == []
    assert pending_uploads(store, request) == []
    assert files_on_disk(store) == []


def test_exception_inside_writer_block_aborts(store, request):
    with pytest.raises(RuntimeError, match="client went away"), store.open_writer("model.onnx") as writer:
        writer.write(payload(9 * MIB))
        raise RuntimeError("client went away")

    assert store.list_keys() == []
    assert pending_uploads(store, request) == []
    assert files_on_disk(store) == []


def test_leaving_writer_block_without_commit_aborts(store):
    with store.open_writer("model.onnx") as writer:
        writer.write(b"abc")

    assert store.exists("model.onnx") is False


def test_writer_refuses_use_after_commit(store):
    writer = store.open_writer("k")
    writer.write(b"abc")
    writer.commit()

    with pytest.raises(ConchError, match="already committed"):
        writer.write(b"more")
    with pytest.raises(ConchError, match="already committed"):
        writer.commit()
    writer.abort()  # no effect after commit
    assert store.read_bytes("k") == b"abc"


def test_s3_failed_part_aborts_writer_and_raises_unavailable(s3_store, s3_client, request):
    # given a multipart upload that the server forgets (as when it is aborted behind our back)
    writer = s3_store.open_writer("model.onnx")
    writer.write(payload(8 * MIB))
    [upload] = started_uploads(s3_store, request, 1)
    time.sleep(0.5)  # let part 1 finish before pulling the upload away
    s3_client.abort_multipart_upload(Bucket=s3_store.bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    # when the next parts are sent (S3 answers NoSuchUpload; moto answers 500, retried then given up)
    with pytest.raises(Unavailable, match="when asked to write 'model.onnx'"):
        writer.write(payload(8 * MIB, seed=1))
        writer.commit()

    # then nothing is left and the writer is closed
    assert s3_store.exists("model.onnx") is False
    assert s3_client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads", []) == []
    with pytest.raises(ConchError, match="already aborted"):
        writer.write(b"x")


def _put_in_thread(pipe: _Pipe, data: bytes) -> tuple[threading.Thread, list[bool]]:
    """Start a thread that puts `data` into `pipe` (blocking while it is full); the list gets put's answer."""
    outcome: list[bool] = []
    putter = threading.Thread(target=lambda: outcome.append(pipe.put(data)), name="pipe-put", daemon=True)
    putter.start()
    return putter, outcome


def test_a_put_waiting_on_a_full_writer_pipe_returns_when_the_transfer_ends():
    # given an S3 writer's pipe that is full (s3transfer read nothing yet) and a put waiting for room in it
    pipe = _Pipe(capacity=4)
    assert pipe.put(b"abcd") is True
    putter, outcome = _put_in_thread(pipe, b"efgh")
    # when the transfer ends (s3transfer's done callback: failed, cancelled)
    pipe.end_reading()
    # then the waiting put is woken and returns without taking the bytes (no timer: it waits on the pipe's state)
    putter.join(timeout=30)
    assert not putter.is_alive() and outcome == [False]
    # and a later put is refused at once
    assert pipe.put(b"ijkl") is False


def test_a_put_waiting_on_a_full_writer_pipe_goes_in_when_the_reader_takes_a_part():
    # given a full pipe and a put waiting for room in it
    pipe = _Pipe(capacity=4)
    pipe.put(b"abcd")
    putter, outcome = _put_in_thread(pipe, b"efgh")
    # when s3transfer reads a part
    assert pipe.read(4) == b"abcd"
    # then the put goes in, and the reader gets its bytes, short at the end of the stream
    putter.join(timeout=30)
    assert not putter.is_alive() and outcome == [True]
    pipe.close()
    assert pipe.read(8) == b"efgh"
    assert pipe.read(8) == b""


def test_s3_objects_live_under_the_store_prefix(s3_store, s3_client):
    s3_store.put_bytes("models/1/config.pbtxt", b"name: 'm'")

    listed = s3_client.list_objects_v2(Bucket=s3_store.bucket)["Contents"]

    assert [item["Key"] for item in listed] == [f"{S3_STORE_PREFIX}/models/1/config.pbtxt"]
    assert s3_store.list_keys() == ["models/1/config.pbtxt"]


def test_copy_small_and_multipart(store):
    small = b"config"
    big = payload(20 * MIB + 1)
    store.put_bytes("src/small", small)
    store.put_bytes("src/big", big)

    store.copy("src/small", "dst/small")
    store.copy("src/big", "dst/big")

    assert store.read_bytes("dst/small") == small
    assert sha256(store.read_bytes("dst/big")) == sha256(big)
    assert store.list_keys() == ["dst/big", "dst/small", "src/big", "src/small"]


def test_open_reader_streams(store):
    data = payload(3 * MIB + 17)
    store.put_bytes("model.onnx", data)

    chunks = []
    with store.open_reader("model.onnx") as reader:
        while chunk := reader.read(MIB):
            chunks.append(chunk)

    assert [len(chunk) for chunk in chunks] == [MIB, MIB, MIB, 17]
    assert b"".join(chunks) == data


def test_download_to(store, tmp_path):
    data = payload(20 * MIB + 5)
    store.put_bytes("models/1/model.onnx", data)
    target = tmp_path / "downloads" / "nested" / "model.onnx"

    store.download_to("models/1/model.onnx", target)

    assert target.read_bytes() == data
    assert sorted(path.name for path in target.parent.iterdir()) == ["model.onnx"]


def test_list_keys_is_sorted_and_scoped_to_a_folder(store):
    for key in ["m/1/b", "m/1/a/x", "m/10/a", "m/1.txt", "z"]:
        store.put_bytes(key, b".")

    assert store.list_keys() == ["m/1.txt", "m/1/a/x", "m/1/b", "m/10/a", "z"]
    assert store.list_keys("m/1") == ["m/1/a/x", "m/1/b"]
    assert store.list_keys("m/1/") == ["m/1/a/x", "m/1/b"]
    assert store.list_keys("m/2") == []


def test_delete_prefix_removes_only_that_folder(store):
    for key in ["m/1/config.pbtxt", "m/1/1/model.onnx", "m/10/config.pbtxt", "m/1.txt"]:
        store.put_bytes(key, b".")

    deleted = store.delete_prefix("m/1")

    assert deleted == 2
    assert store.list_keys() == ["m/1.txt", "m/10/config.pbtxt"]
    assert store.delete_prefix("m/1") == 0


def test_delete_prefix_refuses_the_whole_store(store):
    store.put_bytes("k", b".")

    with pytest.raises(InvalidInput):
        store.delete_prefix("")
    assert store.list_keys() == ["k"]


def test_delete_is_idempotent_and_prunes_empty_folders(store):
    store.put_bytes("m/1/1/model.onnx", b".")
    store.put_bytes("m/2", b".")

    store.delete("m/1/1/model.onnx")
    store.delete("m/1/1/model.onnx")

    assert store.list_keys() == ["m/2"]
    if isinstance(store, FileObjectStore):
        assert not (store.root / "m" / "1").exists()


def test_missing_key_raises_not_found(store, tmp_path):
    with pytest.raises(NotFound):
        store.read_bytes("missing")
    with pytest.raises(NotFound):
        store.open_reader("missing")
    with pytest.raises(NotFound):
        store.size("missing")
    with pytest.raises(NotFound):
        store.copy("missing", "other")
    with pytest.raises(NotFound):
        store.download_to("missing", tmp_path / "out")
    assert store.exists("missing") is False
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "a/./b", "a/", "a\\b", "a/\x00", ".conch-tmp-x/y"])
def test_malformed_keys_are_refused(store, key):
    with pytest.raises(InvalidInput):
        store.put_bytes(key, b".")


def test_file_store_triton_location_is_an_absolute_path(tmp_path):
    store = FileObjectStore(tmp_path / "store")

    assert store.triton_repository_location("models/1/versions/2/repository") == str(
        (tmp_path / "store" / "models" / "1" / "versions" / "2" / "repository").resolve()
    )
    assert store.triton_repository_location("") == str((tmp_path / "store").resolve())
    assert store.triton_environment() == {}


def test_s3_triton_location_with_endpoint(s3_store, s3_server):
    port = s3_server.endpoint_url.rsplit(":", 1)[1]

    location = s3_store.triton_repository_location("models/1/versions/2/repository/")

    assert (
        location == f"s3://http://127.0.0.1:{port}/{s3_store.bucket}/{S3_STORE_PREFIX}/models/1/versions/2/repository"
    )
    match = TRITON_S3_REGEX.fullmatch(location)
    assert match is not None
    assert match.group(4) == s3_store.bucket
    assert match.group(5) == f"/{S3_STORE_PREFIX}/models/1/versions/2/repository"
    assert s3_store.triton_environment() == {
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_DEFAULT_REGION": s3_server.region,
    }


def test_s3_triton_location_forms():
    aws = S3ObjectStore("models-bucket", "prod/repo", "", "eu-west-1")
    minio = S3ObjectStore("models", "", "https://minio.example.com", "", "key", "secret")

    assert aws.triton_repository_location("m/1") == "s3://models-bucket/prod/repo/m/1"
    assert aws.triton_environment() == {"AWS_DEFAULT_REGION": "eu-west-1"}
    assert minio.triton_repository_location("m/1") == "s3://https://minio.example.com:443/models/m/1"
    assert minio.triton_repository_location("") == "s3://https://minio.example.com:443/models"
    assert TRITON_S3_REGEX.fullmatch(minio.triton_repository_location("m/1"))


def test_s3_triton_location_refuses_what_triton_cannot_parse():
    store = S3ObjectStore("models", "", "http://127.0.0.1:9000", "", "key", "secret")

    with pytest.raises(ObjectStoreConfigError, match="segment 'a b'"):
        store.triton_repository_location("m/a b")
    with pytest.raises(ObjectStoreConfigError, match="bucket"):
        S3ObjectStore("Models", "", "http://127.0.0.1:9000").triton_repository_location("m")
    with pytest.raises(ObjectStoreConfigError, match="host name or IPv4"):
        S3ObjectStore("models", "", "http://[::1]:9000").triton_repository_location("m")


def test_s3_unreachable_endpoint_raises_unavailable_quickly():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    store = S3ObjectStore(
        "models", "", f"http://127.0.0.1:{closed_port}", "", "key", "secret", connect_timeout_s=1, max_attempts=2
    )

    started = time.monotonic()
    with pytest.raises(Unavailable, match="cannot|failed"):
        store.put_bytes("k", b".")
    with pytest.raises(Unavailable):
        store.exists("k")

    assert time.monotonic() - started < 10


def test_s3_missing_bucket_raises_unavailable(s3_server):
    store = S3ObjectStore(
        "no-such-bucket", "", s3_server.endpoint_url, s3_server.region, s3_server.access_key, s3_server.secret_key
    )

    with pytest.raises(Unavailable, match="no-such-bucket"):
        store.put_bytes("k", b".")


def test_s3_store_settings_are_validated():
    with pytest.raises(ObjectStoreConfigError, match="both"):
        S3ObjectStore("b", "", "http://127.0.0.1:9000", "", "key-only", "")
    with pytest.raises(ObjectStoreConfigError, match="part size"):
        S3ObjectStore("b", part_size_bytes=MIB)
    with pytest.raises(ObjectStoreConfigError, match="ENDPOINT"):
        S3ObjectStore("b", "", "127.0.0.1:9000")
    assert "secret" not in repr(S3ObjectStore("b", "p", "http://h:1", "", "key", "secret"))


def test_build_object_store_parses_urls(tmp_path):
    folder = build_object_store((tmp_path / "a b").as_uri())
    bucket = build_object_store("s3://models/conch/repo/", endpoint_url="http://127.0.0.1:9000")

    assert isinstance(folder, FileObjectStore)
    assert folder.root == (tmp_path / "a b").resolve()
    assert isinstance(bucket, S3ObjectStore)
    assert (bucket.bucket, bucket.prefix, bucket.endpoint_url) == ("models", "conch/repo", "http://127.0.0.1:9000")
    for url in ["file://relative/path", "s3:///prefix", "gs://bucket", "/plain/path"]:
        with pytest.raises(ObjectStoreConfigError):
            build_object_store(url)


def test_get_object_store_follows_settings(settings, tmp_path, s3_server):
    settings.CONCH_STORAGE_URL = (tmp_path / "objects").as_uri()
    folder = get_object_store()

    assert isinstance(folder, FileObjectStore)
    assert folder.root == (tmp_path / "objects").resolve()
    assert get_object_store() is folder

    settings.CONCH_STORAGE_URL = "s3://bucket/prefix"
    settings.CONCH_S3_ENDPOINT_URL = s3_server.endpoint_url
    settings.CONCH_S3_REGION = ""
    settings.CONCH_S3_ACCESS_KEY_ID = "key"
    settings.CONCH_S3_SECRET_ACCESS_KEY = "secret"
    bucket = get_object_store()

    assert isinstance(bucket, S3ObjectStore)
    assert (bucket.bucket, bucket.prefix, bucket.region) == ("bucket", "prefix", storage.FALLBACK_REGION)
    assert bucket.triton_environment()["AWS_ACCESS_KEY_ID"] == "key"


def test_get_object_store_requires_a_url(settings):
    settings.CONCH_STORAGE_URL = ""

    with pytest.raises(ObjectStoreConfigError, match="CONCH_STORAGE_URL"):
        get_object_store()


def test_file_store_keeps_in_progress_writes_out_of_listings(tmp_path):
    store = FileObjectStore(tmp_path)
    writer = store.open_writer("m/model.onnx")
    writer.write(b"partial")

    assert store.list_keys() == []
    assert store.exists("m/model.onnx") is False
    [temp] = [path for path in Path(tmp_path, "m").iterdir()]
    assert temp.name.startswith(".conch-tmp-")

    stored = writer.commit()

    assert stored.size_bytes == 7
    assert store.list_keys() == ["m/model.onnx"]
    assert [path.name for path in Path(tmp_path, "m").iterdir()] == ["model.onnx"]


def test_abort_multipart_uploads_drops_what_a_dead_writer_left(store, request):
    # given a writer of one key that died mid-write (never committed, never aborted), a finished object of that
    # key, and a writer of a sibling key still at work
    dead = store.open_writer("models/1/source/model.onnx")
    dead.write(payload(9 * MIB))
    store.put_bytes("models/1/source/model.onnx", b"committed earlier")
    sibling = store.open_writer("models/1/source/model.onnx.sig")
    sibling.write(payload(9 * MIB, seed=2))
    started_uploads(store, request, 2)

    # when
    aborted = store.abort_multipart_uploads("models/1/source/model.onnx")

    # then only the dead writer's partial upload is gone; objects are not touched
    assert aborted == 1
    assert store.read_bytes("models/1/source/model.onnx") == b"committed earlier"
    assert [upload["Key"] for upload in pending_uploads(store, request)] == (
        [f"{S3_STORE_PREFIX}/models/1/source/model.onnx.sig"] if isinstance(store, S3ObjectStore) else []
    )
    if isinstance(store, FileObjectStore):
        leftovers = [name for name in files_on_disk(store) if ".conch-tmp-" in name]
        assert len(leftovers) == 1 and leftovers[0].startswith("models/1/source/.conch-tmp-model.onnx.sig.")
    assert sibling.commit().size_bytes == 9 * MIB
    # and nothing is left to abort
    assert store.abort_multipart_uploads("models/1/source/model.onnx") == 0
    assert store.abort_multipart_uploads("models/2/source/model.onnx") == 0


def test_commit_after_abort_multipart_uploads_raises_unavailable(store, request):
    writer = store.open_writer("models/1/source/model.onnx")
    writer.write(payload(9 * MIB))
    started_uploads(store, request, 1)

    store.abort_multipart_uploads("models/1/source/model.onnx")

    with pytest.raises(Unavailable):
        writer.commit()
    assert store.exists("models/1/source/model.onnx") is False


# --- Resumable uploads: multipart uploads filled part by part ---------------------------------------------------


def _send_part(store: ObjectStore, key: str, upload_id: str, number: int, data: bytes) -> None:
    """Send a part as a client would: through the store (folder) or to its presigned URL (S3)."""
    target = store.presign_part(key, upload_id, number, expires_in_s=60)
    if target is None:
        store.write_part(key, upload_id, number, io.BytesIO(data), len(data))
    else:
        assert requests.put(target.url, data=data, headers=target.headers, timeout=30).status_code == 200


def test_a_multipart_upload_is_listed_joined_once_and_ends(store, request):
    # given an upload of two parts, sent out of order
    key = "models/1/uploads/u/model.onnx"
    first, second = payload(5 * MIB, seed=1), payload(1000, seed=2)
    upload_id = store.start_multipart(key)
    _send_part(store, key, upload_id, 2, second)
    _send_part(store, key, upload_id, 1, first)
    # when its parts are listed
    parts = store.list_parts(key, upload_id)
    # then they come by number with their sizes
    assert [(part.number, part.size_bytes) for part in parts] == [(1, 5 * MIB), (2, 1000)]
    assert not store.exists(key)
    # when it is completed, twice (a redelivered task)
    store.complete_multipart(key, upload_id, parts)
    store.complete_multipart(key, upload_id, parts)
    # then the object is the parts joined, and nothing of the upload is left
    assert store.read_bytes(key) == first + second
    assert store.list_keys("") == [key]
    assert pending_uploads(store, request) == []
    with pytest.raises(NotFound):
        store.list_parts(key, upload_id)
    store.abort_multipart(key, upload_id)  # gone already: no error
    assert store.read_bytes(key) == first + second


def test_an_aborted_multipart_upload_leaves_nothing(store, request):
    key = "models/1/uploads/v/model.onnx"
    upload_id = store.start_multipart(key)
    _send_part(store, key, upload_id, 1, b"part")
    store.abort_multipart(key, upload_id)
    assert pending_uploads(store, request) == []
    assert store.list_keys("") == []
    assert files_on_disk(store) == []
    with pytest.raises(NotFound):
        store.list_parts(key, upload_id)


def test_a_folder_part_that_ends_early_is_refused_and_leaves_no_file(tmp_path):
    store = FileObjectStore(tmp_path / "store")
    key = "models/1/uploads/w/model.onnx"
    upload_id = store.start_multipart(key)
    with pytest.raises(InvalidInput) as refused:
        store.write_part(key, upload_id, 3, io.BytesIO(b"x" * 10), 11)
    assert refused.value.field == "size_bytes"
    assert refused.value.detail == "Part 3 ended after 10 of its 11 bytes; send the part again whole."
    assert store.list_parts(key, upload_id) == []
    assert files_on_disk(store) == []


def test_a_crc32_multipart_upload_takes_each_part_with_its_checksum(store, request):
    # given an upload that declares CRC32, and two parts with their CRC32s
    key = "models/1/uploads/c/model.onnx"
    first, second = payload(5 * MIB, seed=3), payload(1000, seed=4)
    crcs = [storage.crc32_base64(zlib.crc32(first)), storage.crc32_base64(zlib.crc32(second))]
    assert storage.crc32_base64(zlib.crc32(b"abc")) == "NSRBwg=="
    upload_id = store.start_multipart(key, checksum_algorithm="CRC32")
    # when each part is sent with its CRC32 as a client would (S3: the presigned target's headers)
    for number, (data, crc) in enumerate(zip((first, second), crcs, strict=True), start=1):
        target = store.presign_part(key, upload_id, number, expires_in_s=60, checksum_crc32=crc)
        if target is None:
            part = store.write_part(key, upload_id, number, io.BytesIO(data), len(data), checksum_crc32=crc)
            assert (part.number, part.size_bytes, part.checksum_crc32) == (number, len(data), crc)
        else:
            assert target.headers == {"x-amz-checksum-crc32": crc, "x-amz-sdk-checksum-algorithm": "CRC32"}
            assert "X-Amz-SignedHeaders=host%3Bx-amz-checksum-crc32%3Bx-amz-sdk-checksum-algorithm" in target.url
            assert requests.put(target.url, data=data, headers=target.headers, timeout=30).status_code == 200
    # then the joined object is the parts
    store.complete_multipart(key, upload_id, store.list_parts(key, upload_id))
    assert store.read_bytes(key) == first + second
    if isinstance(store, S3ObjectStore):
        # and S3 gives it the COMPOSITE CRC32 of the parts' CRC32s
        client = request.getfixturevalue("s3_client")
        head = client.head_object(Bucket=store.bucket, Key=store._object_key(key), ChecksumMode="ENABLED")
        composite = storage.crc32_base64(zlib.crc32(b"".join(base64.b64decode(crc) for crc in crcs)))
        assert head["ChecksumCRC32"].split("-")[0] == composite


def test_s3_lists_and_completes_the_parts_with_their_crc32(s3_store):
    # given a CRC32 upload of two parts on the S3 server. (moto's ListParts omits the parts' ChecksumCRC32 that AWS
    # S3 lists for such an upload, S3 API reference "ListParts", Part.ChecksumCRC32: it is added to the parsed answer
    # here as S3 gives it; the requests themselves go to the server.)
    key = "models/1/uploads/d/model.onnx"
    parts = [payload(5 * MIB, seed=5), payload(10, seed=6)]
    crcs = [storage.crc32_base64(zlib.crc32(data)) for data in parts]
    upload_id = s3_store.start_multipart(key, checksum_algorithm="CRC32")
    for number, (data, crc) in enumerate(zip(parts, crcs, strict=True), start=1):
        target = s3_store.presign_part(key, upload_id, number, expires_in_s=60, checksum_crc32=crc)
        assert requests.put(target.url, data=data, headers=target.headers, timeout=30).status_code == 200
    events = s3_store._client.meta.events

    def as_aws_lists_them(parsed, **kwargs):
        for part, crc in zip(parsed.get("Parts", []), crcs, strict=True):
            part.setdefault("ChecksumCRC32", crc)

    completed_with = []

    def record(params, **kwargs):
        completed_with.append(params)

    events.register("after-call.s3.ListParts", as_aws_lists_them)
    events.register("provide-client-params.s3.CompleteMultipartUpload", record)
    try:
        # when the parts are listed and completed
        listed = s3_store.list_parts(key, upload_id)
        s3_store.complete_multipart(key, upload_id, listed)
    finally:
        events.unregister("after-call.s3.ListParts", as_aws_lists_them)
        events.unregister("provide-client-params.s3.CompleteMultipartUpload", record)
    # then each listed part keeps its CRC32, and CompleteMultipartUpload names it (S3 requires it for CRC32 uploads)
    assert [part.checksum_crc32 for part in listed] == crcs
    sent = completed_with[0]["MultipartUpload"]["Parts"]
    assert [(p["PartNumber"], p["ChecksumCRC32"]) for p in sent] == [(1, crcs[0]), (2, crcs[1])]
    assert s3_store.read_bytes(key) == parts[0] + parts[1]


def test_presigned_part_urls_name_the_public_endpoint(s3_server, s3_bucket):
    endpoint, bucket = s3_bucket
    store = S3ObjectStore(
        bucket,
        "p",
        endpoint,
        s3_server.region,
        s3_server.access_key,
        s3_server.secret_key,
        public_endpoint_url="http://s3.example.test:9000",
    )
    target = store.presign_part("k", "upload-1", 7, expires_in_s=120)
    assert target.method == "PUT" and target.expires_in_s == 120
    assert target.url.startswith(f"http://s3.example.test:9000/{bucket}/p/k?")
    assert "partNumber=7" in target.url and "uploadId=upload-1" in target.url
