"""Lane classification: an explicit lane the tenant may use, else the tenant's default, else rules
on the request's shape (pure Python)."""

from __future__ import annotations

from router.api import invalid
from router.lanes import LanePolicy, TenantConfig


def classify(
    policy: LanePolicy,
    tenant: TenantConfig,
    *,
    explicit_lane: str | None,
    num_prompt_tokens: int,
    stream: bool,
    max_tokens: int,
    max_tokens_given: bool,
) -> str:
    names = {lane.name for lane in policy.lanes}
    if explicit_lane is not None:
        if explicit_lane not in names:
            raise invalid(
                f"unknown lane {explicit_lane!r}; lanes: {', '.join(sorted(names))}", param="lane", code="unknown_lane"
            )
        if tenant.may_use(explicit_lane):
            return explicit_lane
    if tenant.default_lane:
        return tenant.default_lane
    rules = policy.rules
    candidates = []
    if num_prompt_tokens >= rules.long_context_tokens:
        candidates.append("long_context")
    if not stream and (not max_tokens_given or max_tokens >= rules.batch_min_max_tokens):
        candidates.append("batch")
    candidates.append(rules.default_lane)
    for lane in candidates:
        if lane in names and tenant.may_use(lane):
            return lane
    allowed = [lane.name for lane in policy.lanes if tenant.may_use(lane.name)]
    if not allowed:
        raise invalid(f"tenant {tenant.name!r} may not use any lane", param="lane")
    return allowed[0]
