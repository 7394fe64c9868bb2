"""Cases from public bug reports and advisories against tools that do the same job
(Svix and Standard Webhooks libraries, Stripe-style signatures, SSRF guards of webhook
senders, rate limiters, log redaction), run against Durable's incoming webhooks
(api/webhooks_in.py), outgoing webhooks (api/egress.py, api/workflows.py) and redaction.
Each test names the report it comes from."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time

import httpx
import pytest
from django.core.cache import cache
from django.test import Client

import durable
from api import egress
from api import workflows as _delivery  # noqa: F401  (registers the delivery workflow)
from api.models import IncomingWebhook, WebhookAnswer, WebhookSubscription
from durable.models import Signal
from durable.observability import logcontext
from durable.testing import drive
from tests.api.conftest import Api
from tests.api.test_runs import assert_problem
from tests.api.test_webhooks_in import SECRET, hook, post, post_standard, waiting_run
from tests.api.test_webhooks_out import PUBLIC, fake_dns

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = {"type": "run.failed", "data": {"run_id": "r1"}}


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


def standard_headers(msg_id: str, stamp: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(stamp), "webhook-signature": signature}


def hmac_b64(key: bytes, msg_id: str, stamp: int, raw: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


# --- incoming: Standard Webhooks ------------------------------------------------------


def test_several_signatures_in_one_header_pass_when_any_v1_one_matches():
    """svix/svix-webhooks#55 ("make sure the verification libraries can handle multiple
    signatures": ``v1,BADSIG v1,GOODSIG v2,BADSIG``): during a secret rotation the
    header holds several space-separated signatures, of several versions; one good
    ``v1`` is enough, and a header of only bad ones (or only another version) is not."""
    hook()
    run = waiting_run()
    raw = json.dumps({"run_id": run.id}).encode()
    stamp = int(time.time())
    good = hmac_b64(base64.b64decode(SECRET.removeprefix("whsec_")), "msg_r", stamp, raw)
    bad = hmac_b64(b"another secret of the rotation", "msg_r", stamp, raw)
    other_version = "v2," + good.removeprefix("v1,")
    refused = post(run.id, raw, standard_headers("msg_r", stamp, f"{bad} {other_version}"))
    assert_problem(refused, 401, "no v1 signature matches")
    taken = post(run.id, raw, standard_headers("msg_r", stamp, f"{bad} {good} {other_version}"))
    assert taken.status_code == 200, taken.content
    assert Signal.objects.filter(run=run).count() == 1


def test_a_timestamp_in_milliseconds_is_refused():
    """workos/workos-ruby#138 (the sender's timestamp was in milliseconds and the
    tolerance check read it as seconds, far in the future): ``webhook-timestamp`` is Unix
    seconds; a millisecond one, even correctly signed, is a 401 and delivers nothing."""
    hook()
    run = waiting_run()
    raw = json.dumps({"run_id": run.id}).encode()
    millis = int(time.time() * 1000)
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = standard_headers("msg_ms", millis, hmac_b64(key, "msg_ms", millis, raw))
    assert_problem(post(run.id, raw, signed), 401, "webhook-timestamp")
    assert not Signal.objects.exists()


def test_the_signature_is_over_the_raw_bytes_not_a_reserialised_body():
    """cyrusagents/cyrus#996 and gabrielkoerich/orch#134 (signatures checked over
    ``JSON.stringify(parsed)`` / ``serde_json::to_vec`` instead of the bytes received):
    a body with its own key order and whitespace verifies as sent, and the same
    signature over the body re-serialised (same JSON value) does not."""
    hook()
    run = waiting_run()
    raw = b'{ "z" : 1,\n  "run_id":"' + run.id.encode() + b'" ,"a":[1 ,2],"n":1.0 }'
    stamp = int(time.time())
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    headers = standard_headers("msg_raw", stamp, hmac_b64(key, "msg_raw", stamp, raw))
    reserialised = json.dumps(json.loads(raw), sort_keys=True).encode()
    assert json.loads(reserialised) == json.loads(raw) and reserialised != raw
    assert_problem(post(run.id, reserialised, headers), 401, "no v1 signature matches")
    taken = post(run.id, raw, headers)
    assert taken.status_code == 200, taken.content


@pytest.mark.parametrize("secret", ["whsec_!!!!!!!!!!!!!!!!!!!!!!!!", "whsec_ ~~~~ ~~~~ ~~~~"])
def test_a_whsec_secret_that_is_not_base64_never_verifies_as_an_empty_key(secret):
    """openai/openai-node#1887 and the review of corsairdev/corsair#1024 ("a webhook
    secret such as ``whsec_!!!!`` passed to a permissive base64 decoder produces an
    empty, predictable HMAC key, allowing forged events"): an endpoint whose ``whsec_``
    secret is not base64 (an operator's typo or placeholder) must refuse a request
    signed with the empty key -- which anyone can compute -- not deliver it."""
    IncomingWebhook.objects.create(signal="go", secret=secret, workflows=["tests.signal"])
    run = waiting_run()
    raw = json.dumps({"run_id": run.id, "paid": True}).encode()
    stamp = int(time.time())
    forged = standard_headers("msg_forged", stamp, hmac_b64(b"", "msg_forged", stamp, raw))
    assert_problem(post(run.id, raw, forged), 401, "whsec_")
    assert not Signal.objects.exists()


def test_a_rotating_x_forwarded_for_does_not_escape_the_failed_signature_count(settings):
    """long2ice/fastapi-limiter#9 and jazzband/django-axes#224 (each request with another
    ``X-Forwarded-For`` counted as a new client, so the limit was never reached): with
    no trusted proxy (the default), failed webhook signatures count against the
    connection's address, whatever ``X-Forwarded-For`` claims."""
    settings.API_AUTH_FAILURE_LIMIT = 3
    hook()
    run = waiting_run()
    raw = json.dumps({"run_id": run.id}).encode()
    stamp = int(time.time())
    for n in range(3):
        headers = {
            **standard_headers(f"m{n}", stamp, "v1,AAAA"),
            "X-Forwarded-For": f"81.2.69.{n + 1}",
        }
        assert_problem(post(run.id, raw, headers), 401)
    fresh = {"X-Forwarded-For": "81.2.69.99", "X-Real-IP": "81.2.69.98"}
    locked = Client().post(
        f"/api/v1/runs/{run.id}/signals/go",
        raw,
        content_type="application/json",
        headers={**standard_headers("m9", stamp, "v1,AAAA"), **fresh},
    )
    assert_problem(locked, 429, "failed webhook signatures")
    assert_problem(post_standard(run.id, {}), 429)  # a good one too, from that address


