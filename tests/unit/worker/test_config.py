"""Settings are validated at start and a bad one is named in the error."""

import pytest

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


def test_weights_buckets_default_to_the_weights_bucket_and_always_include_it(monkeypatch):
    monkeypatch.setenv("TIDEPLANE_WEIGHTS_BUCKET", "models")
    assert load_settings().weights_buckets == ["models"]
    monkeypatch.setenv("TIDEPLANE_WEIGHTS_BUCKETS", "hub-mirror, team-weights")
    assert load_settings().weights_buckets == ["models", "hub-mirror", "team-weights"]
