"""The runs list's search (``?q=``) also matches a run's output: a GIN trigram index on
``UPPER(output::text)``, the expression Django writes for ``output__icontains``, beside
the three of 0010 (id, tags, input), so the ``OR`` stays a bitmap of index matches.

PostgreSQL only (``pg_trgm``, which 0010 installed); nothing on other databases. An
output is written once, when the run ends, so the index costs a run's completion one
entry in the index's pending list (``gin_pending_list_limit``, as in 0010), never a
checkpoint. A redacted value is stored encrypted and is not found by search.
"""

from django.db import migrations

NAME = "run_search_output_trgm"
EXPRESSION = 'UPPER(("output")::text)'
#: kB of the index's pending list, as for the other trigram indexes (0010)
PENDING_LIST_KB = 256


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f'CREATE INDEX IF NOT EXISTS "{NAME}" ON "durable_run" '
        f"USING gin ({EXPRESSION} gin_trgm_ops) WITH (gin_pending_list_limit = {PENDING_LIST_KB})"
    )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{NAME}"')


class Migration(migrations.Migration):
    dependencies = [("durable", "0019_stream_event_kinds")]
    operations = [migrations.RunPython(create_index, drop_index, elidable=False)]
