"""A local SMTP server (aiosmtpd) that records every message, so duplicates are countable.

Run it as its own process::

    python -m examples.smtp_sink --smtp-port 1025 --http-port 1080 --db var/smtp_sink.sqlite3

Tools send email through Django's SMTP backend (``EMAIL_HOST`` / ``EMAIL_PORT``) with a
``Message-ID`` derived from the step's idempotency key. The sink accepts every message
and records its Message-ID, sender, recipients and subject in SQLite (kept across
restarts); it delivers nothing.

Its web page, ``GET /`` on the HTTP port (http://127.0.0.1:1080/ under ``make up``),
lists the newest messages; ``GET /view/<n>`` shows one with its links clickable (an
approval email's signed link opens the decision page). Its small HTTP API
(``DURABLE_SMTP_SINK_URL``) is what an email provider's "find message" API is in
production, and what the ``email.send`` tool's reconcile hook asks:

- ``GET /messages?message_id=<id>`` (or ``?to=``, ``?subject=``): recorded messages;
- ``GET /_admin/stats``: totals and Message-IDs received more than once;
- ``POST /_admin/faults`` ``{"fault": "refuse"|"tempfail"|"drop"|"slow", "stage":
  "rcpt"|"data"|"query", "match": substring of a recipient or the subject (of the query
  string for "query"), "times": n}``: ``refuse`` answers 550 (permanent), ``tempfail``
  451 (transient), ``drop`` records the message then closes the connection without
  answering (the client cannot know it was delivered), ``slow`` waits ``seconds`` before
  answering; at stage "query" any fault makes ``GET /messages`` answer 503 (the lookup
  of a reconcile hook fails); ``DELETE`` clears them;
- ``POST /_admin/reset``: forget every message.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import os
import re
import signal
import sqlite3
import threading
import time
from html import escape
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP

from examples._http import Request, Response, Router, error, start, thread_db, write_port_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT, mail_from TEXT,
    rcpt_tos TEXT NOT NULL, subject TEXT, received REAL NOT NULL, size INTEGER NOT NULL,
    body TEXT, idempotency_key TEXT);
CREATE INDEX IF NOT EXISTS messages_mid ON messages (message_id);
"""


