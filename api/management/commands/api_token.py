"""``manage.py api_token``: make an API token from a shell (docs/api.md#authentication).

For scripts and CI, where nobody opens the dashboard's API tokens page: the token is
made for an existing user, with the scopes named, and printed once on stdout (only its
digest is stored). ``--expires-days N`` makes it expire. Errors (an unknown user, no or
unknown scopes, a bad name) exit with status 2 and say what to change.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from api.models import token_create
from api.scopes import SCOPES


class Command(BaseCommand):
    help = "Make an API token for a user and print it (shown only now)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="the username the token acts as")
        parser.add_argument("--name", required=True, help="what the token is for (1-100 chars)")
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            metavar="SCOPE",
            help=f"a scope (repeat for several): {', '.join(SCOPES)}",
        )
        parser.add_argument(
            "--expires-days", type=int, default=None, metavar="N", help="expire in N days (> 0)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"--user: there is no user {options['user']!r}", returncode=2)
        expires_at = None
        days = options["expires_days"]
        if days is not None:
            if days <= 0:
                raise CommandError("--expires-days: give a number of days > 0", returncode=2)
            expires_at = timezone.now() + timedelta(days=days)
        try:
            token, text = token_create(
                user=user, name=options["name"], scopes=options["scope"], expires_at=expires_at
            )
        except ValueError as exc:
            raise CommandError(f"--{exc}", returncode=2) from None
        self.stderr.write(
            f"token {token.name!r} for {user.get_username()} ({', '.join(token.scopes)}); "
            "it is shown only now:"
        )
        self.stdout.write(text)
