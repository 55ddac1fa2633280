"""Anthropic's Messages API: routes.py (/v1/messages, count_tokens), convert.py (its request as chat
messages and tools, the answer as its blocks), stream.py (its events)."""
