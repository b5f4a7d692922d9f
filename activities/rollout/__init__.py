"""What ModelRollout does outside the workflow (the contract is workflows/rollout/contract.py):
``RolloutActivities`` (rollout_activities.py) stages weights into the model cache, runs a
Deployment and Service per version (serving_pods.py) and the HTTPRoute split (mirror.py for the
shadow mirror), warms the new version up and measures its canary gates; ``RetireScheduling``
(retire_scheduling.py) and ``BatchingActivities`` (batching_activities.py) implement the other two
contracts of the rollout."""
