"""``tideplane node-cache``: what runs on the nodes (the staging Job's ``stage``, the cache
DaemonSet's ``serve``) and what an operator reads (``list``: each node's versions, bytes, last use).

workers/cli/main.py wires it in with ``add_node_cache_commands(subparsers)``; each subcommand sets
``func(args, settings) -> int``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import httpx

from activities.clients.kube import KubeClient
from activities.clients.s3 import S3Client
from activities.node_cache.cache import NodeCache
from activities.node_cache.chunk_server import ChunkServer, node_cache_index
from activities.node_cache.node_cache_activities import peer_url
from activities.node_cache.stager import NodeCacheStager
from workers.cli.wording import counted
from workers.config import Settings
from workflows.node_cache.contract import NodeCacheRequest

# Where Kubernetes reads a container's termination message (the pod's terminationMessagePath default).
TERMINATION_LOG = Path("/dev/termination-log")


def cmd_stage(args, config: Settings) -> int:
    """Stage one version into this node's cache; the report goes to stdout and the termination log."""
    request = NodeCacheRequest.model_validate_json(args.request)
    s3 = S3Client(config.aws_endpoint_url, config.aws_region)
    stager = NodeCacheStager(NodeCache(config.node_cache_dir), s3, token=config.node_cache_secret)
    report = stager.stage(request).model_dump_json()
    print(report)
    try:
        TERMINATION_LOG.write_text(report)
    except OSError:
        pass  # not in a pod
    return 0


def cmd_serve(args, config: Settings) -> int:
    """Serve this node's verified chunks to its peers (the DaemonSet's container)."""
    server = ChunkServer((args.host, args.port), NodeCache(config.node_cache_dir), args.node, secret=config.node_cache_secret)
    print(f"node cache of {args.node}: {config.node_cache_dir}, chunks on {server.url}", flush=True)
    server.serve_forever()
    return 0


def cache_rows(kube: KubeClient, template: str, http: httpx.Client | None = None, token: str | None = None) -> list[dict]:
    """One row per version per node (a node whose chunk server does not answer: one row saying so)."""
    rows = []
    for node in sorted(kube.core.list_node().items, key=lambda n: n.metadata.name):
        name = node.metadata.name
        try:
            index = node_cache_index(peer_url(node, template), http, token)
        except (httpx.HTTPError, ValueError) as exc:
            rows.append({"node": name, "version": None, "bytes": None, "last_used": None, "error": str(exc) or type(exc).__name__})
            continue
        for key, cached in sorted(index.versions.items()):
            rows.append({"node": name, "version": key, "bytes": cached.size_bytes, "last_used": cached.last_used})
        if not index.versions:
            rows.append({"node": name, "version": None, "bytes": 0, "last_used": None})
    return rows


def cmd_list(args, config: Settings) -> int:
    kube = KubeClient.connect(config.kubeconfig, config.kube_in_cluster)
    rows = cache_rows(kube, config.node_cache_peer_url_template, token=config.node_cache_secret)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NODE':<36} {'VERSION':<28} {'GIB':>8}  LAST USED (UTC)")
    for row in rows:
        if "error" in row:
            print(f"{row['node']:<36} unreachable: {row['error']}")
            continue
        used = datetime.fromtimestamp(row["last_used"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if row["last_used"] else "-"
        print(f"{row['node']:<36} {row['version'] or '(empty)':<28} {row['bytes'] / 2**30:>8.2f}  {used}")
    nodes = {r["node"] for r in rows}
    print(f"\n{counted(len(nodes), 'node')}, {sum(r['bytes'] or 0 for r in rows) / 2**30:.2f} GiB in all", file=sys.stderr)
    return 0


def add_node_cache_commands(commands: argparse._SubParsersAction) -> None:
    cache = commands.add_parser("node-cache", help="node-local weight caches: stage, serve, list")
    actions = cache.add_subparsers(dest="action", required=True)
    stage = actions.add_parser("stage", help="stage a version into this node's cache (a staging Job's container)")
    stage.add_argument("--request", required=True, help="NodeCacheRequest JSON (workflows/node_cache/contract.py)")
    stage.set_defaults(func=cmd_stage)
    serve = actions.add_parser("serve", help="serve this node's verified chunks to peers (the cache DaemonSet's container)")
    serve.add_argument("--node", required=True, help="this node's name (the downward API's spec.nodeName)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8470)
    serve.set_defaults(func=cmd_serve)
    listing = actions.add_parser("list", help="each node's cached versions, bytes and last use")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
