"""Settings are validated at start and a bad one is named in the error."""

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from workers.client import data_converter
from workers.codec import AesGcmCodec, generate_key
from workers.config import SettingsError, load_settings


def test_defaults_and_wellknown_variables(monkeypatch):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "10.0.0.1:7233")
    monkeypatch.setenv("TIDEPLANE_PROMETHEUS_URL", "http://prom:9090/")
    s = load_settings()
    assert s.temporal_address == "10.0.0.1:7233"
    assert s.prometheus_url == "http://prom:9090"
    assert s.task_queue == "tideplane"


@pytest.mark.parametrize(
    "var,value",
    [
        ("TIDEPLANE_PROMETHEUS_URL", "prom:9090"),
        ("TIDEPLANE_TEMPORAL_ADDRESS", "no-port"),
        ("TIDEPLANE_METRICS_PORT", "70000"),
        ("TIDEPLANE_SERVICE_URL_TEMPLATE", "http://{pod}:8000"),
    ],
)
def test_bad_setting_is_named(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=var):
        load_settings()


def test_the_retired_node_cache_token_secret_is_refused_naming_its_replacement(monkeypatch):
    """Ignored, it would leave staging pods without a token: peers refuse them and weights come from S3."""
    monkeypatch.setenv("TIDEPLANE_NODE_CACHE_TOKEN_SECRET", "node-cache/token")
    with pytest.raises(SettingsError, match="TIDEPLANE_NODE_CACHE_TOKEN_SECRET: .*retired: set TIDEPLANE_NODE_CACHE_TOKEN"):
        load_settings()


def test_weights_buckets_default_to_the_weights_bucket_and_always_include_it(monkeypatch):
    monkeypatch.setenv("TIDEPLANE_WEIGHTS_BUCKET", "models")
    assert load_settings().weights_buckets == ["models"]
    monkeypatch.setenv("TIDEPLANE_WEIGHTS_BUCKETS", "hub-mirror, team-weights")
    assert load_settings().weights_buckets == ["models", "hub-mirror", "team-weights"]


def test_without_a_payload_key_a_temporal_client_is_refused_naming_the_fix(monkeypatch):
    """The codec is on by default: no key means no client (worker, CLI, schedules, replayer), and
    the message says which setting, how to make a key and how to opt out."""
    monkeypatch.delenv("TIDEPLANE_PAYLOAD_ENCRYPTION", raising=False)
    monkeypatch.delenv("TIDEPLANE_PAYLOAD_ENCRYPTION_KEY", raising=False)
    with pytest.raises(SettingsError) as err:
        data_converter(load_settings())
    message = str(err.value)
    assert "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY is not set" in message
    assert "generate_key()" in message and "secretKeyRef" in message
    assert "TIDEPLANE_PAYLOAD_ENCRYPTION=off" in message


def test_the_explicit_opt_out_sends_clear_payloads_and_a_key_still_encrypts(monkeypatch):
    monkeypatch.setenv("TIDEPLANE_PAYLOAD_ENCRYPTION", "off")
    monkeypatch.delenv("TIDEPLANE_PAYLOAD_ENCRYPTION_KEY", raising=False)
    assert data_converter(load_settings()) is pydantic_data_converter
    monkeypatch.setenv("TIDEPLANE_PAYLOAD_ENCRYPTION_KEY", generate_key())
    assert isinstance(data_converter(load_settings()).payload_codec, AesGcmCodec)
    monkeypatch.setenv("TIDEPLANE_PAYLOAD_ENCRYPTION", "no")
    with pytest.raises(SettingsError, match="TIDEPLANE_PAYLOAD_ENCRYPTION: .*'required' or 'off'"):
        load_settings()
