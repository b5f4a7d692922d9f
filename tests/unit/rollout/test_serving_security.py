"""What a rollout may put in the cluster (issue 20): serving pods run unprivileged with the model
cache read-only, credentials travel as Secret references only, and images come from allowed
registries. Pure manifests and input validation, no cluster (tests/activities/rollout/test_kube.py
checks the refusals through the emulator)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.node_cache.access import Grant, grant
from activities.rollout.serving_pods import ServingPods, deployment_manifest, image_allowed
from workflows.core.naming import DeploymentRef
from workflows.rollout.contract import EnsureVersionInput
from workflows.core.versions import WeightFile
from workflows.rollout.types import RolloutInput
from workflows.node_cache.contract import NodeCacheRequest
from workflows.node_cache.chunks import cached_version_label

CACHE = Path("/var/cache/tideplane/models")
HF_TOKEN = {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


def version(**extra) -> EnsureVersionInput:
    return EnsureVersionInput(
        deployment=DeploymentRef(namespace="llm-serving", name="chat"),
        model="llama-3-8b",
        version="1.0.0",
        image="vllm/vllm-openai:v0.8.5",
        gpus_per_replica=1,
        replicas=1,
        weights_path=f"{CACHE}/llama-3-8b/1.0.0",
        **extra,
    )


@pytest.mark.parametrize("pods", [ServingPods(CACHE), ServingPods(CACHE, model_cache_pvc="tideplane-model-cache")], ids=["hostPath", "pvc"])
def test_serving_pods_are_restricted_and_mount_the_cache_read_only(pods):
    pod = deployment_manifest(version(), pods)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["volumeMounts"] and all(m["readOnly"] is True for m in container["volumeMounts"])
    assert "privileged" not in security and "hostNetwork" not in pod and "hostPID" not in pod


def test_the_engine_cache_is_the_versions_own_writable_directory_on_the_node():
    pods = ServingPods(CACHE, engine_cache_dir=Path("/var/cache/tideplane/engine"))
    pod = deployment_manifest(version(), pods)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    writable = [m for m in container["volumeMounts"] if not m.get("readOnly")]
    assert [m["mountPath"] for m in writable] == [env["VLLM_CACHE_ROOT"]] == ["/var/cache/tideplane/engine/llama-3-8b/1.0.0"]
    volume = next(v for v in pod["volumes"] if v["name"] == writable[0]["name"])
    assert volume["hostPath"] == {"path": "/var/cache/tideplane/engine/llama-3-8b/1.0.0", "type": "DirectoryOrCreate"}
    assert all(m["readOnly"] for m in container["volumeMounts"] if m is not writable[0]), "the weights stay read-only"
    assert "runAsUser" in pod["securityContext"] and container["securityContext"]["allowPrivilegeEscalation"] is False


def test_a_deleted_replica_drains_after_leaving_the_endpoints():
    pod = deployment_manifest(version(), ServingPods(CACHE))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < pre_stop < pod["terminationGracePeriodSeconds"], "endpoints go first, then the server drains in the grace period"


def test_secret_env_is_a_reference_in_the_deployment():
    container = deployment_manifest(version(env={"HF_TOKEN": HF_TOKEN, "VLLM_LOGGING_LEVEL": "INFO"}), ServingPods(CACHE))[
        "spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", **HF_TOKEN}
    assert env["VLLM_LOGGING_LEVEL"] == {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}


def rollout(env: dict) -> RolloutInput:
    return RolloutInput(deployment="llm-serving/chat", model="llama-3-8b", version="1.0.0", image="vllm/vllm-openai:v0.8.5", env=env)


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GCP_CREDENTIALS", "hf-token"])
def test_a_credential_in_clear_is_refused_naming_it(name):
    with pytest.raises(ValidationError) as err:
        rollout({name: "hf_abcdef", "VLLM_LOGGING_LEVEL": "INFO"})
    assert err.value.errors()[0]["loc"] == ("env",)
    message = err.value.errors()[0]["msg"]
    assert f"{name} looks like a credential" in message and "secretKeyRef" in message


def test_plain_values_and_secret_references_are_accepted():
    accepted = rollout({"TOKENIZERS_PARALLELISM": "false", "KEYWORDS": "a", "HF_TOKEN": HF_TOKEN}).env
    assert accepted["TOKENIZERS_PARALLELISM"] == "false" and accepted["HF_TOKEN"].valueFrom.secretKeyRef.name == "hf"
    with pytest.raises(ValidationError):  # a reference names its Secret and key, nothing else
        rollout({"HF_TOKEN": {"valueFrom": {"secretKeyRef": {"name": "hf"}}}})


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("vllm/vllm-openai:v0.6.3", True),  # the README's image: Docker Hub
        ("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, True),
        ("registry.example.com/ml/vllm:1", True),
        ("vllm/vllm-openai-evil:1", False),  # a prefix ends at a path, tag or digest boundary
        ("evil.example.com/vllm/vllm-openai:v0.6.3", False),
        ("registry.example.com/mlx/vllm:1", False),
        ("busybox", False),
    ],
)
def test_images_only_from_allowed_prefixes(image, allowed):
    assert image_allowed(image, ["docker.io/vllm/vllm-openai", "registry.example.com/ml/"]) is allowed


def test_a_pre_staged_version_is_read_from_the_node_cache_with_a_staging_fallback():
    files = [WeightFile(uri="s3://weights/llama-3-8b/1.0.0/model.safetensors", sha256="a" * 64)]
    pods = ServingPods(CACHE, node_cache_dir=Path("/var/cache/tideplane/node-cache"), node_cache_image="ghcr.io/tideplane/worker:0.1.0")
    pod = deployment_manifest(version(node_cache_files=files), pods)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    local = "/var/cache/tideplane/node-cache/versions/llama-3-8b/1.0.0"
    assert container["args"][container["args"].index("--model") + 1] == local
    assert all(m["readOnly"] for m in container["volumeMounts"]) and {"name": "node-cache-version", "mountPath": local, "readOnly": True} in container["volumeMounts"]
    (stage,) = pod["initContainers"]
    request = NodeCacheRequest.model_validate_json(stage["args"][3])
    assert stage["args"][:3] == ["node-cache", "stage", "--request"] and request.node == "$(NODE_NAME)" and request.files == files
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in stage["env"]
    assert stage["securityContext"]["allowPrivilegeEscalation"] is False and pod["securityContext"]["runAsNonRoot"] is True
    (preferred,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [{"key": cached_version_label("llama-3-8b", "1.0.0"), "operator": "In", "values": ["true"]}]
    assert "initContainers" not in deployment_manifest(version(), pods)["spec"]["template"]["spec"], "not pre-staged: the shared cache"


def test_the_staging_init_container_gets_its_versions_node_cache_token_never_the_secret():
    """A serving pod reads from the node cache with a token for its own version (issue 33): the
    node cache's secret would admit every version on every node."""
    files = [WeightFile(uri="s3://weights/llama-3-8b/1.0.0/model.safetensors", sha256="a" * 64)]
    pods = ServingPods(CACHE, node_cache_dir=Path("/var/cache/tideplane/node-cache"), node_cache_secret="the-secret")
    (stage,) = deployment_manifest(version(node_cache_files=files), pods)["spec"]["template"]["spec"]["initContainers"]
    (token,) = [e["value"] for e in stage["env"] if e["name"] == "TIDEPLANE_NODE_CACHE_TOKEN"]
    assert grant("the-secret", f"Bearer {token}") == Grant("llama-3-8b@1.0.0")
    assert "the-secret" not in str(deployment_manifest(version(node_cache_files=files), pods)) and "the-secret" not in repr(pods)


