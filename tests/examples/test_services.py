"""The example services on their own: the payments service's idempotency contract and
faults, the scripted LLM through the official openai client, the SMTP sink's count."""

from __future__ import annotations

import re
import smtplib
import threading
from email.message import EmailMessage

import httpx
import openai
import pytest

from durable.exceptions import ModelRecoverableError
from durable.runtime.llm import SCRIPTED_FINGERPRINT, parse_response
from examples.procs import admin

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def payments(services):
    admin(services.payments_url, "POST", "/_admin/reset")
    with httpx.Client(base_url=services.payments_url, timeout=10) as client:
        yield client


REFUND = {"charge_id": "ch_svc1", "amount_cents": 1000}


def test_same_key_same_parameters_replays_the_first_result(payments):
    first = payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k1"})
    again = payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(payments.get("/v1/refunds", params={"idempotency_key": "k1"}).json()["data"]) == 1


def test_same_key_other_parameters_is_422(payments):
    payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k2"})
    other = payments.post(
        "/v1/refunds", json={**REFUND, "amount_cents": 999}, headers={"Idempotency-Key": "k2"}
    )
    assert other.status_code == 422
    assert other.json()["error"]["type"] == "idempotency_error"


def test_a_concurrent_request_with_the_same_key_is_409(payments, services):
    headers = {"Idempotency-Key": "k3", "X-Fault": "slow=1.5"}
    slow = threading.Thread(
        target=lambda: httpx.post(
            f"{services.payments_url}/v1/refunds", json=REFUND, headers=headers, timeout=10
        )
    )
    slow.start()
    try:
        import time

        time.sleep(0.5)
        busy = payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k3"})
        assert busy.status_code == 409 and busy.headers["Retry-After"] == "1"
    finally:
        slow.join()
    done = payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k3"})
    assert done.status_code == 200 and done.headers["Idempotent-Replayed"] == "true"


def test_a_rejected_request_stores_nothing_under_its_key(payments):
    bad = payments.post(
        "/v1/refunds",
        json={"charge_id": "nope", "amount_cents": 1},
        headers={"Idempotency-Key": "k4"},
    )
    assert bad.status_code == 400
    limited = payments.post(
        "/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k4", "X-Fault": "429=2"}
    )
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "2"
    ok = payments.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "k4"})
    assert ok.status_code == 200 and "Idempotent-Replayed" not in ok.headers


def test_commit_then_drop_commits_and_resets_the_connection(payments, services):
    with pytest.raises(httpx.TransportError):
        httpx.post(
            f"{services.payments_url}/v1/refunds",
            json=REFUND,
            headers={"Idempotency-Key": "k5", "X-Fault": "drop"},
            timeout=10,
        )
    found = payments.get("/v1/refunds", params={"idempotency_key": "k5"}).json()["data"]
    assert len(found) == 1 and found[0]["charge_id"] == "ch_svc1"


def test_state_survives_a_restart_of_the_service(payments, services):
    created = payments.post(
        "/v1/tickets", json={"customer": "A", "subject": "S"}, headers={"Idempotency-Key": "k6"}
    ).json()
    port = services.payments.ports["http"]
    services.payments.stop()
    services.start_payments(port)
    with httpx.Client(base_url=services.payments_url, timeout=10) as client:
        again = client.post(
            "/v1/tickets", json={"customer": "A", "subject": "S"}, headers={"Idempotency-Key": "k6"}
        )
        assert again.json() == created and again.headers["Idempotent-Replayed"] == "true"


def test_the_scripted_llm_speaks_the_openai_protocol(services):
    admin(services.llm_url, "POST", "/_admin/reset")
    client = openai.OpenAI(base_url=f"{services.llm_url}/v1", api_key="x", max_retries=0)
    messages = [
        {"role": "system", "content": "durable-script: support\nrun: svc-1"},
        {
            "role": "user",
            "content": "Customer: Ann <ann@example.com>\nMessage:\ncharged twice, ch_abc of $5.00",
        },
    ]
    response = client.chat.completions.create(model="scripted", messages=messages)
    assert response.system_fingerprint == SCRIPTED_FINGERPRINT
    assert (
        response.usage.total_tokens
        == (response.usage.prompt_tokens + response.usage.completion_tokens)
        > 0
    )
    plan = parse_response(response)
    assert [c["name"] for c in plan["tool_calls"]] == [
        "kb_search",
        "tickets_create",
        "payments_refund",
        "email_send",
    ]
    assert plan["tool_calls"][2]["arguments"]["amount_cents"] == 500
    assert plan["scripted"] is True

    limited = [
        *messages[:1],
        {"role": "user", "content": messages[1]["content"] + " [fault:429] [fault:retry_after=2]"},
    ]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="scripted", messages=limited)
    assert caught.value.response.headers["retry-after"] == "2"

    broken = [
        *messages[:1],
        {"role": "user", "content": messages[1]["content"] + " [fault:malformed_json]"},
    ]
    with pytest.raises(ModelRecoverableError) as bad:
        parse_response(client.chat.completions.create(model="scripted", messages=broken))
    assert bad.value.details["usage"]["total_tokens"] > 0  # paid for, so counted

    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model="scripted",
            messages=[*messages[:1], {"role": "user", "content": "hi [fault:401]"}],
        )


