"""The input formats' mappings, one module each, and their registry (``RULES``, by format name).

Each module holds only what is its format's own (record and block dispatch, where the format keeps
ids, names, arguments and results, its usage record) and imports only the shared machinery
(``machinery``, ``tools``, ``shell``, ``paths``, ``timefmt``, ``error_classes``' class names), never
another format. Its ``RULES`` is built by ``machinery.format_rules`` from its row of
contracts/formats.py (name, product); the row's
``module`` names the file, and tests/core/test_formats_registry.py holds the table, this registry and
``services/native.py``'s compiled modules equal.
"""

from __future__ import annotations

from services.normalizer.formats import claude_code, codex, gemini_cli, goose, opencode
from services.normalizer.machinery import FormatRules

# One line per format: the registry ``RunNormalizer.set_format`` reads.
RULES: dict[str, FormatRules] = {
    rules.name: rules for rules in (goose.RULES, claude_code.RULES, codex.RULES, gemini_cli.RULES, opencode.RULES)
}
