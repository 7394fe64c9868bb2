"""Outgoing webhooks reach public addresses only (api/egress.py): every spelling of an
internal address is refused when a subscription is made (API, admin) and again when a
delivery resolves the name, which then connects to the address it checked; the
allow-list (DURABLE_WEBHOOK_ALLOWED_NETWORKS) lets an internal receiver through."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import ssl
import threading

import httpx
import pytest
from django.core.checks import run_checks
from django.test import Client
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import durable
from api import egress
from api import workflows as _delivery  # noqa: F401  (registers the delivery workflow)
from api.models import WebhookAnswer, WebhookSubscription
from durable.models import Run, TraceEvent
from durable.testing import drive
from tests.api.test_runs import assert_problem
from tests.api.test_webhooks_out import PUBLIC, Receiver, fake_dns

pytestmark = pytest.mark.django_db(transaction=True)

#: each spelling of an address no webhook may reach, as a URL
INTERNAL = [
    "http://127.0.0.1/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://0177.0.0.1/",
    "http://017700000001/",
    "http://127.1/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::1]/",
    "http://[::]/",
    "http://0.0.0.0/",
    "http://0/",
    "http://localhost/",
    "http://LOCALHOST./",
    "http://api.localhost/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1:8080/",
    "http://100.64.0.1/",
    "http://[fc00::1]/",
    "http://169.254.1.1/",
    "http://[fe80::1]/",
    "http://[fec0::1]/",  # deprecated site-local (found by the outside trial)
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",
    "http://[64:ff9b::7f00:1]/",
    "http://[2002:7f00:1::]/",
    "http://127.0.0.%31/",
    "http://hooks.example.test\\@127.0.0.1/",
    "https://internal.example.test/hook",  # resolves to 10.1.2.3 (fake_dns)
]
EVENT = {"type": "run.failed", "data": {"run_id": "r1"}}


@pytest.fixture
def dns(monkeypatch):
    return fake_dns(
        monkeypatch,
        {"internal.example.test": ["10.1.2.3"], "hooks.example.test": [PUBLIC]},
    )


def deliver(sub: WebhookSubscription) -> Run:
    start = durable.start("api.webhook_delivery", {"subscription": sub.pk, "event": EVENT})
    return drive(start.id, wait_for_retries=False)


# ------------------------------------------------------------------------ creation


@pytest.mark.parametrize("url", INTERNAL)
def test_the_api_refuses_an_internal_destination_naming_the_url_field(url, admin_api, dns):
    body = {"url": url, "secret": "x" * 20, "events": ["run.failed"]}
    made = admin_api.post("/webhooks/subscriptions", body)
    problem = assert_problem(made, 422, "url: ")
    (error,) = problem["errors"]
    assert error["loc"] == ["body", "url"]
    assert any(w in error["msg"] for w in ("public", "this machine", "percent", "password"))
    assert not WebhookSubscription.objects.exists()


def test_the_api_refuses_credentials_in_the_url_and_takes_a_public_one(admin_api, dns):
    url = "https://bob:pw@hooks.example.test/"
    body = {"url": url, "secret": "x" * 20, "events": ["run.failed"]}
    problem = assert_problem(admin_api.post("/webhooks/subscriptions", body), 422, "url: ")
    assert "user name and password" in problem["errors"][0]["msg"]
    body["url"] = "https://hooks.example.test/"
    assert admin_api.post("/webhooks/subscriptions", body).status_code == 201
    # a name that does not resolve now is taken: the delivery checks it again
    body["url"] = "https://not-yet.example.test/"
    assert admin_api.post("/webhooks/subscriptions", body).status_code == 201


@pytest.mark.parametrize(
    "url", ["http://2130706433/", "http://[::ffff:127.0.0.1]/", "http://LOCALHOST./", INTERNAL[-1]]
)
def test_the_admin_form_refuses_an_internal_destination(url, admin_user, dns):
    browser = Client()
    browser.force_login(admin_user)
    page = browser.post(
        "/admin/api/webhooksubscription/add/",
        {"url": url, "secret": "x" * 20, "events": '["run.failed"]', "active": "on"},
    )
    assert page.status_code == 200  # the form again, with its error
    errors = page.context["adminform"].form.errors
    assert "public" in str(errors["url"]) or "this machine" in str(errors["url"]), errors
    assert not WebhookSubscription.objects.exists()


def test_the_admin_form_takes_a_public_destination(admin_user, dns):
    browser = Client()
    browser.force_login(admin_user)
    page = browser.post(
        "/admin/api/webhooksubscription/add/",
        {"url": "https://hooks.example.test/x", "secret": "x" * 20, "events": '["run.failed"]'},
    )
    assert page.status_code == 302, page.context["adminform"].form.errors
    sub = WebhookSubscription.objects.get()
    assert sub.url == "https://hooks.example.test/x" and sub.created_by == admin_user
    # the secret is never shown again; a change that leaves it empty keeps it
    change = f"/admin/api/webhooksubscription/{sub.pk}/change/"
    assert "x" * 20 not in browser.get(change).content.decode()
    page = browser.post(
        change, {"url": sub.url, "secret": "", "events": '["run.succeeded"]', "active": "on"}
    )
    assert page.status_code == 302
    sub.refresh_from_db()
    assert sub.secret == "x" * 20 and sub.events == ["run.succeeded"]


@hsettings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["int", "hex", "dotted-octal", "short", "hex-dotted"]),
)
def test_every_ipv4_spelling_reads_as_the_resolver_reads_it(number, form):
    """Whatever way an IPv4 address is written, it is judged as the address it is."""
    ip = ipaddress.IPv4Address(number)
    a, b, c, d = ip.packed
    text = {
        "int": str(number),
        "hex": hex(number),
        "dotted-octal": ".".join(f"0{x:o}" for x in (a, b, c, d)),
        "short": f"{a}.{number & 0xFFFFFF}",
        "hex-dotted": ".".join(hex(x) for x in (a, b, c, d)),
    }[form]
    assert egress.literal_address(text) == ip
    assert ipaddress.IPv4Address(socket.inet_aton(text)) == ip  # as the C library reads it
    why = egress.refusal(ip, [])
    if ip.is_global and not ip.is_multicast and not ip.is_reserved:
        assert why is None
    else:
        assert why and str(ip) in why
        with pytest.raises(egress.EgressRefused):
            egress.check_url(f"http://{text}/", resolve_names=False)


# ------------------------------------------------------------------------ delivery


def test_a_name_that_resolves_elsewhere_at_delivery_is_refused(monkeypatch, settings):
    """DNS rebinding: public when the subscription is made, loopback when delivered."""
    settings.DURABLE = {**settings.DURABLE, "INPROCESS_RETRY_MAX_SECONDS": 0}
    receiver = Receiver()
    monkeypatch.setattr(
        egress.httpx.HTTPTransport, "handle_request", lambda _t, r: receiver.handle_request(r)
    )
    asked = fake_dns(monkeypatch, {"rebind.example.test": [PUBLIC, "127.0.0.1"]})
    url = "https://rebind.example.test/hook"
    assert egress.check_url(url) == [ipaddress.ip_address(PUBLIC)]
    sub = WebhookSubscription.objects.create(url=url, secret="s" * 20, events=["run.failed"])
    run = deliver(sub)
    assert run.status == "failed"  # for good: not retried
    assert "refused: rebind.example.test resolves to 127.0.0.1" in run.error["message"]
    assert receiver.calls == [] and asked == ["rebind.example.test"] * 2


def test_a_delivery_connects_to_the_address_it_checked(monkeypatch):
    """The name is resolved once: the request goes to that address, whatever the name
    resolves to afterwards (the transport never resolves it)."""
    receiver = Receiver()
    monkeypatch.setattr(
        egress.httpx.HTTPTransport, "handle_request", lambda _t, r: receiver.handle_request(r)
    )
    asked = fake_dns(monkeypatch, {"once.example.test": [PUBLIC, "127.0.0.1"]})
    sub = WebhookSubscription.objects.create(
        url="https://once.example.test:8443/hook", secret="s" * 20, events=["run.failed"]
    )
    assert deliver(sub).status == "succeeded"
    (call,) = receiver.calls
    assert call["url"] == f"https://{PUBLIC}:8443/hook"
    assert call["headers"]["host"] == "once.example.test:8443"
    assert call["extensions"]["sni_hostname"] == "once.example.test"
    assert asked == ["once.example.test"]


def test_an_internationalised_name_is_sent_as_idna(monkeypatch):
    receiver = Receiver()
    monkeypatch.setattr(
        egress.httpx.HTTPTransport, "handle_request", lambda _t, r: receiver.handle_request(r)
    )
    fake_dns(monkeypatch, {"bücher.example": [PUBLIC]})
    sub = WebhookSubscription.objects.create(
        url="https://Bücher.example/hook", secret="s" * 20, events=["run.failed"]
    )
    assert deliver(sub).status == "succeeded"
    (call,) = receiver.calls
    assert call["headers"]["host"] == "xn--bcher-kva.example"
    assert call["extensions"]["sni_hostname"] == "xn--bcher-kva.example"


class LocalReceiver:
    """A real HTTP server on 127.0.0.1 that records each POST and answers ``status``."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None):
        got: list[dict] = []
        self.got = got

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                got.append({"path": self.path, "body": self.rfile.read(length)})
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def local():
    made: list[LocalReceiver] = []

    def start(status: int = 200, headers: dict[str, str] | None = None) -> LocalReceiver:
        made.append(LocalReceiver(status, headers))
        return made[-1]

    yield start
    for server in made:
        server.close()


