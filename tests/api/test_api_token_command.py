"""``manage.py api_token``: an API token made from a shell works as one made on the
dashboard's page, and bad arguments say what to change."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def make(*args: str) -> str:
    out = io.StringIO()
    call_command("api_token", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_a_token_made_in_a_shell_reads_runs_through_the_api(client):
    user = User.objects.create_user("ci")
    user.groups.add(Group.objects.get(name="viewer"))
    text = make("--user", "ci", "--name", "ci job", "--scope", "runs:read")
    assert text.startswith("dur_")
    ok = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {text}"})
    assert ok.status_code == 200
    refused = client.post(
        "/api/v1/runs",
        {},
        content_type="application/json",
        headers={"Authorization": f"Bearer {text}"},
    )
    assert refused.status_code == 403  # only the scope it was given


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--user", "nobody", "--name", "x", "--scope", "runs:read"], "--user: there is no user"),
        (["--user", "ci", "--name", "x"], "--scopes: none given"),
        (["--user", "ci", "--name", "x", "--scope", "runs:everything"], "'runs:everything'"),
        (["--user", "ci", "--name", " ", "--scope", "runs:read"], "--name: give the token"),
        (["--user", "ci", "--name", "x", "--scope", "runs:read", "--expires-days", "0"], "> 0"),
    ],
)
def test_bad_arguments_exit_2_and_say_what_to_change(args, says):
    User.objects.create_user("ci")
    with pytest.raises(CommandError, match=None) as caught:
        make(*args)
    assert caught.value.returncode == 2 and says in str(caught.value)
