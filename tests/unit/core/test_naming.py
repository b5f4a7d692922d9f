"""Object names derived from versions (workflows/core/naming.py)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from workflows.core.naming import VersionLabel, versioned_name


def test_dotted_versions_keep_their_readable_names():
    assert versioned_name("chat", "1.3.0") == "chat-v1-3-0"
    assert versioned_name("chat", "v2") == "chat-vv2"


@pytest.mark.parametrize(
    "versions",
    [
        ["1.3.0-rc.1", "1.3.0-rc-1", "1.3.0_rc_1", "1.3.0-RC.1"],
        ["1.3.0", "1-3-0", "1_3_0"],
        ["a" * 60 + "1", "a" * 60 + "2", "a" * 61],
    ],
)
def test_names_are_distinct_valid_dns_labels(versions):
    names = [versioned_name("chat", v) for v in versions]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 63 and n[0].isalnum() and n[-1].isalnum() for n in names)
    assert versioned_name("chat", versions[0]) == names[0]  # stable: the same version, the same name


@pytest.mark.parametrize("version", ["1.3.0+build.5", "-1", "a" * 64, "1.0 ", ""])
def test_versions_that_cannot_be_label_values_are_refused(version):
    with pytest.raises(ValidationError, match="version must be a Kubernetes label value"):
        TypeAdapter(VersionLabel).validate_python(version)
