"""Who asked for an approval: the run's requesters (its starter, a fork's source chain)
and the names the workflow gave, so that four-eyes can refuse every one of them.

Existing requests get their ``requested_by`` account, or "unknown" when it was empty.
"""

from django.db import migrations, models


def backfill(apps, schema_editor):
    ApprovalRequest = apps.get_model("approvals", "ApprovalRequest")
    for req in ApprovalRequest.objects.select_related("requested_by").iterator(chunk_size=500):
        user = req.requested_by
        first = (
            {"user": user.pk, "name": user.username[:200]}
            if user is not None
            else {"user": None, "name": ""}
        )
        ApprovalRequest.objects.filter(pk=req.pk).update(requesters=[first])


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_approval_argument_versions")]
    operations = [
        migrations.AddField(
            model_name="approvalrequest",
            name="requesters",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="who asked (durable/requesters.py): the run's requesters and the "
                "names the workflow gave; with four_eyes none of them may approve",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
