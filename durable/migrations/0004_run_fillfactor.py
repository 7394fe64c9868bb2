"""Leave room in durable_run's pages so checkpoint updates stay HOT on PostgreSQL.

A checkpoint updates a run row without touching an indexed column; with free space in
the page, PostgreSQL writes the new row version there and no index entry at all
(a heap-only tuple). Other databases ignore this migration.
"""

from django.db import migrations


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE durable_run SET (fillfactor = 85)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE durable_run RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("durable", "0003_llm_tokens")]
    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor, elidable=False)]
