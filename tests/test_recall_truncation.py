"""Truncation around matches: the densest window, phrase before proximity before single terms."""

from gateway.memory.truncation import NEAR_CHARS, match_positions, query_terms, truncate_around_matches

FILL = "lorem ipsum dolor sit amet. "  # 28 characters of text that matches nothing


def filler(n: int) -> str:
    return (FILL * (n // len(FILL) + 1))[:n - 1] + " "


def test_text_that_fits_is_kept_whole():
    assert truncate_around_matches("short docker talk", "docker", max_chars=100) == "short docker talk"


def test_the_densest_window_is_kept_with_a_quarter_before_it():
    text = filler(5_000) + "docker once " + filler(20_000) + "docker docker docker here " + filler(20_000)
    out = truncate_around_matches(text, "docker", max_chars=4_000)
    cluster = text.index("docker docker docker")
    assert "docker docker docker here" in out and "docker once" not in out
    assert out.startswith("[... earlier part of the conversation omitted ...]\n")
    assert out.endswith("\n[... later part of the conversation omitted ...]")
    body = out.split("\n", 1)[1].rsplit("\n", 1)[0]
    assert len(body) == 4_000
    assert body == text[cluster - 1_000:cluster + 3_000]  # a quarter of the window before the match


def test_the_whole_phrase_wins_over_scattered_terms():
    scattered = " ".join(["docker " + filler(300), "restart " + filler(300)] * 20)
    text = scattered + filler(10_000) + "then docker restart fixed it " + filler(10_000)
    out = truncate_around_matches(text, "docker restart", max_chars=3_000)
    assert "then docker restart fixed it" in out
    assert match_positions(text, "docker restart")[0] == "phrase"


def test_terms_near_each_other_win_over_lone_terms():
    lone = ("nginx " + filler(2_000)) * 5 + ("certificate " + filler(2_000)) * 5
    near = "the nginx config points at the old certificate file "
    text = lone + near + filler(20_000)
    strategy, positions = match_positions(text, "nginx certificate")
    assert strategy == "near"
    start = text.index(near)
    assert all(start <= p < start + len(near) for p in positions)
    out = truncate_around_matches(text, "nginx certificate", max_chars=2_000)
    assert near in out


def test_terms_further_apart_than_near_chars_are_not_near():
    text = "nginx " + "x" * (NEAR_CHARS + 10) + " certificate"
    assert match_positions(text, "nginx certificate") == ("term", [0, len(text) - len("certificate")])


def test_no_match_keeps_the_start_and_case_is_ignored():
    text = filler(10_000)
    assert truncate_around_matches(text, "kubernetes", max_chars=1_000) == (
        text[:1_000] + "\n[... later part of the conversation omitted ...]")
    assert match_positions("We use DOCKER daily", "docker") == ("term", [7])


def test_words_match_at_word_starts_and_cjk_anywhere():
    assert match_positions("redeploy then deployment", "deploy*") == ("term", [14])
    assert match_positions("我们的数据库迁移", "数据库") == ("term", [3])


def test_query_terms_drop_operators_and_negated_words():
    assert query_terms('"connection refused" deploy* NOT nginx OR (cache)') == (
        ["connection refused"], ["connection", "refused", "deploy", "cache"])
    assert query_terms("") == ([], [])
    assert query_terms('-secret "x"') == ([], ["x"])
