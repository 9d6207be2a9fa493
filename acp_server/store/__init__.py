"""The durable store (placeholder docstring, rewritten below)."""
