from __future__ import annotations

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0006_operation_owner")]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                (
                    "id",
                    models.CharField(
                        help_text="host:pid", max_length=200, primary_key=True, serialize=False
                    ),
                ),
                ("hostname", models.CharField(max_length=200)),
                ("pid", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("beat_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
            options={"ordering": ["-beat_at"]},
        )
    ]
