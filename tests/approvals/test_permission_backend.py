"""approvals.backends.PermissionsInOneQuery: ModelBackend's permissions, in one query.

The same answers as Django's ModelBackend for a user's own permissions, its groups',
an inactive user, a superuser and an anonymous one; one query a request where
ModelBackend read two; logins and their sessions still ModelBackend's.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser, Group, Permission, User
from django.test import Client

from approvals.backends import PermissionsInOneQuery
from approvals.roles import DECIDE_APPROVAL, OPERATE_RUN, VIEW_RUN

pytestmark = pytest.mark.django_db


def _fresh(user: User) -> User:
    return User.objects.get(pk=user.pk)  # no permission cache, as a new request's user


def _perm(name: str) -> Permission:
    app, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app, codename=codename)


@pytest.fixture
def users() -> dict[str, User]:
    own = User.objects.create_user("own")
    own.user_permissions.add(_perm(VIEW_RUN))
    grouped = User.objects.create_user("grouped")
    group = Group.objects.create(name="test-deciders")
    group.permissions.add(_perm(DECIDE_APPROVAL), _perm(VIEW_RUN))
    grouped.groups.add(group)
    grouped.user_permissions.add(_perm(OPERATE_RUN))
    inactive = User.objects.create_user("inactive", is_active=False)
    inactive.user_permissions.add(_perm(VIEW_RUN))
    return {
        "own": own,
        "grouped": grouped,
        "inactive": inactive,
        "nobody": User.objects.create_user("nobody"),
        "root": User.objects.create_superuser("root"),
    }


def test_the_same_permissions_as_model_backend(users):
    ours, django = PermissionsInOneQuery(), ModelBackend()
    for name, user in users.items():
        expected = django.get_all_permissions(_fresh(user))
        assert ours.get_all_permissions(_fresh(user)) == expected, name
        for perm in (VIEW_RUN, OPERATE_RUN, DECIDE_APPROVAL, "api.change_webhooksubscription"):
            assert ours.has_perm(_fresh(user), perm) == django.has_perm(_fresh(user), perm)
    assert ours.get_all_permissions(AnonymousUser()) == set()
    assert ours.get_all_permissions(_fresh(users["own"]), obj=object()) == set()
    assert users["grouped"].has_perm(DECIDE_APPROVAL) and not users["own"].has_perm(OPERATE_RUN)


def test_a_permission_check_reads_one_query_granted_or_refused(users, django_assert_num_queries):
    granted = _fresh(users["grouped"])
    with django_assert_num_queries(1):
        assert granted.has_perm(OPERATE_RUN) and granted.has_perm(DECIDE_APPROVAL)
    refused = _fresh(users["own"])
    with django_assert_num_queries(1):  # ModelBackend, asked too, reads the same cache
        assert not refused.has_perm(OPERATE_RUN)


def test_logins_and_their_sessions_stay_model_backends(users):
    users["own"].set_password("a long password 1")
    users["own"].save()
    client = Client()
    form = {"username": "own", "password": "a long password 1"}
    assert client.post("/accounts/login/", form).status_code == 302
    assert client.session[BACKEND_SESSION_KEY] == "django.contrib.auth.backends.ModelBackend"
    assert PermissionsInOneQuery().authenticate(None, "own", "a long password 1") is None
    form["password"] = "wrong"
    assert Client().post("/accounts/login/", form).status_code == 200  # the form again
