"""A payments and tickets HTTP service with Stripe's idempotency contract.

Run it as its own process::

    python -m examples.payments_service --port 8020 --db var/payments.sqlite3

The reference agents' tools talk to it with httpx (``DURABLE_PAYMENTS_URL``). State lives
in its own SQLite file, so a restart keeps every refund, ticket, invoice and stored
idempotent response.

**Idempotency** (https://docs.stripe.com/api/idempotent_requests): a ``POST`` with an
``Idempotency-Key`` header stores its first result under the key; a repeat with the
same key and parameters gets that result again (header ``Idempotent-Replayed: true``)
without a second effect; a request with the same key while the first is still executing
gets **409**; the same key with different parameters gets **422**. A request rejected
before it executed (a validation error, an injected 429/503/401) stores nothing, so it
can be retried with the same key. ``GET /v1/<kind>?idempotency_key=K`` looks an object
up by the key that created it (what the tools' ``reconcile`` hooks ask).

**Faults on demand** (for tests, the demo and the chaos audit):

- ``POST /_admin/faults`` ``{"fault": "429"|"503"|"500"|"401"|"drop"|"slow", "path":
  regex, "method": "POST", "match": substring of the key or body, "times": n (-1:
  always), "retry_after": seconds, "seconds": seconds (slow)}``; ``DELETE`` clears them.
- a request header ``X-Fault: 429`` (or ``503``, ``401``, ``drop``, ``slow=2``).
- ``POST /_admin/chaos`` ``{"rate": 0.1, "faults": ["429", "503", "drop"], "methods":
  ["POST"]}``: each matching request gets a random fault with probability ``rate``.

``drop`` is "commit then drop the response": the write is committed, then the TCP
connection is reset without a response, so the client cannot know it happened.

Audit: ``GET /_admin/objects?kind=refund`` lists every object with the idempotency key
and run id that created it; ``GET /_admin/stats`` counts requests, replays and faults;
``GET /_admin/requests`` lists every ``POST`` to :data:`LOGGED_PATHS` (tickets,
invoices) with its idempotency key, the body's ``subject``, the status and its arrival
and end time (Unix seconds), retries and faulted requests included.

**A webhook receiver** for outgoing-webhook tests: ``POST /v1/webhooks`` records each
delivery (its ``webhook-id`` header, the event's ``id``, ``type`` and ``data.run_id``,
the SHA-256 of the body) and answers 200 (it checks no signature); the faults above
apply to it like to any ``/v1/`` write. ``GET /_admin/webhooks`` lists the deliveries.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from examples._http import (
    DropConnection,
    Request,
    Response,
    Router,
    arg_parser,
    error,
    run_forever,
    start,
    thread_db,
)

#: object kinds, their id prefixes and their collection paths
KINDS = {
    "refund": ("re", "refunds"),
    "ticket": ("tk", "tickets"),
    "invoice": ("in", "invoices"),
    "purchase_request": ("pr", "purchase_requests"),
    "order": ("ord", "orders"),
}
COLLECTIONS = {path: kind for kind, (_, path) in KINDS.items()}
#: an in-progress key older than this (seconds) is taken over (its request died)
IN_PROGRESS_TIMEOUT = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, idempotency_key TEXT, run_id TEXT,
    data TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS objects_key ON objects (idempotency_key);
CREATE INDEX IF NOT EXISTS objects_kind ON objects (kind, created);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, method TEXT NOT NULL, path TEXT NOT NULL,
    params_hash TEXT NOT NULL, state TEXT NOT NULL, status INTEGER, body TEXT,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    path TEXT NOT NULL, idempotency_key TEXT, subject TEXT, status INTEGER,
    arrived REAL NOT NULL, ended REAL NOT NULL);
CREATE TABLE IF NOT EXISTS webhooks (
    webhook_id TEXT NOT NULL, event_id TEXT, type TEXT, run_id TEXT, body_sha TEXT NOT NULL,
    received REAL NOT NULL);
"""
#: the paths whose every request (faulted ones too) is logged with its arrival and end
#: time (``GET /_admin/requests``): what a limit audit measures at the service
LOGGED_PATHS = ("/v1/tickets", "/v1/invoices")


class ValidationError(Exception):
    """400: the request's parameters are wrong (nothing is stored under its key)."""


class StateError(Exception):
    """400: the object is not in a state that allows this (e.g. completing a void invoice)."""


