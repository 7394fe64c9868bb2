"""What the pages must never show: unescaped user or model text, and secrets."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User

import durable
from approvals.models import ApprovalRequest
from durable.models import Operation, Step, Wait
from durable.testing import drive
from tests.dashboard import dash_workflows as dw
from tests.dashboard.conftest import HTMX, login

pytestmark = pytest.mark.django_db(transaction=True)

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
SECRET = "sk-test-XYZ123456"


@pytest.fixture
def admin_client():
    user = User.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    return login(user)


def every_page(client, run_ids: list[str]) -> dict[str, str]:
    """Every dashboard page and fragment touching these runs: url -> body."""
    urls = [
        "/",
        "/?" + urlencode({"q": XSS, "version": XSS}),
        "/approvals/",
        "/attention/",
        "/?status=attention",
    ]
    for run_id in run_ids:
        urls.append(f"/runs/{run_id}/")
        urls.append(f"/runs/{run_id}/payload/run-input/run/")
        urls.append(f"/runs/{run_id}/payload/run-output/run/")
        for step in Step.objects.filter(run_id=run_id):
            urls += [
                f"/runs/{run_id}/payload/step-input/{step.pk}/",
                f"/runs/{run_id}/payload/step-output/{step.pk}/",
            ]
        for wait in Wait.objects.filter(run_id=run_id):
            urls += [
                f"/runs/{run_id}/payload/wait-payload/{wait.pk}/",
                f"/runs/{run_id}/payload/wait-result/{wait.pk}/",
            ]
        for op in Operation.objects.filter(run_id=run_id):
            urls += [f"/runs/{run_id}/payload/op-params/{op.pk}/"]
        for req in ApprovalRequest.objects.filter(run_id=run_id):
            urls += [f"/runs/{run_id}/payload/approval-payload/{req.pk}/"]
    pages = {}
    for url in urls:
        for extra in ({}, HTMX):
            response = client.get(url, **extra)
            assert response.status_code == 200, url
            pages[f"{url} {bool(extra)}"] = response.content.decode()
    return pages


def scripts_in(page: str) -> list[str]:
    """<script> tags, other than the dashboard's own (src=... defer)."""
    return [tag for tag in re.findall(r"<script[^>]*>", page) if "src=" not in tag]


def test_user_and_model_text_is_escaped_everywhere(admin_client):
    dw.KNOBS["unknown"] = 1
    runs = [
        drive(durable.start("dash.echo", {"text": XSS}, tags=[XSS], version="1").id),
        drive(durable.start("dash.fail", {"why": XSS}).id),
        drive(durable.start("tests.approval", {"note": XSS}).id),
        drive(durable.start("dash.transfer", {"amount": 1}).id),
    ]
    ApprovalRequest.objects.filter(run=runs[2]).update(title=XSS)
    pages = every_page(admin_client, [r.id for r in runs])
    seen_escaped = 0
    for url, page in pages.items():
        assert not scripts_in(page), url
        assert "<img src=x" not in page, url
        seen_escaped += "&lt;script&gt;alert(" in page
    assert seen_escaped >= 8  # the text is shown (escaped), not dropped
    htmx_run = admin_client.get(f"/runs/{runs[1].id}/", **HTMX).content.decode()
    assert "cannot do it: &lt;script&gt;" in htmx_run


def test_secrets_in_inputs_are_never_shown(admin_client):
    runs = [
        drive(durable.start("dash.echo", {"api_key": SECRET, "note": "hello"}, version="1").id),
        drive(durable.start("tests.approval", {"api_key": SECRET}).id),
        drive(durable.start("dash.fail", {"why": f"token {SECRET}"}).id),
    ]
    pages = every_page(admin_client, [r.id for r in runs])
    for url, page in pages.items():
        assert "XYZ123456" not in page, url
    assert any("[REDACTED]" in page for page in pages.values())
    assert "hello" in pages[f"/runs/{runs[0].id}/ False"]
    # searching for the secret does not find the run either: it is stored encrypted
    assert runs[0].id not in admin_client.get(f"/?q={SECRET}", **HTMX).content.decode()
