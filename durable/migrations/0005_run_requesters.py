"""Record who started each run and who its four-eyes requesters are.

Existing runs get their starter's username (or "unknown"), and a fork inherits its
source's requesters, as new runs do (durable/requesters.py).
"""

from django.db import migrations, models


def backfill(apps, schema_editor):
    Run = apps.get_model("durable", "Run")
    requesters = {}
    for run in (
        Run.objects.select_related("started_by")
        .order_by("created_at", "id")
        .iterator(chunk_size=500)
    ):
        user = run.started_by
        first = (
            {"user": user.pk, "name": user.username[:200]}
            if user is not None
            else {"user": None, "name": ""}
        )
        chain = [first] + [p for p in requesters.get(run.forked_from_id, []) if p != first]
        requesters[run.id] = chain
        Run.objects.filter(pk=run.pk).update(started_by_name=first["name"], requesters=chain)


class Migration(migrations.Migration):
    dependencies = [("durable", "0004_run_fillfactor")]
    operations = [
        migrations.AddField(
            model_name="run",
            name="started_by_name",
            field=models.CharField(
                blank=True,
                default="",
                max_length=200,
                help_text="who started the run; empty: unknown",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="requesters",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="four-eyes requesters: [{user, name}], the starter then (for a "
                "fork) the source run's requesters",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