def test_loopback_is_refused_unless_allow_listed(local, settings):
    server = local()
    sub = WebhookSubscription.objects.create(
        url=f"{server.url}/hook", secret="s" * 20, events=["run.failed"]
    )
    refused = deliver(sub)
    assert refused.status == "failed"
    assert "127.0.0.1 is a loopback address" in refused.error["message"]
    assert server.got == []
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    assert deliver(sub).status == "succeeded"
    (post,) = server.got
    assert post["path"] == "/hook" and b'"run.failed"' in post["body"]


def test_the_metadata_address_is_refused_even_when_allow_listed(settings):
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["169.254.0.0/16"]
    with pytest.raises(egress.EgressRefused, match="cloud metadata"):
        egress.check_url("http://169.254.169.254/")
    assert egress.check_url("http://169.254.1.1/") == [ipaddress.ip_address("169.254.1.1")]


def test_an_allow_listed_name_is_let_through(settings, dns):
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["internal.example.test"]
    assert egress.check_url("https://Internal.Example.Test./hook") == []


def test_a_redirect_is_not_followed(local, settings):
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    target = local()
    server = local(302, {"location": f"{target.url}/elsewhere"})
    sub = WebhookSubscription.objects.create(
        url=f"{server.url}/hook", secret="s" * 20, events=["run.failed"]
    )
    run = deliver(sub)
    assert run.status == "failed" and "302 Found: a redirect, not followed" in run.error["message"]
    assert len(server.got) == 1 and target.got == []


