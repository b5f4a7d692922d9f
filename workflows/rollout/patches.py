"""Every ``workflow.patched`` id ModelRollout asks, in one place: what changed, where the run asks,
and which recorded history (tests/histories/, replayed by tests/workflows/test_replay.py) takes
which side. A run recorded before a change replays the old side; a patch stays until no run that
old can still be in flight. Runs recorded on today's code take every new side they reach.

==============================  ==========================  =========================================
patch id                        asked in                    old side replayed by / new side by
==============================  ==========================  =========================================
``retire-after-promotion``      steps/retire.py             old: model-rollout-promoted,
                                                            model-rollout-rolled-back,
                                                            devserver-rollout-rolled-back (the run
                                                            sleeps the scale-down delay, then scales);
                                                            new: model-rollout-golden-failed
``golden-gate``                 steps/warm_up.py,           old: model-rollout-promoted, -rolled-back,
                                steps/shadow.py             devserver-rollout-rolled-back (no golden
                                                            set, no mirror); new: model-rollout-golden-failed
``quality-failure-              steps/roll_back.py          new: model-rollout-golden-failed (asked only
deprecates``                                                after a quality failure; no old history)
``metrics-via-meter``           actions.py                  old: model-rollout-promoted, -rolled-back,
                                                            devserver-rollout-rolled-back (record_rollout
                                                            and record_gate_verdict activities);
                                                            new: model-rollout-golden-failed
``batching-sweep``              steps/warm_up.py            asked only with ``batching``: no history;
                                                            the new side is tests/workflows/rollout/
``prestage-nodes``              steps/stage.py              asked only with ``prestage``: no history;
                                                            the new side is tests/workflows/node_cache/
``carry-lora-adapters``         steps/start.py              asked only when the stable's pods load
                                                            adapters: no history; the new side is
                                                            tests/workflows/adapters/
``shadow-tally``                steps/shadow.py             asked only with ``shadow``, at the first
                                                            comparison: no history; the new side is
                                                            tests/workflows/quality/ (judge_shadow_pairs
                                                            counts in the activity; the old side read
                                                            the pairs into history)
``size-from-live-total``        steps/canary.py,            old: model-rollout-promoted, -rolled-back,
                                steps/promote.py            devserver-rollout-rolled-back,
                                                            model-rollout-golden-failed (sized once from
                                                            the stable at start); new: tests/workflows/
                                                            rollout/ (re-read before each step and at
                                                            promotion, which waits for the total Ready)
``metric-missing``              steps/canary.py             asked only when a gate query returned no
                                                            series while requests flowed (results
                                                            recorded before it carry no ``no_series``):
                                                            no history; the new side is tests/workflows/
                                                            rollout/ (pauses at once, "metric missing:")
``outcome-in-status``           workflow.py                 old: model-rollout-rolled-back,
                                                            devserver-rollout-rolled-back,
                                                            model-rollout-golden-failed (a rollback
                                                            completed normally, its result the outcome);
                                                            new: tests/workflows/rollout/ (a rollback or
                                                            an abort fails the run: ApplicationError
                                                            RolledBack / Aborted, the result in its
                                                            details and in the ``result`` query)
``search-attributes-checked``   workflow.py (first)         old: every recorded history (upserts at once);
                                                            new: tests/workflows/rollout/ (check_search_
                                                            attributes first; fails naming what is missing)
``diagnose-verdicts``           steps/canary.py             old: model-rollout-promoted, -rolled-back,
                                                            devserver-rollout-rolled-back, model-rollout-
                                                            golden-failed (a verdict is judged alone);
                                                            new: tests/workflows/rollout/ (each verdict's
                                                            cause from read_canary_fleet: an overload
                                                            re-sizes, lost capacity holds the clock, a
                                                            crashed canary rolls back)
``notify``                      actions.py                  old: every recorded history (no notices);
                                                            new: tests/workflows/rollout/ (a notify
                                                            activity at each pause, resume and end)
``gateway-errors``              steps/canary.py             old: every recorded history (the error
                                                            rate is the pods' own only); new:
                                                            tests/workflows/rollout/ (the gate
                                                            queries carry gateway_error_rate: the
                                                            gateway's 5xx and no-healthy-upstream
                                                            503s for the canary's backend)
``gates-read-on-stable``        workflow.py                 old: every recorded history (a gate reading
                                                            nothing is found at the first observation,
                                                            1 % on the canary); new: tests/workflows/
                                                            rollout/ (the gates asked about the stable
                                                            before the first shift; a metric with no
                                                            series pauses there, naming it)
==============================  ==========================  =========================================

tests/workflows/test_replay.py checks that model-rollout-golden-failed holds the new side of
``golden-gate`` and ``quality-failure-deprecates``.
"""

