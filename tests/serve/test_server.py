# `lineage serve` through its HTTP API: the completions agree with `lineage generate` (a session of
# its own, no engine, no cache), streaming, usage and the prefix cache's cached tokens, the other
# endpoints, and every error a client can cause, after which the server still serves.
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Server, run_lineage


def generate_cli(model_dir, prompt: str, max_tokens: int) -> str:
    """What `lineage generate` writes for the prompt at temperature 0 (its trailing newline dropped)."""
    out = run_lineage("generate", "--model", str(model_dir), "--prompt", prompt, "--temperature", "0",
                      "--max-tokens", str(max_tokens), "--threads", "1").stdout
    assert out.endswith("\n")
    return out[:-1]


@pytest.mark.parametrize("which", ["gpt2", "hybrid", "quantized"])
def test_completion_equals_generate(which, request):
    server, model_dir = request.getfixturevalue(f"{which}_server"), request.getfixturevalue(f"{which}_dir")
    prompts = [("The quick brown fox", 12), ("Hello", 5), ("A longer prompt about the lineage of models, " * 3, 9)]
    if os.environ.get("LINEAGE_SANITIZED") == "1":  # each `lineage generate` starts a sanitized process: one will do
        prompts = prompts[2:]
    for prompt, n in prompts:
        status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
        assert status == 200, body
        want = generate_cli(model_dir, prompt, n)
        assert body["choices"][0]["text"] == want, f"{which}: {prompt!r}"
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        u = body["usage"]
        assert u["completion_tokens"] <= n and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_stream_equals_plain(hybrid_server):
    req = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a state?"}],
           "max_tokens": 16, "temperature": 0}
    status, plain = hybrid_server.post("/v1/chat/completions", req)
    assert status == 200, plain
    assert plain["object"] == "chat.completion" and plain["choices"][0]["message"]["role"] == "assistant"
    events = hybrid_server.stream("/v1/chat/completions", {**req, "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
    assert finals[0]["lineage"]["state_bytes"] > 0


def test_prefix_cache_reports_cached_tokens(hybrid_server, hybrid_dir):
    # A long shared prefix, then two different endings: the second request resumes from the
    # recurrent layers' checkpoint (every 16 tokens here) at or before where they part.
    base = "In the beginning the engine kept one state per sequence and wrote it token by token. " * 4
    first = base + "The first ending."
    status, a = hybrid_server.post("/v1/completions", {"prompt": first, "max_tokens": 6, "temperature": 0})
    assert status == 200
    second = base + "Another ending, longer."
    status, b = hybrid_server.post("/v1/completions", {"prompt": second, "max_tokens": 6, "temperature": 0})
    assert status == 200
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0, f"expected a checkpoint's prefix, found {cached} cached tokens"
    assert cached <= b["usage"]["prompt_tokens"] - 1
    # The cache changes the work, not the result.
    assert b["choices"][0]["text"] == generate_cli(hybrid_dir, second, 6)
    # The same request again: all but the last prompt token come from the cache (its end is a checkpoint).
    status, c = hybrid_server.post("/v1/completions", {"prompt": second, "max_tokens": 6, "temperature": 0})
    assert c["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
    assert c["choices"][0]["text"] == b["choices"][0]["text"]
    m = hybrid_server.metrics()
    assert m["lineage_cache_hits_total"] >= 2 and m["lineage_cached_tokens_total"] >= 2 * cached


def test_progress_events(hybrid_server):
    prompt = "word " * 300  # more than one prefill piece (256 tokens)
    events = hybrid_server.stream("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                                      "return_progress": True})
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(progress) >= 2, events[:3]
    total = progress[0]["total"]
    assert [p["total"] for p in progress] == [total] * len(progress)
    done = [p["processed"] for p in progress]
    assert done == sorted(done) and done[-1] == total


def test_stop_sequences(gpt2_server):
    status, full = gpt2_server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0})
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), f"pick a stop string inside {text!r}"
    cut = text[:text.index(stop)]
    status, body = gpt2_server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0,
                                                        "stop": [stop]})
    assert body["choices"][0]["text"] == cut and body["choices"][0]["finish_reason"] == "stop"
    events = gpt2_server.stream("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "stop": stop})
    assert "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == cut


def test_seeded_sampling_repeats(gpt2_server):
    req = {"prompt": "Once", "max_tokens": 10, "temperature": 1.0, "top_k": 40, "top_p": 0.9, "seed": 1234}
    a = gpt2_server.post("/v1/completions", req)[1]["choices"][0]["text"]
    b = gpt2_server.post("/v1/completions", req)[1]["choices"][0]["text"]
    assert a == b


def test_models_health_metrics(gpt2_server):
    models = gpt2_server.get_json("/v1/models")
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert models["data"][0]["meta"]["n_ctx"] == 64 and models["data"][0]["meta"]["vocab_size"] == 50257
    h = gpt2_server.wait_idle()
    assert h["status"] == "ok" and h["slots_idle"] == 4
    before = gpt2_server.metrics()
    gpt2_server.post("/v1/completions", {"prompt": "Count", "max_tokens": 3, "temperature": 0})
    after = gpt2_server.metrics()
    assert after["lineage_requests_total"] == before["lineage_requests_total"] + 1
    assert after["lineage_generated_tokens_total"] >= before["lineage_generated_tokens_total"] + 1
    assert after["lineage_slots"] == 4 and after["lineage_slots_used"] == 0
    for name in ("lineage_prompt_tokens_total", "lineage_cache_hits_total", "lineage_decode_tokens_per_second",
                 "lineage_steps_total"):
        assert name in after


def error_of(server, path, body, status, code=None, param=None, raw=False):
    got, _, data = server.request("POST", path, body if raw else json.dumps(body))
    assert got == status, data
    e = json.loads(data)["error"]
    assert e["message"] and e["type"]
    if code:
        assert e["code"] == code, e
    if param:
        assert e["param"] == param, e
    return e


def test_errors_keep_serving(gpt2_server):
    s = gpt2_server
    error_of(s, "/v1/completions", "{not json", 400, raw=True)
    error_of(s, "/v1/completions", "[1, 2]", 400, raw=True)
    error_of(s, "/v1/completions", {"max_tokens": 4}, 400, param="prompt")
    error_of(s, "/v1/chat/completions", {"messages": "hi"}, 400, param="messages")
    error_of(s, "/v1/completions", {"prompt": "x", "max_tokens": "four"}, 400, param="max_tokens")
    error_of(s, "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, param="max_tokens")
    error_of(s, "/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, param="max_tokens")
    error_of(s, "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, param="temperature")
    error_of(s, "/v1/completions", {"prompt": "x", "top_p": 7}, 400, param="top_p")
    error_of(s, "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, param="stream")
    error_of(s, "/v1/completions", {"prompt": [[]]}, 400, param="prompt")
    error_of(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 5}]}, 400,
             param="tools[0]")
    error_of(s, "/v1/completions", {"prompt": "x", "n": 17}, 400, param="n")
    error_of(s, "/v1/completions", {"prompt": "x", "n": 2, "stream": True}, 400, param="n")
    error_of(s, "/v1/completions", {"prompt": "x", "stop": [1]}, 400, param="stop")
    error_of(s, "/v1/completions", {"prompt": "word " * 80}, 400, code="context_length_exceeded")
    error_of(s, "/v1/completions", {"prompt": [5, 99999999], "max_tokens": 2}, 400)  # outside the vocabulary
    error_of(s, "/v1/completions", {"prompt": "", "max_tokens": 2}, 400, code="empty_prompt")
    error_of(s, "/v1/completions", {"prompt": "x" * (5 << 20)}, 413)
    status, _, data = s.request("GET", "/v1/nothing")
    assert status == 404 and json.loads(data)["error"]["code"] == "not_found"
    # Unknown fields are ignored, as OpenAI clients send many.
    status, body = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "frequency_penalty": 0, "user": "u"})
    assert status == 200, body
    assert s.metrics()['lineage_http_errors_total{status="400"}'] >= 15
    assert s.wait_idle()["status"] == "ok"