def test_nothing_the_receiver_says_is_shown_as_ours(monkeypatch, operator, viewer):
    """A refusal's body, reason phrase or Location are the receiver's words: the failure
    says only the status and its standard phrase; a bounded, redacted excerpt of the body
    is kept apart and shown, marked as the receiver's, to operators only."""
    words = "Your account is locked: call +1 555 0100 at once"
    leaked = "sk-" + "A1b2C3d4" * 6  # a key the receiver echoes back
    body = f"{words}\x1b[2J {leaked} " + "x" * 2000
    answer = httpx.Response(
        403,
        text=body,
        headers={"location": "https://evil.example/"},
        extensions={"reason_phrase": words.encode()},
    )
    monkeypatch.setattr(egress.httpx.HTTPTransport, "handle_request", lambda *a: answer)
    fake_dns(monkeypatch, {"hooks.example.test": [PUBLIC]})
    sub = WebhookSubscription.objects.create(
        url="https://hooks.example.test/x", secret="s" * 20, events=["run.failed"]
    )
    run = deliver(sub)
    assert run.status == "failed"
    assert run.error["message"] == "POST https://hooks.example.test/x: 403 Forbidden"
    kept = WebhookAnswer.objects.get(run_id=run.id)
    assert kept.status == 403 and len(kept.excerpt) == WebhookAnswer.EXCERPT_CHARS
    assert kept.excerpt.startswith(words) and "\x1b" not in kept.excerpt
    assert leaked not in kept.excerpt and "[REDACTED]" in kept.excerpt
    pages = {}
    for user in (viewer, operator):
        browser = Client()
        browser.force_login(user)
        pages[user.username] = browser.get("/webhooks/").content.decode()
    seen = pages[viewer.username]
    assert "403 Forbidden" in seen and "account is locked" not in seen and "evil" not in seen
    page = pages[operator.username]
    assert "The receiver answered 403 (its words, not ours)" in page
    assert page.count("account is locked") == 1 and "evil" not in page and leaked not in page


# ------------------------------------------------------------------ system checks


def ids(allowed: list[str], settings) -> list[str]:
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = allowed
    return sorted(m.id for m in run_checks() if m.id and m.id.startswith("api."))


