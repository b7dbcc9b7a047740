"""A server's form (an elicitation's ``requested_schema``) as questions asked one field at a time.

    questions = form_questions(params.requested_schema)   # ValueError: a form we cannot ask
    value = questions[0].parse("Rome")                     # ValueError: the answer does not fit
    content = form_content(questions, {"city": "Rome"})    # with the defaults of fields left unanswered

The schema is the restricted JSON Schema of the spec: one flat object whose properties are strings
(maybe ``enum``/``oneOf`` choices or a ``format``), numbers, integers, booleans, or arrays of enum
strings (several choices).  A choice or a yes/no is answered with buttons; anything else with text.
A field the user skips gets its ``default`` when it has one (SEP-1034), and is left out otherwise
(a required field cannot be skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_CHOICES = 25  # as buttons; a longer list is asked as text naming them
YES = ("yes", "y", "true", "1", "ok")
NO = ("no", "n", "false", "0")
Value = str | int | float | bool | list[str]


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    title: str
    description: str
    kind: str  # text | number | integer | boolean | choice | choices
    choices: tuple[tuple[str, str], ...] = ()  # (value, label) of a choice field
    default: Value | None = None
    required: bool = False
    min_length: int | None = None
    max_length: int | None = None
    minimum: float | None = None
    maximum: float | None = None

    @property
    def buttoned(self) -> bool:
        return self.kind == "boolean" or (self.kind == "choice" and len(self.choices) <= MAX_CHOICES)

    def prompt(self) -> str:
        """The question as the user reads it (without how to answer)."""
        text = self.title if not self.description or self.description == self.title else f"{self.title}: {self.description}"
        if self.kind in ("choice", "choices") and not self.buttoned:
            text += " (one of: " + ", ".join(label for _, label in self.choices) + ")"
        if self.kind == "choices":
            text += " (several may be named, separated by commas)"
        if self.default is not None and self.default != "":
            text += f" [default: {_shown(self.default)}]"
        return text

    def parse(self, answer: str) -> Value:
        """The typed value of ``answer``; ValueError saying what fits when it does not."""
        text = answer.strip()
        if self.kind == "boolean":
            if text.lower() in YES:
                return True
            if text.lower() in NO:
                return False
            raise ValueError("answer yes or no")
        if self.kind == "choice":
            return self._choice(text)
        if self.kind == "choices":
            return [self._choice(part.strip()) for part in text.split(",") if part.strip()]
        if self.kind in ("number", "integer"):
            try:
                number: int | float = int(text) if self.kind == "integer" else float(text)
            except ValueError:
                raise ValueError(f"answer {'a whole number' if self.kind == 'integer' else 'a number'}") from None
            if self.minimum is not None and number < self.minimum:
                raise ValueError(f"at least {self.minimum:g}")
            if self.maximum is not None and number > self.maximum:
                raise ValueError(f"at most {self.maximum:g}")
            return number
        if self.min_length is not None and len(text) < self.min_length:
            raise ValueError(f"at least {self.min_length} characters")
        if self.max_length is not None and len(text) > self.max_length:
            raise ValueError(f"at most {self.max_length} characters")
        return text

    def _choice(self, text: str) -> str:
        for value, label in self.choices:
            if text == value or text.lower() == label.lower() or text.lower() == value.lower():
                return value
        raise ValueError("answer one of: " + ", ".join(label for _, label in self.choices))


def form_questions(schema: dict[str, Any]) -> list[Question]:
    """The fields of ``schema`` in its order, as questions; ValueError for a form that is not flat."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError("the form is not an object of fields")
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        raise ValueError("the form's properties are not a mapping")
    required = set(schema.get("required") or ())
    return [_question(name, spec if isinstance(spec, dict) else {}, name in required)
            for name, spec in properties.items()]


def _question(name: str, spec: dict[str, Any], required: bool) -> Question:
    kind = spec.get("type", "string")
    common = dict(name=name, title=str(spec.get("title") or name), description=str(spec.get("description") or ""),
                  default=spec.get("default"), required=required)
    if kind == "boolean":
        return Question(kind="boolean", **common)  # type: ignore[arg-type]
    if kind in ("number", "integer"):
        return Question(kind=kind, minimum=spec.get("minimum"), maximum=spec.get("maximum"), **common)  # type: ignore[arg-type]
    if kind == "array":
        items = spec.get("items") if isinstance(spec.get("items"), dict) else {}
        return Question(kind="choices", choices=_choices(items), **common)  # type: ignore[arg-type]
    if kind != "string":
        raise ValueError(f"the field {name!r} is of type {kind!r}, which a chat cannot ask for")
    choices = _choices(spec)
    if choices:
        return Question(kind="choice", choices=choices, **common)  # type: ignore[arg-type]
    return Question(kind="text", min_length=spec.get("minLength"), max_length=spec.get("maxLength"), **common)  # type: ignore[arg-type]


def _choices(spec: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    if isinstance(spec.get("enum"), list):
        names = spec.get("enumNames") if isinstance(spec.get("enumNames"), list) else None
        return tuple((str(v), str(names[i]) if names and i < len(names) else str(v)) for i, v in enumerate(spec["enum"]))
    for key in ("oneOf", "anyOf"):
        if isinstance(spec.get(key), list):
            return tuple((str(o.get("const")), str(o.get("title") or o.get("const"))) for o in spec[key]
                         if isinstance(o, dict) and "const" in o)
    return ()


def form_content(questions: list[Question], answers: dict[str, Value]) -> dict[str, Value]:
    """The form's content: each answer, and the default of each field left unanswered that has one."""
    out: dict[str, Value] = {}
    for q in questions:
        if q.name in answers:
            out[q.name] = answers[q.name]
        elif q.default is not None:
            out[q.name] = q.default
    return out


def _shown(value: Value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(value)
    return str(value)
