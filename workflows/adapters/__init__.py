"""LoRA adapters: loaded on a base model's running replicas, canaried by model name (issue 18)."""
