"""Operator state changes, one transaction each (the second public face, after the SDK):
cancel, resume, compensate, signal, reconcile, fork, schedules, retention, export and
the tool table's sync.
"""
