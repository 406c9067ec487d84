"""Transport: how orch runs commands on a host.

``base`` defines the ``Runner`` interface every operation uses; ``ssh`` (the only module that imports
fabric/paramiko) and ``local`` implement it. ``connect`` picks one for a host of the inventory.
"""
