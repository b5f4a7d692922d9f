"""What an HTTPRoute tideplane writes lets through: the engine's inference API only (pure).

vLLM serves its admin endpoints on the same port as inference (``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` with runtime LoRA updating on, ``/reset_prefix_cache``, ``/sleep``,
``/tokenize``, ``/metrics``…), so a rule without ``matches`` (every path) would let any client load
an adapter from any path or unload a serving one. Every rule tideplane writes matches these paths
exactly (a rule's header matches, e.g. an adapter's model name, repeated on each); a request to any
other path matches no rule, and the gateway answers 404 without reaching the engine.
"""

from __future__ import annotations

INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models")


def inference_matches(headers: list[dict] | None = None) -> list[dict]:
    """One HTTPRouteMatch per inference path (Exact), each with ``headers`` when given."""
    return [{"path": {"type": "Exact", "value": path}, **({"headers": list(headers)} if headers else {})}
            for path in INFERENCE_PATHS]


def only_inference(matches: list[dict] | None) -> bool:
    """Whether a rule's ``matches`` let through nothing but inference paths (none: every path)."""
    return bool(matches) and all(
        (m.get("path") or {}).get("type") == "Exact" and (m.get("path") or {}).get("value") in INFERENCE_PATHS for m in matches
    )