def test_eos_and_ignore_eos(tmp_path):
    from tiny_checkpoints import write_tiny_gpt2
    s = Server(write_tiny_gpt2(tmp_path / "eos", seed=2, always_eos=True), "--ctx", "64")
    try:
        status, body = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 5, "temperature": 0})
        assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 0
        status, body = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 5, "temperature": 0, "ignore_eos": True})
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
    finally:
        s.stop()


def test_queue_bound_503_and_disconnect_frees_slot(hybrid_dir):
    # One slot and a queue of one: a third request while the first decodes and the second waits gets
    # 503. A client that goes away frees its slot at once, and the waiting request takes it.
    s = Server(hybrid_dir, "--slots", "1", "--queue", "1", "--ctx", "200000")
    try:
        long_req = json.dumps({"prompt": "Long", "max_tokens": 150000, "temperature": 0, "ignore_eos": True,
                               "stream": True}).encode()

        def open_stream():
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(long_req) + long_req)
            return sock

        a = open_stream()
        assert a.recv(4096).startswith(b"HTTP/1.1 200"), "the first stream starts"
        # The headers go out when the request is queued; it holds the slot once the engine admits it.
        # Until then the second request would find the queue of one full.
        deadline = time.time() + 10
        while (h := s.get_json("/health"))["slots_processing"] != 1 or h["queued"] != 0:
            assert time.time() < deadline, f"the first request does not take the slot: {h}"
            time.sleep(0.01)
        b = open_stream()
        deadline = time.time() + 10
        while s.get_json("/health")["queued"] != 1:
            assert time.time() < deadline, "the second request is not queued"
            time.sleep(0.01)
        e = error_of(s, "/v1/completions", {"prompt": "x", "max_tokens": 2}, 503, code="overloaded")
        assert "busy" in e["message"]
        assert s.metrics()["lineage_requests_rejected_total"] == 1
        a.close()  # the first client goes away: the second request gets the slot
        deadline = time.time() + 5
        while (h := s.get_json("/health"))["queued"] != 0 or h["slots_processing"] != 1:
            assert time.time() < deadline, f"the waiting request did not get the freed slot: {h}"
            time.sleep(0.01)
        got = b""
        while b'"text":"' not in got.replace(b'"text":""', b""):
            chunk = b.recv(65536)
            assert chunk, "the second stream ended early"
            got += chunk
        b.close()
        h = s.wait_idle(seconds=5)
        assert h["slots_idle"] == 1
        m = s.metrics()
        assert m["lineage_disconnects_total"] == 2 and m["lineage_slots_used"] == 0
        status, body = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0})
        assert status == 200, body
    finally:
        s.stop()


