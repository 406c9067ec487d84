"""Operations: what orch does to a host (status, pull, tune, serve, bench, run).

Each operation is a function of ``(host, runner, ...)`` that returns a value and records what it
learned in the state file; the CLI fans it out over the fleet and renders the values.
"""
