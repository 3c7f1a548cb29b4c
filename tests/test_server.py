"""The OpenAI-compatible server: the official openai client unchanged (streaming and not), errors, API key,
disconnects, back pressure, metrics, and a bounded load test (tiny model, a few seconds)."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from server_helpers import MODEL_ID, client, running, wait_idle
from tiny import write_tiny_gguf

import workbench as wb
from workbench.serve.loadtest import run_load


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


@pytest.fixture(scope="module")
def engine(tiny_model):
    return wb.Engine(tiny_model, "numpy")


@pytest.fixture(scope="module")
def server(engine):
    with running(engine, max_batch=8, max_queue=64) as (url, sched):
        yield url, sched


def test_openai_client_completions_and_chat(server, engine):
    url, _ = server
    c = client(url)
    assert [m.id for m in c.models.list().data] == [MODEL_ID]
    prompt = "the three the"
    alone = engine.generate(prompt, 12, stop_ids=engine.tokenizer.stop_ids)
    r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == alone.text and r.usage.completion_tokens == len(alone.output_ids)
    assert r.choices[0].finish_reason == ("stop" if alone.finish_reason == "stop" else "length")
    streamed = [ch.choices[0].text for ch in
                c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0, stream=True)
                if ch.choices]  # fmt: skip
    assert "".join(streamed) == alone.text
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    chat_alone = engine.generate(engine.tokenizer.chat_prompt(messages), 10)
    r = c.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == chat_alone.text and r.choices[0].message.role == "assistant"
    parts, finish, usage = [], None, None
    for ch in c.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10, temperature=0,
                                        stream=True, stream_options={"include_usage": True}):  # fmt: skip
        if ch.usage:
            usage = ch.usage
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == chat_alone.text and finish in ("stop", "length")
    assert usage.completion_tokens == len(chat_alone.output_ids)


def test_token_ids_prompt_stop_strings_and_sampling(server, engine):
    url, _ = server
    c = client(url)
    ids = [2, 40, 41, 42, 43]
    alone = engine.generate(ids, 8, stop_ids=engine.tokenizer.stop_ids)
    r = c.completions.create(model=MODEL_ID, prompt=ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == alone.text and r.usage.prompt_tokens == len(ids)
    if len(alone.text) > 3:
        stop = alone.text[2:4]
        r = c.completions.create(model=MODEL_ID, prompt=ids, max_tokens=8, temperature=0, stop=[stop])
        assert (
            r.choices[0].text == alone.text[: alone.text.index(stop)] and r.choices[0].finish_reason == "stop"
        )
    a, b = (c.completions.create(model=MODEL_ID, prompt="the", max_tokens=6, temperature=0.9, seed=5).choices[0].text
            for _ in range(2))  # fmt: skip
    assert a == b  # same seed, same sample


def test_bad_input_gets_clear_errors_and_the_server_goes_on(server):
    url, _ = server
    c = client(url)
    post = lambda path, body, **kw: httpx.post(f"{url}{path}", content=body, timeout=30, **kw)  # noqa: E731
    r = post("/v1/completions", b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="not found"):
        c.completions.create(model="gpt-5", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context limit"):
        c.completions.create(model=MODEL_ID, prompt="the", max_tokens=10_000)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model=MODEL_ID, prompt="the", max_tokens=2, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="context limit"):
        c.completions.create(model=MODEL_ID, prompt="the " * 400, max_tokens=2)  # a huge prompt
    r = post("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": "x" * (5 << 20)}).encode())
    assert r.status_code == 413
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model=MODEL_ID, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="token ids"):
        c.completions.create(model=MODEL_ID, prompt=[5, 99_999], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="n=1"):
        c.completions.create(model=MODEL_ID, prompt="x", n=2)
    r = c.completions.create(model=MODEL_ID, prompt="the", max_tokens=3, temperature=0)  # still serving
    assert r.usage.completion_tokens >= 1


def test_client_disconnect_mid_stream_frees_the_sequence(server):
    url, sched = server
    body = {"model": MODEL_ID, "prompt": "the", "max_tokens": 200, "temperature": 0, "stream": True}
    before = sched.stats.generated_tokens
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    assert wait_idle(sched) and not sched.running
    assert sched.stats.generated_tokens - before < 200  # cancelled, not run to its end
    text = httpx.get(f"{url}/metrics").text
    assert "workbench_running_requests 0" in text and "workbench_queue_depth 0" in text


def test_metrics_and_health(server):
    url, _ = server
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and h["model"] == MODEL_ID and h["backend"] == "numpy"
    text = httpx.get(f"{url}/metrics").text
    for name in ("queue_depth", "tokens_per_second", "kv_cache_bytes", "kv_cache_usage_ratio",
                 "generated_tokens_total", "process_resident_memory_bytes"):  # fmt: skip
        assert f"# TYPE workbench_{name} " in text
    assert 'workbench_http_responses_total{path="/v1/completions",status="200"}' in text


def test_api_key(engine):
    with running(engine, api_key="s3cret") as (url, _):
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model=MODEL_ID, prompt="x", max_tokens=1)
        assert client(url, "s3cret").models.list().data[0].id == MODEL_ID
        assert httpx.get(f"{url}/health").status_code == 200  # health stays open for probes


def test_more_requests_than_the_queue_get_429_with_retry_after(engine):
    with running(engine, max_batch=1, max_queue=1) as (url, sched):
        body = {"model": MODEL_ID, "prompt": "the", "max_tokens": 150, "temperature": 0}
        results: list[httpx.Response] = []

        def send():
            results.append(httpx.post(f"{url}/v1/completions", json=body, timeout=60))

        threads = [threading.Thread(target=send) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in results)
        busy = [r for r in results if r.status_code == 429]
        assert 200 in codes and busy and set(codes) <= {200, 429}
        assert int(busy[0].headers["retry-after"]) >= 1 and busy[0].json()["error"]["code"] == "queue_full"
        assert wait_idle(sched)


def test_bounded_load(engine):
    """32 concurrent streaming clients for a few seconds: no errors, every stream equals the request alone."""
    with running(engine, max_batch=8, max_queue=64) as (url, sched):
        res = run_load(f"{url}/v1", MODEL_ID, clients=32, seconds=4, max_tokens=12, rss_every_s=1)
        assert res["errors"] == 0, res["error_samples"]
        assert res["mismatches"] == 0, res["mismatch_samples"]
        assert res["requests"] >= 32
        assert res["rss_growth_bytes"] < 64 << 20 and res["rss_growth_after_warmup_bytes"] < 32 << 20
        assert wait_idle(sched) and max(sched.stats.batch_sizes) > 1
