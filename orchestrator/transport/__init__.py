"""Transport: how orch runs commands on a host.

``base`` defines the ``Runner`` interface every operation uses; ``ssh`` (with ``sshconfig``, the only
modules that import paramiko) and ``local`` implement it. ``connect`` picks one for a host of the inventory.
"""
