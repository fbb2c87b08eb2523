"""kdbench.backends."""
