"""The embedded broker writes a message whole before a worker can see it.

kombu's own filesystem transport opens the message file under its final name and writes
afterwards: a worker polling in between read an empty file and stopped with a
JSONDecodeError (a fresh ``make up`` on the embedded default). ``config.fsbroker`` writes
aside and renames into place.
"""

from __future__ import annotations

import os
import threading

import pytest
from kombu import Connection
from kombu.transport import filesystem

from config import fsbroker


def _connection(folder, transport):
    for name in ("queue", "processed"):
        (folder / name).mkdir(exist_ok=True)
    return Connection(
        "filesystem://",
        transport=transport,
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
        },
    )


@pytest.mark.backend
def test_the_embedded_default_uses_the_atomic_transport(settings):
    if not str(settings.CELERY_BROKER_URL).startswith("filesystem://"):
        pytest.skip("the production configuration uses Redis")
    from config.celery import app

    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, fsbroker.Channel)


KOMBU_OWN = "kombu.transport.filesystem:Transport"


@pytest.mark.parametrize("transport", ["config.fsbroker:Transport", KOMBU_OWN])
def test_a_reader_never_sees_a_message_before_it_is_whole(tmp_path, monkeypatch, transport):
    """At the moment a message is written, no file a reader would take exists yet
    (kombu's own transport, the second case, is shown to fail this)."""
    seen: list[list[str]] = []

    class Spy:
        def __init__(self, f):
            self.f = f

        def write(self, data):  # what a polling reader would find at this instant
            seen.append(sorted(n for n in os.listdir(tmp_path / "queue") if n.endswith(".q.msg")))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    real_open = open

    def spying_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Spy(f) if "w" in mode and str(path).startswith(str(tmp_path)) else f

    monkeypatch.setattr(filesystem, "open", spying_open, raising=False)
    monkeypatch.setattr(fsbroker, "open", spying_open, raising=False)
    with _connection(tmp_path, transport) as conn:
        conn.default_channel._put("q", {"body": "x" * 1000})
        assert conn.default_channel._get("q") == {"body": "x" * 1000}
    assert seen, "the message was not written through open()"
    if transport == KOMBU_OWN:
        assert seen != [[]]  # kombu's: the final file is visible while it is written
    else:
        assert seen == [[]]


def test_a_worker_polling_while_messages_arrive_reads_every_one_whole(tmp_path):
    with _connection(tmp_path, "config.fsbroker:Transport") as writer_conn:
        writer = writer_conn.default_channel
        done = threading.Event()

        def write():
            for i in range(300):
                writer._put("q", {"n": i, "pad": "y" * 4000})
            done.set()

        thread = threading.Thread(target=write)
        with _connection(tmp_path, "config.fsbroker:Transport") as reader_conn:
            reader = reader_conn.default_channel
            got = []
            thread.start()
            while not (done.is_set() and len(got) == 300):
                try:
                    got.append(reader._get("q")["n"])
                except filesystem.Empty:
                    if done.is_set() and len(got) < 300 and not os.listdir(tmp_path / "queue"):
                        break
            thread.join()
    assert sorted(got) == list(range(300))
