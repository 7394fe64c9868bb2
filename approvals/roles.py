"""The roles: four groups and the permissions they hold, for the dashboard and the API.

They live here, below both web apps, because both check them and neither may import the
other (docs/architecture.md#layers); approving is one of the four. ``durable`` declares
no permission for operating runs and no web app edits its models, so
``durable.operate_run`` is created here as a Permission row on the content type of
:class:`durable.models.Run` (like the default ``durable.view_run``).

:func:`ensure_roles` creates what is missing and never removes anything an administrator
added. It runs from the dashboard's data migration ``0001_roles`` and again after every ``migrate``
or ``flush`` (a ``post_migrate`` receiver), because ``flush`` -- which transactional
tests run between tests -- deletes the rows a data migration made.
"""

from __future__ import annotations

from typing import Any

#: permission names used by the views, as ``user.has_perm`` expects them
VIEW_RUN = "durable.view_run"
OPERATE_RUN = "durable.operate_run"
DECIDE_APPROVAL = "approvals.decide_approval"

#: (app_label, model, codename) -> human name
PERMISSIONS: dict[tuple[str, str, str], str] = {
    ("durable", "run", "view_run"): "Can view run",
    ("durable", "run", "operate_run"): "Can cancel, compensate, resume, fork and reconcile runs",
    ("approvals", "approvalrequest", "decide_approval"): "Can approve or reject pending actions",
    ("approvals", "approvalrequest", "view_approvalrequest"): "Can view approval request",
    ("approvals", "approvaldecision", "view_approvaldecision"): "Can view approval decision",
    ("durable", "step", "view_step"): "Can view step",
    ("durable", "stepattempt", "view_stepattempt"): "Can view step attempt",
    ("durable", "operation", "view_operation"): "Can view operation",
    ("durable", "wait", "view_wait"): "Can view wait",
    ("durable", "signal", "view_signal"): "Can view signal",
    ("durable", "traceevent", "view_traceevent"): "Can view trace event",
    ("durable", "tool", "view_tool"): "Can view tool",
    ("durable", "tool", "change_tool"): "Can change tool",
}

_VIEW = [("durable", "run", "view_run")]
_OPERATE = [("durable", "run", "operate_run")]
_DECIDE = [("approvals", "approvalrequest", "decide_approval")]

#: group name -> permissions (keys of PERMISSIONS)
ROLES: dict[str, list[tuple[str, str, str]]] = {
    "viewer": _VIEW,
    "operator": _VIEW + _OPERATE,
    "approver": _VIEW + _DECIDE,
    "admin": list(PERMISSIONS),
}


def ensure_roles(apps: Any = None) -> None:
    """Create the role groups and their permissions where missing (idempotent).

    ``apps``: the historical app registry of a migration, or ``None`` for the live one.
    """
    if apps is None:
        from django.apps import apps as live_apps

        apps = live_apps
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    # a few queries however many roles: read what exists, create only what is missing
    # (get_or_create, so that two processes migrating at once both succeed)
    labels = {app_label for app_label, _, _ in PERMISSIONS}
    types = {
        (ct.app_label, ct.model): ct for ct in ContentType.objects.filter(app_label__in=labels)
    }
    found = {
        (p.content_type_id, p.codename): p
        for p in Permission.objects.filter(content_type__in=list(types.values()))
    }
    perms = {}
    for (app_label, model, codename), name in PERMISSIONS.items():
        ct = types.get((app_label, model))
        if ct is None:
            ct, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
            types[(app_label, model)] = ct
        perm = found.get((ct.pk, codename))
        if perm is None:
            perm, _ = Permission.objects.get_or_create(
                content_type=ct, codename=codename, defaults={"name": name}
            )
        perms[(app_label, model, codename)] = perm
    groups = {g.name: g for g in Group.objects.filter(name__in=list(ROLES))}
    Through = Group.permissions.through
    links = []
    for group_name, keys in ROLES.items():
        group = groups.get(group_name) or Group.objects.get_or_create(name=group_name)[0]
        links += [Through(group_id=group.pk, permission_id=perms[key].pk) for key in keys]
    Through.objects.bulk_create(links, ignore_conflicts=True)  # the pair is unique


def ensure_roles_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """``post_migrate`` receiver (also sent by ``flush``)."""
    from django.contrib.auth.models import Group
    from django.db import router

    if not router.allow_migrate_model(using, Group):
        return
    ensure_roles()
