"""Indexes for the dashboard at scale (100k runs): text search and the duration sort.

PostgreSQL only; on other databases (the embedded SQLite default) this migration does
nothing, and the same queries run as before, unindexed.

- **Search** (``?q=``): the runs list matches ``UPPER(col::text) LIKE UPPER('%term%')``
  on the run id, the tags and the input (Django's ``icontains``). A GIN trigram index
  (``pg_trgm``) on each of those three expressions lets PostgreSQL answer the ``OR`` with
  a bitmap of the matching rows instead of reading every run. The expressions are the
  ones Django writes, character for character, so the planner matches them.
- **Duration sort** (``?sort=duration`` / ``-duration``): a finished run's duration is
  ``finished_at - COALESCE(started_at, created_at)``: an expression index over finished
  runs. An unfinished run's duration is ``now - COALESCE(started_at, created_at)``, so
  longest first is oldest start first: a second, partial index over unfinished runs.
  :func:`durable.queries.runs.runs_page` reads one page from each and merges them.
  Expression indexes need no upkeep (no stored column to keep right); the columns they
  name change once per run (start, finish), never on a checkpoint, so checkpoint updates
  stay heap-only (see 0004).
- **Needs attention**: the newest failed runs, ``status IN ('failed',
  'compensation_failed') ORDER BY finished_at DESC, id DESC``: a partial index in that
  order, instead of sorting every failed run.

``pg_trgm`` must be installed in the database. The migration creates it when it is
missing, which needs a superuser or (PostgreSQL 13+, where ``pg_trgm`` is a trusted
extension) a role with CREATE on the database. When it cannot, the migration fails with
a message saying what to run as a superuser (``CREATE EXTENSION pg_trgm;``) before
migrating again: a silent fallback would leave search scanning every run at scale.
"""

from django.db import migrations

TRIGRAM_INDEXES = {
    "run_search_id_trgm": 'UPPER(("id")::text)',
    "run_search_tags_trgm": 'UPPER(("tags")::text)',
    "run_search_input_trgm": 'UPPER(("input")::text)',
}
#: kB of new entries a trigram index keeps in its unsorted pending list (GIN's fast
#: update) before moving them into the index. Every search reads the whole list, so the
#: default (4 MB) cost a search ~20 ms when the list was full; 256 kB bounds that to a
#: couple of ms. Inserts pay the same in total, moved into the index in smaller batches
#: (a run creation that triggers the move does less of it at once than with 4 MB).
PENDING_LIST_KB = 256
DURATION_INDEXES = {
    "run_duration_idx": (
        '(("finished_at" - COALESCE("started_at", "created_at"))) DESC, "id" DESC',
        '"finished_at" IS NOT NULL',
    ),
    "run_unfinished_start_idx": (
        'COALESCE("started_at", "created_at"), "id" DESC',
        '"finished_at" IS NULL',
    ),
    # "needs attention": the newest failed runs (status filter, then finished_at order)
    "run_failed_finished_idx": (
        '"finished_at" DESC, "id" DESC',
        "\"status\" IN ('failed', 'compensation_failed')",
    ),
}

EXTENSION_HELP = (
    "Migration durable.0010_dashboard_indexes needs the PostgreSQL extension pg_trgm "
    "(trigram indexes for the dashboard's text search) and could not create it: {error}. "
    "Run `CREATE EXTENSION pg_trgm;` in this database as a superuser (or as a role with "
    "CREATE on the database, PostgreSQL 13+), then migrate again."
)


class TrigramExtensionMissing(RuntimeError):
    """pg_trgm is not installed and this role may not install it."""


def _ensure_pg_trgm(schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone():
            return
        try:
            cursor.execute("SAVEPOINT durable_pg_trgm")
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            cursor.execute("RELEASE SAVEPOINT durable_pg_trgm")
        except Exception as exc:  # psycopg's InsufficientPrivilege, FeatureNotSupported...
            cursor.execute("ROLLBACK TO SAVEPOINT durable_pg_trgm")
            raise TrigramExtensionMissing(EXTENSION_HELP.format(error=exc)) from exc


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    _ensure_pg_trgm(schema_editor)
    for name, expr in TRIGRAM_INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{name}" ON "durable_run" '
            f"USING gin ({expr} gin_trgm_ops) WITH (gin_pending_list_limit = {PENDING_LIST_KB})"
        )
    for name, (columns, condition) in DURATION_INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{name}" ON "durable_run" ({columns}) WHERE {condition}'
        )


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in [*TRIGRAM_INDEXES, *DURATION_INDEXES]:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [("durable", "0009_schedule")]
    operations = [migrations.RunPython(create_indexes, drop_indexes, elidable=False)]
