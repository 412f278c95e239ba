from serving.cache import ResponseCache, cache_key


def test_key_ignores_dict_order_but_not_content():
    a = cache_key({"model": "m", "params": {"temperature": 0, "max_tokens": 5}})
    b = cache_key({"params": {"max_tokens": 5, "temperature": 0}, "model": "m"})
    c = cache_key({"model": "m", "params": {"temperature": 0, "max_tokens": 6}})
    assert a == b
    assert a != c


def test_template_and_adapter_change_the_key():
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}], "template": "t@v1#aa"}
    assert cache_key(base) != cache_key(base | {"template": "t@v2#bb"})
    assert cache_key(base) != cache_key(base | {"model": "adapter"})


def test_persists_across_instances(tmp_path):
    path = tmp_path / "c.sqlite"
    first = ResponseCache(path)
    assert len(first) == 0
    first.put("k", {"choices": [{"message": {"content": "hi"}}]})
    first.close()
    second = ResponseCache(path)
    assert second.get("k") == {"choices": [{"message": {"content": "hi"}}]}
    assert second.get("missing") is None
    assert len(second) == 1
