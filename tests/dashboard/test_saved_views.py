"""Named saved views of the runs list (issue 31, item 2): personal or shared, applied
with one click, renamed and deleted by their owner; only the list's own filters kept."""

from __future__ import annotations

import re

import pytest

from dashboard.models import SavedView
from tests.dashboard.conftest import HTMX, login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def links(page: str) -> dict[str, str]:
    """view name -> its href, from the saved views' navigation."""
    nav = page.split('id="view-links"', 1)[1].split("</nav>", 1)[0]
    return {
        re.sub(r"<[^>]+>", "", text).split("·")[0].strip(): href.replace("&amp;", "&")
        for href, text in re.findall(r'<a href="([^"]+)"[^>]*>(.*?)</a>', nav, re.S)
    }


def test_save_apply_and_mark_the_current_view(viewer_client, viewer):
    saved = viewer_client.post(
        "/views/save/",
        {
            "name": "  Failed   refunds ",
            "query": "status=failed&workflow=shop.refund&after=xyz&before=abc&bogus=1",
        },
    )
    assert saved.status_code == 302 and saved["Location"] == "/?status=failed&workflow=shop.refund"
    view = SavedView.objects.get(owner=viewer)
    assert (view.name, view.query, view.shared) == (
        "Failed refunds",
        "status=failed&workflow=shop.refund",
        False,
    )
    page = viewer_client.get("/").content.decode()
    assert links(page) == {"Failed refunds": "/?status=failed&workflow=shop.refund"}
    assert 'aria-current="page">Failed refunds' not in page
    current = viewer_client.get("/?workflow=shop.refund&status=failed").content.decode()
    assert 'aria-current="page">Failed refunds' in current  # the same filters, any order
    # the filters changed by htmx: the fragment carries the views and the query to save
    fragment = viewer_client.get("/?status=failed&workflow=shop.refund", **HTMX).content.decode()
    assert 'id="view-links" hx-swap-oob="true"' in fragment
    assert 'id="view-query" value="status=failed&amp;workflow=shop.refund"' in fragment
    # saving under the same name again replaces its filters
    viewer_client.post("/views/save/", {"name": "Failed refunds", "query": "status=cancelled"})
    assert SavedView.objects.get(owner=viewer).query == "status=cancelled"


def test_personal_views_are_private_and_shared_ones_need_an_operator(viewer_client, operator):
    ops = login(operator)
    ops.post("/views/save/", {"name": "Team: stuck", "query": "status=waiting", "shared": "1"})
    ops.post("/views/save/", {"name": "Mine only", "query": "status=running"})
    seen = links(viewer_client.get("/").content.decode())
    assert seen == {"Team: stuck": "/?status=waiting"}
    refused = viewer_client.post(
        "/views/save/", {"name": "Everyone", "query": "status=failed", "shared": "1"}
    )
    assert refused.status_code == 422 and "needs the operator role" in refused.content.decode()
    assert not SavedView.objects.filter(name="Everyone").exists()


def test_only_the_owner_renames_or_deletes(viewer_client, operator):
    ops = login(operator)
    ops.post("/views/save/", {"name": "Shared", "query": "status=waiting", "shared": "1"})
    ops.post("/views/save/", {"name": "Private", "query": "status=running"})
    shared = SavedView.objects.get(name="Shared")
    private = SavedView.objects.get(name="Private")
    assert viewer_client.post(f"/views/{shared.pk}/delete/").status_code == 403
    assert viewer_client.post(f"/views/{shared.pk}/rename/", {"name": "x"}).status_code == 403
    assert viewer_client.post(f"/views/{private.pk}/delete/").status_code == 404
    assert SavedView.objects.count() == 2
    assert ops.post(f"/views/{shared.pk}/rename/", {"name": "Waiting runs"}).status_code == 302
    assert SavedView.objects.get(pk=shared.pk).name == "Waiting runs"
    clash = ops.post(f"/views/{shared.pk}/rename/", {"name": "Private"})
    assert clash.status_code == 422 and "already a view named" in clash.content.decode()
    # the error is beside the rename form that was sent, which keeps the name typed
    body = clash.content.decode()
    assert f'id="rename-error-{shared.pk}"' in body and 'id="view-error"' not in body
    assert 'value="Private" required aria-invalid="true"' in body
    blank = ops.post(f"/views/{shared.pk}/rename/", {"name": "   "})
    assert blank.status_code == 422 and "Give the view a name" in blank.content.decode()
    assert SavedView.objects.get(pk=shared.pk).name == "Waiting runs"
    assert ops.post(f"/views/{private.pk}/delete/").status_code == 302
    assert list(SavedView.objects.values_list("name", flat=True)) == ["Waiting runs"]
    admin = login(make_user("root", is_staff=True, is_superuser=True))
    assert admin.post(f"/views/{shared.pk}/delete/").status_code == 302  # staff may


