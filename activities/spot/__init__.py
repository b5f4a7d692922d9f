"""Spot failover's side effects (the contracts are workflows/spot/contract.py): ``SpotActivities``
(SQS notices, node cordon and drain, on-demand replacements, the on-demand pool's capacity),
``SpotMixActivities`` (the spot mix's pools and Deployments) and ``SpotWorkflowStarts``."""
