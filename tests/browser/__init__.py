"""Browser tests: headless Chromium driving the real dashboard (see conftest.py)."""
