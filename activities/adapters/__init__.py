"""LoRA adapters' side effects: ``AdapterActivities`` (the registry entry, vLLM's dynamic LoRA API per
pod, the adapter's rule of the route)."""
