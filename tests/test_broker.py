"""The filesystem broker (`filesystem://`, conch.broker): a message appears in the queue folder whole, never
empty or cut, so a worker that lists the folder while a message is written does not read it half-made."""

from __future__ import annotations

import os
from queue import Empty

import pytest
from kombu import Connection

import conch.celery  # noqa: F401 (registers the transport of `filesystem://`)
from conch import broker


@pytest.fixture
def channel(tmp_path):
    """A channel of a `filesystem://` connection on a queue folder of its own."""
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "processed_folder": str(tmp_path / "processed"),
        "control_folder": str(tmp_path / "control"),
    }
    with Connection("filesystem://", transport_options=options) as connection:
        channel = connection.default_channel
        channel.folder = folder
        yield channel


def test_filesystem_urls_use_the_transport_whose_messages_appear_whole(channel):
    assert isinstance(channel, broker.Channel)
    assert isinstance(channel.connection, broker.Transport)


def test_a_message_being_written_is_not_taken_and_appears_whole(channel, monkeypatch):
    payload = {"body": "x" * 100_000, "headers": {"task": "builds.finish_upload"}}
    seen_while_writing = []
    real_replace = os.replace

    def replace_after_a_look(source, target):
        # the moment between the write and the rename: a consumer looking now finds nothing to take
        seen_while_writing.append(sorted(os.listdir(channel.folder)))
        with pytest.raises(Empty):
            channel._get("celery")
        real_replace(source, target)

    monkeypatch.setattr(broker.os, "replace", replace_after_a_look)
    channel._put("celery", payload)
    # the message was only under its temporary name while it was written, and is whole once it appears
    ((writing,),) = seen_while_writing
    assert writing.endswith(".celery.msg" + broker.WRITING_SUFFIX)
    assert channel._get("celery") == payload
    assert os.listdir(channel.folder) == []


def test_a_folder_that_cannot_be_written_is_a_channel_error_and_leaves_no_file(channel, monkeypatch):
    from kombu.exceptions import ChannelError

    def refuse(source, target):
        raise PermissionError(13, "Permission denied", target)

    monkeypatch.setattr(broker.os, "replace", refuse)
    with pytest.raises(ChannelError, match="Cannot add file"):
        channel._put("celery", {"body": "x"})
    assert os.listdir(channel.folder) == []
