"""ModelRollout's steps, one module each, in the order workflows/rollout/workflow.py runs them:
stage, start, warm_up (and the golden set), canary (a step of the ladder with its gates), shadow,
promote, roll_back, retire. Each works on the run's ``RunState`` and returns what happened; none
imports another (what they share is workflows/rollout/actions.py)."""
