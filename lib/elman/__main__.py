"""`python -m elman ...` (also what `torchrun -m elman train ...` runs)."""
import sys

from .cli import main

sys.exit(main())
