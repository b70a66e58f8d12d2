"""Archives of a model unpacked with their caps (`builds.archives`), and what an unpacked archive holds
(`builds.formats.find_model_in_folder`). Each refusal the issue names has a case here; `unpack_archive` runs in
this process (it is what the sandbox child runs), and one case goes through the sandbox."""

from __future__ import annotations

import io
import random
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from builds.archives import ArchiveLimits, unpack_archive, unpack_archive_in_sandbox
from builds.formats import find_model_in_folder
from conch.errors import InvalidInput
from devtools.tree_models import lightgbm_model
from tests.builds.test_inspection import save_model_with_external_weights

LIMITS = ArchiveLimits(max_unpacked_bytes=64 * 1024**2, max_members=100, max_ratio=100.0)


def _zip(path: Path, members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as bundle:
        for name, data in members.items():
            bundle.writestr(name, data)
    return path


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as bundle:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            bundle.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _entry(name: str, kind: bytes = tarfile.REGTYPE, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _refused(archive: Path, tmp_path: Path, limits: ArchiveLimits = LIMITS) -> str:
    target = Path(tempfile.mkdtemp(dir=tmp_path))
    with pytest.raises(InvalidInput) as raised:
        unpack_archive(archive, target, limits)
    assert raised.value.field == "file"
    return raised.value.detail


def test_a_zip_and_a_tar_gz_of_a_folder_unpack_with_their_names(tmp_path):
    # given the same folder packed as a zip and as a tar.gz, with macOS's resource files in the zip
    members = {"mymodel/model.onnx": b"\x08\x08onnx", "mymodel/weights/w.bin": b"\x01" * 100}
    zipped = _zip(tmp_path / "m.zip", {**members, "__MACOSX/mymodel/._model.onnx": b"junk", "mymodel/.DS_Store": b""})
    tarred = _tar(
        tmp_path / "m.tar.gz",
        [(_entry("./mymodel", tarfile.DIRTYPE), None)] + [(_entry(f"./{n}"), d) for n, d in members.items()],
    )
    for archive, kind in ((zipped, "zip"), (tarred, "tar.gz")):
        target = tmp_path / kind
        # when each is unpacked
        unpacked = unpack_archive(archive, target, LIMITS)
        # then the files are there under their relative names, the junk skipped
        assert unpacked.kind == kind
        assert unpacked.files == ("mymodel/model.onnx", "mymodel/weights/w.bin")
        assert unpacked.unpacked_bytes == 106
        assert (target / "mymodel/weights/w.bin").read_bytes() == b"\x01" * 100
        assert not (target / "__MACOSX").exists() and not (target / "mymodel/.DS_Store").exists()
    assert unpack_archive(zipped, tmp_path / "again", LIMITS).skipped == (
        "__MACOSX/mymodel/._model.onnx",
        "mymodel/.DS_Store",
    )


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("/etc/cron.d/evil", "its name is an absolute path"),
        ("C:\\Windows\\evil.dll", "its name is an absolute path"),
        ("model/../../evil", "its name climbs out of the archive with `..`"),
        ("..\\evil", "its name climbs out of the archive with `..`"),
    ],
)
def test_members_named_outside_the_folder_are_refused_naming_them(tmp_path, name, says):
    # given archives whose member would land outside the target folder
    for archive in (
        _zip(tmp_path / "a.zip", {"model.onnx": b"\x08\x08", name: b"x"}),
        _tar(tmp_path / "a.tar", [(_entry("model.onnx"), b"\x08\x08"), (_entry(name), b"x")], mode="w"),
    ):
        # then unpacking it is refused naming the member and why
        detail = _refused(archive, tmp_path)
        assert detail.startswith(f"Archive member {name!r} is refused: {says}")
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_links_devices_and_fifos_in_a_tar_are_refused_naming_them(tmp_path):
    cases = [
        (_entry("weights.bin", tarfile.SYMTYPE, linkname="/etc/passwd"), "it is a link"),
        (_entry("weights.bin", tarfile.LNKTYPE, linkname="model.onnx"), "it is a link"),
        (_entry("weights.bin", tarfile.CHRTYPE, devmajor=1, devminor=3), "it is a device file or a FIFO"),
        (_entry("weights.bin", tarfile.FIFOTYPE), "it is a device file or a FIFO"),
    ]
    for info, says in cases:
        archive = _tar(tmp_path / "a.tar.gz", [(_entry("model.onnx"), b"\x08\x08"), (info, None)])
        assert _refused(archive, tmp_path).startswith(f"Archive member 'weights.bin' is refused: {says}")


