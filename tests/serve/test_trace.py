# lineage trace's page in Debian's headless Chromium (tests/web/trace_test.mjs, puppeteer-core): the
# page `lineage trace` writes, opened from disk, for the shipped GPT-2 and for a tiny hybrid (KDA, MLA,
# MoE); the page `lineage serve` serves at /trace, which fetches a head it does not hold; the load
# time of two large traces (the shipped model at its full 256-token context, the gated-deltanet preset
# at 1,024 tokens); and bad input to the command and to /trace/data.
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import Server, lineage_bin

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "tests" / "web"
SHIPPED = ROOT / "models" / "kjv-gpt2"
SANITIZED = os.environ.get("LINEAGE_SANITIZED") == "1"
PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form, and void."


def shots(tmp_path) -> Path:
    return Path(os.environ.get("LINEAGE_SCREENSHOT_DIR", tmp_path))


def trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([lineage_bin(), "trace", "--threads", "1", *args], capture_output=True, text=True, timeout=600)


def browse(*args: str) -> dict:
    assert (WEB / "node_modules" / "puppeteer-core").is_dir(), "run scripts/install-deps.sh --test (npm ci in tests/web)"
    p = subprocess.run(["node", str(WEB / "trace_test.mjs"), *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"trace page test failed:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def assert_png(path: Path):
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, path
    assert struct.unpack(">II", png[16:24]) == (1200, 900)


def test_shipped_model_page(tmp_path):
    out = tmp_path / "kjv.html"
    p = trace("--model", str(SHIPPED), "--prompt", PROMPT, "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "heads in full" in p.stdout
    page = out.read_bytes()
    assert b"http://" not in page and b"https://" not in page, "the page loads nothing from elsewhere"
    r = browse("file", str(out), str(shots(tmp_path)))
    assert r["views"] == ["softmax"] and r["checked"] >= 6, r
    assert_png(shots(tmp_path) / "trace_file_layer0_softmax.png")


def test_hybrid_page_every_view(hybrid_dir, tmp_path):
    out = tmp_path / "hybrid.html"
    data = tmp_path / "hybrid.json"
    p = trace("--model", str(hybrid_dir), "--prompt", PROMPT, "--out", str(out), "--json", str(data))
    assert p.returncode == 0, p.stderr
    d = json.loads(data.read_text())
    mixers = {l["mixer"] for l in d["layers"]}
    assert {"delta", "mla"} <= mixers, mixers
    assert any("experts" in l for l in d["layers"]), "the hybrid has a MoE"
    assert max(l.get("residual", 0) for l in d["layers"]) < 1e-4, "the parts sum to the engine's state"
    r = browse("file", str(out), str(shots(tmp_path)))
    assert {"delta", "mla"} <= set(r["views"]), r
    assert_png(shots(tmp_path) / "trace_file_start.png")


def test_two_models_side_by_side(tmp_path):
    data = Path(os.environ["LINEAGE_TESTDATA"])
    out = tmp_path / "compare.html"
    p = trace("--model", str(data / "gpt2" / "f32_defaults"), "--compare", str(data / "kda" / "f32"),
              "--tokens", " ".join(str(i * 13 % 200) for i in range(24)), "--out", str(out))
    assert p.returncode == 0 and "2 models" in p.stdout, p.stderr
    r = browse("file", str(out), str(shots(tmp_path)))
    assert [c["title"] for c in r["runs"]] == ["f32_defaults", "f32"] and all(c["drawn"] > 1 for c in r["runs"]), r
    # Ids outside the second model's vocabulary: an error naming it.
    p = trace("--model", str(data / "kda" / "f32"), "--compare", str(data / "gpt2" / "f32_defaults"), "--tokens", "250",
              "--out", str(tmp_path / "x.html"))
    assert p.returncode == 2 and "--compare" in p.stderr and "outside the vocabulary" in p.stderr, p.stderr


def test_served_trace_fetches_heads(hybrid_dir, tmp_path):
    s = Server(hybrid_dir, "--ctx", "256")
    try:
        status, ctype, page = s.request("GET", "/trace")
        assert status == 200 and ctype.startswith("text/html") and b"const SERVED = true;" in page
        r = browse("served", str(s.port), str(shots(tmp_path)))
        assert "fetched" in r["views"], r
        # Bad requests: a 400 naming the field.
        for body, field in [("not json", "JSON"), ({"prompt": ""}, "prompt"), ({"tokens": [1, -2]}, "tokens"),
                            ({"prompt": "x", "heads": "99:0"}, "layer 99"), ({"prompt": "x", "heads": 3}, "heads"),
                            ({"tokens": list(range(600))}, "--trace-max-tokens")]:
            status, err = s.post("/trace/data", body)
            assert status == 400 and field in err["error"]["message"], (body, status, err)
        status, ok = s.post("/trace/data", {"tokens": [1, 2, 3], "heads": "0:0"})
        assert status == 200 and ok["layers"][0]["detail"] == [0] and ok["tokens"] == [1, 2, 3]
    finally:
        s.stop()


def test_command_refuses_bad_input(tmp_path):
    for args, piece in [((), "--tokens or --prompt"),
                        (("--tokens", "1 2", "--heads", "0:99"), "--heads: head 99"),
                        (("--tokens", "1 x"), "--tokens"),
                        (("--tokens", "999999"), "outside the vocabulary"),
                        (("--tokens", "1", "--detail-bytes", "lots"), "--detail-bytes")]:
        p = trace("--model", str(SHIPPED), "--out", str(tmp_path / "x.html"), *args)
        assert p.returncode == 2 and piece in p.stderr, (args, p.returncode, p.stderr)


@pytest.mark.skipif(SANITIZED, reason="load times mean nothing under the sanitizers")
def test_large_traces_load_within_two_seconds(tmp_path):
    cases = [("shipped GPT-2, 256 tokens", ["--model", str(SHIPPED), "--tokens", " ".join(str(i * 37 % 11348) for i in range(256))]),
             ("gated-deltanet preset, 1024 tokens", ["--preset", "gated-deltanet", "--tokens", " ".join(str(i * 101 % 50257) for i in range(1024))])]
    for name, args in cases:
        out = tmp_path / "large.html"
        p = trace(*args, "--out", str(out))
        assert p.returncode == 0, p.stderr
        r = browse("load", str(out))
        print(f"{name}: {out.stat().st_size / 2**20:.1f} MiB, loaded and drawn in {r['load_ms']} ms")
        assert r["load_ms"] < 2000, (name, r)
