"""accord.policies.model.chat_ids: a prompt's token ids, rendered once per distinct messages and kept (bounded)
for the next time the same messages come (every evaluation, every epoch, instances with one prompt)."""

from __future__ import annotations

from collections import OrderedDict

from accord.models.tiny import tiny_tokenizer
from accord.policies import model as model_module
from accord.policies.model import chat_ids

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]


class CountingTokenizer:
    """The tiny tokenizer, counting how often the template is rendered."""

    def __init__(self, template: bool = True):
        self.inner, self.rendered = tiny_tokenizer(), 0
        self.chat_template = self.inner.chat_template if template else None

    def apply_chat_template(self, *args, **kwargs):
        self.rendered += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        self.rendered += 1
        return self.inner(*args, **kwargs)


def test_cached_ids_equal_the_rendered_ones_and_render_once():
    tok, cache = CountingTokenizer(), OrderedDict()
    fresh = tiny_tokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    fresh = list(fresh["input_ids"] if hasattr(fresh, "keys") else fresh)
    first = chat_ids(tok, MESSAGES, cache)
    first.append(-1)   # the caller's list is its own: the cache is not changed through it
    again = chat_ids(tok, [dict(m) for m in MESSAGES], cache)   # equal messages, other objects
    assert again == fresh and tok.rendered == 1
    other = chat_ids(tok, [MESSAGES[0], {"role": "user", "content": "What is 2 + 4?"}], cache)
    assert other != fresh and tok.rendered == 2
    assert chat_ids(tok, MESSAGES, None) == fresh and tok.rendered == 3   # no cache: rendered every time


def test_without_a_template_and_with_unhashable_fields():
    plain, cache = CountingTokenizer(template=False), OrderedDict()
    expected = tiny_tokenizer()("Be brief.\n\nWhat is 2 + 3?\n\n", add_special_tokens=True)["input_ids"]
    assert chat_ids(plain, MESSAGES, cache) == chat_ids(plain, MESSAGES, cache) == expected
    assert plain.rendered == 1
    # a field that is a list (content parts) is rendered each time, never cached
    parts = [{"role": "user", "content": "hi", "meta": ["a"]}]
    tok = CountingTokenizer()
    chat_ids(tok, parts, cache)
    chat_ids(tok, parts, cache)
    assert tok.rendered == 2 and len(cache) == 1


def test_the_cache_keeps_the_most_recently_used(monkeypatch):
    monkeypatch.setattr(model_module, "CHAT_CACHE_SIZE", 2)
    tok, cache = CountingTokenizer(), OrderedDict()
    a, b, c = ([{"role": "user", "content": t}] for t in "abc")
    chat_ids(tok, a, cache)
    chat_ids(tok, b, cache)
    chat_ids(tok, a, cache)   # a is the most recent now
    chat_ids(tok, c, cache)   # b goes
    assert len(cache) == 2 and tok.rendered == 3
    chat_ids(tok, a, cache)
    assert tok.rendered == 3
    chat_ids(tok, b, cache)
    assert tok.rendered == 4
