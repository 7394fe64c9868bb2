"""Create the dashboard's groups (viewer, operator, approver, admin) and the
``durable.operate_run`` permission. See :mod:`approvals.roles`."""

from __future__ import annotations

from django.db import migrations


def create_roles(apps, schema_editor):
    from approvals.roles import ensure_roles

    ensure_roles(apps)


class Migration(migrations.Migration):
    dependencies = [  # noqa: RUF012
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("durable", "0001_initial"),
        ("approvals", "0001_initial"),
    ]

    operations = [  # noqa: RUF012
        migrations.RunPython(create_roles, migrations.RunPython.noop)
    ]
