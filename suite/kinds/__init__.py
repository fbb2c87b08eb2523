"""kdbench.kinds."""
