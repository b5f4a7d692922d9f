"""The node cache's side effects: a node's cache directory (cache.py), staging a version into it
from peers and S3 (stager.py), serving its chunks (chunk_server.py), and the Jobs that stage onto
every node of a pool (node_cache_activities.py)."""
