# The Python bindings against independent references: the float64 PyTorch reference's goldens
# (logits, KV projections, MLA latents, final recurrent states), js-tiktoken's GPT-2 token ids, and
# the engine's own invariants seen from Python (decode = prefill, save/load continues bit for bit,
# generate = an argmax loop).
import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import lineage
from conftest import GPT2_EOS, Golden, assert_close_to_golden, data_root, rel_rms

CASES = ["gpt2/f32_defaults", "kda/f32", "delta_net/f32", "kimi_linear/f32"]
_models = {}


def model(case: str, mmap: bool = True) -> lineage.Model:
    if (case, mmap) not in _models:
        _models[case, mmap] = lineage.Model.load(data_root() / case, mmap=mmap)
    return _models[case, mmap]


# --- module and model ---------------------------------------------------------------------------

def test_error_is_a_runtime_error_with_the_message(tmp_path):
    assert issubclass(lineage.Error, RuntimeError)
    with pytest.raises(lineage.Error, match="no_such_model: model directory does not exist"):
        lineage.Model.load(data_root() / "no_such_model")
    with pytest.raises(RuntimeError, match="config.json"):
        lineage.Model.load(tmp_path)


def test_config_and_layer_kinds_follow_config_json():
    g = Golden("gpt2/f32_defaults")
    cfg = model("gpt2/f32_defaults").config
    assert (cfg["model_type"], cfg["vocab_size"], cfg["d_model"], cfg["n_layers"], cfg["max_positions"]) == (
        "gpt2", g.config["vocab_size"], g.config["n_embd"], g.config["n_layer"], g.config["n_positions"])
    assert model("gpt2/f32_defaults").layer_kinds == ["attention"] * g.config["n_layer"]

    g = Golden("kimi_linear/f32")
    lac = g.config["linear_attn_config"]  # 1-based layer numbers
    want = ["delta_rule" if i + 1 in lac["kda_layers"] else "mla" for i in range(g.config["num_hidden_layers"])]
    assert "mla" in want and "delta_rule" in want
    assert model("kimi_linear/f32").layer_kinds == want
    assert model("kimi_linear/f32").config["model_type"] == "kimi_linear"

    g = Golden("kda/f32")
    assert model("kda/f32").layer_kinds == ["delta_rule"] * g.config["num_hidden_layers"]


def test_preset_builds_a_seeded_model():
    assert "gpt2-124m" in lineage.Model.presets()
    a = lineage.Model.preset("kda", seed=3)
    assert a.config["n_layers"] == 12 and a.layer_kinds == ["delta_rule"] * 12
    la = lineage.Session(a).prefill([1, 2, 3])
    lb = lineage.Session(lineage.Model.preset("kda", seed=3)).prefill([1, 2, 3])
    lc = lineage.Session(lineage.Model.preset("kda", seed=4)).prefill([1, 2, 3])
    assert np.array_equal(la, lb), "the same (name, seed) gives the same weights"
    assert not np.allclose(la, lc)
    with pytest.raises(lineage.Error, match="gpt2-124m"):  # the message lists the presets
        lineage.Model.preset("no-such-preset")
    with pytest.raises(lineage.Error, match="f32, f16 or bf16"):
        lineage.Model.preset("kda", dtype="f8")


# --- logits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_prefill_logits_match_the_reference(case):
    g = Golden(case)
    s = lineage.Session(model(case))
    logits = s.prefill(g.tokens, all_positions=True)
    assert logits.dtype == np.float32 and logits.shape == (len(g.tokens), model(case).config["vocab_size"])
    assert_close_to_golden(logits, g, "logits")
    assert s.position == len(g.tokens) and s.tokens == g.tokens
    assert np.array_equal(s.logits, logits)
    # A copy: changing what was returned changes nothing in the session.
    logits[:] = 0
    assert not np.array_equal(s.logits, logits)


@pytest.mark.parametrize("case", CASES)
def test_prefill_last_position_only(case):
    g = Golden(case)
    last = lineage.Session(model(case)).prefill(g.tokens)
    assert last.shape == (model(case).config["vocab_size"],)
    assert_close_to_golden(last, g, "logits", want=g.array("logits")[-1])


def test_copied_weights_match_the_reference_too():
    g = Golden("gpt2/f32_defaults")
    logits = lineage.Session(model("gpt2/f32_defaults", mmap=False)).prefill(g.tokens, all_positions=True)
    assert_close_to_golden(logits, g, "logits")


