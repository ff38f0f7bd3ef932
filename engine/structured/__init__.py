"""Structured outputs: constraints a request's output must match (a JSON schema, a regex, a choice,
a grammar), compiled by llguidance into token-bitmask matchers (docs/ARCHITECTURE.md)."""
