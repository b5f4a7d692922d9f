"""Spot-reclaim failover: the notice watcher, reclaim, return to spot, the pure mix policy and notice parsing."""
