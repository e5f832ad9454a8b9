"""Fleet capture: every replica's engine metrics read from a Prometheus-compatible query API (docs/fleet.md).

``queries`` turns the engine maps (diagnose/engines/detect.py) into PromQL that aggregates per replica on the
server; ``capture`` asks them, picks the replicas that matter and pulls those at full resolution, and writes
a bundle (streams ``fleet_replicas``, ``fleet_series``, ``fleet_totals``, ``fleet_metrics``,
``fleet_queries``; docs/bundle-format.md). diagnose/normalize/fleet.py reads it back.
"""
