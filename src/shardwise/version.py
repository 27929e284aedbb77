"""shardwise's version, in a module of its own: a layer reads it here, as no layer imports the top package (it
registers the readers of plan URIs from above every layer: `shardwise.plan_readers`)."""

__version__ = "0.1.0"
