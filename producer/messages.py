"""Chat messages as a job carries them (``JobSpec.messages``)."""

from __future__ import annotations

from typing import Literal

from producer.wire import Frozen


class ChatMessage(Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
