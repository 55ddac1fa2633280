"""A request's translation into a job: its body (schemas.py), sampling fields, samplers, grammar and
JSON schema (structured.py), prompt forms (prompts.py), a chat request's one plan (chat.py, chat_tools.py),
FIM (fim.py)."""
