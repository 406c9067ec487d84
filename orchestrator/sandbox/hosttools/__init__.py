"""Programs installed on every simulated host (into ``<root>/bin``).

Each module here is self-contained (standard library only): it is copied onto the host and run there
by the host's interpreter, so it cannot import orch. orch's side may import it to read the same state.
"""