@pytest.mark.parametrize(
    "allowed, expected",
    [
        ([], []),
        (["10.1.2.0/24", "10.1.2.3", "fd12:3456::/64", "receiver.internal"], []),
        (["127.0.0.1/32"], ["api.W011"]),
        (["::1"], ["api.W011"]),
        (["localhost"], ["api.W011"]),
        (["::ffff:127.0.0.1"], ["api.W011"]),
        (["10.0.0.0/8"], ["api.W012"]),
        (["192.168.0.0/23"], ["api.W012"]),
        (["0.0.0.0/0"], ["api.W011"]),
        (["fd00::/48"], ["api.W012"]),
        (["10.0.0.300/8"], ["api.W010"]),
    ],
)
def test_the_system_check_warns_of_a_wide_allow_list(allowed, expected, settings):
    assert ids(allowed, settings) == expected


# ------------------------------------------------------------------ TLS to the address


def _certificates(tmp_path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A test authority and a server certificate for ``name`` only (not for 127.0.0.1):
    (the server's context, a client context trusting the authority)."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def made(subject: str, key, issuer=None, issuer_key=None, ca=False):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
            )
        return builder.sign(issuer_key or key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = made("Durable test CA", ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = made(name, key, issuer=ca.subject, issuer_key=ca_key)
    pem = serialization.Encoding.PEM
    (tmp_path / "leaf.pem").write_bytes(
        leaf.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "leaf.pem")
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


@pytest.fixture
def tls_server(tmp_path):
    """An HTTPS server on 127.0.0.1 whose certificate names hooks.example.test; records
    the TLS server name (SNI) and the Host header of each request."""
    server_ctx, client_ctx = _certificates(tmp_path, "hooks.example.test")
    seen: list[dict] = []

    def sni(sock, server_name, _ctx):
        seen.append({"sni": server_name})

    server_ctx.sni_callback = sni

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen[-1]["host"] = self.headers["host"]
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], client_ctx, seen
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_tls_goes_to_the_checked_address_with_the_name_for_sni_and_the_certificate(
    tls_server, monkeypatch, settings
):
    port, trust, seen = tls_server
    settings.DURABLE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    loopback = ["127.0.0.1"]
    fake_dns(monkeypatch, {"hooks.example.test": loopback, "other.example.test": loopback})
    answer = egress.post(
        f"https://hooks.example.test:{port}/hook",
        content=b"{}",
        headers={"content-type": "application/json"},
        timeout=5,
        verify=trust,
    )
    assert answer.status_code == 204
    assert seen == [{"sni": "hooks.example.test", "host": f"hooks.example.test:{port}"}]
    # the certificate is checked against the name, not the address connected to
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|match"):
        egress.post(
            f"https://other.example.test:{port}/hook",
            content=b"{}",
            headers={},
            timeout=5,
            verify=trust,
        )


# ------------------------------------------------- credentials in an older URL


def test_credentials_in_an_older_subscription_url_are_shown_nowhere(
    monkeypatch, admin_api, admin_user, operator
):
    """A subscription made before URLs with credentials were refused keeps delivering,
    but its ``user:pass@`` and ``token=`` show as ``[REDACTED]`` everywhere: the API's
    list, the admin's list and change page, the delivery log and a failed delivery's
    error."""
    answer = httpx.Response(503)
    monkeypatch.setattr(egress.httpx.HTTPTransport, "handle_request", lambda *a: answer)
    fake_dns(monkeypatch, {"hooks.example.test": [PUBLIC]})
    sub = WebhookSubscription.objects.create(  # as an older release stored it
        url="https://bob:hunter2@hooks.example.test/x?token=tok-777",
        secret="s" * 20,
        events=["run.failed"],
    )
    run = deliver(sub)
    assert run.status == "retrying"
    shown = "https://[REDACTED]@hooks.example.test/x?token=[REDACTED]"
    failures = TraceEvent.objects.filter(run=run, kind="attempt_failed")
    assert failures and all(
        e.message.startswith("POST https://[REDACTED]@hooks.example.test/x?token=[REDACTED]")
        and e.message.endswith("503 Service Unavailable")
        and "hunter2" not in e.message
        and "tok-777" not in e.message
        for e in failures
    ), [e.message for e in failures]

    listed = admin_api.get("/webhooks/subscriptions")
    assert [s["url"] for s in listed.json()] == [shown]
    pages = []
    staff = Client()
    staff.force_login(admin_user)
    pages.append(staff.get("/admin/api/webhooksubscription/").content.decode())
    pages.append(staff.get(f"/admin/api/webhooksubscription/{sub.pk}/change/").content.decode())
    browser = Client()
    browser.force_login(operator)
    pages.append(browser.get("/webhooks/").content.decode())
    for page in pages:
        assert "hunter2" not in page and "tok-777" not in page
        assert "hooks.example.test/x" in page
    assert str(sub) == f"{shown} (run.failed)"