def test_behind_a_trusted_proxy_each_client_has_its_own_failure_count(settings):
    """jazzband/django-axes#1099 and opengisch/QFieldCloud#1836 (django-axes reads
    ``X-Forwarded-For`` only when django-ipware is installed -- an optional extra since
    axes 6 -- and silently falls back to ``REMOTE_ADDR``, the proxy's address): with
    ``DURABLE_TRUSTED_PROXY_COUNT=1`` (``settings.TRUSTED_PROXY_COUNT``, set here)
    behind the proxy docs/security.md shows (nginx sets ``X-Forwarded-For
    $remote_addr``), one client's junk must not throttle another
    client's webhooks -- else anyone throttles every provider at once."""
    settings.TRUSTED_PROXY_COUNT = 1
    settings.API_AUTH_FAILURE_LIMIT = 3
    hook()
    run = waiting_run()
    raw = json.dumps({"run_id": run.id}).encode()
    stamp = int(time.time())
    proxy = Client(REMOTE_ADDR="127.0.0.1")  # every request arrives from the proxy
    for n in range(4):
        junk = proxy.post(
            f"/api/v1/runs/{run.id}/signals/go",
            raw,
            content_type="application/json",
            headers={**standard_headers(f"j{n}", stamp, "v1,AAAA"), "X-Forwarded-For": "81.2.69.1"},
        )
        assert junk.status_code == (401 if n < 3 else 429), junk.content
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    good = proxy.post(
        f"/api/v1/runs/{run.id}/signals/go",
        raw,
        content_type="application/json",
        headers={
            **standard_headers("ok1", stamp, hmac_b64(key, "ok1", stamp, raw)),
            "X-Forwarded-For": "81.2.69.2",
        },
    )
    assert good.status_code == 200, good.content


