"""Heuristic policies for every decision level. Importing this package registers them."""

from fleetwise.policies import batchers, routers  # noqa: F401
