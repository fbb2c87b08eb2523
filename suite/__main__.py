"""`python -m kdbench` = the kdbench command."""
import sys

from kdbench.cli import main

sys.exit(main())
