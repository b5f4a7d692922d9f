"""A rollout that asks for a share of a GPU: the field is validated and the Deployment requests a share."""

from pathlib import Path

import pydantic
import pytest

from activities.rollout.serving_pods import ServingPods, deployment_manifest
from workflows.core.naming import GPU_RESOURCE, DeploymentRef
from workflows.rollout.contract import EnsureVersionInput
from workflows.rollout.types import RolloutInput
from workflows.core.gpu_shares import SHARED_GPU_RESOURCE, gpu_memory_utilization

ROLLOUT = {"deployment": "llm-serving/embed", "model": "bge-m3", "version": "1.0.0", "image": "vllm/vllm-openai:v0.8.5"}


def container(share: float | None) -> dict:
    version = EnsureVersionInput(deployment=DeploymentRef(namespace="llm-serving", name="embed"), model="bge-m3",
                                 version="1.0.0", image="vllm/vllm-openai:v0.8.5", gpus_per_replica=1, replicas=1,
                                 weights_path="/models/bge-m3", gpu_memory_utilization=share)
    return deployment_manifest(version, ServingPods(model_cache_dir=Path("/models")))["spec"]["template"]["spec"]["containers"][0]


def test_a_share_requests_one_shared_gpu_and_tells_vllm_its_claim():
    shared = container(0.3)
    assert shared["resources"] == {"limits": {SHARED_GPU_RESOURCE: "1"}, "requests": {SHARED_GPU_RESOURCE: "1"}}
    assert gpu_memory_utilization(shared["args"]) == 0.3  # what the emulator's scheduler and vLLM read
    whole = container(None)
    assert whole["resources"]["limits"] == {GPU_RESOURCE: "1"} and "--gpu-memory-utilization" not in whole["args"]


@pytest.mark.parametrize("changes,message", [
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization\n  Input should be greater than 0"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization\n  Input should be less than or equal to 1"),
    ({"gpu_memory_utilization": 0.3, "gpus_per_replica": 2}, "gpu_memory_utilization: a replica shares one GPU; gpus_per_replica must be 1, got 2"),
    ({"gpu_memory_utilization": 0.3, "args": ["--gpu-memory-utilization=0.5"]}, "gpu_memory_utilization: also given in args"),
])
def test_a_share_out_of_range_or_contradicted_is_refused_naming_the_field(changes, message):
    with pytest.raises(pydantic.ValidationError) as refused:
        RolloutInput.model_validate({**ROLLOUT, **changes})
    assert message in str(refused.value)
    assert RolloutInput.model_validate({**ROLLOUT, "gpu_memory_utilization": 1}).gpu_memory_utilization == 1