class Sink:
    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self.lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.injected: dict[str, int] = {}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.conn().executescript(SCHEMA)

    def conn(self) -> sqlite3.Connection:
        return thread_db(self._local, self.path)

    def fault(self, stage: str, haystack: str) -> dict[str, Any] | None:
        with self.lock:
            for rule in self.rules:
                if rule["times"] == 0 or rule["stage"] != stage:
                    continue
                if rule["match"] and rule["match"] not in haystack:
                    continue
                if rule["times"] > 0:
                    rule["times"] -= 1
                self.injected[rule["fault"]] = self.injected.get(rule["fault"], 0) + 1
                return rule
        return None

    def record(self, envelope: Any) -> int:
        raw = (
            envelope.content
            if isinstance(envelope.content, bytes)
            else (envelope.content or "").encode("utf-8", "replace")
        )
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        body = msg.get_body(preferencelist=("plain",)) if msg.is_multipart() else msg
        text = ""
        try:
            text = body.get_content() if body is not None else ""
        except (KeyError, LookupError, AttributeError):
            text = ""
        cur = self.conn().execute(
            "INSERT INTO messages (message_id, mail_from, rcpt_tos, subject, received, size, "
            "body, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                str(msg.get("Message-ID") or "").strip(),
                envelope.mail_from,
                json.dumps(list(envelope.rcpt_tos)),
                str(msg.get("Subject") or ""),
                time.time(),
                len(raw),
                str(text)[:20000],
                str(msg.get("X-Durable-Idempotency-Key") or "").strip(),
            ),
        )
        return int(cur.lastrowid)

    def query(self, q: dict[str, str]) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM messages WHERE 1=1", []
        if q.get("message_id"):
            wanted = q["message_id"].strip()
            sql += " AND message_id IN (?, ?)"
            args += [wanted, f"<{wanted.strip('<>')}>"]
        if q.get("subject"):
            sql += " AND subject = ?"
            args.append(q["subject"])
        rows = self.conn().execute(sql + " ORDER BY id LIMIT 10000", args).fetchall()
        out = [
            {
                "id": r["id"],
                "message_id": r["message_id"],
                "from": r["mail_from"],
                "to": json.loads(r["rcpt_tos"]),
                "subject": r["subject"],
                "received": r["received"],
                "size": r["size"],
                "body": r["body"],
                "idempotency_key": r["idempotency_key"],
                "run_id": (r["idempotency_key"] or "").split(":", 1)[0],
            }
            for r in rows
        ]
        if q.get("to"):
            out = [m for m in out if q["to"] in m["to"]]
        return out

    # ------------------------------------------------------------- HTTP API

    def router(self) -> Router:
        r = Router()
        r.route("GET", "/")(self._page)
        r.route("GET", r"/view/(?P<n>[0-9]{1,12})")(self._view)
        r.route("GET", "/health")(lambda req: Response(200, {"ok": True}))
        r.route("GET", "/messages")(self._messages)
        r.route("GET", "/_admin/stats")(self._stats)
        r.route("POST", "/_admin/faults")(self._add_fault)
        r.route("GET", "/_admin/faults")(lambda req: Response(200, {"rules": self.rules}))
        r.route("DELETE", "/_admin/faults")(self._clear_faults)
        r.route("POST", "/_admin/reset")(self._reset)
        return r

    def _page(self, req: Request) -> Response:
        rows = self.conn().execute(
            "SELECT id, mail_from, rcpt_tos, subject, received FROM messages "
            f"ORDER BY id DESC LIMIT {PAGE_MESSAGES}"
        )
        items = "".join(
            f'<tr><td><a href="/view/{r["id"]}">{escape(r["subject"] or "(no subject)")}</a>'
            f"</td><td>{escape(', '.join(json.loads(r['rcpt_tos'])))}</td>"
            f"<td>{escape(r['mail_from'] or '')}</td><td>{_when(r['received'])}</td></tr>"
            for r in rows
        )
        table = (
            "<table><thead><tr><th>Subject</th><th>To</th><th>From</th><th>Received</th>"
            f"</tr></thead><tbody>{items}</tbody></table>"
            if items
            else "<p>No message yet. Approval emails and the agents' email tool land here.</p>"
        )
        note = (
            f"<p>The newest {PAGE_MESSAGES} messages this sink received, newest first. "
            "It delivers nothing.</p>"
        )
        return Response(200, _html("Messages", note + table))

    def _view(self, req: Request) -> Response:
        r = (
            self.conn()
            .execute("SELECT * FROM messages WHERE id = ?", (int(req.params["n"]),))
            .fetchone()
        )
        if r is None:
            return Response(404, _html("No such message", '<p><a href="/">All messages</a></p>'))
        facts = "".join(
            f"<dt>{name}</dt><dd>{escape(str(value))}</dd>"
            for name, value in (
                ("From", r["mail_from"] or ""),
                ("To", ", ".join(json.loads(r["rcpt_tos"]))),
                ("Received", _when(r["received"])),
                ("Message-ID", r["message_id"] or ""),
                ("Idempotency key", r["idempotency_key"] or "—"),
            )
        )
        body = (
            f'<p><a href="/">All messages</a></p><dl>{facts}</dl>'
            f"<pre>{_linked(r['body'] or '')}</pre>"
        )
        return Response(200, _html(r["subject"] or "(no subject)", body))

    def _messages(self, req: Request) -> Response:
        rule = self.fault("query", " ".join(req.query.values()))
        if rule is not None:
            return error(
                503,
                "the message store is unavailable (injected)",
                "api_error",
                headers={"Retry-After": "5"},
            )
        return Response(200, {"data": self.query(req.query)})

    def _stats(self, req: Request) -> Response:
        db = self.conn()
        total = db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        dups = db.execute(
            "SELECT message_id, COUNT(*) AS n FROM messages GROUP BY message_id HAVING n > 1"
        ).fetchall()
        return Response(
            200,
            {
                "messages": total,
                "duplicates": {r["message_id"]: r["n"] for r in dups},
                "faults_injected": dict(self.injected),
            },
        )

    def _add_fault(self, req: Request) -> Response:
        p = req.json()
        fault = str(p.get("fault") or "")
        if fault not in ("refuse", "tempfail", "drop", "slow"):
            return error(400, "fault must be refuse, tempfail, drop or slow")
        stage = str(p.get("stage") or ("data" if fault in ("drop", "slow") else "rcpt"))
        if stage not in ("rcpt", "data", "query"):
            return error(400, "stage must be rcpt, data or query")
        rule = {
            "fault": fault,
            "stage": stage,
            "match": str(p.get("match") or ""),
            "times": int(p.get("times", 1)),
            "seconds": float(p.get("seconds", 2)),
        }
        with self.lock:
            self.rules.append(rule)
        return Response(200, rule)

    def _clear_faults(self, req: Request) -> Response:
        with self.lock:
            self.rules.clear()
        return Response(200, {"rules": []})

    def _reset(self, req: Request) -> Response:
        self.conn().execute("DELETE FROM messages")
        with self.lock:
            self.rules.clear()
            self.injected.clear()
        return Response(200, {"reset": True})


