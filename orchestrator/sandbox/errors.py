"""The one error the sandbox raises: the simulated fleet could not be set up or driven."""

from __future__ import annotations

from orchestrator.errors import OrchError


class SandboxError(OrchError):
    """A simulated host could not be prepared or started (sshd missing, port taken, git failed...)."""
