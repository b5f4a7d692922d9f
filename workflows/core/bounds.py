"""Upper bounds on every duration, count and size a workflow input, signal or update carries.

A number a workflow turns into a timer or a datetime must stay far inside what ``timedelta`` and
``datetime`` hold: ``1e308`` seconds is a valid float, and without a bound it raised OverflowError on
every workflow task, freezing the run (abort included). Pure: workflows import this module.

Maxima (documented in the README's bad-input table):
- durations: 30 days (``MAX_SECONDS``); a timer longer than that is a mistake, not a plan;
- replicas of one version: ``MAX_REPLICAS``; GPUs per replica: ``MAX_GPUS_PER_REPLICA`` (the worker
  refuses more than the cluster's configured maxima, TIDEPLANE_MAX_REPLICAS and
  TIDEPLANE_MAX_GPUS_PER_REPLICA, in ensure_version and scale_version);
- query windows: at least ``MIN_WINDOW_SECONDS`` (Prometheus needs two samples in a rate window:
  keep it at least twice the scrape interval), at most a day, always rendered as ``<n>s``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator, Field

DAY_SECONDS = 24 * 3600
MAX_SECONDS = 30 * DAY_SECONDS
MAX_REPLICAS = 10_000
MAX_GPUS_PER_REPLICA = 64
MAX_ITERATIONS = 10_000  # decisions per run before continue-as-new
MIN_WINDOW_SECONDS = 1
MAX_WINDOW_SECONDS = DAY_SECONDS

# A duration in seconds: > 0 (or >= 0) and at most MAX_SECONDS.
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
SecondsOrZero = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Replicas = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]

_PROM_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNIT_SECONDS = (DAY_SECONDS, 3600, 60, 1, 0.001)


def window_seconds(value: object) -> int:
    """A query window as whole seconds, from seconds (``90``) or a Prometheus duration (``1h30m``).

    Refuses anything else (a window is pasted into ``[...]`` of a query: it is rendered from this
    number, never from the user's text), and windows under ``MIN_WINDOW_SECONDS`` or over a day.
    """
    if isinstance(value, bool):
        raise ValueError(f"window must be seconds or a Prometheus duration like 5m, got {value!r}")
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        value = float(value)
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _PROM_DURATION.match(value.strip())) and value.strip():
        seconds = sum(int(n) * unit for n, unit in zip(match.groups(), _UNIT_SECONDS) if n)
    else:
        raise ValueError(f"window must be seconds or a Prometheus duration like 30s, 5m, 1h30m; got {value!r}")
    if not math.isfinite(seconds) or seconds < MIN_WINDOW_SECONDS or seconds > MAX_WINDOW_SECONDS:
        raise ValueError(
            f"window must be between {MIN_WINDOW_SECONDS}s and {MAX_WINDOW_SECONDS}s"
            f" (at least twice the scrape interval), got {value!r}"
        )
    return round(seconds)


def render_window(value: object) -> str:
    """A validated window as Prometheus reads it: ``<n>s``."""
    return f"{window_seconds(value)}s"


# A query window field: accepts ``5m``/``30s``/``1h30m``/seconds, holds ``"<n>s"``.
PromWindow = Annotated[str, BeforeValidator(render_window)]


def gate_window(query_window_seconds: float | None, gate_interval_seconds: float) -> str:
    """A gate's ``${window}``: the query window (else the gate interval) rendered from a number,
    never from user text, within the window bounds. Shared by the model and adapter rollouts."""
    seconds = round(query_window_seconds or gate_interval_seconds)
    return f"{min(MAX_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, seconds))}s"
