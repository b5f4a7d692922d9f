import pydantic, pytest
from workflows.rollout.types import RolloutInput

def test_a_refused_credential_is_not_echoed_in_the_error():
    """The refusal names the variable but never repeats its value (it would land in the workflow's failure)."""
    with pytest.raises(pydantic.ValidationError) as refused:
        RolloutInput.model_validate({"deployment": "llm-serving/chat", "model": "llama-3-8b", "version": "1.3.0",
                                     "image": "vllm/vllm-openai:v0.6.3", "env": {"HF_TOKEN": "hf_verysecret123"}})
    assert "HF_TOKEN" in str(refused.value)
    assert "hf_verysecret123" not in str(refused.value)
