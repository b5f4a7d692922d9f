"""Custom search attributes, so users can filter workflows in the Temporal UI and CLI.

A namespace needs them registered once: ``tideplane setup temporal`` (workers/cli/setup.py; the
sandbox runs it at start) or the ``temporal operator search-attribute create`` lines in
docs/getting-started.md.
"""

from temporalio.common import SearchAttributeKey

DEPLOYMENT = SearchAttributeKey.for_keyword("TideplaneDeployment")
MODEL = SearchAttributeKey.for_keyword("TideplaneModel")
VERSION = SearchAttributeKey.for_keyword("TideplaneVersion")
STAGE = SearchAttributeKey.for_keyword("TideplaneStage")
CANARY_PERCENT = SearchAttributeKey.for_int("TideplaneCanaryPercent")

ALL = (DEPLOYMENT, MODEL, VERSION, STAGE, CANARY_PERCENT)

# name -> type as the temporal CLI's --search-attribute flag spells it
CLI_TYPES = {key.name: ("Int" if key is CANARY_PERCENT else "Keyword") for key in ALL}

# The error type of a run refused because its namespace lacks them.
MISSING_ERROR = "SearchAttributesMissing"


def missing_message(missing: list[str], namespace: str) -> str:
    """Why a run cannot start in ``namespace``: the attributes it lacks and the commands that add them."""
    names = ", ".join(f"{name} ({CLI_TYPES[name]})" for name in missing)
    first = missing[0]
    return (
        f"namespace {namespace} has no search attribute {names}: register tideplane's search attributes once with "
        f"`tideplane setup temporal --namespace {namespace}` (or `temporal operator search-attribute create "
        f"--namespace {namespace} --name {first} --type {CLI_TYPES[first]}` for each; docs/getting-started.md#search-attributes)"
    )
