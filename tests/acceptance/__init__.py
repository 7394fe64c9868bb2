"""Acceptance cases from outside: an outside tester's cases for issue 27's capabilities (keys,
cancel, held slots, retention and parent-close, deadlines, cron across DST, failure
reasons, fair admission, the web's connection pool, identifiers), each taken from a public
bug report of a tool that does the same job, named in its docstring."""
