"""kdbench.engine."""
