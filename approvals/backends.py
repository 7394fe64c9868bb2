"""The users' permissions in one query, for ``user.has_perm``.

Django's ``ModelBackend`` reads a user's permissions in two queries (the user's own, then
its groups'), once per request, since each request loads its user afresh: two of the five
queries of the API's runs list. :class:`PermissionsInOneQuery` reads the same set with
one query and keeps it where ``ModelBackend`` keeps it (``user._perm_cache``), so
that ``ModelBackend``, after it in ``AUTHENTICATION_BACKENDS``, answers from it too and
reads nothing (a refusal asks every backend).

The query is SQL written once from the models' tables (:func:`_permissions_sql`): built
by the ORM as a ``UNION`` it cost 0.6 ms of CPU to compile at every request, sent as
text ~0.1 ms; tests/approvals/test_permission_backend.py holds its answers equal to
``ModelBackend``'s.

It authenticates nobody: a login is still ``ModelBackend``'s, and the sessions keep
naming ``ModelBackend`` as their backend, so that the sessions made before it was added
stay valid.
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connections, router


@functools.cache
def _permissions_sql(alias: str) -> str:
    """The SQL of a user's permissions, its own and its groups' (parameters: the user's
    id twice), as ``(app_label, codename)`` rows, for the database ``alias``; names
    quoted for it and taken from the models (so a custom user model works)."""
    q = connections[alias].ops.quote_name
    user_model = get_user_model()
    own = user_model._meta.get_field("user_permissions")
    groups = user_model._meta.get_field("groups")
    granted = Group._meta.get_field("permissions")
    perm, ct = Permission._meta, ContentType._meta
    content_type = perm.get_field("content_type").column
    return (
        f"SELECT c.{q('app_label')}, p.{q('codename')} FROM {q(perm.db_table)} p "
        f"JOIN {q(ct.db_table)} c ON c.{q(ct.pk.column)} = p.{q(content_type)} "
        f"WHERE p.{q(perm.pk.column)} IN ("
        f"SELECT u.{q(own.m2m_reverse_name())} FROM {q(own.m2m_db_table())} u "
        f"WHERE u.{q(own.m2m_column_name())} = %s "
        f"UNION ALL SELECT g.{q(granted.m2m_reverse_name())} FROM {q(granted.m2m_db_table())} g "
        f"JOIN {q(groups.m2m_db_table())} m ON m.{q(groups.m2m_reverse_name())} = "
        f"g.{q(granted.m2m_column_name())} WHERE m.{q(groups.m2m_column_name())} = %s)"
    )


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
            rows: Any
            if user_obj.is_superuser:  # every permission, as ModelBackend says
                rows = Permission.objects.values_list("content_type__app_label", "codename")
            else:
                alias = router.db_for_read(Permission)
                with connections[alias].cursor() as cursor:
                    cursor.execute(_permissions_sql(alias), [user_obj.pk, user_obj.pk])
                    rows = cursor.fetchall()
            user_obj._perm_cache = {f"{app}.{codename}" for app, codename in rows}
        return user_obj._perm_cache