#: messages listed on the web page
PAGE_MESSAGES = 100
_URL = re.compile(r"https?://[^\s<>\"']+")
_STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:1.5rem auto;padding:0 1rem}"
    "table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.3rem .5rem;"
    "border-bottom:1px solid #ccc;overflow-wrap:anywhere}pre{white-space:pre-wrap;"
    "overflow-wrap:anywhere;background:#f4f4f4;padding:.8rem}dt{font-weight:600}"
    "dd{margin:0 0 .4rem;overflow-wrap:anywhere}"
    "@media (prefers-color-scheme:dark){body{background:#16181c;color:#e6e6e6}"
    "a{color:#8ab4f8}pre{background:#23262b}}"
)


def _html(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · SMTP sink</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def _when(received: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(received))


def _linked(text: str) -> str:
    """``text`` escaped, with each http(s) URL a link (the same text, escaped once)."""
    out, last = [], 0
    for match in _URL.finditer(text):
        url = match.group(0).rstrip(".,;:)")
        out.append(escape(text[last : match.start()]))
        out.append(f'<a href="{escape(url)}">{escape(url)}</a>')
        last = match.start() + len(url)
    out.append(escape(text[last:]))
    return "".join(out)


class SinkHandler:
    """aiosmtpd handler: accept, record, or inject a fault."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        rule = self.sink.fault("rcpt", address)
        if rule is not None:
            reply = await self._fault_reply(rule, server)
            if reply:
                return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        raw = envelope.content if isinstance(envelope.content, bytes) else b""
        subject = re.search(rb"^Subject: ?(.*)$", raw, re.MULTILINE | re.IGNORECASE)
        haystack = (
            " ".join(envelope.rcpt_tos)
            + " "
            + (subject.group(1).decode("utf-8", "replace") if subject else "")
        )
        rule = self.sink.fault("data", haystack)
        if rule is not None and rule["fault"] != "drop":
            reply = await self._fault_reply(rule, server)
            if reply:
                return reply
        row = self.sink.record(envelope)
        if rule is not None and rule["fault"] == "drop":
            # recorded, then the connection goes away before "250": an unknown outcome
            server.transport.abort()
            return "421 4.3.0 connection dropped (injected)"
        return f"250 2.0.0 OK: queued as {row}"

    @staticmethod
    async def _fault_reply(rule: dict[str, Any], server: Any) -> str | None:
        if rule["fault"] == "refuse":
            return "550 5.7.1 Message refused by policy (injected)"
        if rule["fault"] == "tempfail":
            return "451 4.3.0 Temporary failure, try again later (injected)"
        if rule["fault"] == "slow":
            await asyncio.sleep(rule["seconds"])
        return None


def main(argv: list[str] | None = None) -> None:
    import argparse

    default_db = Path(os.environ.get("DURABLE_VAR_DIR") or "var") / "smtp_sink.sqlite3"
    parser = argparse.ArgumentParser(description="SMTP sink recording every message.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--smtp-port", type=int, default=1025)
    parser.add_argument("--http-port", type=int, default=1080)
    parser.add_argument("--db", default=str(default_db))
    parser.add_argument(
        "--port-file", default=None, help='write {"smtp": port, "http": port} here once listening'
    )
    args = parser.parse_args(argv)

    sink = Sink(args.db)
    http = start(sink.router(), "smtp-sink", args.host, args.http_port)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    handler = SinkHandler(sink)
    server = loop.run_until_complete(
        loop.create_server(
            lambda: SMTP(
                handler,
                hostname="durable-sink.local",
                ident="durable smtp sink",
                enable_SMTPUTF8=True,
                timeout=60,
            ),
            host=args.host,
            port=args.smtp_port,
        )
    )
    smtp_port = server.sockets[0].getsockname()[1]
    http_port = http.server_address[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    write_port_file(args.port_file, json.dumps({"smtp": smtp_port, "http": http_port}))
    print(
        f"SMTP sink on {args.host}:{smtp_port}, query API on http://{args.host}:"
        f"{http_port}/messages (db {args.db})",
        flush=True,
    )
    loop.run_until_complete(stop.wait())
    server.close()
    http.shutdown()


if __name__ == "__main__":
    main()
