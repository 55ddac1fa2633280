"""Screens pushed over the chat: model loading (with progress and load errors)."""
