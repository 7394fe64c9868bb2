"""The embedded broker's transport: kombu's ``filesystem://``, with atomic writes.

kombu's filesystem ``Channel._put`` (5.7) opens a message file under its final name and
then writes into it. A worker polling the folder can move and read the file between the
two and get an empty message, which stops the worker with a ``JSONDecodeError`` (seen in
a fresh ``make up``: honcho then stops every process). Here a message is written under a
name no reader picks up and renamed into place; ``os.replace`` is atomic within one
filesystem, so a reader sees a whole message or none. Used by ``config/settings.py``
for the ``filesystem://`` scheme (tests/test_fsbroker.py).
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


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put ``payload`` on ``queue``: written aside, then renamed into the folder."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"  # kombu's format
        final = os.path.join(self.data_folder_out, name)
        # a leading dot: readers match "<anything>.<queue>.msg" after the first dot
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4().hex}.partial")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