class Store:
    """SQLite storage: one connection per thread, WAL, IMMEDIATE write transactions."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.conn().executescript(SCHEMA)

    def conn(self) -> sqlite3.Connection:
        return thread_db(self._local, self.path)

    def tx(self) -> _Tx:
        return _Tx(self.conn())

    def count(self, db: sqlite3.Connection, name: str, n: int = 1) -> None:
        db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) "
            "DO UPDATE SET value = value + excluded.value",
            (name, n),
        )


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _params_hash(method: str, path: str, params: Any) -> str:
    text = json.dumps([method, path, params], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _run_id(key: str | None) -> str:
    """The run id of an engine idempotency key ``"{run_id}:{step_id}"``."""
    return key.split(":", 1)[0] if key and ":" in key else ""


class Faults:
    """Injected faults: queued rules, per-request headers and a random chaos mode."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.chaos: dict[str, Any] | None = None
        self.rng = random.Random()
        self.injected: Counter[str] = Counter()

    def add(self, rule: dict[str, Any]) -> dict[str, Any]:
        fault = str(rule.get("fault") or "")
        if fault not in ("429", "503", "500", "401", "drop", "slow"):
            raise ValidationError("fault must be one of 429, 503, 500, 401, drop, slow")
        clean = {
            "fault": fault,
            "path": str(rule.get("path") or ".*"),
            "method": str(rule.get("method") or "").upper(),
            "match": str(rule.get("match") or ""),
            "times": int(rule.get("times", 1)),
            "retry_after": float(rule.get("retry_after", 1)),
            "seconds": float(rule.get("seconds", 2)),
        }
        re.compile(clean["path"])
        with self.lock:
            self.rules.append(clean)
        return clean

    def pick(self, request: Request, key: str) -> dict[str, Any] | None:
        header = request.header("x-fault")
        if header:
            name, _, arg = header.partition("=")
            return {"fault": name, "retry_after": float(arg or 1), "seconds": float(arg or 2)}
        haystack = " ".join([key, *request.query.values(), request.body.decode("utf-8", "replace")])
        with self.lock:
            for rule in self.rules:
                if rule["times"] == 0:
                    continue
                if rule["method"] and rule["method"] != request.method:
                    continue
                if not re.search(rule["path"], request.path):
                    continue
                if rule["match"] and rule["match"] not in haystack:
                    continue
                if rule["times"] > 0:
                    rule["times"] -= 1
                return rule
            chaos = self.chaos
            if (
                chaos
                and request.path.startswith("/v1/")
                and request.method in chaos["methods"]
                and self.rng.random() < chaos["rate"]
            ):
                return {
                    "fault": self.rng.choice(chaos["faults"]),
                    "retry_after": 0.2,
                    "seconds": 1.0,
                }
        return None