def test_a_symbolic_link_in_a_zip_is_refused_naming_it(tmp_path):
    # given a zip holding a symbolic link (as `zip -y` stores one: the link's mode in the external attributes)
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("model.onnx", b"\x08\x08")
        link = zipfile.ZipInfo("weights.bin")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        bundle.writestr(link, "/etc/passwd")
    detail = _refused(archive, tmp_path)
    assert detail.startswith("Archive member 'weights.bin' is refused: it is a link")
    assert not list(tmp_path.glob("*/weights.bin"))


def test_an_encrypted_zip_member_and_a_name_given_twice_are_refused(tmp_path):
    # given a zip whose member is marked encrypted in the central directory
    archive = _zip(tmp_path / "a.zip", {"model.onnx": b"\x08\x08" * 10})
    data = bytearray(archive.read_bytes())
    central = data.index(b"PK\x01\x02")
    data[central + 8] |= 0x1
    archive.write_bytes(bytes(data))
    assert "it is encrypted. Pack the files without a password" in _refused(archive, tmp_path)
    # and a tar that holds one name twice (a zip can too)
    twice = _tar(tmp_path / "b.tar", [(_entry("model.onnx"), b"a"), (_entry("./model.onnx"), b"b")], mode="w")
    assert _refused(twice, tmp_path).startswith(
        "Archive member './model.onnx' is refused: the archive holds this name twice"
    )


def test_the_member_count_and_unpacked_size_caps_name_the_member_and_the_setting(tmp_path):
    many = _zip(tmp_path / "many.zip", {f"f{i}.bin": b"x" for i in range(12)})
    detail = _refused(many, tmp_path, ArchiveLimits(max_unpacked_bytes=10**9, max_members=10, max_ratio=100))
    assert detail.startswith("Archive member 'f10.bin' is refused: the archive lists more than 10 members")
    assert "CONCH_ARCHIVE_MAX_MEMBERS" in detail
    # the size a member's header claims is checked before it is written, in a zip and in a tar
    big = {"a.bin": bytes(range(256)) * 16, "b.bin": bytes(range(256)) * 16}
    small = ArchiveLimits(max_unpacked_bytes=6000, max_members=10, max_ratio=100)
    for archive in (
        _zip(tmp_path / "big.zip", big, compression=zipfile.ZIP_STORED),
        _tar(tmp_path / "big.tar.xz", [(_entry(n), d) for n, d in big.items()], mode="w:xz"),
    ):
        detail = _refused(archive, tmp_path, small)
        assert detail.startswith("Archive member 'b.bin' is refused: the archive unpacks to more than 6,000 bytes")
        assert "CONCH_ARCHIVE_MAX_UNPACKED_BYTES" in detail


def test_archives_that_unpack_to_far_more_than_their_size_are_refused_as_bombs(tmp_path):
    # given 8 MiB of zeros, which deflate, gzip and bzip2 squeeze hundreds of times
    zeros = bytes(8 * 1024 * 1024)
    for archive in (
        _zip(tmp_path / "bomb.zip", {"model.onnx": b"\x08\x08", "weights.bin": zeros}),
        _tar(tmp_path / "bomb.tar.gz", [(_entry("model.onnx"), b"\x08\x08"), (_entry("weights.bin"), zeros)]),
        _tar(tmp_path / "bomb.tar.bz2", [(_entry("weights.bin"), zeros)], mode="w:bz2"),
    ):
        detail = _refused(archive, tmp_path)
        # then the member that crosses the ratio is named, with the setting and what to do
        assert detail.startswith("Archive member 'weights.bin' is refused: it unpacks to ")
        assert "times its compressed size, more than the 100 accepted (CONCH_ARCHIVE_MAX_RATIO" in detail
        assert "(`zip -0 -r` or plain `tar cf`)" in detail
    # and the same bytes stored without compression unpack
    stored = _zip(tmp_path / "stored.zip", {"weights.bin": zeros}, compression=zipfile.ZIP_STORED)
    assert unpack_archive(stored, tmp_path / "stored", LIMITS).unpacked_bytes == len(zeros)


