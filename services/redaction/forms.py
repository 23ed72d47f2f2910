"""Secret form answers: the per-run state of what a run's secret forms asked for and were answered.

``SecretFieldTracker`` follows goose elicitations (``actionRequired`` with ``actionType:
elicitation`` and a ``requested_schema`` whose properties are ``writeOnly: true`` or ``format:
"password"``) and the matching ``elicitationResponse``; the values answered for those fields are
then redacted everywhere as ``[REDACTED:form-secret]`` by ``Redactor.redact_event``. It also keeps
which streams are inside a private key block printed one line per event.

Its own module because it is state, not a rule: the redactor (``redactor.py``) is pure and shared,
the tracker belongs to one run and is serialised with its state (``to_dict``/``from_dict``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


def _schema_secret_fields(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    out = []
    for name, prop in props.items():
        if isinstance(name, str) and isinstance(prop, dict):
            if prop.get("writeOnly") is True or prop.get("format") == "password":
                out.append(name)
    return out


def _id_key(x: Any) -> str | None:
    if isinstance(x, str):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return _int_text(x)
    return None


def _int_text(x: int) -> str | None:
    try:
        return str(x)
    except ValueError:  # beyond Python's int->str digit limit: never an id or a typed answer
        return None


def _action_dicts(obj: Any) -> list[dict[Any, Any]]:
    """Every object inside ``obj`` (any depth, document order) that has an ``actionType``."""
    found: list[dict[Any, Any]] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if "actionType" in x:
                found.append(x)
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return found


def _secret_value_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v if v else None
    if isinstance(v, bool) or v is None:
        return None  # true/false/null are never redacted everywhere
    if isinstance(v, int):
        return _int_text(v)
    if isinstance(v, float):
        return json.dumps(v)
    return None


def _user_data(d: dict[Any, Any]) -> dict[Any, Any] | None:
    for key in ("user_data", "userData"):
        ud = d.get(key)
        if isinstance(ud, dict):
            return ud
    return None


class SecretFieldTracker:
    """Per-run redaction state: secret form fields of elicitations and the values answered for
    them, and the streams currently inside a private key block. Pure; ``to_dict``/``from_dict``
    make it part of a run's persisted state. NOTE: the serialized form holds the secret values in
    clear text (they are needed to find later occurrences); keep that state as private as the raw
    log.
    """

    VERSION: ClassVar[int] = 1

    def __init__(self) -> None:
        self._fields: dict[str, tuple[str, ...]] = {}  # elicitation id -> secret field names
        self._values: list[str] = []  # in order of discovery, unique
        self._value_set: set[str] = set()
        self._key_blocks: dict[str, int] = {}  # stream inside a private key block -> body lines seen

    def observe(self, obj: Any) -> bool:
        """Scans any JSON value for elicitation requests (recording their secret fields) and for
        responses to tracked elicitations (recording the answered secret values). Requests are
        collected before responses, so both may sit in the same object. Returns True when the
        state changed."""
        changed = False
        dicts = _action_dicts(obj)
        for d in dicts:
            if d.get("actionType") == "elicitation":
                eid = _id_key(d.get("id"))
                schema = d.get("requested_schema", d.get("requestedSchema"))
                names = _schema_secret_fields(schema)
                if eid is not None and names:
                    merged = tuple(dict.fromkeys(self._fields.get(eid, ()) + tuple(names)))
                    if merged != self._fields.get(eid):
                        self._fields[eid] = merged
                        changed = True
        for d in dicts:
            fields = self.fields_for_response(d)
            if not fields:
                continue
            data = _user_data(d)
            for f in fields:
                text = _secret_value_text(data.get(f)) if data is not None else None
                if text is not None and text not in self._value_set:
                    self._value_set.add(text)
                    self._values.append(text)
                    changed = True
        return changed

    def fields_for_response(self, d: dict[Any, Any]) -> tuple[str, ...]:
        """Secret field names when ``d`` is an ``elicitationResponse`` to a tracked elicitation."""
        if not self._fields or d.get("actionType") != "elicitationResponse":
            return ()
        eid = _id_key(d.get("id"))
        if eid is None or _user_data(d) is None:
            return ()
        return self._fields.get(eid, ())

    def secret_fields(self) -> dict[str, tuple[str, ...]]:
        return dict(self._fields)

    def secret_values(self) -> tuple[str, ...]:
        return tuple(self._values)

    def has_values(self) -> bool:
        return bool(self._values)

    def key_block_lines(self, stream: str) -> int | None:
        """Body lines seen so far when ``stream`` is inside a private key block, else None."""
        return self._key_blocks.get(stream)

    def set_key_block(self, stream: str, lines: int | None) -> None:
        """``lines`` body lines seen inside a block of ``stream``; None: not inside one."""
        if lines is None:
            self._key_blocks.pop(stream, None)
        else:
            self._key_blocks[stream] = lines

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.VERSION,
            "fields": {k: list(v) for k, v in self._fields.items()},
            "values": list(self._values),
        }
        if self._key_blocks:  # optional: states written before it existed stay valid
            out["keyBlocks"] = dict(sorted(self._key_blocks.items()))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SecretFieldTracker:
        if not isinstance(d, dict) or d.get("version") != cls.VERSION:
            raise ValueError(f"unsupported SecretFieldTracker state: {d!r:.80}")
        t = cls()
        for k, v in (d.get("fields") or {}).items():
            t._fields[str(k)] = tuple(str(x) for x in v)
        for v in d.get("values") or ():
            if isinstance(v, str) and v and v not in t._value_set:
                t._value_set.add(v)
                t._values.append(v)
        blocks = d.get("keyBlocks")
        if isinstance(blocks, dict):
            t._key_blocks = {str(k): int(v) for k, v in blocks.items() if isinstance(v, int)}
        return t

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretFieldTracker) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:  # never print the values
        return (f"SecretFieldTracker(elicitations={len(self._fields)}, values={len(self._values)}, "
                f"key_blocks={len(self._key_blocks)})")
