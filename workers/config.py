"""Worker and CLI configuration, read from ``TIDEPLANE_*`` environment variables.

The well-known variables that other tools already read (``TEMPORAL_ADDRESS`` for the temporal
CLI, ``KUBECONFIG`` for kubectl, ``AWS_ENDPOINT_URL`` for boto3, ``PROMETHEUS_URL``) are
accepted too, so that sourcing ``.tideplane/sandbox/env`` points every tool at the sandbox.
Settings are validated at start; a bad value fails with the setting's name in the message.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from workflows.core.bounds import MAX_GPUS_PER_REPLICA, MAX_REPLICAS


def _env(name: str, *fallbacks: str) -> AliasChoices:
    return AliasChoices(f"TIDEPLANE_{name}", *fallbacks)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    # Temporal
    temporal_address: str = Field("127.0.0.1:7233", validation_alias=_env("TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"))
    temporal_namespace: str = Field("default", validation_alias=_env("TEMPORAL_NAMESPACE", "TEMPORAL_NAMESPACE"))
    task_queue: str = Field("tideplane", validation_alias=_env("TASK_QUEUE"))
    # TLS / mTLS to a self-hosted cluster or Temporal Cloud; the fallbacks are the temporal CLI's
    # own variables, so one environment configures both. Any TLS option or an API key turns TLS on.
    temporal_tls: bool = Field(False, validation_alias=_env("TEMPORAL_TLS", "TEMPORAL_TLS"))
    temporal_tls_ca_path: Path | None = Field(
        None, validation_alias=_env("TEMPORAL_TLS_CA_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    )
    temporal_tls_cert_path: Path | None = Field(
        None, validation_alias=_env("TEMPORAL_TLS_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH")
    )
    temporal_tls_key_path: Path | None = Field(
        None, validate_default=True, validation_alias=_env("TEMPORAL_TLS_KEY_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH")
    )
    temporal_tls_server_name: str | None = Field(
        None, validation_alias=_env("TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS_SERVER_NAME")
    )
    temporal_api_key: SecretStr | None = Field(None, validation_alias=_env("TEMPORAL_API_KEY", "TEMPORAL_API_KEY"))
    # AES-256-GCM key (base64 of 32 bytes) for the payload codec, from a Secret: every payload a
    # tideplane process sends to Temporal is encrypted with it.
    payload_encryption_key: SecretStr | None = Field(None, validation_alias=_env("PAYLOAD_ENCRYPTION_KEY"))
    # "required" (default): a process that talks to Temporal refuses to start without the key, so no
    # payload reaches Temporal in clear by omission; "off": the explicit opt-out, no key needed (a
    # key that is set is still used, so histories it encrypted stay readable).
    payload_encryption: Literal["required", "off"] = Field("required", validation_alias=_env("PAYLOAD_ENCRYPTION"))
    # `tideplane codec-server`'s bearer token: set, every encode/decode needs `Authorization: Bearer
    # <token>` (temporal --codec-auth, the web UI's access token); required to bind off loopback.
    codec_server_token: SecretStr | None = Field(None, validation_alias=_env("CODEC_SERVER_TOKEN"))
    # Retired keys (comma-separated base64), still accepted for decoding while old histories live.
    payload_decryption_keys: SecretStr | None = Field(None, validation_alias=_env("PAYLOAD_DECRYPTION_KEYS"))

    # Kubernetes: a kubeconfig file, or the in-cluster service account when running in a pod.
    kubeconfig: Path | None = Field(None, validation_alias=_env("KUBECONFIG", "KUBECONFIG"))
    kube_in_cluster: bool = Field(False, validation_alias=_env("KUBE_IN_CLUSTER"))

    # S3 (AWS, MinIO, or moto in the sandbox) and the other AWS services
    aws_endpoint_url: str | None = Field(None, validation_alias=_env("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL"))
    aws_region: str = Field("us-east-1", validation_alias=_env("AWS_REGION", "AWS_DEFAULT_REGION"))
    weights_bucket: str = Field("tideplane-models", validation_alias=_env("WEIGHTS_BUCKET"))
    # Buckets weights may come from (comma-separated): a rollout's weights_uri, a registered
    # s3:// source and retention's deletes are refused elsewhere. Unset: the weights bucket only.
    weights_buckets: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validate_default=True, validation_alias=_env("WEIGHTS_BUCKETS")
    )
    spot_queue_url: str | None = Field(None, validation_alias=_env("SPOT_QUEUE_URL"))
    # Where serving images may come from (comma-separated registry or repository prefixes, Docker Hub
    # names as docker.io/...): a rollout of another image is refused. Default: the vLLM image.
    image_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["docker.io/vllm/vllm-openai"], validation_alias=_env("IMAGE_PREFIXES")
    )
    # "tag": any version tag (latest and untagged are refused at start); "digest": only IMAGE@sha256:...
    image_pinning: Literal["tag", "digest"] = Field("tag", validation_alias=_env("IMAGE_PINNING"))

    # The most replicas of one version and GPUs per replica this cluster runs: a rollout or a
    # scaling decision above them is refused (non-retryable, naming the field and the setting).
    max_replicas: int = Field(MAX_REPLICAS, ge=1, le=MAX_REPLICAS, validation_alias=_env("MAX_REPLICAS"))
    max_gpus_per_replica: int = Field(8, ge=0, le=MAX_GPUS_PER_REPLICA, validation_alias=_env("MAX_GPUS_PER_REPLICA"))

    # Prometheus
    prometheus_url: str = Field("http://127.0.0.1:9090", validation_alias=_env("PROMETHEUS_URL", "PROMETHEUS_URL"))

    # Where serving pods mount staged weights (a shared volume in production).
    model_cache_dir: Path = Field(Path("/var/cache/tideplane/models"), validation_alias=_env("MODEL_CACHE_DIR"))
    # The PVC that holds model_cache_dir for serving pods (mounted read-only at the same path);
    # unset: a hostPath of model_cache_dir on the node.
    model_cache_pvc: str | None = Field(None, validation_alias=_env("MODEL_CACHE_PVC"))
    # vLLM's compile and CUDA-graph cache (VLLM_CACHE_ROOT), kept per model version on each node's
    # disk (a writable hostPath <dir>/<model>/<version>), so a replica restarting or scaling onto a
    # node that served the version skips compilation; unset: no engine cache.
    engine_cache_dir: Path | None = Field(Path("/var/cache/tideplane/engine"), validation_alias=_env("ENGINE_CACHE_DIR"))
    # Node-local weight caches (pre-staging): the hostPath on every node, the image the staging Jobs
    # run (tideplane's), a node's chunk server when its Node has no tideplane.io/node-cache-url
    # annotation, and the cache's size limit (unset: none).
    node_cache_dir: Path = Field(Path("/var/cache/tideplane/node-cache"), validation_alias=_env("NODE_CACHE_DIR"))
    node_cache_image: str = Field("ghcr.io/tideplane/worker:0.1.0", validation_alias=_env("NODE_CACHE_IMAGE"))
    # The engines' API key: the serving pods get VLLM_API_KEY from this Secret ("NAME/KEY", in each
    # serving namespace), and the worker sends TIDEPLANE_ENGINE_API_KEY (the same value, from the same
    # Secret in its own namespace) on warm-up, benchmark, golden-set and LoRA calls. Unset: no key.
    engine_api_key_secret: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-._a-zA-Z0-9]+$", validation_alias=_env("ENGINE_API_KEY_SECRET")
    )
    engine_api_key: SecretStr | None = Field(None, validation_alias=_env("ENGINE_API_KEY"))
    node_cache_peer_url_template: str = Field("http://{node_ip}:8470", validation_alias=_env("NODE_CACHE_PEER_URL_TEMPLATE"))
    node_cache_capacity_bytes: int | None = Field(None, gt=0, validation_alias=_env("NODE_CACHE_CAPACITY_BYTES"))
    # On the chunk servers and the worker: the node cache's secret. The servers answer /index and
    # /chunks only to a token it admits; the worker's CLI presents it (every version) and each staging
    # pod gets its own version's token, derived from it (activities/node_cache/access.py), in this
    # same variable, which its stager presents.
    node_cache_token: SecretStr | None = Field(None, validation_alias=_env("NODE_CACHE_TOKEN"))
    # Retired: it named a Secret whose one token every staging pod got. Refused rather than ignored,
    # so that an upgraded worker does not silently stage from S3 with peers refusing its pods.
    retired_node_cache_token_secret: str | None = Field(None, validation_alias=_env("NODE_CACHE_TOKEN_SECRET"))
    # The Gateway that new HTTPRoutes attach to: "name" (the route's namespace) or "namespace/name".
    gateway: str = Field("inference-gateway", validation_alias=_env("GATEWAY"))

    # How the worker reaches a version's OpenAI-compatible endpoint (warm-up, benchmark).
    service_url_template: str = Field(
        "http://{service}.{namespace}.svc.cluster.local:8000",
        validation_alias=_env("SERVICE_URL_TEMPLATE"),
    )

    # How the worker reaches one serving pod (vLLM's LoRA API is per process): {pod_ip}, {namespace},
    # {pod}, {port}.
    pod_url_template: str = Field("http://{pod_ip}:{port}", validation_alias=_env("POD_URL_TEMPLATE"))

    # Where answers to requests mirrored to a canary are recorded (the shadow gate reads them):
    # "{namespace}" and "{name}" are the HTTPRoute's; unset, a rollout asking for shadow fails.
    shadow_pairs_url: str | None = Field(None, validation_alias=_env("SHADOW_PAIRS_URL"))

    # Notifications of a rollout's pause, resume, rollback, abort and promotion (docs/rollout.md): a
    # Kubernetes Event always; set, a JSON POST to this webhook too, generic or Slack-compatible,
    # with a link to the run in the Temporal web UI at web_ui_url (unset: no link).
    notify_webhook_url: str | None = Field(None, pattern=r"^https?://", validation_alias=_env("NOTIFY_WEBHOOK_URL"))
    notify_webhook_format: Literal["generic", "slack"] = Field("generic", validation_alias=_env("NOTIFY_WEBHOOK_FORMAT"))
    web_ui_url: str | None = Field(None, pattern=r"^https?://", validation_alias=_env("WEB_UI_URL"))

    # The worker's own /metrics port (0 disables it) and the address it binds: every interface by
    # default, so Prometheus reaches the pod; the sandbox binds 127.0.0.1.
    metrics_port: int = Field(9464, ge=0, le=65535, validation_alias=_env("METRICS_PORT"))
    metrics_host: str = Field("0.0.0.0", min_length=1, validation_alias=_env("METRICS_HOST"))
    # Where the worker writes its pid while it runs (the sandbox's env file sets it, so
    # `tideplane sandbox status` and `down` find a worker however it was started); unset: none.
    pid_file: Path | None = Field(None, validation_alias=_env("PID_FILE"))

    # Per-request tracing in the serving pods (vLLM's OpenTelemetry export); no endpoint: off.
    otlp_traces_endpoint: str | None = Field(
        None, validation_alias=_env("OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    trace_sample_ratio: float = Field(0.1, ge=0, le=1, validation_alias=_env("TRACE_SAMPLE_RATIO"))

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @field_validator("temporal_tls_ca_path", "temporal_tls_cert_path", "temporal_tls_key_path")
    @classmethod
    def _readable(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if info.field_name == "temporal_tls_key_path":
            # (a cert that failed its own check is absent from info.data: that error suffices)
            cert_ok = "temporal_tls_cert_path" in info.data
            if cert_ok and (info.data["temporal_tls_cert_path"] is None) != (value is None):
                raise ValueError(
                    "TIDEPLANE_TEMPORAL_TLS_CERT_PATH and TIDEPLANE_TEMPORAL_TLS_KEY_PATH must be set together (mTLS)"
                )
        if value is not None:
            try:
                value.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror or exc}") from None
        return value

    @field_validator("payload_encryption_key", "payload_decryption_keys")
    @classmethod
    def _aes_keys(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None:
            if info.field_name == "payload_encryption_key" and "," in value.get_secret_value():
                raise ValueError("one key only; retired keys go in TIDEPLANE_PAYLOAD_DECRYPTION_KEYS")
            for part in value.get_secret_value().split(","):
                try:
                    key = base64.b64decode(part.strip(), validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError("not valid base64 (value not shown)") from None
                if len(key) != 32:
                    raise ValueError(f"an AES-256 key is 32 bytes, this one decodes to {len(key)} (value not shown)")
        return value

    @field_validator("weights_buckets", "image_prefixes", mode="before")
    @classmethod
    def _bucket_list(cls, value: str | list[str]) -> list[str]:
        return [b.strip() for b in value.split(",") if b.strip()] if isinstance(value, str) else value

    @field_validator("weights_buckets")
    @classmethod
    def _with_weights_bucket(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """The registry's own bucket is always allowed (its weights are uploaded there)."""
        own = info.data.get("weights_bucket")
        return value if own is None or own in value else [own, *value]

    @field_validator("prometheus_url", "aws_endpoint_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http(s) URL, got {value!r}")
        return value.rstrip("/") if value else value

    @field_validator("retired_node_cache_token_secret")
    @classmethod
    def _retired(cls, value: str | None) -> None:
        if value is not None:
            raise ValueError(
                "retired: set TIDEPLANE_NODE_CACHE_TOKEN to the node cache's secret instead (the value of the Secret"
                " the chunk servers read); each staging pod now gets its own version's token, derived from it"
            )
        return None

    @model_validator(mode="after")
    def _engine_key_both_or_neither(self) -> Settings:
        """Pods with a key the worker lacks would answer its warm-up 401; a key without pods that ask for it protects nothing."""
        if (self.engine_api_key_secret is None) != (self.engine_api_key is None):
            raise ValueError(
                "TIDEPLANE_ENGINE_API_KEY_SECRET and TIDEPLANE_ENGINE_API_KEY go together: the pods read the key from"
                " the Secret, the worker presents it (set both from the same Secret, or neither)"
            )
        return self

    @property
    def node_cache_secret(self) -> str | None:
        """TIDEPLANE_NODE_CACHE_TOKEN's value: the secret (chunk servers, worker) or a version's token (staging pods)."""
        return self.node_cache_token.get_secret_value() if self.node_cache_token else None

    @field_validator("service_url_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(service="s", namespace="n")
        except (KeyError, IndexError) as exc:
            raise ValueError(f"may only use {{service}} and {{namespace}}: {exc}") from None
        return value


class SettingsError(RuntimeError):
    """A setting is invalid; the message names the environment variable."""


def load_settings() -> Settings:
    """Read and validate the settings, naming the bad variable when one is wrong."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "?"
            if not name.isupper():
                name = f"TIDEPLANE_{name.upper()}"
            problems.append(f"{name}: {err['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
