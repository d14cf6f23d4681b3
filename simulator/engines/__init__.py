"""One module per simulated engine, registered explicitly in simulator.server."""
