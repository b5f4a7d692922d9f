"""Token usage per tenant, model version and request class over a window (pure; unit-tested).

The gateway counts every answer's tokens in ``gen_ai_client_token_usage`` (Envoy AI Gateway's
name, after the OpenTelemetry GenAI conventions: a histogram whose ``_sum`` is a counter of
tokens), labelled ``gen_ai_token_type`` (input | output) and with the tenant header, the model,
the version and the class; TokenMetering reads its increase over the day and tabulates it here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class TokenQueries(BaseModel):
    """PromQL template (``${window}``) returning tenant, gen_ai_request_model, version, request_class, gen_ai_token_type."""

    usage: str = (
        "sum by (tenant, gen_ai_request_model, version, request_class, gen_ai_token_type) "
        "(increase(gen_ai_client_token_usage_sum[${window}]))"
    )


class TokenUsage(BaseModel):
    tenant: str
    model: str
    version: str
    request_class: str
    input_tokens: float = 0.0
    output_tokens: float = 0.0


class UsageSample(BaseModel):
    """One series of the usage query: its labels and tokens over the window."""

    labels: dict[str, str]
    tokens: float = Field(ge=0)


def tabulate(samples: list[UsageSample]) -> list[TokenUsage]:
    """One row per (tenant, model, version, class), input and output tokens side by side, sorted."""
    rows: dict[tuple[str, str, str, str], TokenUsage] = {}
    for s in samples:
        key = (s.labels.get("tenant", ""), s.labels.get("gen_ai_request_model", ""), s.labels.get("version", ""),
               s.labels.get("request_class", ""))
        row = rows.setdefault(key, TokenUsage(tenant=key[0], model=key[1], version=key[2], request_class=key[3]))
        if s.labels.get("gen_ai_token_type") == "input":
            row.input_tokens += s.tokens
        elif s.labels.get("gen_ai_token_type") == "output":
            row.output_tokens += s.tokens
    return [rows[k] for k in sorted(rows)]


def render_markdown(rows: list[TokenUsage], title: str) -> str:
    lines = [f"### {title}", "", "| tenant | model | version | class | input tokens | output tokens |", "|---|---|---|---|--:|--:|"]
    lines += [f"| {r.tenant} | {r.model} | {r.version} | {r.request_class} | {r.input_tokens:,.0f} | {r.output_tokens:,.0f} |"
              for r in rows]
    if not rows:
        lines.append("| (no tokens in this window) | | | | | |")
    return "\n".join(lines)
