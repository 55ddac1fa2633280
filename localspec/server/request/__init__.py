"""A request's translation into a job: its body (schemas.py), sampling fields, samplers, grammar and
JSON schema (structured.py), prompt forms (prompts.py), chat messages (chat.py, chat_tools.py), FIM (fim.py)."""