# --- outgoing: where deliveries may go ------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "64:ff9b:1::a9fe:a9fe",  # RFC 8215 local-use NAT64 carrying 169.254.169.254
        "64:ff9b:1::a00:1",  # ... carrying 10.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible (deprecated) 169.254.169.254
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT) 127.0.0.1
    ],
)
def test_a_name_resolving_to_an_ipv6_transition_address_is_refused(address, monkeypatch):
    """vulnerability-lookup/vulnerability-lookup#540 (GHSA-mvm9-4fhw-xqf3: NAT64, 6to4 and
    Teredo addresses pass ``is_global`` though they carry an internal IPv4 address) and
    felippe-regazio/ssrfcheck#11 (``::/96``, ``64:ff9b:1::/48``): a name whose AAAA
    answer is such an address is refused at creation and at delivery."""
    fake_dns(monkeypatch, {"aaaa.example.test": [address]})
    with pytest.raises(egress.EgressRefused):
        egress.check_url("https://aaaa.example.test/hook")
    with pytest.raises(egress.EgressRefused):
        egress.post("https://aaaa.example.test/hook", content=b"{}", headers={}, timeout=1.0)


@pytest.mark.parametrize(
    "url",
    [
        "https://xn--/hook",  # an A-label with nothing after the prefix
        "https://xn--localhost-/hook",  # an A-label that is not Punycode
        "https://a..example.test/hook",  # an empty label
        "https://" + "a" * 64 + ".example.test/hook",  # a label over 63 characters
    ],
)
def test_a_host_name_that_is_not_valid_idna_is_refused_as_a_bad_url(url, admin_user, monkeypatch):
    """kjd/idna#82 (``xn--`` raised an unexpected error) and commixproject/commix#624
    (``UnicodeError: encoding with 'idna' codec failed (label empty or too long)`` out
    of ``socket.getaddrinfo`` in a URL check): a subscription URL whose host is not a
    valid IDNA name is refused as any bad URL is -- the API's 422 names ``url`` (its
    documented contract), the admin form shows an error on the URL field (not a 500) --
    and nothing is stored."""
    # the resolver's own first step, and then no name resolves: no lookup leaves here
    monkeypatch.setattr(egress, "_getaddrinfo", lambda host, port: _idna_then_unknown(host))
    api = Api(_token(admin_user), client=Client(raise_request_exception=False))
    made = api.post(
        "/webhooks/subscriptions", {"url": url, "secret": "x" * 20, "events": ["run.failed"]}
    )
    problem = assert_problem(made, 422, "url: ")
    assert [e["loc"] for e in problem["errors"]] == [["body", "url"]]
    browser = Client(raise_request_exception=False)
    browser.force_login(admin_user)
    page = browser.post(
        "/admin/api/webhooksubscription/add/",
        {"url": url, "secret": "x" * 20, "events": '["run.failed"]', "active": "on"},
    )
    assert page.status_code == 200  # the form again, with its error
    assert "url" in page.context["adminform"].form.errors
    assert not WebhookSubscription.objects.exists()


def _idna_then_unknown(host: str):
    """What ``socket.getaddrinfo`` does with a ``str`` host before any lookup: encode it
    with the ``idna`` codec (raising ``UnicodeError`` for an empty or too long label);
    then, here, the name is unknown."""
    import socket

    host.encode("idna")
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def _token(user) -> str:
    from api.models import token_create
    from api.scopes import SCOPES

    return token_create(user=user, name="trial28", scopes=list(SCOPES))[1]


# --- outgoing: what a receiver can make the worker do ---------------------------------


class EndlessBody(httpx.SyncByteStream):
    """A receiver's body of ``total`` bytes in 64 KiB chunks, counting what was read."""

    def __init__(self, total: int):
        self.total = total
        self.read = 0

    def __iter__(self):
        chunk = b"x" * 65536
        while self.read < self.total:
            self.read += len(chunk)
            yield chunk


