"""A server's form as questions asked one field at a time (gateway.tools_mcp.elicit)."""

from __future__ import annotations

import pytest

from gateway.tools_mcp.elicit import form_content, form_questions

FORM = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "title": "City", "enum": ["paris", "rome"], "enumNames": ["Paris", "Rome"]},
    "confirm": {"type": "boolean", "description": "Book it now?", "default": True},
    "nights": {"type": "integer", "minimum": 1, "maximum": 14},
    "note": {"type": "string", "maxLength": 10, "default": "none"},
    "extras": {"type": "array", "items": {"type": "string", "enum": ["breakfast", "parking"]}},
}}


def test_each_field_is_a_question_in_the_forms_order_choices_and_yes_no_on_buttons():
    questions = form_questions(FORM)
    assert [(q.name, q.kind, q.buttoned, q.required) for q in questions] == [
        ("city", "choice", True, True), ("confirm", "boolean", True, False), ("nights", "integer", False, False),
        ("note", "text", False, False), ("extras", "choices", False, False)]
    assert questions[0].choices == (("paris", "Paris"), ("rome", "Rome"))
    assert questions[1].prompt() == "confirm: Book it now? [default: yes]"


def test_answers_are_typed_and_a_wrong_one_says_what_fits():
    city, confirm, nights, note, extras = form_questions(FORM)
    assert (city.parse("Rome"), city.parse("paris"), confirm.parse("No"), nights.parse(" 3 ")) == ("rome", "paris", False, 3)
    assert extras.parse("parking, breakfast") == ["parking", "breakfast"]
    for question, answer, why in ((city, "Oslo", "answer one of: Paris, Rome"), (confirm, "maybe", "answer yes or no"),
                                  (nights, "15", "at most 14"), (nights, "two", "answer a whole number"),
                                  (note, "x" * 11, "at most 10 characters")):
        with pytest.raises(ValueError, match=why):
            question.parse(answer)


def test_a_skipped_field_gets_its_default_and_one_without_is_left_out():
    questions = form_questions(FORM)
    assert form_content(questions, {"city": "rome"}) == {"city": "rome", "confirm": True, "note": "none"}


def test_a_nested_form_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="'address' is of type 'object'"):
        form_questions({"type": "object", "properties": {"address": {"type": "object"}}})
