"""Saved conversations: one local SQLite file ($LOCALSPEC_HOME/chats.sqlite), stdlib sqlite3 only.

Each assistant message keeps the stats of the request that wrote it (tokens/s, acceptance, drafter, k),
so a reloaded chat still says where speculation paid. The store is used from the UI thread only.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models.paths import home

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    system TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system: str
    created: float
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str  # "user" | "assistant"
    content: str
    stats: dict[str, Any] | None  # assistant messages: Stats.to_dict() + mode, drafter, k, finish
    created: float


def default_path() -> Path:
    return home() / "chats.sqlite"


class ChatStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def new_conversation(self, title: str, *, model: str = "", system: str = "") -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute("INSERT INTO conversations (title, model, system, created, updated) "
                                   "VALUES (?, ?, ?, ?, ?)", (title, model, system, now, now))
        assert cur.lastrowid is not None  # an INSERT sets it
        return cur.lastrowid

    def add_message(self, conversation_id: int, role: str, content: str,
                    stats: dict[str, Any] | None = None) -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute("INSERT INTO messages (conversation_id, role, content, stats, created) "
                                   "VALUES (?, ?, ?, ?, ?)",
                                   (conversation_id, role, content, json.dumps(stats) if stats else None, now))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        assert cur.lastrowid is not None  # an INSERT sets it
        return cur.lastrowid

    def conversations(self) -> list[Conversation]:
        rows = self._db.execute("SELECT id, title, model, system, created, updated FROM conversations "
                                "ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT id, title, model, system, created, updated FROM conversations "
                               "WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(*row) if row else None

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute("SELECT id, role, content, stats, created FROM messages "
                                "WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return [StoredMessage(i, role, content, json.loads(s) if s else None, t) for i, role, content, s, t in rows]

    def drop_last_answer(self, conversation_id: int) -> None:
        """Forget the conversation's newest message if it is an answer (it is being answered again)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages WHERE conversation_id"
                             " = ?) AND role = 'assistant'", (conversation_id,))

    def delete(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def recent_inputs(self, limit: int = 100) -> list[str]:
        """The user's latest prompts, oldest first: seeds the input history (↑)."""
        rows = self._db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?",
                                (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]