class PaymentsService:
    def __init__(self, db_path: str, api_key: str = "") -> None:
        self.store = Store(db_path)
        self.faults = Faults()
        self.api_key = api_key
        self.router = Router()
        self._routes()

    # ----------------------------------------------------------------- routes

    def _routes(self) -> None:
        r = self.router
        r.route("GET", "/health")(lambda req: Response(200, {"ok": True}))
        r.route("POST", "/v1/refunds")(self._guard(self._create_refund))
        r.route("POST", "/v1/tickets")(self._guard(self._create_ticket))
        r.route("POST", "/v1/invoices")(self._guard(self._create_invoice))
        r.route("POST", r"/v1/invoices/(?P<id>in_\w+)/void")(self._guard(self._void_invoice))
        r.route("POST", r"/v1/invoices/(?P<id>in_\w+)/complete")(
            self._guard(self._complete_invoice)
        )
        r.route("POST", "/v1/purchase_requests")(self._guard(self._create_pr))
        r.route("POST", r"/v1/purchase_requests/(?P<id>pr_\w+)/close")(self._guard(self._close_pr))
        r.route("POST", "/v1/orders")(self._guard(self._create_order))
        r.route("POST", "/v1/webhooks")(self._guard(self._receive_webhook))
        r.route("GET", r"/v1/(?P<collection>\w+)")(self._guard(self._list))
        r.route("GET", r"/v1/(?P<collection>\w+)/(?P<id>\w+)")(self._guard(self._get))
        r.route("GET", "/_admin/objects")(self._admin_objects)
        r.route("GET", "/_admin/stats")(self._admin_stats)
        r.route("GET", "/_admin/requests")(self._admin_requests)
        r.route("GET", "/_admin/webhooks")(self._admin_webhooks)
        r.route("POST", "/_admin/faults")(self._admin_add_fault)
        r.route("GET", "/_admin/faults")(
            lambda req: Response(200, {"rules": self.faults.rules, "chaos": self.faults.chaos})
        )
        r.route("DELETE", "/_admin/faults")(self._admin_clear_faults)
        r.route("POST", "/_admin/chaos")(self._admin_chaos)
        r.route("DELETE", "/_admin/chaos")(self._admin_clear_chaos)
        r.route("POST", "/_admin/reset")(self._admin_reset)

    def _guard(self, fn: Any) -> Any:
        """Authentication, fault injection and the idempotency contract around ``fn``."""

        def handler(req: Request) -> Response:
            if req.method == "POST" and req.path in LOGGED_PATHS:
                return self._logged(inner, req)
            return inner(req)

        def inner(req: Request) -> Response:
            key = req.header("idempotency-key")
            with self.store.tx() as db:
                self.store.count(db, f"requests {req.method} {_template(req.path)}")
            if self.api_key and req.header("authorization") != f"Bearer {self.api_key}":
                return error(401, "Invalid API Key provided", "authentication_error")
            fault = self.faults.pick(req, key)
            if fault is not None:
                self.faults.injected[fault["fault"]] += 1
                early = _early_fault(fault)
                if early is not None:
                    return early
            if req.method != "POST" or not key:
                response = self._execute(fn, req, None, fault)
            else:
                response = self._idempotent(fn, req, key, fault)
            return response

        return handler

    def _logged(self, handler: Any, req: Request) -> Response:
        """``handler(req)``, logged with its arrival and end time (a dropped one too)."""
        arrived, status = time.time(), None
        try:
            response = handler(req)
            status = response.status
            return response
        finally:
            ended = time.time()
            try:
                subject = str(req.json().get("subject") or "")[:300]
            except (ValueError, AttributeError):
                subject = ""
            with self.store.tx() as db:
                db.execute(
                    "INSERT INTO requests (path, idempotency_key, subject, status, arrived, "
                    "ended) VALUES (?, ?, ?, ?, ?, ?)",
                    (req.path, req.header("idempotency-key"), subject, status, arrived, ended),
                )

    def _idempotent(self, fn: Any, req: Request, key: str, fault: dict | None) -> Response:
        params = req.json()
        phash = _params_hash(req.method, req.path, params)
        now = time.time()
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row is not None:
                if row["params_hash"] != phash:
                    self.store.count(db, "idempotency_mismatch")
                    return error(
                        422,
                        "Keys for idempotent requests can only be used with "
                        "the same parameters they were first used with. Try "
                        "using a key other than "
                        f"'{key}' if you meant to execute a different request.",
                        "idempotency_error",
                    )
                if row["state"] == "done":
                    self.store.count(db, "idempotent_replays")
                    return Response(
                        row["status"],
                        json.loads(row["body"]),
                        {"Idempotent-Replayed": "true", "Idempotency-Key": key},
                    )
                if now - row["created"] < IN_PROGRESS_TIMEOUT:
                    self.store.count(db, "idempotency_conflicts")
                    return error(
                        409,
                        "There is currently another in-progress request using "
                        "this Idempotency Key (that probably means you "
                        "submitted twice, and the other request is still going "
                        "through). Please try again later.",
                        "idempotency_error",
                        headers={"Retry-After": "1"},
                    )
                db.execute("UPDATE idempotency SET created = ? WHERE key = ?", (now, key))
            else:
                db.execute(
                    "INSERT INTO idempotency (key, method, path, params_hash, state, "
                    "created) VALUES (?, ?, ?, ?, 'in_progress', ?)",
                    (key, req.method, req.path, phash, now),
                )
        return self._execute(fn, req, key, fault)

    def _execute(self, fn: Any, req: Request, key: str | None, fault: dict | None) -> Response:
        if fault is not None and fault["fault"] == "slow":
            time.sleep(fault["seconds"])
        try:
            with self.store.tx() as db:
                status, body = fn(db, req, key)
                if key:
                    db.execute(
                        "UPDATE idempotency SET state = 'done', status = ?, body = ? WHERE key = ?",
                        (status, json.dumps(body), key),
                    )
        except Exception as exc:
            if key:  # rolled back, nothing executed: the key may be used again
                with self.store.tx() as db:
                    db.execute(
                        "DELETE FROM idempotency WHERE key = ? AND state = 'in_progress'", (key,)
                    )
            if isinstance(exc, (ValidationError, StateError, json.JSONDecodeError)):
                return error(400, str(exc), "invalid_request_error")
            if isinstance(exc, _NotFound):
                return error(404, str(exc), "invalid_request_error")
            raise
        if fault is not None and fault["fault"] == "drop":
            raise DropConnection()
        return Response(status, body, {"Idempotency-Key": key} if key else {})

    # ------------------------------------------------------------- resources

    def _insert(
        self, db: sqlite3.Connection, kind: str, key: str | None, data: dict[str, Any]
    ) -> dict[str, Any]:
        prefix = KINDS[kind][0]
        now = time.time()
        obj = {
            "id": f"{prefix}_{secrets.token_hex(7)}",
            "object": kind,
            **data,
            "idempotency_key": key,
            "created": int(now),
        }
        db.execute(
            "INSERT INTO objects (id, kind, idempotency_key, run_id, data, created, "
            "updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (obj["id"], kind, key, _run_id(key), json.dumps(obj), now, now),
        )
        self.store.count(db, f"created {kind}")
        return obj

    def _load(self, db: sqlite3.Connection, kind: str, obj_id: str) -> dict[str, Any]:
        row = db.execute(
            "SELECT data FROM objects WHERE id = ? AND kind = ?", (obj_id, kind)
        ).fetchone()
        if row is None:
            raise _NotFound(f"No such {kind}: '{obj_id}'")
        return json.loads(row["data"])

    def _save(self, db: sqlite3.Connection, obj: dict[str, Any]) -> None:
        db.execute(
            "UPDATE objects SET data = ?, updated = ? WHERE id = ?",
            (json.dumps(obj), time.time(), obj["id"]),
        )

    def _create_refund(self, db, req, key):
        p = req.json()
        charge = _text(p, "charge_id", 100)
        if not re.fullmatch(r"ch_\w{1,60}", charge):
            raise ValidationError(f"No such charge: '{charge}' (charge ids look like ch_...)")
        amount = _amount(p, "amount_cents")
        return 200, self._insert(
            db,
            "refund",
            key,
            {
                "charge_id": charge,
                "amount_cents": amount,
                "currency": _currency(p),
                "reason": str(p.get("reason") or "")[:500],
                "status": "succeeded",
            },
        )

    def _create_ticket(self, db, req, key):
        p = req.json()
        priority = str(p.get("priority") or "normal")
        if priority not in ("low", "normal", "high", "urgent"):
            raise ValidationError("priority must be low, normal, high or urgent")
        number = self._next_number(db, "ticket")
        return 200, self._insert(
            db,
            "ticket",
            key,
            {
                "number": f"T-{number:05d}",
                "customer": _text(p, "customer", 200),
                "email": _text(p, "email", 200, required=False),
                "subject": _text(p, "subject", 300),
                "body": str(p.get("body") or "")[:5000],
                "priority": priority,
                "status": "open",
            },
        )

    def _create_invoice(self, db, req, key):
        p = req.json()
        lines = p.get("lines")
        if not isinstance(lines, list) or not lines or len(lines) > 100:
            raise ValidationError("lines must be a list of 1-100 {description, amount_cents}")
        clean = [
            {
                "description": _text(line, "description", 300),
                "amount_cents": _amount(line, "amount_cents"),
            }
            for line in lines
            if isinstance(line, dict)
        ]
        if len(clean) != len(lines):
            raise ValidationError("every line must be an object")
        number = self._next_number(db, "invoice")
        return 200, self._insert(
            db,
            "invoice",
            key,
            {
                "number": f"INV-{number:06d}",
                "customer": _text(p, "customer", 200),
                "email": _text(p, "email", 200),
                "currency": _currency(p),
                "lines": clean,
                "total_cents": sum(line["amount_cents"] for line in clean),
                "status": "open",
            },
        )

    def _receive_webhook(self, db, req, key):
        event = req.json()
        if not isinstance(event, dict):
            raise ValidationError("a webhook body is a JSON object")
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        db.execute(
            "INSERT INTO webhooks (webhook_id, event_id, type, run_id, body_sha, received) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                req.header("webhook-id") or "",
                str(event.get("id") or ""),
                str(event.get("type") or ""),
                str(data.get("run_id") or ""),
                hashlib.sha256(req.body).hexdigest(),
                time.time(),
            ),
        )
        return 200, {"received": True}

    def _void_invoice(self, db, req, key):
        inv = self._load(db, "invoice", req.params["id"])
        if inv["status"] != "void":
            inv["status"] = "void"
            inv["voided"] = int(time.time())
            self._save(db, inv)
            self.store.count(db, "voided invoice")
        return 200, inv

    def _complete_invoice(self, db, req, key):
        inv = self._load(db, "invoice", req.params["id"])
        if inv["status"] == "void":
            raise StateError(f"invoice {inv['id']} is void and cannot be completed")
        if inv["status"] != "completed":
            inv["status"] = "completed"
            inv["completed"] = int(time.time())
            self._save(db, inv)
            self.store.count(db, "completed invoice")
        return 200, inv

    def _create_pr(self, db, req, key):
        p = req.json()
        return 200, self._insert(
            db,
            "purchase_request",
            key,
            {
                "requester": _text(p, "requester", 200),
                "item": _text(p, "item", 300),
                "quantity": _amount(p, "quantity"),
                "amount_cents": _amount(p, "amount_cents"),
                "vendor": _text(p, "vendor", 200),
                "status": "submitted",
            },
        )

    def _close_pr(self, db, req, key):
        pr = self._load(db, "purchase_request", req.params["id"])
        outcome = str(req.json().get("outcome") or "closed")[:100]
        if pr["status"] != "closed":
            pr["status"] = "closed"
            pr["outcome"] = outcome
            self._save(db, pr)
        return 200, pr

    def _create_order(self, db, req, key):
        p = req.json()
        pr_id = _text(p, "purchase_request", 100)
        self._load(db, "purchase_request", pr_id)
        return 200, self._insert(
            db,
            "order",
            key,
            {
                "purchase_request": pr_id,
                "vendor": _text(p, "vendor", 200),
                "item": _text(p, "item", 300),
                "quantity": _amount(p, "quantity"),
                "amount_cents": _amount(p, "amount_cents"),
                "status": "placed",
            },
        )

    def _next_number(self, db: sqlite3.Connection, kind: str) -> int:
        self.store.count(db, f"number {kind}")
        return db.execute(
            "SELECT value FROM counters WHERE name = ?", (f"number {kind}",)
        ).fetchone()[0]

    def _list(self, db, req, key):
        kind = COLLECTIONS.get(req.params["collection"])
        if kind is None:
            raise _NotFound(f"Unrecognized request URL (GET: {req.path})")
        sql, args = "SELECT data FROM objects WHERE kind = ?", [kind]
        for field in ("idempotency_key", "run_id"):
            if req.query.get(field):
                sql += f" AND {field} = ?"
                args.append(req.query[field])
        rows = db.execute(sql + " ORDER BY created LIMIT 1000", args).fetchall()
        data = [json.loads(r["data"]) for r in rows]
        for field in ("charge_id",):
            if req.query.get(field):
                data = [d for d in data if d.get(field) == req.query[field]]
        return 200, {"object": "list", "data": data, "has_more": False}

    def _get(self, db, req, key):
        kind = COLLECTIONS.get(req.params["collection"])
        if kind is None:
            raise _NotFound(f"Unrecognized request URL (GET: {req.path})")
        return 200, self._load(db, kind, req.params["id"])

    # ----------------------------------------------------------------- admin

    def _admin_objects(self, req: Request) -> Response:
        sql, args = "SELECT kind, idempotency_key, run_id, data FROM objects", []
        if req.query.get("kind"):
            sql += " WHERE kind = ?"
            args.append(req.query["kind"])
        rows = self.store.conn().execute(sql + " ORDER BY created", args).fetchall()
        return Response(
            200, {"data": [{**json.loads(r["data"]), "run_id": r["run_id"]} for r in rows]}
        )

    def _admin_stats(self, req: Request) -> Response:
        rows = self.store.conn().execute("SELECT name, value FROM counters").fetchall()
        return Response(
            200,
            {
                "counters": {r["name"]: r["value"] for r in rows},
                "faults_injected": dict(self.faults.injected),
            },
        )

    def _admin_requests(self, req: Request) -> Response:
        rows = self.store.conn().execute("SELECT * FROM requests ORDER BY arrived").fetchall()
        return Response(200, {"data": [dict(r) for r in rows]})

    def _admin_webhooks(self, req: Request) -> Response:
        rows = self.store.conn().execute("SELECT * FROM webhooks ORDER BY received").fetchall()
        return Response(200, {"data": [dict(r) for r in rows]})

    def _admin_add_fault(self, req: Request) -> Response:
        try:
            return Response(200, self.faults.add(req.json()))
        except (ValidationError, re.error, ValueError, TypeError) as exc:
            return error(400, str(exc))

    def _admin_clear_faults(self, req: Request) -> Response:
        with self.faults.lock:
            self.faults.rules.clear()
            self.faults.chaos = None
        return Response(200, {"rules": []})

    def _admin_chaos(self, req: Request) -> Response:
        p = req.json()
        faults = [str(f) for f in p.get("faults") or ["429", "503", "drop"]]
        if not set(faults) <= {"429", "503", "500", "401", "drop", "slow"}:
            return error(400, "unknown fault in faults")
        with self.faults.lock:
            self.faults.chaos = {
                "rate": float(p.get("rate", 0.1)),
                "faults": faults,
                "methods": [m.upper() for m in p.get("methods") or ["POST"]],
            }
            if "seed" in p:
                self.faults.rng.seed(p["seed"])
        return Response(200, self.faults.chaos)

    def _admin_clear_chaos(self, req: Request) -> Response:
        with self.faults.lock:
            self.faults.chaos = None
        return Response(200, {"chaos": None})

    def _admin_reset(self, req: Request) -> Response:
        with self.store.tx() as db:
            db.execute("DELETE FROM objects")
            db.execute("DELETE FROM idempotency")
            db.execute("DELETE FROM counters")
            db.execute("DELETE FROM requests")
            db.execute("DELETE FROM webhooks")
        with self.faults.lock:
            self.faults.rules.clear()
            self.faults.chaos = None
            self.faults.injected.clear()
        return Response(200, {"reset": True})


