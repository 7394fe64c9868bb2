"""The implementation of ``manage.py durable``, kept out of ``management/commands/``.

The command module (:mod:`durable.management.commands.durable`) holds only the
``Command`` class and its argument wiring; every module there is a command Django would
list, so the subcommands live here: :mod:`.text` (formatting, parsing, exit codes),
:mod:`.inspection` (what is read: workflows, runs, show) and :mod:`.actions` (what
changes state: start, the run transitions, sweep, reconcile).
"""
