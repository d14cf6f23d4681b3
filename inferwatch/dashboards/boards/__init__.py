"""One module per dashboard, each mostly data; :mod:`inferwatch.dashboards.registry` lists them."""
