"""A scaling workflow reads and sets a deployment's scale: its replicas (claiming its Deployment for
this workflow), its signals from Prometheus, and the scale itself through the rollout's
``scale_version`` (the Deployment's scale subresource). Shared by ReactiveScaling and
SharedPoolScaling; composes the rollout's contract for ``scale_version``."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

import workflows.scaling.contract as acts
from workflows.core.bounds import PromWindow
from workflows.core.failures import cause
from workflows.core.naming import DEPLOYMENT_OWNED, DeploymentRef
from workflows.rollout.contract import RolloutActivities, ScaleVersionInput
from workflows.scaling.contract import ScalingActivities
from workflows.scaling.decide import Signals


SHORT_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))


async def read_scale(namespace: str, name: str, version: str | None, summary: str = "read replicas") -> acts.ScaleStatus | str:
    """The scaled version's replicas, claiming its Deployment for this workflow: another loop's claim
    fails the run (non-retryable); any other failure comes back as text, for the loop to report."""
    try:
        return await workflow.execute_activity_method(
            ScalingActivities.get_scale,
            acts.ScaleTarget(namespace=namespace, deployment=name, version=version, owner=workflow.info().workflow_id),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=SHORT_RETRY,
            summary=summary,
        )
    except ActivityError as err:
        if isinstance(err.cause, ApplicationError) and err.cause.type == DEPLOYMENT_OWNED:
            raise ApplicationError(cause(err), type=DEPLOYMENT_OWNED, non_retryable=True) from err  # another loop scales it
        return f"cannot read the deployment's scale: {cause(err)}"


async def read_signals(namespace: str, name: str, queries: dict[str, str], window: PromWindow, summary: str = "read signals") -> Signals:
    """The deployment's signals; an unreadable Prometheus reads as ``Signals(error=...)``."""
    try:
        return await workflow.execute_activity_method(
            ScalingActivities.read_scaling_signals,
            acts.ReadSignalsInput(namespace=namespace, deployment=name, queries=queries, window=window),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=SHORT_RETRY,
            summary=summary,
        )
    except ActivityError as err:
        return Signals(error=cause(err))


async def scale_to(namespace: str, name: str, scale: acts.ScaleStatus, replicas: int) -> str | None:
    """Scale the version's Deployment to ``replicas``: None when done, else why it failed."""
    try:
        await workflow.execute_activity_method(
            RolloutActivities.scale_version,
            ScaleVersionInput(deployment=DeploymentRef(namespace=namespace, name=name), version=scale.version, replicas=replicas),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=SHORT_RETRY,
            summary=f"scale {name} {scale.version} {scale.replicas} -> {replicas}",
        )
    except ActivityError as err:
        return cause(err)
    return None
