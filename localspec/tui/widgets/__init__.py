"""Widgets of the chat app, one per file; each can be mounted and tested alone in a tiny host App."""