@pytest.mark.parametrize("status", [200, 403])
def test_a_huge_answer_is_not_read_whole(status, monkeypatch):
    """BradGroux/veritas-kanban#610 ("responseBodyLimit loads the full webhook response
    before slicing") and hookdeck/outpost#975 (a destination's large response stored
    whole): a delivery keeps at most ``WebhookAnswer.EXCERPT_CHARS`` of what the
    receiver says, so it must stop reading well before a receiver's 16 MiB body ends --
    an endless body would otherwise hold the worker and its memory."""
    body = EndlessBody(16 * 1024 * 1024)
    monkeypatch.setattr(
        egress.httpx.HTTPTransport,
        "handle_request",
        lambda _t, request: httpx.Response(status, stream=body, request=request),
    )
    fake_dns(monkeypatch, {"hooks.example.test": [PUBLIC]})
    sub = WebhookSubscription.objects.create(
        url="https://hooks.example.test/x", secret="s" * 20, events=["run.failed"]
    )
    start = durable.start("api.webhook_delivery", {"subscription": sub.pk, "event": EVENT})
    run = drive(start.id, wait_for_retries=False)
    assert run.status == ("succeeded" if status == 200 else "failed")
    assert body.read <= 1024 * 1024, f"read {body.read} bytes of the receiver's answer"
    if status == 403:
        assert len(WebhookAnswer.objects.get(run_id=run.id).excerpt) <= 500


def test_a_key_parameter_in_a_subscription_url_is_shown_nowhere(admin_api, monkeypatch, caplog):
    """librefang/librefang#5872 and valentinfrlch/ha-llmvision#334 (a Google API key
    sent as ``?key=`` written to logs in clear): docs/security.md promises that a
    subscription URL shows its secret-looking parameters (``token=``, ``key=``) as
    ``[REDACTED]`` everywhere it shows; the API's answer, the worker's log line of the
    POST (httpx logs each request's URL at INFO) and a failed delivery's error must not
    hold the key."""
    key = "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
    fake_dns(monkeypatch, {"hooks.example.test": [PUBLIC]})
    monkeypatch.setattr(
        egress.httpx.HTTPTransport, "handle_request", lambda _t, r: httpx.Response(410)
    )
    made = admin_api.post(
        "/webhooks/subscriptions",
        {
            "url": f"https://hooks.example.test/in?key={key}&team=ops",
            "secret": "s" * 20,
            "events": ["run.failed"],
        },
    )
    assert made.status_code == 201, made.content
    shown = made.json()["url"]
    assert "team=ops" in shown
    sub = WebhookSubscription.objects.get()
    with caplog.at_level(logging.INFO, logger="httpx"):
        start = durable.start("api.webhook_delivery", {"subscription": sub.pk, "event": EVENT})
        run = drive(start.id, wait_for_retries=False)
    assert run.status == "failed" and "410 Gone" in run.error["message"]
    lines = [logcontext.RedactingFormatter().format(r) for r in caplog.records]
    assert any("HTTP Request: POST" in line for line in lines), lines
    leaks = {
        "api": key in shown,
        "log": [line for line in lines if key in line],
        "error": key in run.error["message"],
    }
    assert not any(leaks.values()), leaks


@pytest.mark.parametrize(
    ("secret", "refused"),
    [
        ("whsec_!!!!!!!!!!!!!!!!!!!!", "base64"),  # openai/openai-node#1887: garbage
        ("whsec_" + base64.b64encode(b"x" * 8).decode(), "at least 16 bytes"),  # 8 bytes
        ("short", "at least 16 characters"),
        ("whsec_" + base64.b64encode(b"k" * 24).decode(), None),
        ("s" * 16, None),
    ],
)
def test_a_secret_that_cannot_sign_is_refused_where_it_is_entered(admin_api, secret, refused):
    """A secret that decodes to nothing (or one byte) is refused when it is given, with
    the field named, not when a delivery first signs with it (a ValueError in the tool,
    every retry)."""
    made = admin_api.post(
        "/webhooks/subscriptions",
        {"url": "https://93.184.215.14/in", "secret": secret, "events": ["run.failed"]},
    )
    if refused is None:
        assert made.status_code == 201, made.content
    else:
        assert_problem(made, 422, refused)
        assert made.json()["errors"][0]["loc"] == ["body", "secret"]
