from __future__ import annotations

from gateway.proxy.token_estimate import DEFAULT_CHARS_PER_TOKEN, CharsPerToken
from gateway.proxy.usage import prompt_usage


def test_a_model_keeps_the_default_until_enough_tokens_were_counted() -> None:
    est = CharsPerToken(min_tokens=1000)
    est.observe("m", 900, 500)  # 1.8 characters a token, but only 500 tokens so far
    assert est.ratio("m") == DEFAULT_CHARS_PER_TOKEN
    est.observe("m", 900, 500)
    assert est.ratio("m") == 1.8
    assert est.tokens("m", 3600) == 2000
    assert est.ratio("other") == DEFAULT_CHARS_PER_TOKEN  # each model its own


def test_recent_answers_weigh_most() -> None:
    est = CharsPerToken(min_tokens=100, forget_tokens=1000)
    for _ in range(10):
        est.observe("m", 400, 100)  # 4.0
    for _ in range(30):
        est.observe("m", 200, 100)  # 2.0: the sums halve past 1,000 tokens
    assert 2.0 < est.ratio("m") < 2.1


def test_implausible_pairs_are_ignored() -> None:
    est = CharsPerToken(min_tokens=10)
    for chars, tokens in ((0, 50), (50, 0), (10, 100), (5000, 100)):
        est.observe("m", chars, tokens)
    assert est.ratio("m") == DEFAULT_CHARS_PER_TOKEN


def test_every_answer_is_read_until_calibrated_then_one_in_sample_every() -> None:
    est = CharsPerToken(min_tokens=100, sample_every=4)
    assert est.wants("m")
    est.observe("m", 50, 20)
    assert all(est.wants("m") for _ in range(5))
    est.observe("m", 300, 100)
    assert [est.wants("m") for _ in range(8)].count(True) == 2


def test_prompt_usage_reads_each_shape() -> None:
    chat = b'{"choices":[],"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8}}'
    assert prompt_usage(chat) == 12
    messages = (
        b'{"usage":{"input_tokens":5,"cache_read_input_tokens":7,'
        b'"cache_creation_input_tokens":1,"output_tokens":3}}'
    )
    assert prompt_usage(messages) == 13
    assert prompt_usage(b'data: {"usage":null}\n\n') is None
    assert prompt_usage(b'{"choices":[{"text":"usage"}]}') is None