def rollout_with(**fields) -> RolloutInput:
    return RolloutInput(**{"deployment": "llm-serving/chat", "model": "llama-3-8b", "version": "1.0.0",
                           "image": "vllm/vllm-openai:v0.8.5", **fields})


@pytest.mark.parametrize(
    "args, flag",
    [(["--api-key", "sk-abc123"], "--api-key"), (["--api-key=sk-abc123"], "--api-key"),
     (["--max-model-len", "4096", "--hf-token", "hf_abcdef"], "--hf-token"), (["--foo", "sk-proj-abcdef"], "--foo")],
)
def test_a_credential_in_clear_in_args_is_refused_pointing_at_a_secret(args, flag):
    """As in env: the args land in the Deployment and in the workflow history (issue 33)."""
    with pytest.raises(ValidationError) as err:
        rollout_with(args=args)
    error = err.value.errors()[0]
    assert error["loc"] == ("args",)
    assert f"{flag} carries a credential in clear" in error["msg"] and "secretKeyRef" in error["msg"]
    assert "abc" not in str(err.value), "the refused value is never repeated"


def test_args_may_refer_to_a_secret_through_env():
    accepted = rollout_with(args=["--api-key", "$(VLLM_API_KEY)", "--max-model-len", "4096"], env={"VLLM_API_KEY": HF_TOKEN})
    assert accepted.args[:2] == ["--api-key", "$(VLLM_API_KEY)"]


