"""The E-series variants; importing this package registers them."""
from . import e0, e1  # noqa: F401
