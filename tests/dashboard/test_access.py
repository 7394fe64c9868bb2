"""Who may see and do what: login, roles, and 403 pages that name the missing permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.urls import reverse

import durable
from approvals import roles
from durable.testing import drive
from tests.dashboard.conftest import HTMX, login, make_user

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = ["/", "/approvals/", "/attention/"]


def test_roles_exist_with_their_permissions():
    def perms(group: str) -> set[str]:
        return {
            f"{p.content_type.app_label}.{p.codename}"
            for p in Group.objects.get(name=group).permissions.select_related("content_type")
        }

    assert perms("viewer") == {roles.VIEW_RUN}
    assert perms("operator") == {roles.VIEW_RUN, roles.OPERATE_RUN}
    assert perms("approver") == {roles.VIEW_RUN, roles.DECIDE_APPROVAL}
    assert {roles.VIEW_RUN, roles.OPERATE_RUN, roles.DECIDE_APPROVAL} <= perms("admin")
    operate = Permission.objects.get(codename="operate_run")
    assert operate.content_type.app_label == "durable" and operate.content_type.model == "run"


def test_ensure_roles_is_idempotent_and_keeps_additions():
    extra = Permission.objects.get(codename="view_tool")
    Group.objects.get(name="viewer").permissions.add(extra)
    roles.ensure_roles()
    roles.ensure_roles()
    assert Group.objects.filter(name__in=roles.ROLES).count() == 4
    assert Permission.objects.filter(codename="operate_run").count() == 1
    assert Group.objects.get(name="viewer").permissions.filter(pk=extra.pk).exists()


@pytest.mark.parametrize("url", PAGES + ["/runs/some-run/"])
def test_every_page_needs_a_login(url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


def test_htmx_request_with_expired_session_redirects_the_whole_page():
    response = Client().get("/", HTTP_HX_CURRENT_URL="http://testserver/?status=failed", **HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=%2F%3Fstatus%3Dfailed"


def test_login_page_and_logging_in():
    make_user("vera", "viewer")
    page = Client().get(reverse("login"))
    assert page.status_code == 200
    assert b'<label for="id_username">' in page.content and b'for="id_password"' in page.content
    client = Client()
    response = client.post(
        reverse("login"), {"username": "vera", "password": "pw-for-tests", "next": "/attention/"}
    )
    assert response.status_code == 302 and response["Location"] == "/attention/"
    bad = Client().post(reverse("login"), {"username": "vera", "password": "nope"})
    assert bad.status_code == 200 and b"flash-error" in bad.content


def test_logout_is_a_post():
    client = login(make_user("vera", "viewer"))
    response = client.post(reverse("logout"))
    assert response.status_code == 200 and b"You are logged out" in response.content
    assert client.get("/").status_code == 302


def test_user_without_a_role_gets_403_naming_view_run():
    client = login(make_user("nobody"))
    for url in ["/", "/attention/", "/runs/x/"]:
        response = client.get(url)
        assert response.status_code == 403
        assert "durable.view_run" in response.content.decode()
        assert "viewer" in response.content.decode()


def test_viewer_sees_runs_but_not_the_inbox(viewer_client):
    assert viewer_client.get("/").status_code == 200
    assert viewer_client.get("/attention/").status_code == 200
    inbox = viewer_client.get("/approvals/")
    assert inbox.status_code == 403 and "approvals.decide_approval" in inbox.content.decode()
    # and the navigation does not offer it
    assert b'href="/approvals/"' not in viewer_client.get("/").content


def test_viewer_cannot_act_and_sees_which_permission_is_missing(viewer_client):
    run = drive(durable.start("dash.fail", {}).id)
    for action in ("cancel", "resume", "compensate", "fork"):
        response = viewer_client.post(f"/runs/{run.id}/{action}/", {"from_step": "first"})
        assert response.status_code == 403, action
        assert "durable.operate_run" in response.content.decode()
    htmx = viewer_client.post(f"/runs/{run.id}/resume/", **HTMX)
    assert htmx.status_code == 403 and b"data-message" in htmx.content
    run.refresh_from_db()
    assert run.status == "failed"


def test_viewer_sees_no_action_buttons(viewer_client, operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    page = viewer_client.get(f"/runs/{run.id}/").content.decode()
    assert "Resume</button>" not in page and "Compensate</button>" not in page
    page = operator_client.get(f"/runs/{run.id}/").content.decode()
    assert "Resume</button>" in page and "Compensate</button>" in page
    assert "Cancel run</button>" not in page  # illegal for a failed run


def test_forged_or_missing_csrf_token_is_refused(operator):
    run = drive(durable.start("dash.fail", {}).id)
    client = login(operator, enforce_csrf_checks=True)
    missing = client.post(f"/runs/{run.id}/resume/")
    assert missing.status_code == 403 and b"could not be verified" in missing.content
    forged = client.post(
        f"/runs/{run.id}/resume/",
        {"csrfmiddlewaretoken": "x" * 64},
        HTTP_X_CSRFTOKEN="y" * 64,
        **HTMX,
    )
    assert forged.status_code == 403
    run.refresh_from_db()
    assert run.status == "failed"
    # with the token from the page (the body's hx-headers) it works
    page = client.get(f"/runs/{run.id}/")
    token = page.context["csrf_token"]
    assert f'"X-CSRFToken": "{token}"' in page.content.decode()
    ok = client.post(f"/runs/{run.id}/resume/", HTTP_X_CSRFTOKEN=str(token), **HTMX)
    assert ok.status_code == 200
    run.refresh_from_db()
    assert run.status == "pending"


def test_get_is_refused_on_actions(operator_client):
    run = drive(durable.start("dash.fail", {}).id)
    assert operator_client.get(f"/runs/{run.id}/cancel/").status_code == 405
    assert operator_client.post("/").status_code == 405
