"""The E-series variants, one module each; `elman.registry` collects their `ENTRIES`."""
from . import e0, e1

MODULES = (e0, e1)
