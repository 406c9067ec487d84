"""Operations: what orch does to a host (status, pull, serve, bench, report, run, logs).

Each operation takes the host's ``HostSession`` (``orchestrator.session``: the host, its runner, the
state store, and the facts read from the host so far), the recipe and its options:
``op(session, recipe, options)``. It returns a value and records what it learned through the state's
event methods (``HostState.pulled()``, ``server_verified()``...); the CLI fans it out over the fleet
(``Fleet.map_sessions``) and renders the values. Tuning is its own package, ``orchestrator.tuning``;
stopping orch's server, which serve, status, tuning and run all do, is ``orchestrator.server_job``, below
them, so no operation imports another for it.
"""