def test_experts_streamed_under_a_memory_budget_give_the_same_logits():
    """memory_budget as the CLI's --memory-budget: a budget below the minimum is an error naming both
    minima; at the one that holds the trunk and one routed expert (every step evicts), and at the one
    with the trunk streamed a sublayer at a time too, the logits are the resident model's bit for bit,
    with either cache policy."""
    g = Golden("kimi_linear/f32")
    want = lineage.Session(model("kimi_linear/f32")).prefill(g.tokens, all_positions=True)
    path = data_root() / "kimi_linear/f32"
    for cache in ("global", "per-layer"):
        with pytest.raises(RuntimeError, match=r"below this model's minimum, \d+ bytes, with its trunk streamed") as e:
            lineage.Model.load(path, memory_budget="1K", expert_cache=cache)
        streamed_trunk = str(e.value).split("minimum, ")[1].split(" ")[0]
        resident_trunk = str(e.value).split("with the trunk resident the minimum is ")[1].split(" ")[0]
        assert int(streamed_trunk) < int(resident_trunk)
        for minimum in (resident_trunk, streamed_trunk):
            streamed = lineage.Model.load(path, memory_budget=minimum, expert_cache=cache)
            got = lineage.Session(streamed).prefill(g.tokens, all_positions=True)
            assert np.array_equal(got, want), (cache, minimum)


def test_int8_dot_is_close_to_the_exact_products():
    # W8A16 with one scale a row of 64 (group 128 over rows of 64): the int8-activation mode takes its
    # matrices, so its logits differ from the exact path's, within int8 rounding of x.
    if not lineage.Model.int8_dot_available():
        pytest.skip("no AVX512_VNNI here")
    g = Golden("quant/w8a16_g128")
    exact = lineage.Session(lineage.Model.load(data_root() / "quant/w8a16_g128")).prefill(g.tokens, all_positions=True)
    int8 = lineage.Session(lineage.Model.load(data_root() / "quant/w8a16_g128", int8_dot=True)).prefill(
        g.tokens, all_positions=True)
    assert 1e-5 < rel_rms(int8, exact) < 2e-2


def test_bf16_exact_and_the_default_bf16_dot_products():
    # A BF16 checkpoint with MXFP4 linears: bf16_exact=True gives the reference's exact logits; the
    # default, where the CPU has AVX512_BF16, the reference's emulation of the bf16 dot products (x
    # rounded to bf16 before every BF16 and MXFP4 linear), far from the exact ones.
    g = Golden("quant/mxfp4")
    exact = lineage.Session(lineage.Model.load(data_root() / "quant/mxfp4", bf16_exact=True)).prefill(
        g.tokens, all_positions=True)
    assert_close_to_golden(exact, g, "logits")
    if not lineage.Model.bf16_dot_available():
        pytest.skip("no AVX512_BF16 here: the default is the exact products")
    dot = lineage.Session(lineage.Model.load(data_root() / "quant/mxfp4")).prefill(g.tokens, all_positions=True)
    emulated = np.load(data_root() / "quant/mxfp4/golden/logits_bf16_dot.npy")
    assert rel_rms(dot, emulated) < 2e-3
    assert rel_rms(dot, exact) > 1e-3


@pytest.mark.parametrize("case", CASES)
def test_decode_one_token_at_a_time_equals_prefill(case):
    g = Golden(case)
    full = lineage.Session(model(case)).prefill(g.tokens, all_positions=True)
    s = lineage.Session(model(case))
    stepped = np.stack([s.decode(t) for t in g.tokens])
    assert np.allclose(stepped, full, rtol=1e-4, atol=1e-5), f"max |diff| {np.abs(stepped - full).max()}"
    assert rel_rms(stepped, full) <= 1e-5
    assert s.position == len(g.tokens)


# --- state ----------------------------------------------------------------------------------------

