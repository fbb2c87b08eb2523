"""kdbench.model."""
