"""One package per simulated engine (API, metrics and spans modules), registered explicitly in simulator.server."""
