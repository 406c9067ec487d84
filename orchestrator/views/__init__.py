"""All of orch's rendering: what each command shows, given the values its operation returned (one module
per command family). Commands in ``orchestrator.cli`` parse flags, call an operation and hand its result here;
nothing here contacts a host or changes the state."""
