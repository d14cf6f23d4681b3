"""The collector's HTTP routes, one router per concern; :func:`inferwatch.collector.app.create_app` mounts them."""
