"""The process around executions: claiming, executing and releasing runs (engine), the
lease heartbeat, database connection care, the sweeper, and the thin Celery tasks.
"""