def test_attention_kv_grows_and_holds_the_k_v_projections():
    g = Golden("gpt2/f32_defaults")
    m = model("gpt2/f32_defaults")
    D, H = g.config["n_embd"], g.config["n_head"]
    hd = D // H
    s = lineage.Session(m)
    for layer in s.state():
        assert layer["kind"] == "attention"
        assert layer["arrays"]["k"].shape == (H, 0, hd) and layer["arrays"]["v"].shape == (H, 0, hd)
    n = 10
    s.prefill(g.tokens[:n])
    bytes_before = s.state_bytes
    assert [layer["arrays"]["k"].shape for layer in s.state()] == [(H, n, hd)] * m.config["n_layers"]
    s.decode(g.tokens[n])
    assert s.state_bytes == bytes_before + m.config["state_bytes_per_token"]
    s.prefill(g.tokens[n + 1:])
    T = len(g.tokens)
    for i, layer in enumerate(s.state()):
        # The reference's qkv projection [T, 3D] = q | k | v, each head-major [T, H, hd].
        qkv = g.array(f"h{i}.attn.qkv")
        for j, name in ((1, "k"), (2, "v")):
            want = qkv[:, j * D:(j + 1) * D].reshape(T, H, hd).transpose(1, 0, 2)
            got = layer["arrays"][name]
            assert got.shape == (H, T, hd) and got.flags.c_contiguous
            assert_close_to_golden(got, g, f"h{i}.attn.qkv", want=want)


@pytest.mark.parametrize("case", ["kda/f32", "delta_net/f32"])
def test_delta_rule_S_stays_fixed_in_size_and_equals_the_reference_state(case):
    g = Golden(case)
    s = lineage.Session(model(case))
    empty = s.state()
    shape = empty[0]["arrays"]["S"].shape
    assert len(shape) == 3 and not empty[0]["arrays"]["S"].any()
    bytes_empty = s.state_bytes
    s.prefill(g.tokens[:-1])
    before = s.state()
    s.decode(g.tokens[-1])
    after = s.state()
    assert s.state_bytes == bytes_empty, "a recurrent state does not grow with the context"
    for i, layer in enumerate(after):
        assert layer["kind"] == "delta_rule"
        assert layer["arrays"]["S"].shape == shape  # [HV, K, V]
        assert not np.array_equal(layer["arrays"]["S"], before[i]["arrays"]["S"]), "S changes with each token"
        assert_close_to_golden(layer["arrays"]["S"], g, f"h{i}.attn.state")
        if "conv_tail" in layer["arrays"]:
            assert layer["arrays"]["conv_tail"].shape[0] == g.config.get("conv_size", 4) - 1


def test_hybrid_state_kda_S_and_mla_latents_match_the_reference():
    g = Golden("kimi_linear/f32")
    s = lineage.Session(model("kimi_linear/f32"))
    s.prefill(g.tokens)
    T = len(g.tokens)
    for i, layer in enumerate(s.state()):
        if layer["kind"] == "delta_rule":
            assert_close_to_golden(layer["arrays"]["S"], g, f"h{i}.attn.state")
        else:
            # The MLA cache: per position the compressed latent and the rotated key of the rope dims.
            kv = layer["arrays"]["kv"]
            rank, rope = g.config["kv_lora_rank"], g.config["qk_rope_head_dim"]
            assert kv.shape == (T, rank + rope)
            assert_close_to_golden(kv[:, :rank], g, f"h{i}.attn.latent")
            assert_close_to_golden(kv[:, rank:], g, f"h{i}.attn.k_rope")


# --- state files ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["gpt2/f32_defaults", "kimi_linear/f32"])
def test_save_then_load_continues_bit_for_bit(case, tmp_path):
    g = Golden(case)
    m = model(case)
    split = len(g.tokens) // 2
    original = lineage.Session(m)
    original.prefill(g.tokens[:split])
    path = tmp_path / "state.lst"
    original.save(path)
    saved_state, saved_logits = original.state(), original.logits

    restored = lineage.Session(m)
    restored.prefill(g.tokens[-3:])  # something to overwrite
    restored.load(path)
    assert restored.position == split and restored.tokens == g.tokens[:split]
    assert np.array_equal(restored.logits, saved_logits)
    for a, b in zip(restored.state(), saved_state):
        assert a["kind"] == b["kind"] and a["arrays"].keys() == b["arrays"].keys()
        for name in a["arrays"]:
            assert np.array_equal(a["arrays"][name], b["arrays"][name]), name

    for t in g.tokens[split:split + 3]:
        assert np.array_equal(original.decode(t), restored.decode(t))
    rest = g.tokens[split + 3:]
    assert np.array_equal(original.prefill(rest, all_positions=True), restored.prefill(rest, all_positions=True))


