"""API keys are matched in constant time (``LanePolicy.tenant_for_key``)."""

from __future__ import annotations

import hmac

from router.lanes import LanePolicy, TenantConfig

TENANTS = (
    TenantConfig("open"),
    TenantConfig("a", api_key="sk-alpha"),
    TenantConfig("b", api_key="sk-beta"),
    TenantConfig("c", api_key="sk-clé"),
)


def policy(auth_required: bool = True) -> LanePolicy:
    return LanePolicy(tenants=TENANTS, auth_required=auth_required)


def test_keys_find_their_tenant():
    p = policy()
    assert p.tenant_for_key("sk-alpha").name == "a"
    assert p.tenant_for_key("sk-beta").name == "b"
    assert p.tenant_for_key("sk-clé").name == "c"  # non-ASCII (compare_digest refuses such str)
    assert p.tenant_for_key("sk-alph") is None and p.tenant_for_key("sk-alphaa") is None
    assert p.tenant_for_key("\udc80") is None  # a lone surrogate is no key, not a crash
    assert p.tenant_for_key(None).name == "open" and p.tenant_for_key("").name == "open"


def test_with_authentication_off_an_unknown_key_is_no_key():
    """OpenAI's client always sends a key ("unused" in the README): without authentication it is
    served as the keyless tenant, while a tenant's own key still names that tenant."""
    p = policy(auth_required=False)
    assert p.tenant_for_key("unused").name == "open" and p.tenant_for_key("sk-alph").name == "open"
    assert p.tenant_for_key("\udc80").name == "open"
    assert p.tenant_for_key("sk-beta").name == "b"
    keyed_only = LanePolicy(tenants=TENANTS[1:])
    assert keyed_only.tenant_for_key("unused") is None  # no keyless tenant: nothing to serve it as


def test_every_keyed_tenant_is_compared_with_compare_digest(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert policy().tenant_for_key("sk-alpha").name == "a"
    # no early exit at the match: the time taken does not say which tenant (or none) matched
    assert sorted(a for a, _ in calls) == sorted(t.api_key.encode() for t in TENANTS if t.api_key)
    calls.clear()
    assert policy().tenant_for_key("sk-nope") is None and len(calls) == 3


class NoEq(str):
    """A key that fails the test if anything compares it with ``==`` (which exits at the first difference)."""

    def __eq__(self, other):
        raise AssertionError("an API key was compared with ==")

    __hash__ = str.__hash__


def test_a_key_is_never_compared_with_eq():
    assert policy().tenant_for_key(NoEq("sk-beta")).name == "b"
    assert policy().tenant_for_key(NoEq("sk-wrong")) is None
