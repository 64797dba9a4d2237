"""The platform layer (issue 8): autoscaling with cold starts, spot and on-demand pools, tenants' quotas and
admission control, faults and failover, cost accounting and monitoring, on top of the simulator.
See docs/platform.md."""