from __future__ import annotations

from workflows.core.telemetry import METER_PATCH

# Runs from before this patch kept the rollout open for the scale-down delay; newer ones end when
# traffic has moved and leave the delayed scale-down to a RetireVersion workflow (retire_version.py).
RETIRE_PATCH = "retire-after-promotion"
# Runs from before the quality gates (issue 21) never read a golden set at warm-up.
GOLDEN_PATCH = "golden-gate"
# Runs from before batching was tuned at warm-up (issue 19) never swept; asked only when a run has `batching`.
BATCHING_PATCH = "batching-sweep"
# Runs from before pre-staging (issue 18) never staged onto nodes.
PRESTAGE_PATCH = "prestage-nodes"
# Runs from before LoRA adapters followed the base (issue 18) never carried --lora-modules nor moved
# adapter rules; asked only when the stable version's pods load adapters at start.
ADAPTERS_PATCH = "carry-lora-adapters"
# Runs from before this patch left a version whose golden set or shadow comparison failed in
# `testing` (a warm-up failure) or `testing` again (a shadow drift), free to be rolled out again.
QUALITY_DEPRECATES_PATCH = "quality-failure-deprecates"

# Runs from before this patch read the mirrored pairs themselves (read_shadow_pairs) into history:
# user traffic in clear, and past 2 MiB a result fails. Newer ones get only counts (judge_shadow_pairs).
SHADOW_TALLY_PATCH = "shadow-tally"
# Runs from before issue 32 sized the canary and the promoted version once, from the stable's
# replicas at start; newer ones re-read the stable's live total before each step and at promotion.
LIVE_TOTAL_PATCH = "size-from-live-total"

# Runs from before this patch counted a gate without any series as one more inconclusive observation
# (pausing after inconclusive_limit of them, as "too few samples"); newer ones pause at once and say
# which metric is missing.
METRIC_MISSING_PATCH = "metric-missing"

# Runs from before issue 35 completed normally when they rolled back or were aborted (green in the web
# UI, exit 0 from `temporal workflow execute`); newer ones fail with a typed, non-retryable error.
OUTCOME_PATCH = "outcome-in-status"

# Runs from before issue 31 upserted the search attributes without asking whether the namespace has
# them: in one without, the workflow task failed and retried forever. Newer ones ask first
# (check_search_attributes) and fail at once naming the missing attribute and the command that adds it.
SEARCH_ATTRIBUTES_PATCH = "search-attributes-checked"

# Runs from before issue 32 (item 4) judged each verdict alone: an overloaded canary failing its latency
# gates was rolled back and deprecated, a lost canary pod was invisible. Newer ones read the canary's
# pods and load after each verdict and act on its cause (cause_actions.py).
DIAGNOSIS_PATCH = "diagnose-verdicts"

# Runs from before issue 35 told nobody; newer ones issue a notice (a Kubernetes Event, the optional
# webhook) at each pause, resume, rollback, abort and promotion.
NOTIFY_PATCH = "notify"

# Runs from before issue 32 (item 3) gated on the pods' own error counts: the 503s the gateway answers for
# a lost or crashed canary pod counted nowhere. Newer ones also gate on the gateway's answers for the
# canary's backend (GateQueries.gateway_error_rate; no gateway data is no pass).
GATEWAY_ERRORS_PATCH = "gateway-errors"

# Runs from before this patch found a gate that reads nothing only at the first observation, with
# 1 % of traffic already on the canary; newer ones ask the gates about the stable before the first
# shift (steps/canary.py gates_read_the_stable) and pause there, naming the metric.
STABLE_READ_PATCH = "gates-read-on-stable"

PATCHES = (RETIRE_PATCH, GOLDEN_PATCH, QUALITY_DEPRECATES_PATCH, METER_PATCH, BATCHING_PATCH, PRESTAGE_PATCH, ADAPTERS_PATCH, SHADOW_TALLY_PATCH,
           LIVE_TOTAL_PATCH, METRIC_MISSING_PATCH, OUTCOME_PATCH, SEARCH_ATTRIBUTES_PATCH, DIAGNOSIS_PATCH, NOTIFY_PATCH,
           GATEWAY_ERRORS_PATCH, STABLE_READ_PATCH)