def test_loading_another_models_state_fails(tmp_path):
    g = Golden("gpt2/f32_defaults")
    s = lineage.Session(model("gpt2/f32_defaults"))
    s.prefill(g.tokens[:5])
    path = tmp_path / "gpt2.lst"
    s.save(path)
    with pytest.raises(lineage.Error, match="another model"):
        lineage.Session(model("kda/f32")).load(path)


def test_truncated_state_file_fails(tmp_path):
    s = lineage.Session(model("kda/f32"))
    s.prefill(Golden("kda/f32").tokens[:5])
    path = tmp_path / "kda.lst"
    s.save(path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    fresh = lineage.Session(model("kda/f32"))
    with pytest.raises(lineage.Error, match="truncated"):
        fresh.load(path)
    assert fresh.position == 0, "a failed load leaves the session as it was"
    with pytest.raises(lineage.Error, match="does not exist"):
        fresh.load(tmp_path / "missing.lst")


# --- tokenizer and generation ---------------------------------------------------------------------

def test_tokenizer_matches_js_tiktoken(tiny_gpt2):
    ref = json.loads((data_root() / "tokenizer" / "expected.json").read_text())
    assert tiny_gpt2.encode("Hello world") == [15496, 995]
    assert tiny_gpt2.decode([15496, 995]) == "Hello world"
    mismatches = [seg["file"] for seg in ref["segments"] if tiny_gpt2.encode(seg["text"]) != seg["ids"]]
    assert not mismatches, f"{len(mismatches)} of {len(ref['segments'])} segments differ, e.g. in {mismatches[:3]}"
    for seg in ref["segments"][:50]:
        assert tiny_gpt2.decode(seg["ids"]) == seg["text"]


def test_models_without_a_tokenizer_say_so():
    m = model("gpt2/f32_defaults")
    assert not m.has_tokenizer
    with pytest.raises(lineage.Error, match="tokenizer"):
        m.encode("hi")
    with pytest.raises(lineage.Error, match="tokenizer"):
        lineage.Session(m).generate([1, 2, 3])


def argmax_loop(m, prompt_ids, n, start=None):
    s = start or lineage.Session(m)
    logits = s.prefill(prompt_ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))  # ties to the lowest id, as the engine's greedy sampler
        logits = s.decode(out[-1])
    return out


def test_greedy_generate_equals_an_argmax_loop(tiny_gpt2):
    prompt = "The cat sat on the"
    ids = tiny_gpt2.encode(prompt)
    want = argmax_loop(tiny_gpt2, ids, 12)
    assert GPT2_EOS not in want, "the seeded tiny model should not produce EOS here"
    s = lineage.Session(tiny_gpt2)
    text = s.generate(prompt, max_tokens=12, temperature=0.0)
    assert text == tiny_gpt2.decode(want)
    assert s.tokens == ids + want, "every generated token is fed"
    s2 = lineage.Session(tiny_gpt2)
    assert s2.generate(ids, max_tokens=12) == text, "token ids as the prompt"
    assert np.array_equal(s2.logits, s.logits)


def test_generate_continues_the_session(tiny_gpt2, tmp_path):
    ids = tiny_gpt2.encode("Once upon a time")
    more = tiny_gpt2.encode(" there")
    s = lineage.Session(tiny_gpt2)
    s.prefill(ids)
    text = s.generate(more, max_tokens=6)
    ref = lineage.Session(tiny_gpt2)
    assert text == tiny_gpt2.decode(argmax_loop(tiny_gpt2, ids + more, 6, start=ref))
    # An empty prompt continues from the last logits, also after a save and load.
    path = tmp_path / "gen.lst"
    s.save(path)
    loaded = lineage.Session(tiny_gpt2)
    loaded.load(path)
    assert loaded.generate("", max_tokens=5) == s.generate([], max_tokens=5)
    assert loaded.tokens == s.tokens
    s.reset()
    assert s.position == 0 and s.tokens == [] and s.logits is None
    with pytest.raises(lineage.Error, match="empty"):
        s.generate("", max_tokens=5)


