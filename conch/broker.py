"""kombu's filesystem transport (the Celery broker of the demo and of a single machine, `filesystem://`), with
messages that appear in the queue folder whole.

kombu's own `Channel._put` creates the message file under its final name and writes the message after; a worker
that lists the folder in between moves the file away and reads it empty or cut, and dies of the JSONDecodeError
(seen in a demo: "Unrecoverable error: JSONDecodeError" in kombu/transport/filesystem.py `_get`). Here the message
is written to a temporary name that no queue's consumer takes, then renamed to its final name: a rename within
one folder is atomic (POSIX rename(2)), so a consumer finds either no message or all of it. Everything else is
kombu's. `conch.celery` makes `filesystem://` resolve to this transport.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

#: Suffix of a message being written: `_get` takes only names ending in `.<queue>.msg`.
WRITING_SUFFIX = ".writing"


class Channel(filesystem.Channel):
    """kombu's filesystem channel whose `_put` makes each message appear whole."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put `payload` onto `queue`: written to `<name>.writing`, then renamed to kombu's message name
        (`<ms>_<uuid>.<queue>.msg`, which orders messages by time). Raises ChannelError when the folder cannot be
        written (the partial file is removed)."""
        name = os.path.join(self.data_folder_out, f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg")
        writing = name + WRITING_SUFFIX
        try:
            with open(writing, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(writing, name)
        except OSError as exc:
            try:
                os.remove(writing)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with `Channel` above."""

    Channel = Channel
