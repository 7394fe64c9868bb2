from django.apps import AppConfig


class McpConfig(AppConfig):
    """Registers the MCP call workflow (``workflows.py``); imports no ``mcp`` SDK."""

    name = "durable.contrib.mcp"
    label = "durable_mcp"
    verbose_name = "Durable MCP"
