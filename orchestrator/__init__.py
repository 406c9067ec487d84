"""orch: run a fleet of SGLang GPU inference hosts over SSH."""

__version__ = "0.1.0"