def test_sampling_is_seeded(tiny_gpt2):
    run = lambda seed: lineage.Session(tiny_gpt2).generate("Hello", max_tokens=10, temperature=1.5, top_k=50,
                                                           top_p=0.9, seed=seed, stop_at_eos=False)
    assert run(7) == run(7)
    assert len({run(seed) for seed in range(4)}) > 1


def test_generation_stops_at_eos(eos_gpt2):
    ids = eos_gpt2.encode("Hi")
    assert int(np.argmax(lineage.Session(eos_gpt2).prefill(ids))) == GPT2_EOS, "the model is built to emit EOS"
    s = lineage.Session(eos_gpt2)
    assert s.generate("Hi", max_tokens=5) == ""
    assert s.tokens == ids + [GPT2_EOS], "the EOS is fed, so the state holds the whole sequence"
    assert lineage.Session(eos_gpt2).generate("Hi", max_tokens=3, stop_at_eos=False) == "<|endoftext|>" * 3


# --- errors and threads ---------------------------------------------------------------------------

def test_bad_calls_raise_lineage_errors():
    s = lineage.Session(model("gpt2/f32_defaults"))
    with pytest.raises(lineage.Error, match="at least one token"):
        s.prefill([])
    with pytest.raises(lineage.Error, match="vocab"):
        s.decode(model("gpt2/f32_defaults").config["vocab_size"])
    with pytest.raises(lineage.Error, match="context"):
        s.prefill([1] * (model("gpt2/f32_defaults").config["max_positions"] + 1))
    assert s.position == 0


def test_session_keeps_its_model_alive():
    s = lineage.Session(lineage.Model.load(data_root() / "kda" / "f32"))
    import gc
    gc.collect()
    g = Golden("kda/f32")
    assert_close_to_golden(s.prefill(g.tokens, all_positions=True), g, "logits")
    assert s.model.layer_kinds[0] == "delta_rule"


def test_the_gil_is_released_during_forwards():
    g = Golden("kimi_linear/f32")
    m = model("kimi_linear/f32")
    ref = lineage.Session(m).prefill(g.tokens * 8, all_positions=True)

    # Two sessions on two threads give what one gives alone.
    results = [None, None]
    def work(i):
        results[i] = lineage.Session(m).prefill(g.tokens * 8, all_positions=True)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # (Close, not equal: a thread that finds the pool taken runs its regions alone, another split.)
    assert all(rel_rms(r, ref) <= 1e-5 for r in results)

    # While a thread is inside a long prefill, this thread runs (it could not if the call held the
    # GIL) and finds that session busy.
    busy = lineage.Session(m)
    seen_busy = False
    def feed():
        for _ in range(20):
            busy.prefill(g.tokens * 8)
            busy.reset()
    worker = threading.Thread(target=feed)
    worker.start()
    while worker.is_alive() and not seen_busy:
        try:
            busy.position
        except lineage.Error as e:
            assert "another thread" in str(e)
            seen_busy = True
    worker.join()
    assert seen_busy


def test_a_gguf_file_loads_as_its_directory_does(tmp_path):
    # reference/gguf_mirror.py writes the checkpoint as llama.cpp's converter lays it out; copied
    # (mmap=False) both hold GPT-2's matrices [out, in]: the same logits, bit for bit.
    mirror = Path(__file__).resolve().parents[2] / "reference" / "gguf_mirror.py"
    g = Golden("gpt2/f32_gpt2_shapes")
    gguf = tmp_path / "gpt2.gguf"
    subprocess.run(["/usr/bin/python3", str(mirror), str(data_root() / "gpt2/f32_gpt2_shapes"), str(gguf)], check=True)
    from_gguf = lineage.Session(lineage.Model.load(gguf, mmap=False)).prefill(g.tokens, all_positions=True)
    from_dir = lineage.Session(model("gpt2/f32_gpt2_shapes", mmap=False)).prefill(g.tokens, all_positions=True)
    assert np.array_equal(from_gguf, from_dir)
    assert_close_to_golden(from_gguf, g, "logits")


