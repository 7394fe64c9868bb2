"""One execution of a run under a lease (private to the engine): replay, the fenced
checkpoint and ledger writes, retries, parallel groups, model turns, waits parking,
child runs, limits and compensation.
"""
