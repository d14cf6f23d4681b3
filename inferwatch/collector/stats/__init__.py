"""The read side: request listings and exact or sketched statistics over the store.

- :mod:`~inferwatch.collector.stats.planner`: every query of the read API; ``compute_stats`` picks a
  plan per window (rollups, value blocks, raw rows) and answers with the API's schemas.
- :mod:`~inferwatch.collector.stats.rollup`: the minute and ten-minute rollups and the job keeping them.
- :mod:`~inferwatch.collector.stats.values`: value blocks, exact percentiles read in place.
- :mod:`~inferwatch.collector.stats.sketch`: the log-bucket quantile sketch of the rollups.
- :mod:`~inferwatch.collector.stats.sides`: which spans count as the engine's, the proxy's or both.
"""
