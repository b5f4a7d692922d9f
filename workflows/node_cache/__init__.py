"""Weights on every node: the node-local chunk cache (pure decisions) and the pre-staging contract."""
