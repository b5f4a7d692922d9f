"""Model rollout: the ModelRollout workflow, its public types, its gates (pure canary verdicts) and its activity contract."""
