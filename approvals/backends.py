"""The users' permissions in one query, for ``user.has_perm``.

Django's ``ModelBackend`` reads a user's permissions in two queries (the user's own, then
its groups'), once per request, since each request loads its user afresh: two of the five
queries of the API's runs list. :class:`PermissionsInOneQuery` reads the same set with
one ``UNION`` and keeps it where ``ModelBackend`` keeps it (``user._perm_cache``), so
that ``ModelBackend``, after it in ``AUTHENTICATION_BACKENDS``, answers from it too and
reads nothing (a refusal asks every backend).

It authenticates nobody: a login is still ``ModelBackend``'s, and the sessions keep
naming ``ModelBackend`` as their backend, so that the sessions made before it was added
stay valid.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission


class PermissionsInOneQuery(ModelBackend):
    """``ModelBackend``'s answers to ``has_perm`` and ``get_all_permissions`` (a set of
    ``"app_label.codename"``; empty for an inactive or anonymous user or with ``obj``),
    read in one query; ``authenticate`` always answers ``None``."""

    def authenticate(
        self, request: Any, username: Any = None, password: Any = None, **kw: Any
    ) -> None:
        return None

    async def aauthenticate(
        self, request: Any, username: Any = None, password: Any = None, **kw: Any
    ) -> None:
        return None

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            if user_obj.is_superuser:  # every permission, as ModelBackend says
                rows = Permission.objects.values_list("content_type__app_label", "codename")
            else:
                own = Permission.objects.filter(user=user_obj)
                groups = Permission.objects.filter(group__in=user_obj.groups.all())
                rows = (
                    own.values_list("content_type__app_label", "codename")
                    .order_by()
                    .union(groups.values_list("content_type__app_label", "codename").order_by())
                )
            user_obj._perm_cache = {f"{app}.{codename}" for app, codename in rows}
        return user_obj._perm_cache
