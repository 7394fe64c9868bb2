"""Closing waits and waking runs: resolving, expiring and cancelling wait rows, where a
signal went (mailbox) and a child's end reaching its parent. Below the runtime and the
services, which both call it.
"""
