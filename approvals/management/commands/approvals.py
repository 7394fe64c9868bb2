"""``manage.py approvals <subcommand>``: list and decide approval requests from a shell.

Subcommands: ``pending`` (what a user may decide), ``approve`` and ``reject``. They call
:func:`approvals.services.approval_decide`, as the dashboard does, acting as the user
named by ``--as`` (whose permission, group and four-eyes rule apply). Payloads print
through :func:`durable.values.codec.decode_for_display`: secrets show as ``[REDACTED]``.

Exit codes: 0 done; 2 refused (expired, already decided, changed arguments, not allowed,
an invalid edit), with a message on stderr saying what happened and what to do next.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.edits import InvalidEdit, parse_edit
from approvals.models import ApprovalRequest
from approvals.selectors import pending_for
from approvals.services import AlreadyDecided, ApprovalNotFound, NotAllowed, approval_decide
from durable.exceptions import IllegalTransition, PayloadError

USER_ERROR = 2


class Command(BaseCommand):
    help = "List and decide approval requests (the same service as the dashboard's inbox)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="subcommand", required=True, metavar="subcommand", title="subcommands"
        )
        p = sub.add_parser("pending", help="the pending requests USER may decide")
        p.add_argument("--as", dest="username", required=True, metavar="USER")
        p = sub.add_parser("approve", help="approve a request (optionally with an edit)")
        p.add_argument("request_id", type=int)
        p.add_argument("--as", dest="username", required=True, metavar="USER")
        p.add_argument(
            "--edit",
            default=None,
            metavar="JSON",
            help="approve these arguments instead (a JSON object; leave secret "
            "parameters out: they are kept)",
        )
        p.add_argument(
            "--version",
            type=int,
            default=None,
            metavar="N",
            help="the version of the arguments you reviewed (refused if changed)",
        )
        p.add_argument("--comment", default="")
        p = sub.add_parser("reject", help="reject a request; the agent receives the comment")
        p.add_argument("request_id", type=int)
        p.add_argument("--as", dest="username", required=True, metavar="USER")
        p.add_argument("--comment", required=True)
        p.add_argument("--version", type=int, default=None, metavar="N")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"there is no user {options['username']!r}", returncode=USER_ERROR)
        if options["subcommand"] == "pending":
            self._pending(user)
            return
        edited = None
        if options.get("edit") is not None:
            try:
                edited = parse_edit(options["edit"])
            except InvalidEdit as exc:
                raise CommandError(f"--edit: {exc}", returncode=USER_ERROR) from None
        try:
            req = approval_decide(
                request_id=options["request_id"],
                user=user,
                approve=options["subcommand"] == "approve",
                comment=options["comment"],
                edited=edited,
                version=options["version"],
            )
        except ApprovalNotFound as exc:
            raise CommandError(str(exc), returncode=USER_ERROR) from None
        except (AlreadyDecided, IllegalTransition) as exc:  # expired, decided, changed
            raise CommandError(f"refused, nothing recorded: {exc}", returncode=USER_ERROR) from None
        except NotAllowed as exc:
            raise CommandError(f"not allowed: {exc}", returncode=USER_ERROR) from None
        except (InvalidEdit, PayloadError, ValueError) as exc:
            raise CommandError(str(exc), returncode=USER_ERROR) from None
        if req.status == "pending":
            self.stdout.write(
                f"approval {req.pk}: approval recorded; it needs {req.required_approvals} in all"
            )
        else:
            self.stdout.write(
                f"approval {req.pk}: {req.status} by {req.decided_by}; run {req.run_id} continues"
            )

    def _pending(self, user: Any) -> None:
        requests: list[ApprovalRequest] = list(pending_for(user).select_related("arguments"))
        if not requests:
            self.stdout.write("nothing to decide")
            return
        for req in requests:
            version = req.arguments.number if req.arguments else 1
            shown = req.arguments.value_for_display() if req.arguments else None
            deadline = (
                f" expires {req.expires_at.isoformat(timespec='seconds')}" if req.expires_at else ""
            )
            self.stdout.write(f"{req.pk}\t{req.title}\trun {req.run_id}\tv{version}{deadline}")
            self.stdout.write("\t" + json.dumps(shown, ensure_ascii=False, default=str)[:2000])
