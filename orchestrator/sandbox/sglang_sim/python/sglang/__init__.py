"""SGLang (simulated). See README.md at the top of the checkout."""

from sglang.version import __version__

__all__ = ["__version__"]