def test_bench_serve_runs_every_concurrency(gpt2_dir):
    # The benchmark's numbers are for reading, not asserting; here: every request it sends is served
    # in full at each concurrency, and the roofline beside it is measured.
    rows = json.loads(run_lineage("bench-serve", "--model", str(gpt2_dir), "--clients", "1,3", "--requests", "2",
                                  "--prompt", "8", "--gen", "5", "--json").stdout)
    assert [r["clients"] for r in rows] == [1, 3]
    for r in rows:
        assert r["failed"] == 0 and r["requests"] == 2 * r["clients"]
        assert r["generated_tokens"] == 5 * r["requests"]
        assert r["roofline_tokens_per_second"] > 0 and r["bandwidth_bytes_per_s"] > 1e9
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and 0 < r["per_token_p50_ms"] <= r["per_token_p99_ms"]
        # The roofline counts the round's work: the prefills and the decode steps, each at its bound.
        assert r["roofline_prefill_seconds"] > 0 and r["roofline_decode_seconds"] > 0
        least = r["roofline_prefill_seconds"] + r["roofline_decode_seconds"]
        assert abs(r["roofline_tokens_per_second"] * least - r["generated_tokens"]) < 1e-6 * r["generated_tokens"]
        # The decode phase: steps in which every sequence decoded; at most gen - 1 tokens a request.
        assert 0 < r["decode_tokens"] <= 4 * r["requests"] and r["decode_steps"] <= r["decode_tokens"]
        assert r["decode_seconds"] > 0 and r["decode_tokens_per_second"] > 0 and r["decode_roofline_tokens_per_second"] > 0
    # One client: its requests one after the other, each a prefill step then 4 steps of its one token.
    assert rows[0]["decode_tokens"] == 4 * rows[0]["requests"] and rows[0]["decode_mean_batch"] == 1


