from gateway.formatting import split_message, utf16_len


def _fences_balanced(part: str) -> bool:
    return sum(1 for line in part.split("\n") if line.strip().startswith("```")) % 2 == 0


def test_short_text_is_one_part():
    assert split_message("hello", 100) == ["hello"]


def test_prefers_paragraph_boundaries():
    text = "first paragraph " * 5 + "\n\n" + "second paragraph " * 5
    parts = split_message(text, 120)
    assert parts[0] == ("first paragraph " * 5).rstrip()
    assert all(len(p) <= 120 for p in parts)
    assert "".join(p.replace("\n", "").replace(" ", "") for p in parts) == text.replace("\n", "").replace(" ", "")


def test_code_block_survives_a_split():
    code = "\n".join(f"line_{i} = {i} * 2" for i in range(600))
    text = "Here is the script:\n\n```python\n" + code + "\n```\n\nThat is all."
    parts = split_message(text, 2000)
    assert len(parts) > 2
    assert all(len(p) <= 2000 for p in parts)
    assert all(_fences_balanced(p) for p in parts)
    # every continuation part that holds code reopens the block with its language
    assert all(p.startswith("```python") for p in parts[1:-1])
    body = "\n".join(parts)
    for i in (0, 299, 599):
        assert f"line_{i} = {i} * 2" in body


def test_utf16_limit_counts_emoji_as_two_units():
    text = "😀" * 5000  # 10,000 UTF-16 units
    parts = split_message(text, 4096, length=utf16_len)
    assert all(utf16_len(p) <= 4096 for p in parts)
    assert "".join(parts) == text


def test_ten_thousand_characters_with_no_spaces():
    text = "x" * 10_000
    parts = split_message(text, 2000)
    assert "".join(parts) == text
    assert all(len(p) <= 2000 for p in parts)
