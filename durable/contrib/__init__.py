"""Optional integrations of Durable with other frameworks (each behind its own extra)."""