def test_the_smtp_sink_counts_every_message(services):
    admin(services.sink_url, "POST", "/_admin/reset")
    for _ in range(2):
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = "a@example.com", "b@example.com", "Hi"
        msg["Message-ID"] = "<same@durable.local>"
        msg.set_content("body")
        with smtplib.SMTP("127.0.0.1", services.sink.ports["smtp"], timeout=10) as smtp:
            smtp.send_message(msg)
    stats = admin(services.sink_url, "GET", "/_admin/stats")
    assert stats["messages"] == 2 and stats["duplicates"] == {"<same@durable.local>": 2}
    found = httpx.get(
        f"{services.sink_url}/messages", params={"message_id": "<same@durable.local>"}
    ).json()["data"]
    assert len(found) == 2 and found[0]["to"] == ["b@example.com"]


def test_a_request_cut_off_in_its_body_is_not_handled(payments, services):
    """A worker SIGKILLed while sending a webhook delivery left the receiver an empty
    body under a real ``webhook-id`` (the 1,000-run chaos audit's "webhook id with two
    payloads"): an incomplete request is not a request."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(services.payments_url)
    body = b'{"id": "evt_cut", "type": "run.succeeded", "data": {"run_id": "r-cut"}}'
    head = (
        f"POST /v1/webhooks HTTP/1.1\r\nHost: {url.hostname}\r\n"
        f"Content-Type: application/json\r\nwebhook-id: wh-cut\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for auth in [h for h in payments.headers.items() if h[0].lower() == "authorization"]:
        head = head.replace(b"\r\n\r\n", f"\r\n{auth[0]}: {auth[1]}\r\n\r\n".encode())
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(head)  # the headers only: then the sender is gone
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1024) == b""  # closed, unanswered
    whole = payments.post(
        "/v1/webhooks",
        content=body,
        headers={"webhook-id": "wh-whole", "Content-Type": "application/json"},
    )
    assert whole.status_code == 200, whole.text
    ids = [w["webhook_id"] for w in admin(services.payments_url, "GET", "/_admin/webhooks")["data"]]
    assert "wh-whole" in ids and "wh-cut" not in ids


def test_the_smtp_sink_page_lists_messages_with_their_links_clickable(services):
    admin(services.sink_url, "POST", "/_admin/reset")
    assert "No message yet" in httpx.get(f"{services.sink_url}/").text
    link = "http://127.0.0.1:8000/approvals/email/abc.def-ghi/?x=1&y=2"
    msg = EmailMessage()
    msg["From"], msg["To"] = "durable@example.com", "ann@example.com"
    msg["Subject"] = "Approve <refund> of 40"
    msg["Message-ID"] = "<page@durable.local>"
    msg.set_content(f"Decide here: {link}.\n<script>alert(1)</script>")
    with smtplib.SMTP("127.0.0.1", services.sink.ports["smtp"], timeout=10) as smtp:
        smtp.send_message(msg)
    page = httpx.get(f"{services.sink_url}/")
    assert page.headers["content-type"].startswith("text/html")
    assert "Approve &lt;refund&gt; of 40" in page.text and "ann@example.com" in page.text
    view = re.search(r'href="(/view/\d+)"', page.text)
    assert view is not None
    one = httpx.get(services.sink_url + view.group(1)).text
    escaped = link.replace("&", "&amp;")
    assert f'<a href="{escaped}">{escaped}</a>.' in one  # the full stop is not in the link
    assert "<script>" not in one and "&lt;script&gt;" in one
    assert httpx.get(f"{services.sink_url}/view/999999").status_code == 404
