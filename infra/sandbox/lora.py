"""vLLM's dynamic LoRA API as one simulated replica serves it, and the gateway's per-model counts.

What ``vllm/entrypoints/openai/serving_models.py`` does: ``POST /v1/load_lora_adapter``
``{"lora_name", "lora_path"}`` answers 200 ``Success: LoRA adapter '<name>' added successfully.``,
400 ``InvalidUserInput`` when a field is missing or the name is already loaded, and 400
``BadRequestError`` when the engine refuses it (no ``--enable-lora``: vLLM's "LoRA is not
enabled" error); ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` answers 200, or 404
``NotFoundError`` for a name not loaded. The routes exist only when the server runs with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (otherwise 404, as FastAPI answers an unknown path).
Loaded adapters are listed by ``GET /v1/models`` beside the base model and answer requests whose
``model`` is their name. A pod starts with the adapters its container's ``--lora-modules`` names
(``name=path`` or the JSON form, as vLLM parses them) and loses the dynamically loaded ones when
it restarts (a new Replica).

``ModelRequests`` counts the gateway's requests per served model as the Inference Extension's
endpoint picker does (``inference_objective_request_total{model_name,target_model_name}``), so an
adapter canary's gates can read its own error rate and latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.fleetmodel.metrics import Histogram
from workflows.core.lora import lora_modules

RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
ENABLE_LORA_ARG = "--enable-lora"
NOT_ENABLED = "LoRA is not enabled. Use --enable-lora to enable LoRA."
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def lora_settings(pod: dict) -> tuple[bool, bool, dict[str, str]]:
    """(``--enable-lora`` in a container's args, runtime updating allowed by its env, the
    adapters its ``--lora-modules`` loads at start)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    enabled = any(ENABLE_LORA_ARG in (c.get("args") or []) or ENABLE_LORA_ARG in (c.get("command") or []) for c in containers)
    runtime = any(
        e.get("name") == RUNTIME_UPDATING_ENV and str(e.get("value", "")).lower() in ("true", "1")
        for c in containers for e in c.get("env") or []
    )
    at_start = {name: path for c in containers for name, path in lora_modules(c.get("args") or []).items()} if enabled else {}
    return enabled, runtime, at_start


def error(status: int, message: str, kind: str) -> tuple[int, dict]:
    """vLLM's ErrorResponse body."""
    return status, {"object": "error", "message": message, "type": kind, "param": None, "code": status}


@dataclass
class LoraAdapters:
    """The adapters one vLLM process holds (lora_name -> lora_path)."""

    enabled: bool = False
    runtime_updating: bool = False
    loaded: dict[str, str] = field(default_factory=dict)

    def load(self, body: dict) -> tuple[int, dict | str]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in self.loaded:
            return error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        if not self.enabled:
            return error(400, NOT_ENABLED, "BadRequestError")
        self.loaded[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: dict) -> tuple[int, dict | str]:
        name = body.get("lora_name")
        if not name and not body.get("lora_int_id"):
            return error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
        if name not in self.loaded:
            return error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loaded[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def model_cards(self, base: str) -> list[dict]:
        """``/v1/models``' data: the base model, then each adapter with the base as its parent."""
        return [
            {"id": base, "object": "model", "root": base, "parent": None},
            *({"id": name, "object": "model", "root": path, "parent": base} for name, path in self.loaded.items()),
        ]

    def serves(self, model: str | None, base: str) -> bool:
        """Whether a request naming ``model`` is answered. A server without ``--enable-lora``
        answers any name as its base model (the sandbox always has; vLLM would 404)."""
        return not self.enabled or not model or model == base or model in self.loaded


@dataclass
class ModelRequests:
    """Gateway requests per (namespace, route, requested model, served model): count, errors, latency."""

    counts: dict[tuple[str, str, str, str], list] = field(default_factory=dict)

    def record(self, key: tuple[str, str, str, str], failed: bool, latency_s: float | None) -> None:
        entry = self.counts.setdefault(key, [0, 0, Histogram(LATENCY_BUCKETS)])
        entry[0] += 1
        entry[1] += failed
        if latency_s is not None:
            entry[2].observe(latency_s)

    def expose(self, out) -> None:
        """Write the endpoint picker's metric families into an ``Exposition``."""
        for (namespace, route, model, target), (total, errors, latency) in sorted(self.counts.items(), key=lambda kv: kv[0]):
            labels = {"namespace": namespace, "route": route, "model_name": model, "target_model_name": target}
            out.sample("inference_objective_request_total", "counter", "Requests per model, by the gateway.", labels, total)
            out.sample("inference_objective_request_error_total", "counter", "Failed requests per model.", labels, errors)
            out.histogram("inference_objective_request_duration_seconds", "Request latency per model.", labels, latency)
