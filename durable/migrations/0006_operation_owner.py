"""Which run answers for a write: a fork adopts the writes it reuses (docs/compensation.md).

Existing rows keep an empty owner, which means the run that made the write.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0005_run_requesters")]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="owner_run",
            field=models.ForeignKey(
                blank=True,
                help_text="the fork that adopted this write and answers for it (compensation); empty: the run that made it",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="adopted_operations",
                to="durable.run",
            ),
        ),
        migrations.AddField(
            model_name="operation",
            name="owners",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="ownership history: [{run, from, at, by}], oldest first",
            ),
        ),
    ]
