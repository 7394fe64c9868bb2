"""The dashboard's own table: the runs list's saved views. Everything else it shows is
Durable's, read and changed through services.

(The module also makes Django send ``post_migrate`` for the app, which lets
:mod:`approvals.roles` re-create the role groups after ``flush``.)
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from durable.values.fields import StorableCharField

#: the longest name of a saved view, and of its query text
VIEW_NAME_MAX = 80
VIEW_QUERY_MAX = 2000


class SavedView(models.Model):
    """A named set of the runs list's filters (``query``: the list's query string, with
    only the filters it understands). Personal, or ``shared`` with everyone who may see
    the dashboard; only its owner (or staff) renames or deletes it."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views"
    )
    # a person's text: NUL and lone surrogates refused as on every text column
    name = StorableCharField(max_length=VIEW_NAME_MAX)
    query = StorableCharField(max_length=VIEW_QUERY_MAX, blank=True, default="")
    shared = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name", "id")
        constraints = (
            models.UniqueConstraint(fields=("owner", "name"), name="saved_view_owner_name"),
        )
        indexes = (models.Index(fields=("shared", "name"), name="saved_view_shared_idx"),)

    def __str__(self) -> str:
        return f"{self.name} ({self.owner})"