@pytest.mark.parametrize("model", ["llama 3", "lläma", "m" * 64, "-llama", "llama/3"])
def test_a_model_that_is_no_label_value_is_refused_naming_the_rule(model):
    with pytest.raises(ValidationError) as err:
        rollout_with(model=model)
    error = err.value.errors()[0]
    assert error["loc"] == ("model",)
    assert "Kubernetes label value (1-63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)" in error["msg"]


def test_a_port_other_than_the_served_one_is_refused_at_start():
    with pytest.raises(ValidationError) as err:
        rollout_with(port=8080)
    error = err.value.errors()[0]
    assert error["loc"] == ("port",)
    assert "8000" in error["msg"] and "NetworkPolicy" in error["msg"]
    assert rollout_with(port=8000).port == 8000


def test_the_engine_api_key_comes_from_a_secret_the_worker_names():
    """vLLM reads VLLM_API_KEY itself: with TIDEPLANE_ENGINE_API_KEY_SECRET the serving pods get it
    from that Secret, never in clear; a rollout's own VLLM_API_KEY reference wins."""
    pods = ServingPods(CACHE, engine_api_key_secret="vllm-api-key/key")
    env = {e["name"]: e for e in deployment_manifest(version(), pods)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "key"}}}
    own = {"valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}}
    env = {e["name"]: e for e in deployment_manifest(version(env={"VLLM_API_KEY": own}), pods)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    unset = deployment_manifest(version(), ServingPods(CACHE))["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "VLLM_API_KEY" not in {e["name"] for e in unset}


def test_the_engine_key_settings_go_together():
    from workers.config import Settings

    with pytest.raises(ValidationError, match="go together"):
        Settings.model_validate({"TIDEPLANE_ENGINE_API_KEY_SECRET": "vllm-api-key/key"})
    with pytest.raises(ValidationError, match="go together"):
        Settings.model_validate({"TIDEPLANE_ENGINE_API_KEY": "k"})
    both = Settings.model_validate({"TIDEPLANE_ENGINE_API_KEY_SECRET": "vllm-api-key/key", "TIDEPLANE_ENGINE_API_KEY": "k"})
    assert both.engine_api_key is not None and "k" not in repr(both.engine_api_key)


@pytest.mark.parametrize("image", ["vllm/vllm-openai", "vllm/vllm-openai:latest", "registry.local:5000/vllm"])
def test_a_mutable_image_reference_is_refused_at_start(image):
    """``latest`` or no tag moves under a rollout: the canary and its rollback would run whatever it is now."""
    with pytest.raises(ValidationError) as err:
        rollout_with(image=image)
    error = err.value.errors()[0]
    assert error["loc"] == ("image",) and "pin a version tag or a digest" in error["msg"]


def test_pinned_images_are_accepted_and_digest_only_mode_refuses_tags():
    from activities.rollout.serving_pods import image_pinning_problem

    assert rollout_with(image="vllm/vllm-openai:v0.8.5").image == "vllm/vllm-openai:v0.8.5"
    digest = "vllm/vllm-openai@sha256:" + "a" * 64
    assert rollout_with(image=digest).image == digest
    assert image_pinning_problem("vllm/vllm-openai:v0.8.5", "digest") is not None
    assert "TIDEPLANE_IMAGE_PINNING" in image_pinning_problem("vllm/vllm-openai:v0.8.5", "digest")
    assert image_pinning_problem(digest, "digest") is None and image_pinning_problem("vllm/vllm-openai:v0.8.5", "tag") is None
