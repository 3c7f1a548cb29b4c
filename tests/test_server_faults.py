"""Faults at the server: wrong types in every field, malformed JSON, a prompt past the context, 429 past the
waiting KV budget, a backend error in one request, a scheduler that stopped, and 32 streaming clients with
one killed every two seconds (tiny model, numpy reference, greedy: "equal to its solo run" is exact)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from fault_backend import FaultyBackend
from server_helpers import MODEL_ID, client, running, wait_idle
from tiny import write_tiny_gguf

import workbench as wb
from workbench.runtime.scheduler import Request, Scheduler
from workbench.serve.loadtest import run_load


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(write_tiny_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf"))


@pytest.fixture(scope="module")
def engine(tiny_model):
    return wb.Engine(tiny_model, "numpy")


# wrong values per field (wrong types, and values the server does not implement), and the param each names
COMMON = {
    "model": [None, 5, [], {"a": 1}, True],
    "max_tokens": ["5", 1.5, True, [], {}, 0, -3],
    "temperature": ["0", True, [], {}, -0.5, 2.5],
    "top_p": ["1", False, [1], 0, 1.5],
    "top_k": ["1", 1.5, True, -1],
    "min_p": ["0", [0], 1.0],
    "repetition_penalty": ["1", {}, 0],
    "seed": ["1", 1.5, True, []],
    "stop": [5, [5], [""], {}, True, ["a", "b", "c", "d", "e"]],
    "stream": ["true", 1, [], {}],
    "stream_options": ["x", 1, [], True, {"include_usage": "yes"}],
    "n": ["1", 1.5, True, 2],
    "best_of": ["1", True, 3],
    "logprobs": [1, True, "x"],
    "echo": [True, "x"],
    "logit_bias": [{"5": 1}, "x"],
    "suffix": ["tail", 5],
    "user": [5, []],
    "presence_penalty": ["0", 0.5, 3],
    "frequency_penalty": [True, 1],
}
COMPLETION = {"prompt": [None, 5, "", [], [True], [1.5], [[1]], {"a": 1}, ["a", "b"], [-1], [10**6]]}
CHAT = {
    "messages": [None, "hi", [], [5], [{"role": "user"}], [{"role": "user", "content": 5}],
                 [{"role": 5, "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]],
    "max_completion_tokens": ["5", True, 0],
}  # fmt: skip


def test_wrong_types_in_every_field_get_400_naming_the_field(engine):
    base = {
        "/v1/completions": ({"model": MODEL_ID, "prompt": "the", "max_tokens": 2}, {**COMMON, **COMPLETION}),
        "/v1/chat/completions": (
            {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            {**COMMON, **CHAT},
        ),
    }
    with running(engine, max_batch=4) as (url, sched), httpx.Client(base_url=url, timeout=30) as http:
        tried = 0
        for path, (ok_body, fields) in base.items():
            assert http.post(path, json=ok_body).status_code == 200
            for field, values in fields.items():
                for v in values:
                    r = http.post(path, json={**ok_body, field: v})
                    tried += 1
                    assert r.status_code == 400, (path, field, v, r.status_code, r.text)
                    err = r.json()["error"]
                    assert err["param"] == field and err["message"], (path, field, v, err)
        assert tried > 150
        for raw in (b"{not json", b'{"model": "tiny-test", "prompt": "the"', b'{"model": "tiny-test", '
                    b'"prompt": "the", "temperature": NaN}', b"[1, 2]", b"null", b"\xff\xfe{}", b""):  # fmt: skip
            r = http.post("/v1/completions", content=raw)
            assert r.status_code == 400 and r.json()["error"]["message"], (raw, r.text)
        ok_body = base["/v1/completions"][0]
        assert http.post("/v1/completions", json=ok_body).status_code == 200  # still serving
        assert sched.stats.finish_reasons["error"] == 0 and wait_idle(sched)


def test_prompt_past_the_context_streamed_or_not(engine):
    with running(engine) as (url, _):
        c = client(url)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError, match="context limit"):
                c.completions.create(model=MODEL_ID, prompt=[5] * 300, max_tokens=4, stream=stream)
            with pytest.raises(openai.BadRequestError, match="context limit"):
                c.completions.create(model=MODEL_ID, prompt=[5] * 200, max_tokens=100, stream=stream)


def test_429_with_retry_after_past_the_waiting_kv_budget(engine):
    """One request runs (max_batch 1); the waiting budget holds two more; the next gets 429 at once."""
    need = Scheduler(engine).full_kv_bytes(Request([5] * 4, 100))
    with running(engine, max_batch=1, max_waiting_kv_bytes=2 * need) as (url, sched):
        body = {"model": MODEL_ID, "prompt": [5, 6, 7, 8], "max_tokens": 100, "temperature": 0}
        with httpx.Client(base_url=url, timeout=60) as http:
            with http.stream(
                "POST", "/v1/completions", json={**body, "max_tokens": 200, "stream": True}
            ) as first:
                lines = first.iter_lines()
                next(lines)  # streaming: it holds the batch
                answers: list[httpx.Response] = []
                waiting = [threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/v1/completions",
                           json=body, timeout=60))) for _ in range(2)]  # fmt: skip
                for t in waiting:
                    t.start()
                while len(sched.waiting) < 2:
                    threading.Event().wait(0.01)
                busy = http.post("/v1/completions", json=body)
                assert busy.status_code == 429, busy.text
                assert busy.json()["error"]["code"] == "kv_budget_full"
                assert int(busy.headers["retry-after"]) >= 1
                assert "KV cache" in busy.json()["error"]["message"]
                assert all(line == "" or line.startswith("data: ") for line in lines)
            for t in waiting:
                t.join()
        assert [a.status_code for a in answers] == [200, 200]
        alone = engine.generate([5, 6, 7, 8], 100, stop_ids=engine.tokenizer.stop_ids).text
        assert all(a.json()["choices"][0]["text"] == alone for a in answers)
        assert wait_idle(sched) and sched.stats.requests_rejected == 1


def test_backend_error_fails_that_request_with_500_and_the_server_goes_on(tiny_model, engine):
    prompts = ["the three the", "a th he", "in er an", "on re the"]
    alone = [engine.generate(p, 16, stop_ids=engine.tokenizer.stop_ids) for p in prompts]
    used = {t for r in alone for t in r.output_ids + engine.tokenizer.encode(r.text)}
    poison = next(t for t in range(6, 300) if t not in used)
    faulty = wb.Engine(tiny_model, FaultyBackend(tiny_model, poison_token=poison))
    with running(faulty, max_batch=8, error_window_s=1.5) as (url, sched):
        c = client(url)
        texts: dict[int, str] = {}

        def stream(i: int) -> None:
            try:
                parts = c.completions.create(model=MODEL_ID, prompt=prompts[i], max_tokens=16, temperature=0,
                                             stream=True)  # fmt: skip
                texts[i] = "".join(ch.choices[0].text for ch in parts if ch.choices)
            except openai.APIError as e:
                texts[i] = f"failed: {e}"

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        bad = {"model": MODEL_ID, "prompt": [2, 40, poison, 41], "max_tokens": 8, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=bad, timeout=60)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and "injected fault" in err["message"]
        with pytest.raises(openai.APIError, match="injected fault"):
            for _ in c.completions.create(model=MODEL_ID, prompt=bad["prompt"], max_tokens=8, stream=True):
                pass
        for t in threads:
            t.join()
        assert [texts[i] for i in range(len(prompts))] == [a.text for a in alone]
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "degraded" and health["errors_recent"] == 2
        assert "injected fault" in health["last_error"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'workbench_requests_finished_total{reason="error"} 2' in metrics
        after = c.completions.create(model=MODEL_ID, prompt=prompts[0], max_tokens=16, temperature=0)
        assert after.choices[0].text == alone[0].text  # still serving, and right
        threading.Event().wait(1.6)
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # no error within the window
        assert wait_idle(sched) and sched.kv_used_bytes() == 0


def test_health_says_down_when_the_scheduler_stopped(engine):
    with running(engine) as (url, sched):
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        sched.stop()
        for _ in range(200):
            r = httpx.get(f"{url}/health")
            if r.status_code == 503:
                break
            threading.Event().wait(0.01)
        assert r.status_code == 503 and r.json()["status"] == "down"
        with pytest.raises(openai.InternalServerError, match="not running"):
            client(url).completions.create(model=MODEL_ID, prompt="the", max_tokens=2)


def test_killed_clients_do_not_disturb_the_other_streams(engine):
    """32 concurrent streaming clients for 10 s, one killed (connection reset mid-stream) every 2 s: zero
    errors and zero streams different from their solo run among the others; every killed request is
    cancelled and its sequence freed."""
    with running(engine, max_batch=8, max_queue=64) as (url, sched):
        res = run_load(f"{url}/v1", MODEL_ID, clients=32, seconds=10, max_tokens=12, rss_every_s=2,
                       kill_every_s=2.0, kill_max_tokens=200)  # fmt: skip
        assert res["errors"] == 0, res["error_samples"]
        assert res["mismatches"] == 0, res["mismatch_samples"]
        assert res["kill_failures"] == 0, res["kill_failure_samples"]
        assert res["killed"] >= 4 and res["requests"] >= 64
        assert wait_idle(sched) and not sched.running and sched.kv_used_bytes() == 0
        assert sched.stats.finish_reasons["cancelled"] == res["killed"], sched.stats.finish_reasons
        assert sched.stats.finish_reasons["error"] == 0
        print(f"\n32 clients, 10 s: {res['requests']} surviving streams, {res['killed']} killed, "
              f"{res['errors']} errors, {res['mismatches']} mismatches, wall {res['wall_s']:.1f} s")  # fmt: skip