def test_api_key(gpt2_dir, tmp_path):
    """--api-key-file: every endpoint but /health and the page wants `Authorization: Bearer KEY`; a missing
    or wrong key (a prefix of it, a longer one, another scheme) is a 401 with an OpenAI error object; the
    right one serves as without a key. A file without a key, and both flags at once, are refused."""
    key_file = tmp_path / "key"
    key_file.write_text("  s3cret-key-123\n")
    s = Server(gpt2_dir, "--ctx", "64", "--slots", "2", "--api-key-file", str(key_file))
    try:
        body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
        json_type = {"Content-Type": "application/json"}
        for path in ("/v1/completions", "/v1/chat/completions", "/completions"):
            status, err = s.post(path, body if "chat" not in path else {**body, "messages": [{"role": "user", "content": "Hi"}]})
            assert status == 401, (path, err)
            assert err["error"]["code"] == "invalid_api_key" and "API key" in err["error"]["message"]
        for header in ("Bearer s3cret-key-12", "Bearer s3cret-key-1234", "Basic s3cret-key-123", "s3cret-key-123",
                       "Bearer  s3cret-key-123", "Bearer S3CRET-KEY-123"):
            status, err = s.post("/v1/completions", body, headers={**json_type, "Authorization": header})
            assert status == 401, header
            assert "Incorrect API key" in err["error"]["message"]
        for path in ("/v1/models", "/metrics"):
            status, _, raw = s.request("GET", path)
            assert status == 401, path
        ok = {**json_type, "Authorization": "Bearer s3cret-key-123"}
        status, out = s.post("/v1/completions", body, headers=ok)
        assert status == 200 and out["choices"][0]["text"], out
        status, out = s.post("/v1/completions", body, headers={**json_type, "Authorization": "bearer s3cret-key-123"})
        assert status == 200, out
        status, _, raw = s.request("GET", "/v1/models", headers=ok)
        assert status == 200 and json.loads(raw)["data"]
        assert s.request("GET", "/health")[0] == 200
        status, ctype, page = s.request("GET", "/")
        assert status == 200 and ctype.startswith("text/html") and b"Authorization" in page
        status, _, raw = s.request("GET", "/metrics", headers=ok)
        assert status == 200 and 'lineage_http_errors_total{status="401"}' in raw.decode()
    finally:
        s.stop()
    (tmp_path / "empty").write_text("\n")
    p = run_lineage("serve", "--model", str(gpt2_dir), "--port", "0", "--api-key-file", str(tmp_path / "empty"), check=False)
    assert p.returncode == 2 and "holds no key" in p.stderr, p.stderr
    p = run_lineage("serve", "--model", str(gpt2_dir), "--port", "0", "--api-key", "a", "--api-key-file", str(key_file),
                    check=False)
    assert p.returncode == 2 and "excludes" in p.stderr, p.stderr


