"""``tideplane setup temporal``: registers tideplane's search attributes in a Temporal namespace.

Idempotent: it lists the namespace's custom search attributes, adds only those missing (through
the operator service, as ``temporal operator search-attribute create`` does) and says what it
added and what it found. An attribute that exists with another type is refused, naming it: the
type of a search attribute cannot be changed in place. The sandbox runs this command at start
(infra/sandbox/launcher.py); ``--print`` writes the equivalent ``temporal`` CLI lines instead.
"""

from __future__ import annotations

import argparse
import asyncio

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workers.client import connect
from workers.config import Settings
from workflows.core.search_attributes import CLI_TYPES

INDEXED = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}


def create_commands(namespace: str | None = None) -> list[str]:
    """The ``temporal operator search-attribute create`` lines that register what this command does."""
    where = f" --namespace {namespace}" if namespace else ""
    return [f"temporal operator search-attribute create{where} --name {name} --type {kind}" for name, kind in CLI_TYPES.items()]


async def custom_attributes(client: Client, namespace: str) -> dict[str, str]:
    """The namespace's custom search attributes: name -> type as the temporal CLI spells it (Keyword, Int, ...)."""
    listed = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    return {name: _cli_type(kind) for name, kind in listed.custom_attributes.items()}


async def register_search_attributes(client: Client, namespace: str) -> tuple[list[str], list[str]]:
    """Adds tideplane's missing search attributes to ``namespace``: (added, found), by name. A server
    that cannot list them (Temporal's time-skipping test server) is asked to add them all."""
    try:
        have = await custom_attributes(client, namespace)
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        have = {}
    wrong = {name: have[name] for name, kind in CLI_TYPES.items() if name in have and have[name] != kind}
    if wrong:
        raise RuntimeError(
            "search attributes with another type in namespace " + namespace + ": "
            + ", ".join(f"{name} is {kind}, tideplane needs {CLI_TYPES[name]}" for name, kind in wrong.items())
            + " (a type cannot be changed: remove it with `temporal operator search-attribute remove` first)"
        )
    missing = {name: INDEXED[kind] for name, kind in CLI_TYPES.items() if name not in have}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:  # another setup added them meanwhile
                raise
    return list(missing), [name for name in CLI_TYPES if name in have]


def _cli_type(kind: int) -> str:
    """INDEXED_VALUE_TYPE_KEYWORD -> Keyword, ..._KEYWORD_LIST -> KeywordList."""
    return "".join(part.capitalize() for part in IndexedValueType.Name(kind).removeprefix("INDEXED_VALUE_TYPE_").split("_"))


def cmd_temporal(args: argparse.Namespace, config: Settings) -> int:
    namespace = args.namespace or config.temporal_namespace
    if args.print:
        print("\n".join(create_commands(namespace)))
        return 0
    config = config.model_copy(update={"temporal_address": args.address or config.temporal_address, "temporal_namespace": namespace})

    async def run() -> tuple[list[str], list[str]]:
        return await register_search_attributes(await connect(config, payloads=False), namespace)

    try:
        added, found = asyncio.run(run())
    except RPCError as exc:
        raise RuntimeError(f"registering search attributes in namespace {namespace} at {config.temporal_address}: {exc}") from exc
    for name in added:
        print(f"added {name} ({CLI_TYPES[name]})")
    for name in found:
        print(f"found {name} ({CLI_TYPES[name]})")
    print(f"namespace {namespace} at {config.temporal_address}: {len(added)} search attributes added, {len(found)} already there")
    return 0


def add_setup_commands(subparsers) -> None:
    setup = subparsers.add_parser("setup", help="one-time set-up of what tideplane needs outside the cluster")
    sub = setup.add_subparsers(dest="setup", required=True)
    p = sub.add_parser("temporal", help="register tideplane's search attributes in a Temporal namespace (idempotent)")
    p.add_argument("--address", default=None, help="Temporal frontend host:port (default: TIDEPLANE_TEMPORAL_ADDRESS)")
    p.add_argument("--namespace", default=None, help="the namespace (default: TIDEPLANE_TEMPORAL_NAMESPACE)")
    p.add_argument("--print", action="store_true", help="print the equivalent `temporal operator search-attribute create` lines, register nothing")
    p.set_defaults(func=cmd_temporal)
