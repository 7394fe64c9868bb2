"""Benchmarks of Durable against DBOS Transact, LangGraph and the commit floor.

``python -m bench`` (see bench/README.md).
"""
