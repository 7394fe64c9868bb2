"""A password hasher for the test process: PBKDF2 with one iteration.

Django's default PBKDF2 (1,000,000 iterations in 5.2) costs about 0.3 s of CPU a
password, and the suite's fixtures create users by the thousand: that was a third of
the approvals and dashboard tests' time. The algorithm keeps Django's name,
``pbkdf2_sha256``, and a hash carries its own iteration count, so a password set here
still verifies in a process that runs the real settings (the browser tests' daphne,
which logs in by password) -- where Django's ``must_update`` re-hashes it at full
strength on that first login. Enabled for the whole session in ``tests/conftest.py``;
the product's settings are untouched.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1


HASHERS = [f"{__name__}.OneIterationPBKDF2PasswordHasher"]