def _log_softmax_rows(model_dir, ids, tmp_path):
    """log-softmax of `lineage logits` over ids: row i scores the token after position i."""
    import numpy as np
    out = tmp_path / "logits.npy"
    run_lineage("logits", "--model", str(model_dir), "--tokens", " ".join(map(str, ids)), "--out", str(out))
    x = np.load(out).astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_logprobs_and_echo(gpt2_server, gpt2_dir, tmp_path):
    """logprobs (and echo's prompt logprobs) against the log-softmax of `lineage logits` on the same
    tokens, to 1e-5; the alternatives are the top N; chat's logprobs likewise; the refusals named."""
    import numpy as np
    prompt = [464, 3290, 3332, 319, 262, 2603, 13]
    status, out = gpt2_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                                       "logprobs": 3, "echo": True})
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    generated = out["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(prompt) + generated
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    status, plain = gpt2_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert out["choices"][0]["text"].endswith(plain["choices"][0]["text"])
    # The generated ids: greedy, so the argmax of each row; the text of every token.
    rows = _log_softmax_rows(gpt2_dir, prompt, tmp_path)
    ids = list(prompt)
    for _ in range(generated):
        ids.append(int(_log_softmax_rows(gpt2_dir, ids, tmp_path)[-1].argmax()))
    rows = _log_softmax_rows(gpt2_dir, ids, tmp_path)
    for i in range(1, len(ids)):
        want = rows[i - 1]
        assert abs(lp["token_logprobs"][i] - want[ids[i]]) <= 1e-5 * max(1.0, abs(want[ids[i]])), i
        top = sorted(lp["top_logprobs"][i].values(), reverse=True)
        assert np.allclose(top, np.sort(want)[::-1][:len(top)], rtol=1e-5, atol=1e-6), i
        assert len(top) <= 3
    assert lp["text_offset"][1] == len(lp["tokens"][0])

    # The request lm-evaluation-harness's local-completions model sends for a log-likelihood task
    # (context + continuation as one token list in a list, max_tokens 1, logprobs 1, echo), and its
    # reading of the answer: the continuation's summed log-probability and whether it is greedy.
    context, continuation = prompt[:5], prompt[5:]
    status, out = gpt2_server.post("/v1/completions", {"model": "tiny", "prompt": [context + continuation],
                                                       "temperature": 0, "max_tokens": 1, "logprobs": 1,
                                                       "seed": 1234, "echo": True})
    assert status == 200, out
    res = out["choices"][0]["logprobs"]
    ctxlen = len(context)
    loglik = sum(res["token_logprobs"][ctxlen:-1])
    greedy = all(max(top, key=top.get) == tok for top, tok in zip(res["top_logprobs"][ctxlen:-1], res["tokens"][ctxlen:-1]))
    want = sum(rows[i - 1][prompt[i]] for i in range(ctxlen, len(prompt)))
    assert abs(loglik - want) <= 1e-5 * abs(want)
    assert greedy == all(rows[i - 1].argmax() == prompt[i] for i in range(ctxlen, len(prompt)))

    # Streamed: the chunks' logprobs, joined, are the unstreamed reply's.
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    status, plain = gpt2_server.post("/v1/completions", body)
    events = gpt2_server.stream("/v1/completions", body)
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events:
        for c in e["choices"]:
            for k in joined:
                joined[k] += (c.get("logprobs") or {}).get(k, [])
    assert joined == plain["choices"][0]["logprobs"]
    chat_body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0, "logprobs": True,
                 "top_logprobs": 1}
    status, plain = gpt2_server.post("/v1/chat/completions", chat_body)
    streamed = [t for e in gpt2_server.stream("/v1/chat/completions", chat_body) for c in e["choices"]
                for t in (c.get("logprobs") or {}).get("content", [])]
    assert streamed == plain["choices"][0]["logprobs"]["content"]

    # Scoring the prompt alone (max_tokens 0 with echo), and chat's logprobs.
    status, out = gpt2_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 0, "logprobs": 0, "echo": True})
    assert status == 200 and out["usage"]["completion_tokens"] == 0, out
    assert len(out["choices"][0]["logprobs"]["tokens"]) == len(prompt)
    status, out = gpt2_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                            "max_tokens": 3, "temperature": 0, "logprobs": True,
                                                            "top_logprobs": 2})
    assert status == 200, out
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    for c in content:
        assert c["top_logprobs"][0]["logprob"] == max(t["logprob"] for t in c["top_logprobs"])
        assert c["logprob"] == c["top_logprobs"][0]["logprob"], "greedy: the chosen token is the most likely"
        assert bytes(c["bytes"]).decode("utf-8", "replace") == c["token"]
    for body, field in (({"prompt": "x", "logprobs": 21}, "logprobs"), ({"prompt": "x", "echo": True, "stream": True}, "echo"),
                        ({"prompt": "x", "max_tokens": 0}, "max_tokens"), ({"prompt": [[1, 2], [3]]}, "prompt")):
        status, err = gpt2_server.post("/v1/completions", body)
        assert status == 400 and err["error"]["param"] == field, (body, err)
    status, err = gpt2_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2})
    assert status == 400 and err["error"]["param"] == "top_logprobs", err


