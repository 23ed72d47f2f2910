"""Stand-ins shared by the tests: what cannot be provoked with real input on demand."""

from __future__ import annotations

from typing import Any

import orjson


class RaisingRedactor:
    """Stands in for a redactor bug on exotic input (its owner fixes the real ones): raises `error`
    on any event whose JSON holds `token`; everything else passes through unredacted."""

    rule_names: tuple[str, ...] = ()

    def __init__(self, token: str = "POISON", error: type[BaseException] = RecursionError) -> None:
        self.token = token
        self.error = error

    def redact_event(self, event: dict[str, Any], tracker: Any = None) -> tuple[dict[str, Any], dict[str, int]]:
        if self.token in orjson.dumps(event).decode():
            raise self.error("simulated")
        return event, {}

    def redact_text(self, text: str) -> tuple[str, dict[str, int]]:  # run records' labels (host, agent)
        return text, {}
