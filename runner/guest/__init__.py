"""Code that runs inside the guest (in the Harbor venv or as a script over SSH): the Harbor agent
classes, the scripts they run, how a harness is pointed at the proxy, the state collector.
Imports only runner.core and runner.spec, so it runs with pydantic alone beside Harbor."""