def test_damaged_empty_and_foreign_archives_say_what_to_do(tmp_path):
    whole = _zip(tmp_path / "whole.zip", {"model.onnx": b"\x08\x08" * 1000}).read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(whole[: len(whole) // 2])
    assert _refused(cut, tmp_path).startswith("This zip archive cannot be read (")
    cut_tar = tmp_path / "cut.tar.gz"
    cut_tar.write_bytes(
        _tar(tmp_path / "t.tar.gz", [(_entry("model.onnx"), random.Random(0).randbytes(100_000))]).read_bytes()[:900]
    )
    assert "cannot be read" in _refused(cut_tar, tmp_path)
    empty = _zip(tmp_path / "empty.zip", {"__MACOSX/._x": b""})
    assert _refused(empty, tmp_path) == (
        "The zip archive holds no files (only __MACOSX/._x). Pack the model's files into it and upload it again."
    )
    gzipped = tmp_path / "model.onnx.gz"
    import gzip

    gzipped.write_bytes(gzip.compress(b"\x08\x08onnx" * 100))
    assert _refused(gzipped, tmp_path).startswith("This tar.gz archive cannot be read (")


def test_an_archive_unpacks_in_the_sandbox_and_its_refusals_come_back_unchanged(tmp_path):
    good = _zip(tmp_path / "good.zip", {"m/model.onnx": b"\x08\x08"})
    assert unpack_archive_in_sandbox(good, tmp_path / "good", limits=LIMITS).files == ("m/model.onnx",)
    bad = _zip(tmp_path / "bad.zip", {"../evil": b"x"})
    with pytest.raises(InvalidInput) as raised:
        unpack_archive_in_sandbox(bad, tmp_path / "bad", limits=LIMITS)
    assert raised.value.detail.startswith("Archive member '../evil' is refused: its name climbs out")


# --- what an unpacked archive holds --------------------------------------------------------------------------


def test_an_onnx_model_with_its_external_data_is_found_in_its_folder(tmp_path):
    (tmp_path / "mymodel").mkdir()
    model = save_model_with_external_weights(tmp_path / "mymodel")
    model_format, entry = find_model_in_folder(tmp_path, ["mymodel/model.onnx", "mymodel/weights.bin", "README"])
    assert (model_format.key, entry) == ("onnx", model)


def test_a_savedmodel_folder_is_found_by_its_saved_model_pb(tmp_path):
    files = ["export/saved_model.pb", "export/variables/variables.index", "export/fingerprint.pb"]
    model_format, entry = find_model_in_folder(tmp_path, files)
    assert (model_format.key, entry) == ("tf_savedmodel", tmp_path / "export")


def test_a_lone_model_file_of_another_format_is_told_by_its_name_and_bytes(tmp_path):
    lightgbm_model(tmp_path / "churn.txt")
    model_format, entry = find_model_in_folder(tmp_path, ["churn.txt"])
    assert (model_format.key, entry.name) == ("lightgbm", "churn.txt")


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (["a/model.onnx", "b/model.onnx"], "The archive holds 2 ONNX models (a/model.onnx, b/model.onnx)"),
        (["m/saved_model.pbtxt", "m/variables/variables.index"], "a TensorFlow SavedModel saved as text"),
        (["a/saved_model.pb", "b/saved_model.pb"], "The archive holds 2 SavedModels (a, b)"),
        (["archive/data.pkl", "archive/version"], "it looks like an unpacked PyTorch file"),
        (["notes.md", "train.py"], "The archive holds no model Conch builds. It holds 2 files: notes.md, train.py"),
    ],
)
def test_a_folder_without_one_model_conch_builds_is_refused_saying_what_it_holds(tmp_path, files, says):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"# not a model\n")
    with pytest.raises(InvalidInput) as raised:
        find_model_in_folder(tmp_path, files)
    assert raised.value.field == "file" and says in raised.value.detail


def test_an_archive_inside_the_archive_is_refused(tmp_path):
    _zip(tmp_path / "inner.zip", {"model.onnx": b"\x08\x08"})
    with pytest.raises(InvalidInput) as raised:
        find_model_in_folder(tmp_path, ["inner.zip"])
    assert raised.value.detail.startswith("The archive holds only another archive ('inner.zip')")
