"""Sample workflows and tools. ``examples.hello`` is the demo that ``make up`` starts."""