def test_a_block_quantized_gguf_decodes_as_it_prefills():
    # A GGUF whose matrices and embedding are ggml blocks (Q8_0, Q4_0, Q5_0, Q5_1, MXFP4: the fuzzer's
    # seed): 12 tokens prefilled at once take the blocks' GEMM (panels decoded in the kernels' order), one
    # at a time their GEMV; the two agree to the f32 sums' rounding, and the logits move with the input.
    gguf = Path(__file__).resolve().parents[2] / "fuzz" / "corpus" / "fuzz_gguf" / "tiny_gpt2_blocks.gguf"
    m = lineage.Model.load(gguf)
    tokens = [1, 7, 42, 3, 250, 9, 9, 100, 17, 5, 64, 2]
    whole = lineage.Session(m).prefill(tokens, all_positions=True)
    s = lineage.Session(m)
    stepped = np.stack([s.decode(t) for t in tokens])
    assert whole.shape == (12, 260)
    assert rel_rms(stepped, whole) <= 1e-5
    assert np.std(whole[1] - whole[0]) > 1e-3


# --- trace ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["gpt2/f32_defaults", "kda/f32", "delta_net/f32", "kimi_linear/f32"])
def test_trace_records_the_sequences_own_states_and_weights(case):
    m = model(case)
    ids = [(i * 7919 + 13) % m.config["vocab_size"] for i in range(10)]
    s = lineage.Session(m)
    s.prefill([1, 2])  # the trace runs from an empty state and leaves the session as it was
    tr = s.trace(ids)
    assert s.position == 2
    assert tr["tokens"] == ids and len(tr["state_bytes"]) == len(ids)
    replay = lineage.Session(m)
    for t, tok in enumerate(ids):
        replay.decode(tok)
        for layer, state in zip(tr["layers"], replay.state()):
            if layer["mixer"] == "delta_rule":  # S after token t: the session's own state, bit for bit
                assert np.array_equal(layer["states"][t], state["arrays"]["S"]), (case, t)
    assert tr["state_bytes"][-1] == replay.state_bytes
    for layer in tr["layers"]:
        if layer["mixer"] != "delta_rule":
            w = layer["weights"]  # [T, heads, T]: rows are distributions over positions 0 .. t
            T = w.shape[0]
            assert np.allclose(w.sum(-1), 1, atol=1e-5) and (w >= 0).all()
            future = np.broadcast_to(np.triu(np.ones((T, T), bool), 1)[:, None, :], w.shape)
            assert not w[future].any(), "no weight on a later position"
            continue
        # The update in float64 numpy from the recorded pieces: S_t = a ⊙ S_{t−1} + β k (v − r)ᵀ with
        # r = (a ⊙ S_{t−1})ᵀk for the delta rule (r = 0 for an additive one).
        S, k, v, beta = (layer[n].astype(np.float64) for n in ("states", "k", "v", "beta"))
        T, HV, K, V = S.shape
        G = HV // k.shape[1]
        prev = np.zeros((HV, K, V))
        for t in range(T):
            kk = np.repeat(k[t], G, axis=0)  # [HV, K]
            if layer["gate"] == "none":
                a = np.ones((HV, K))
            elif layer["gate"] == "head":
                a = np.repeat(np.exp(layer["log_decay"][t].astype(np.float64))[:, None], K, axis=1)
            else:
                a = np.exp(layer["log_decay"][t].astype(np.float64))
            decayed = a[:, :, None] * prev
            r = np.einsum("hkv,hk->hv", decayed, kk) if layer["erase"] else 0 * v[t]
            want = decayed + beta[t][:, None, None] * np.einsum("hk,hv->hkv", kk, v[t] - r)
            assert np.abs(want - S[t]).max() <= 2e-5 * max(1.0, np.abs(S[t]).max()), (case, t)
            if layer["erase"]:
                assert np.allclose(layer["recalled"][t], r, atol=1e-5 * max(1.0, np.abs(r).max()))
            assert np.allclose(layer["norms"][t, :, 4], np.linalg.norm(S[t].reshape(HV, -1), axis=1), rtol=1e-5)
            # The recorded parts: decay, erase and write, as this replay computes them.
            parts = layer["parts"][t].astype(np.float64)  # [HV, 3, K, V]
            assert np.abs(parts[:, 0] - (decayed - prev)).max() <= 1e-6 * max(1.0, np.abs(prev).max())
            write = beta[t][:, None, None] * np.einsum("hk,hv->hkv", kk, v[t])
            assert np.abs(parts[:, 2] - write).max() <= 1e-5 * max(1.0, np.abs(write).max())
            assert np.abs(parts[:, 1] - (want - decayed - write)).max() <= 1e-5 * max(1.0, np.abs(want).max())
            prev = S[t]