class _NotFound(Exception):
    pass


def _template(path: str) -> str:
    return re.sub(r"/(re|tk|in|pr|ord)_\w+", r"/{id}", path)


def _early_fault(fault: dict[str, Any]) -> Response | None:
    """The response of a fault that answers before anything executes (None: later)."""
    name = fault["fault"]
    retry_after = fault.get("retry_after", 1)
    if name == "429":
        return error(
            429,
            "Too many requests hit the API too quickly.",
            "rate_limit_error",
            headers={"Retry-After": _fmt(retry_after)},
        )
    if name == "503":
        return error(
            503,
            "The service is temporarily unavailable.",
            "api_error",
            headers={"Retry-After": _fmt(retry_after)},
        )
    if name == "500":
        return error(500, "An unexpected error occurred (injected).", "api_error")
    if name == "401":
        return error(401, "Invalid API Key provided (injected).", "authentication_error")
    return None


def _fmt(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _text(p: Any, name: str, limit: int, *, required: bool = True) -> str:
    value = p.get(name) if isinstance(p, dict) else None
    if value is None or value == "":
        if required:
            raise ValidationError(f"Missing required param: {name}.")
        return ""
    if not isinstance(value, str):
        raise ValidationError(f"Invalid string: {name} must be a string")
    if len(value) > limit:
        raise ValidationError(f"{name} is longer than {limit} characters")
    return value


def _amount(p: Any, name: str) -> int:
    value = p.get(name) if isinstance(p, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"Invalid integer: {name} must be a whole number")
    if not 0 < value <= 100_000_000:
        raise ValidationError(f"{name} must be between 1 and 100000000")
    return value


def _currency(p: dict[str, Any]) -> str:
    value = str(p.get("currency") or "usd").lower()
    if not re.fullmatch(r"[a-z]{3}", value):
        raise ValidationError("currency must be a three-letter ISO code")
    return value


def main(argv: list[str] | None = None) -> None:
    default_db = Path(os.environ.get("DURABLE_VAR_DIR") or "var") / "payments.sqlite3"
    parser = arg_parser(
        "Payments and tickets service with Stripe's idempotency contract.", default_port=8020
    )
    parser.add_argument("--db", default=str(default_db), help=f"SQLite file (default {default_db})")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PAYMENTS_SERVICE_API_KEY", ""),
        help="require 'Authorization: Bearer KEY' (default: no check)",
    )
    args = parser.parse_args(argv)
    service = PaymentsService(args.db, api_key=args.api_key)
    server = start(service.router, "payments", args.host, args.port)
    port = server.server_address[1]
    run_forever(
        [server],
        port,
        args.port_file,
        f"payments service on http://{args.host}:{port}/ (db {args.db})",
    )


if __name__ == "__main__":
    main()
