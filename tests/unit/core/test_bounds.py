"""Bounds on inputs (workflows/core/bounds.py) and how query variables reach PromQL (issue 20 defects 2, 5, 6)."""

from __future__ import annotations

import pytest

from activities.clients.prometheus import render
from workflows.core.bounds import render_window


@pytest.mark.parametrize(
    "given, rendered", [(60, "60s"), ("90", "90s"), ("5m", "300s"), ("1h30m", "5400s"), ("30s", "30s"), (1.4, "1s")]
)
def test_windows_are_rendered_from_numbers(given, rendered):
    assert render_window(given) == rendered


@pytest.mark.parametrize("given", ["abc", "1m]) or vector(1000) #", "", "0s", 0.4, "500ms", 1e308, float("nan"), True, "2d"])
def test_windows_that_are_no_duration_or_out_of_bounds_are_refused(given):
    with pytest.raises(ValueError, match="window must be"):
        render_window(given)


def test_a_value_inside_a_label_matcher_cannot_end_the_string():
    query = render("g", 'x{version="${version}"}', {"version": '1"} or vector(1000) #'})
    assert query == 'x{version="1\\"} or vector(1000) #"}'
