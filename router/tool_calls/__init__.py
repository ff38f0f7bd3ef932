"""Tool calling: the calls a model's output holds, parsed per model family (router/tool_calls/parsers.py),
whole or while it streams (router/tool_calls/streaming.py)."""
