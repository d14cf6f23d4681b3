"""The read side: request listings and exact or sketched statistics over the store.

- :mod:`~inferwatch.collector.stats.listing`: the request list, lookups and examples, the readiness check, and
  what every read query shares (:class:`~inferwatch.collector.stats.listing.DatabaseUnavailable`, cursors).
- :mod:`~inferwatch.collector.stats.planner`: ``compute_stats`` picks a plan per window (rollups, value
  blocks, raw rows) and answers with the API's schemas; the plans are in
  :mod:`~inferwatch.collector.stats.exact` (value blocks, raw rows, index walks),
  :mod:`~inferwatch.collector.stats.rollup_plan` (the rollups' counts and buckets) and
  :mod:`~inferwatch.collector.stats.tails` (the values in those buckets), on what
  :mod:`~inferwatch.collector.stats.windowing` holds (the filter, the window, the table's state).
- :mod:`~inferwatch.collector.stats.rollup`: the minute and ten-minute rollups and the job keeping them.
- :mod:`~inferwatch.collector.stats.values`: value blocks, exact percentiles read in place.
- :mod:`~inferwatch.collector.stats.sketch`: the log-bucket quantile sketch of the rollups.
- :mod:`~inferwatch.collector.stats.sides`: which spans count as the engine's, the proxy's or both.
"""
