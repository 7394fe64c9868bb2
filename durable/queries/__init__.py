"""The operator's reads that are not shaped for one page, shared by the dashboard and the
JSON API: the runs list's filters, keyset pages and cursors, status counts, "needs
attention" and a run's duration (``runs.py``), and the strict parsing of what a request
carries (``parsing.py``: bounded integers, dates and JSON, the path converters), so that
malformed input is answered with a message, never a 500, and a run's live stream as its
readers read it (``streams.py``: ``durable.stream`` and the API's server-sent events).
Neither web app imports the other (docs/architecture.md#layers); both read through here.
"""
