"""The application layer: one module per `shardwise` verb, each a settings model (the only home of that
verb's defaults) and `run(settings) -> result`. The CLI, a config file and a pipeline step all build the same
settings and call the same `run`; results render a terminal summary and serialise to JSON.

Importing this package is cheap; each job module imports what its verb needs.
"""
