"""Production hardening: HTTPS settings from the environment, ``check --deploy``, the
Content-Security-Policy, login throttling and the request-body limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client

from dashboard.bodylimit import BodySizeLimitMiddleware

ROOT = Path(__file__).resolve().parents[2]

#: the production configuration of docs/production.md, minus the services
PRODUCTION_ENV = {
    "DJANGO_HTTPS": "true",
    "DJANGO_SECRET_KEY": "x7Jq9-k2Lp3Vw8Zr4Nt6Yb1Hc5Fd0Gs_Em-Ua7Qo2Ri9Xe3Wn6Tv8Kj4Pl1Mz5By0C",
    "DJANGO_ALLOWED_HOSTS": "durable.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://durable.example.com",
}


def _environment(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "CELERY_", "DURABLE_"))
    }
    env["DURABLE_VAR_DIR"] = str(tmp_path)
    env.update(extra)
    return env


def _settings_in(tmp_path: Path, extra: dict[str, str]) -> dict:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({k: getattr(s, k, None) for k in ('DEBUG', 'SECURE_SSL_REDIRECT',"
        " 'SECURE_HSTS_SECONDS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE',"
        " 'SECURE_PROXY_SSL_HEADER', 'MAX_REQUEST_BODY_BYTES')}))"
    )
    # the settings alone: no workflow discovery, which imports the agent frameworks
    # (seconds of CPU a process, and four processes here)
    env = _environment(
        tmp_path,
        {"DJANGO_SETTINGS_MODULE": "config.settings", "DURABLE_AUTODISCOVER": "false", **extra},
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_in_the_production_configuration(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=_environment(tmp_path, PRODUCTION_ENV),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues (0 silenced)." in output
    assert "WARNINGS" not in output


def test_check_deploy_flags_the_embedded_default(tmp_path):
    """The same check warns without DJANGO_HTTPS: the test above can fail."""
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=_environment(tmp_path, {}),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert "security.W008" in result.stdout + result.stderr  # SECURE_SSL_REDIRECT


def test_https_settings_only_when_asked_for(tmp_path):
    embedded = _settings_in(tmp_path, {})
    assert embedded == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "MAX_REQUEST_BODY_BYTES": 4 * 1024 * 1024,
    }
    https = _settings_in(tmp_path, {"DJANGO_HTTPS": "true"})
    assert https["SECURE_SSL_REDIRECT"] and https["SESSION_COOKIE_SECURE"]
    assert https["CSRF_COOKIE_SECURE"] and https["SECURE_HSTS_SECONDS"] == 31_536_000
    assert https["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    # each one can still be set on its own
    one = _settings_in(
        tmp_path,
        {
            "DJANGO_HTTPS": "true",
            "DJANGO_SECURE_SSL_REDIRECT": "false",
            "DJANGO_SECURE_HSTS_SECONDS": "60",
            "DURABLE_MAX_REQUEST_BYTES": "1000",
        },
    )
    assert one["SECURE_SSL_REDIRECT"] is False and one["SECURE_HSTS_SECONDS"] == 60
    assert one["SESSION_COOKIE_SECURE"] and one["MAX_REQUEST_BODY_BYTES"] == 1000
    alone = _settings_in(tmp_path, {"DJANGO_SESSION_COOKIE_SECURE": "true"})
    assert alone["SESSION_COOKIE_SECURE"] and not alone["SECURE_SSL_REDIRECT"]


# --- Content-Security-Policy -------------------------------------------------------------


@pytest.mark.django_db
def test_every_page_carries_a_strict_content_security_policy(viewer_client):
    for url in ("/", "/accounts/login/", "/attention/", "/nope/"):
        response = viewer_client.get(url)
        policy = response.headers.get("Content-Security-Policy", "")
        assert "default-src 'self'" in policy, url
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, url
        assert "frame-ancestors 'none'" in policy


def _templates() -> list[Path]:
    found = []
    # the project's own: not django-ninja's folder (its Swagger page, which the API docs'
    # view renders; its JSON settings block is data, not a script CSP would run)
    own = [Path(d) for d in django_settings.TEMPLATES[0]["DIRS"] if "site-packages" not in str(d)]
    for base in own + [
        ROOT / app / "templates" for app in ("dashboard", "approvals", "durable", "api")
    ]:
        found += sorted(base.rglob("*.html")) if base.exists() else []
    return found


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE), "an inline <script>"),
    (re.compile(r"<style\b", re.IGNORECASE), "a <style> element"),
    (re.compile(r"\sstyle\s*=", re.IGNORECASE), "a style= attribute"),
    (re.compile(r"\son[a-z]+\s*=", re.IGNORECASE), "an on*= event handler"),
    (re.compile(r"\bhx-on\b|hx-on:|javascript:", re.IGNORECASE), "script in an attribute"),
]


def test_no_template_has_inline_script_or_style():
    """What CSP would block: inline scripts and styles, style and on* attributes, in the
    templates and in HTML built by Python (format_html in the admin)."""
    templates = _templates()
    assert len(templates) >= 15
    python = [
        path
        for app in ("dashboard", "approvals", "durable", "config", "api")
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts
    ]
    texts = {path: path.read_text() for path in templates}
    for path in python:  # code, not comments
        texts[path] = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
    problems = [
        f"{path.relative_to(ROOT)}: {what}"
        for path, text in texts.items()
        for pattern, what in INLINE[:-1]
        if pattern.search(text)
    ]
    assert problems == []
    base = (ROOT / "templates" / "base.html").read_text()
    # htmx copies a swapped element's style attribute while settling (an inline style)
    assert '"attributesToSettle": ["class", "width", "height"]' in base


# --- login throttling ------------------------------------------------------------------


@pytest.mark.django_db
def test_repeated_failed_logins_lock_the_account_out(settings):
    settings.AXES_ENABLED = True
    User.objects.create_user("locked", password="right-password")
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/accounts/login/", {"username": "locked", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    response = client.post("/accounts/login/", {"username": "locked", "password": "wrong"})
    assert response.status_code == 429
    # now even the right password is refused, for this user from this address
    response = client.post("/accounts/login/", {"username": "locked", "password": "right-password"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    # another address is not locked out
    other = Client(REMOTE_ADDR="198.51.100.9")
    response = other.post("/accounts/login/", {"username": "locked", "password": "right-password"})
    assert response.status_code == 302


# --- request-body limit ------------------------------------------------------------------


class _Recorder:
    def __init__(self):
        self.messages = []

    async def __call__(self, message):
        self.messages.append(message)

    @property
    def status(self):
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")


async def _echo_app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def _call(headers, chunks, limit=1000):
    app = BodySizeLimitMiddleware(_echo_app, max_bytes=limit)
    sent = _Recorder()
    queue = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    read = []

    async def receive():
        message = queue.pop(0)
        read.append(message)
        return message

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    async_to_sync(app)(scope, receive, sent)
    return sent, read


def test_a_declared_content_length_over_the_limit_is_refused_unread():
    sent, read = _call([(b"content-length", b"209715200")], [b"x" * 10])
    assert sent.status == 413 and read == []  # answered before a byte was read
    sent, read = _call([(b"content-length", b"12x")], [b""])
    assert sent.status == 400 and read == []


def test_a_streamed_body_over_the_limit_is_refused_as_it_arrives():
    sent, read = _call([], [b"x" * 600, b"x" * 600, b"x" * 600])
    assert sent.status == 413
    assert len(read) == 2  # stopped at the chunk that went over
    sent, _ = _call([(b"content-length", b"900")], [b"x" * 900])
    assert sent.status == 200 and sent.messages[-1]["body"] == b"900"


@pytest.mark.django_db(transaction=True)
def test_the_asgi_application_refuses_a_large_body(settings):
    from config.asgi import application

    settings.MAX_REQUEST_BODY_BYTES = 100
    sent = _Recorder()
    queue = [{"type": "http.request", "body": b"x" * 101, "more_body": False}]

    async def receive():
        return queue.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/accounts/login/",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"content-length", b"101")],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
        "root_path": "",
    }
    async_to_sync(application)(scope, receive, sent)
    assert sent.status == 413
    assert queue  # the body was never read
    # without a Content-Length, Django starts reading and is stopped at the limit
    sent = _Recorder()
    queue = [
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": False},
    ]
    scope["headers"] = [(b"host", b"testserver")]
    async_to_sync(application)(scope, receive, sent)
    assert sent.status == 413
    assert len(queue) == 1


@pytest.mark.django_db
def test_head_is_answered_like_get_and_favicon_ico_points_to_the_icon(client):
    """Load balancers and uptime checks send HEAD; browsers ask for /favicon.ico."""
    head = client.head("/")
    assert head.status_code == 302 and "/accounts/login/" in head["Location"]
    icon = client.get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"].endswith("dashboard/favicon.svg")
