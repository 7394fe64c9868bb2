"""The one-statement PostgreSQL paths."""