@pytest.mark.parametrize(
    "form,says",
    [
        ({"name": "", "query": "status=failed"}, "Give the view a name"),
        ({"name": "x" * 81, "query": ""}, "at most 80"),
        ({"name": "bad", "query": "status=exploded"}, "“status” cannot be saved"),
        ({"name": "bad", "query": "retries=-4"}, "“retries” cannot be saved"),
    ],
)
def test_bad_input_is_a_422_beside_the_form_and_saves_nothing(viewer_client, form, says):
    response = viewer_client.post("/views/save/", form)
    assert response.status_code == 422
    body = response.content.decode()
    assert says in body and 'id="view-error"' in body
    assert not SavedView.objects.exists()


def test_get_is_refused_and_anonymous_users_go_to_login(client, viewer_client):
    assert viewer_client.get("/views/save/").status_code == 405
    response = client.post("/views/save/", {"name": "x", "query": ""})
    assert response.status_code in (302, 403) and not SavedView.objects.exists()


def test_a_name_with_a_nul_is_stored_on_every_database(viewer_client, viewer):
    response = viewer_client.post("/views/save/", {"name": "nul\x00view", "query": "q=ab"})
    assert response.status_code == 302
    assert SavedView.objects.filter(owner=viewer).count() == 1


def test_forged_posts_by_another_user_change_nothing(viewer_client, viewer, operator):
    """Another viewer's personal view is not there for you (404), whatever the form; a
    post without the CSRF token is refused before it is read (403)."""
    mine = login(make_user("vic", "viewer"))
    mine.post("/views/save/", {"name": "Mine", "query": "status=failed"})
    view = SavedView.objects.get(name="Mine")
    assert viewer_client.post(f"/views/{view.pk}/delete/").status_code == 404
    assert viewer_client.post(f"/views/{view.pk}/rename/", {"name": "Gone"}).status_code == 404
    assert viewer_client.post("/views/999999/delete/").status_code == 404
    strict = login(view.owner, enforce_csrf_checks=True)
    assert strict.post(f"/views/{view.pk}/delete/").status_code == 403
    assert strict.post("/views/save/", {"name": "No token", "query": ""}).status_code == 403
    assert list(SavedView.objects.values_list("name", flat=True)) == ["Mine"]


def test_a_name_is_unique_per_owner_not_across_owners(viewer_client, viewer, operator):
    ops = login(operator)
    ops.post("/views/save/", {"name": "Failed", "query": "status=failed", "shared": "1"})
    assert viewer_client.post("/views/save/", {"name": "Failed", "query": "q=x"}).status_code == 302
    assert SavedView.objects.filter(name="Failed").count() == 2
    # saving again under a name you use replaces that view's filters, not a second view
    again = viewer_client.post("/views/save/", {"name": "Failed", "query": "status=cancelled"})
    assert again.status_code == 302 and SavedView.objects.filter(owner=viewer).count() == 1
    assert SavedView.objects.get(owner=viewer).query == "status=cancelled"
    # yours first, then the shared ones, with their owner's name
    page = viewer_client.get("/").content.decode()
    nav = page.split('id="view-links"', 1)[1].split("</nav>", 1)[0]
    assert nav.index("/?status=cancelled") < nav.index("/?status=failed")
    assert f"shared by {operator.get_username()}" in nav


def test_the_admin_lists_and_searches_every_view(viewer_client, viewer):
    viewer_client.post("/views/save/", {"name": "Refunds", "query": "q=refund"})
    view = SavedView.objects.get()
    admin = login(make_user("root", is_staff=True, is_superuser=True))
    listing = admin.get("/admin/dashboard/savedview/?q=refund").content.decode()
    assert "Refunds" in listing and viewer.get_username() in listing
    assert admin.get(f"/admin/dashboard/savedview/{view.pk}/change/").status_code == 200