def test_tools_render_through_the_template(hybrid_dir, gpt2_server, tmp_path):
    """Chat with tools: the tools, an assistant's tool_calls and a tool result are rendered by the
    model's template (Qwen3's) exactly as @huggingface/jinja renders them (the prompt's token count
    against `lineage tokenize` of that render); tool_choice none drops the tools; a model whose
    template cannot render tools, and tool_choice required, are 400s naming the field."""
    import shutil
    source = Path(__file__).resolve().parents[2]
    model = tmp_path / "with_tools"
    shutil.copytree(hybrid_dir, model)
    template = (source / "tests" / "chat_template" / "templates" / "qwen3.jinja").read_text()
    (model / "chat_template.jinja").write_text(template)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                               "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]

    def reference_tokens(context: dict) -> int:
        script = ("import {Template} from '@huggingface/jinja';"
                  "import {readFileSync} from 'node:fs';"
                  "const [t, c] = process.argv.slice(1).map((f) => readFileSync(f, 'utf8'));"
                  "process.stdout.write(new Template(t).render(JSON.parse(c)));")
        (tmp_path / "t.jinja").write_text(template)
        (tmp_path / "c.json").write_text(json.dumps(context))
        rendered = subprocess.run(["node", "--input-type=module", "-e", script, str(tmp_path / "t.jinja"), str(tmp_path / "c.json")],
                                  cwd=source / "tests" / "chat_template", capture_output=True, text=True, check=True).stdout
        (tmp_path / "r.txt").write_text(rendered)
        out = run_lineage("tokenize", "--model", str(model), "--text", rendered).stdout.split()
        return len(out)

    s = Server(model, "--ctx", "1024", "--slots", "1")
    try:
        base = {"messages": messages, "max_tokens": 3, "temperature": 0}
        status, out = s.post("/v1/chat/completions", {**base, "tools": tools})
        assert status == 200, out
        # The server passes a null content as "" (templates test content as a string).
        sent = [{**m, "content": m["content"] or ""} for m in messages]
        ctx = {"messages": sent, "tools": tools, "add_generation_prompt": True, "bos_token": "", "eos_token": ""}
        assert out["usage"]["prompt_tokens"] == reference_tokens(ctx)
        assert out["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")
        status, none = s.post("/v1/chat/completions", {**base, "tools": tools, "tool_choice": "none"})
        assert status == 200
        ctx.pop("tools")
        assert none["usage"]["prompt_tokens"] == reference_tokens(ctx) < out["usage"]["prompt_tokens"]
        events = s.stream("/v1/chat/completions", {**base, "tools": tools})
        assert events[-1]["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")
        status, err = s.post("/v1/chat/completions", {**base, "tools": tools, "tool_choice": "required"})
        assert status == 400 and err["error"]["param"] == "tool_choice", err
        status, err = s.post("/v1/chat/completions", {**base, "tools": [{"type": "function"}]})
        assert status == 400 and err["error"]["param"] == "tools[0]", err
    finally:
        s.stop()
    # Template variables: a request's chat_template_kwargs, and the server's --chat-template-kwargs for
    # every chat (Qwen3's enable_thinking: false closes an empty think block in the prompt).
    plain = {"messages": messages[:1], "max_tokens": 2, "temperature": 0}
    ctx = {"enable_thinking": False, "messages": messages[:1], "add_generation_prompt": True, "bos_token": "", "eos_token": ""}
    s = Server(model, "--ctx", "1024", "--slots", "1")
    try:
        status, off = s.post("/v1/chat/completions", {**plain, "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200, off
        assert off["usage"]["prompt_tokens"] == reference_tokens(ctx)
        status, on = s.post("/v1/chat/completions", plain)
        assert on["usage"]["prompt_tokens"] < off["usage"]["prompt_tokens"]
        status, err = s.post("/v1/chat/completions", {**plain, "chat_template_kwargs": "no"})
        assert status == 400 and err["error"]["param"] == "chat_template_kwargs", err
    finally:
        s.stop()
    s = Server(model, "--ctx", "1024", "--slots", "1", "--chat-template-kwargs", '{"enable_thinking": false}')
    try:
        status, off = s.post("/v1/chat/completions", plain)
        assert status == 200 and off["usage"]["prompt_tokens"] == reference_tokens(ctx), off
    finally:
        s.stop()
    p = run_lineage("serve", "--model", str(model), "--port", "0", "--chat-template-kwargs", "[1]", check=False)
    assert p.returncode == 2 and "--chat-template-kwargs" in p.stderr, p.stderr
    status, err = gpt2_server.post("/v1/chat/completions", {"messages": messages[:1], "tools": tools, "max_tokens": 2})
    assert status == 400 and err["error"]["param"] == "tools" and "chat template" in err["error"]["message"], err


def test_n_samples(gpt2_server):
    """n samples of one prompt: n choices (index 0 .. n-1), the first what the same request with n = 1
    gives (the same seed), each its own sampler stream; usage counts the prompt once and every sample's
    completion; chat likewise."""
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    status, one = gpt2_server.post("/v1/completions", body)
    assert status == 200, one
    status, many = gpt2_server.post("/v1/completions", {**body, "n": 3})
    assert status == 200, many
    choices = many["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert choices[0]["text"] == one["choices"][0]["text"]
    assert len({c["text"] for c in choices}) > 1, "the samples draw from their own streams"
    assert many["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert many["usage"]["completion_tokens"] == 3 * 6
    assert many["usage"]["total_tokens"] == many["usage"]["prompt_tokens"] + 18
    status, chat = gpt2_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2,
                                                             "max_tokens": 4, "temperature": 1.0, "seed": 3})
    assert status == 200 and len(chat["choices"]) == 2 and chat["choices"][1]["index"] == 1, chat


def test_a_gguf_file_serves_as_its_directory_does(gpt2_dir, tmp_path):
    """The same model served from its directory (with a ChatML template) and from the GGUF that
    reference/gguf_mirror.py writes of it (tokenizer and template in the metadata): the template
    comes from the file's tokenizer.chat_template, and a chat and a completion give the same
    prompt tokens and the same greedy text."""
    import shutil
    source = Path(__file__).resolve().parents[2]
    model = tmp_path / "chatml"
    shutil.copytree(gpt2_dir, model)
    (model / "chat_template.jinja").write_text(
        (source / "tests" / "chat_template" / "templates" / "qwen1.5-chat.jinja").read_text())
    gguf = tmp_path / "chatml.gguf"
    subprocess.run(["/usr/bin/python3", str(source / "reference" / "gguf_mirror.py"), str(model), str(gguf)], check=True)
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}],
            "max_tokens": 6, "temperature": 0}
    completion = {"prompt": "In the beginning", "max_tokens": 6, "temperature": 0}
    answers = []
    for path in (model, gguf):
        s = Server(path, "--ctx", "64", "--slots", "2")
        try:
            meta = s.get_json("/v1/models")["data"][0]["meta"]
            status, c = s.post("/v1/chat/completions", chat)
            assert status == 200, c
            status, p = s.post("/v1/completions", completion)
            assert status == 200, p
            answers.append((meta["chat_template"], c["choices"][0]["message"]["content"], c["usage"],
                            p["choices"][0]["text"], p["usage"]))
        finally:
            s.stop()
    (dir_template, *dir_rest), (gguf_template, *gguf_rest) = answers
    assert dir_template.endswith("chat_template.jinja"), dir_template
    assert gguf_template.endswith("key tokenizer.chat_template"), gguf_template
    assert gguf_rest == dir_rest
    assert dir_rest[1]["prompt_tokens"] > 10  # the rendered ChatML, not "role: content"


def test_trace_data_names_the_ranks_under_mpirun(gpt2_server):
    """The trace page records a whole forward on one process; across ranks each maps only its slice
    of the weights, so POST /trace/data answers 501 naming the ranks (one rank: it records)."""
    from conftest import serve_ranks
    status, body = gpt2_server.post("/trace/data", {"prompt": "In the beginning"})
    if serve_ranks() > 1:
        assert status == 501, body
        assert f"over {serve_ranks()} ranks" in body["error"]["message"], body
    else:
        assert status == 200, body
