#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses (fuzz/corpus/<harness>/): a few small valid
inputs of each format and a few broken ones. The valid config.json seeds come from the harness
itself, so they always match the checkpoints it writes:
    LINEAGE_FUZZ_WRITE_SEEDS=fuzz/corpus/fuzz_config build-asan/fuzz/fuzz_config
Run from the repository root: python3 fuzz/make_corpus.py"""
import base64
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from byte_level import byte_to_unicode  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SEP = b"\n@@@@\n"  # fuzz_support.h: kSectionSeparator


def put(harness, name, data):
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors ---------------------------------------------------------------------------------
def safetensors(tensors, metadata=None, pad=True):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("fuzz_safetensors", "two_tensors.safetensors",
    safetensors([("w", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40")],
                {"format": "pt"}))
put("fuzz_safetensors", "scalar_and_empty.safetensors",
    safetensors([("s", "F64", [], struct.pack("<d", 1.5)), ("e", "I8", [0, 4], b""), ("u", "U8", [2], b"\x01\x02"),
                 ("i", "I64", [1], struct.pack("<q", -1)), ("h", "F16", [1], b"\x00\x3c"), ("k", "BOOL", [1], b"\x01")]))
put("fuzz_safetensors", "no_tensors.safetensors", safetensors([], {"note": "empty"}))
good = safetensors([("w", "F32", [2], f32(1, 2))])
put("fuzz_safetensors", "header_past_end.safetensors", struct.pack("<Q", 1 << 40) + good[8:])
overlap = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}).encode()
put("fuzz_safetensors", "overlap.safetensors", struct.pack("<Q", len(overlap)) + overlap + b"\0" * 6)
put("fuzz_safetensors", "unknown_dtype.safetensors", safetensors([("w", "Q4", [2], b"\0\0")]))
put("fuzz_safetensors", "truncated.safetensors", good[:-3])

# ---- sharded index (fuzz_checkpoint_index.cpp writes these shards) -------------------------------
shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
weight_map = {"model.embed.weight": shard1, "model.layers.0.norm.weight": shard1,
              "model.layers.0.proj.weight": shard2, "lm_head.weight": shard2}
put("fuzz_checkpoint_index", "valid.json",
    json.dumps({"metadata": {"total_size": 92}, "weight_map": weight_map}, indent=2))
put("fuzz_checkpoint_index", "one_shard.json",
    json.dumps({"weight_map": {"model.embed.weight": shard1, "model.layers.0.norm.weight": shard1}}))
put("fuzz_checkpoint_index", "duplicate_name.json",
    json.dumps({"weight_map": dict(weight_map, **{"extra": "extra.safetensors"})}))
put("fuzz_checkpoint_index", "missing_shard.json",
    json.dumps({"weight_map": {"model.embed.weight": "model-00003-of-00003.safetensors"}}))
put("fuzz_checkpoint_index", "wrong_shard.json", json.dumps({"weight_map": {"lm_head.weight": shard1}}))
put("fuzz_checkpoint_index", "not_object.json", json.dumps({"weight_map": ["model.safetensors"]}))
put("fuzz_checkpoint_index", "truncated.json", json.dumps({"weight_map": weight_map})[:40])

# ---- config.json (broken ones; the valid ones come from the harness) -----------------------------
put("fuzz_config", "broken_gpt2_heads.json",
    '0{"model_type": "gpt2", "vocab_size": 40, "n_positions": 16, "n_embd": 8, "n_layer": 2, "n_head": 3}')
put("fuzz_config", "broken_kda_types.json",
    '7{"model_type": "kda", "vocab_size": "40", "hidden_size": 8.5, "num_hidden_layers": -2, "head_dim": null}')
put("fuzz_config", "broken_unknown_type.json", '2{"model_type": "mamba", "vocab_size": 40}')
put("fuzz_config", "broken_not_json.json", '4{"model_type": "delta_net", "vocab_size": 40,')
put("fuzz_config", "broken_array.json", '5[1, 2, 3]')

# ---- tokenizers ----------------------------------------------------------------------------------
B2U = byte_to_unicode()
spell = lambda s: "".join(B2U[b] for b in s.encode())
byte_vocab = {B2U[b]: b for b in range(256)}
pieces = ["he", "ll", "hell", "hello", spell(" w"), "or", spell(" wor"), "ld", spell(" world")]
gpt2_vocab = dict(byte_vocab)
for p in pieces:
    gpt2_vocab[p] = len(gpt2_vocab)
gpt2_vocab["<|endoftext|>"] = len(gpt2_vocab)
gpt2_merges = ["h e", "l l", "he ll", "hell o", spell(" ") + " w", spell(" w") + " or", spell(" wor") + " ld"]
assert all(p in gpt2_vocab for m in gpt2_merges for p in m.split(" ") + ["".join(m.split(" "))])
merges_txt = "#version: 0.2\n" + "\n".join(gpt2_merges) + "\n"
vocab_json = json.dumps(gpt2_vocab, ensure_ascii=False)
text = "hello world<|endoftext|> hello\n\ttabs café 日本 😀"
put("fuzz_tokenizer", "vocab_merges.txt", b"1" + vocab_json.encode() + SEP + merges_txt.encode() + SEP + text.encode())
put("fuzz_tokenizer", "vocab_merges_config.txt",
    b"3" + vocab_json.encode() + SEP + merges_txt.encode() + SEP +
    json.dumps({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|endoftext|>", "add_bos_token": True}).encode())
gpt2_json = {"version": "1.0",
             "added_tokens": [{"id": len(gpt2_vocab) - 1, "content": "<|endoftext|>", "special": True}],
             "normalizer": None,
             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
             "decoder": {"type": "ByteLevel"},
             "model": {"type": "BPE", "vocab": gpt2_vocab, "merges": [m.split(" ") for m in gpt2_merges]}}
put("fuzz_tokenizer", "gpt2_tokenizer_json.txt", b"0" + json.dumps(gpt2_json, ensure_ascii=False).encode() + SEP + text.encode())
# Qwen's: the NFC normalizer, a Split on Qwen2's or Qwen3.5's pattern, ByteLevel without its own regex.
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
mark_text = text + " x\u0301y !\u0301! \u0301 नमस्ते e\u0301 'S"
for name, pattern in (("qwen2_sequence.txt", QWEN2), ("qwen35_sequence.txt", QWEN35)):
    qwen_json = dict(gpt2_json, normalizer={"type": "NFC"},
                     pre_tokenizer={"type": "Sequence", "pretokenizers": [
                         {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                         {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]})
    put("fuzz_tokenizer", name, b"0" + json.dumps(qwen_json, ensure_ascii=False).encode() + SEP + mark_text.encode())

SP = "\u2581"
sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    sp_vocab["<0x%02X>" % b] = 3 + b
for p in [SP, "h", "e", "l", "o", "w", "r", "d", SP + "h", "ll", SP + "he", "llo", SP + "hello", SP + "w", "or",
          SP + "wor", "ld", SP + "world"]:
    sp_vocab[p] = len(sp_vocab)
sp_merges = [SP + " h", "l l", SP + "h e", "ll o", SP + "he llo", SP + " w", "o r", SP + "w or", "l d", SP + "wor ld"]
added = [{"id": i, "content": c, "special": True, "normalized": False} for i, c in enumerate(["<unk>", "<s>", "</s>"])]
sp_decoder = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
llama = {"version": "1.0", "added_tokens": added,
         "normalizer": {"type": "Sequence", "normalizers": [
             {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
         "pre_tokenizer": None,
         "post_processor": {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
         "decoder": sp_decoder,
         "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                   "vocab": sp_vocab, "merges": sp_merges}}
put("fuzz_tokenizer", "llama_prepend_replace.txt",
    b"2" + json.dumps(llama, ensure_ascii=False).encode() + SEP + json.dumps({"eos_token": "</s>", "add_bos_token": True}).encode()
    + SEP + "hello world </s> zz ü".encode())
metaspace = dict(llama, normalizer=None,
                 pre_tokenizer={"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False},
                 decoder={"type": "Sequence", "decoders": [{"type": "Metaspace", "replacement": SP, "prepend_scheme": "first"},
                                                           {"type": "ByteFallback"}, {"type": "Fuse"}]})
put("fuzz_tokenizer", "llama_metaspace.txt", b"0" + json.dumps(metaspace, ensure_ascii=False).encode())
put("fuzz_tokenizer", "broken_missing_bytes.txt", b"1" + json.dumps({"a": 0, "b": 1}).encode() + SEP + b"a b\n")
put("fuzz_tokenizer", "broken_three_part_merge.txt", b"1" + vocab_json.encode() + SEP + b"#version: 0.2\nh e l\n")
put("fuzz_tokenizer", "broken_unigram.txt", b"0" + json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}).encode())
put("fuzz_tokenizer", "broken_truncated.txt", b"0" + json.dumps(gpt2_json, ensure_ascii=False).encode()[:300])

# ---- tiktoken.model (fuzz_tiktoken: first byte bit 0 = a tokenizer_config.json follows) -----------
def tiktoken_model(extra, ranks=None):
    lines = [base64.b64encode(bytes([b])).decode() + " %d" % b for b in range(256)]
    for i, token in enumerate(extra):
        lines.append(base64.b64encode(token.encode()).decode() + " %d" % (ranks[i] if ranks else 256 + i))
    return "\n".join(lines) + "\n"


tik_pieces = ["he", "ll", "hell", "hello", " w", "or", " wor", "ld", " world", "中文", "'s"]
tik_model = tiktoken_model(tik_pieces)
n_tik = 256 + len(tik_pieces)
tik_config = json.dumps({
    "added_tokens_decoder": {str(n_tik + k): {"content": c, "special": True}
                             for k, c in [(0, "[BOS]"), (1, "[EOS]"), (2, "<|im_end|>"), (255, "[PAD]")]},
    "bos_token": "[BOS]", "eos_token": {"content": "[EOS]"}, "pad_token": "[PAD]"})
tik_text = "[BOS]hello world<|im_end|> DON'T it's 中文。 café 😀\n\n\t<|reserved_token_%d|>" % (n_tik + 7)
put("fuzz_tiktoken", "kimi_config.txt", b"1" + tik_model.encode() + SEP + tik_config.encode() + SEP + tik_text.encode())
put("fuzz_tiktoken", "no_config.txt", b"0" + tik_model.encode() + SEP + tik_text.encode())
put("fuzz_tiktoken", "broken_base64.txt", b"0" + tiktoken_model(["ab"]).replace("YWI=", "YW*=").encode())
put("fuzz_tiktoken", "broken_duplicate_rank.txt", b"0" + tiktoken_model(["ab", "cd"], [256, 256]).encode())
put("fuzz_tiktoken", "broken_rank_gap.txt", b"0" + tiktoken_model(["ab"], [300]).encode())
put("fuzz_tiktoken", "broken_missing_byte.txt", b"0" + tiktoken_model([]).replace("eA== 120\n", "YWJj 120\n").encode())
put("fuzz_tiktoken", "broken_config_id.txt",
    b"1" + tik_model.encode() + SEP + json.dumps({"added_tokens_decoder": {"5": {"content": "x"}}}).encode())

# ---- .npy ----------------------------------------------------------------------------------------
def npy(descr, shape, data, version=1, fortran=False):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    pre = 10 if version == 1 else 12
    header += " " * (-(pre + len(header) + 1) % 64) + "\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + data


put("fuzz_npy", "f4_2x3.npy", npy("<f4", [2, 3], f32(0, 1, 2, 3, 4, 5)))
put("fuzz_npy", "f8_3.npy", npy("<f8", [3], struct.pack("<3d", 1.0, -2.5, 1e300)))
put("fuzz_npy", "i4_scalar.npy", npy("<i4", [], struct.pack("<i", 7)))
put("fuzz_npy", "i8_v2.npy", npy("<i8", [2, 1], struct.pack("<2q", -1, 1 << 40), version=2))
put("fuzz_npy", "f4_empty.npy", npy("<f4", [0, 5], b""))
put("fuzz_npy", "broken_fortran.npy", npy("<f4", [2, 2], f32(1, 2, 3, 4), fortran=True))
put("fuzz_npy", "broken_f2.npy", npy("<f2", [2], b"\0\0\0\0"))
put("fuzz_npy", "broken_short_data.npy", npy("<f4", [4, 4], f32(1, 2, 3)))
put("fuzz_npy", "broken_magic.npy", b"\x93NUMPX\x01\x00" + npy("<f4", [1], f32(1))[8:])


# ---- state files (fuzz_state_file: byte 0 the mode, byte 1 the model, byte 2 the position) -------
for model in (0, 1):
    for pos in (0, 3):
        put("fuzz_state_file", f"valid_m{model}_p{pos}.bin", bytes([1, model, pos]))
        put("fuzz_state_file", f"patched_m{model}_p{pos}.bin", bytes([0x81, model, pos, 30, 0, ord("9"), 200, 0, 7]))
    for name, patch in [("position", {"position": 9}), ("tokens_far", {"tokens": {"offset": 10**12, "count": 3}}),
                        ("logits_count", {"logits": {"offset": 0, "count": 17}}), ("version", {"version": 2}),
                        ("model", {"model": {"config_hash": "0000000000000000"}}), ("layers_empty", {"layers": []}),
                        ("rng", {"rng": {"state": "zz", "spare_bits": -1, "has_spare": 3}}),
                        ("payload", {"payload_bytes": 1}), ("meta", {"meta": {"messages": [1, 2]}})]:
        put("fuzz_state_file", f"header_{name}_m{model}.bin", bytes([2, model, 3]) + json.dumps(patch).encode())
put("fuzz_state_file", "raw_magic.bin", bytes([0, 0, 0]) + b"LINSTATE\x01\0\0\0\0\0\0\0" + b"\xff" * 8)

# ---- OpenAI request bodies (fuzz_openai_request: the last byte picks chat and the piece sizes) ---
for name, body, control in [
        ("completion", {"prompt": "Hello there, stop here", "max_tokens": 8, "stop": ["stop", "here"]}, 0),
        ("ids", {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0, "seed": 7}, 2),
        ("stream", {"prompt": "abcabc", "stream": True, "stream_options": {"include_usage": True}, "stop": "ca"}, 4),
        ("chat", {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                  "max_completion_tokens": 4, "top_p": 0.5, "top_k": 3, "stop": ["\n\n", "user:"]}, 1),
        ("chat_parts", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, 3),
        ("extras", {"prompt": "x", "n": 1, "ignore_eos": True, "return_progress": True, "user": "u",
                    "frequency_penalty": 0}, 6),
        ("logprobs_echo", {"prompt": [[464, 3290, 13]], "max_tokens": 0, "logprobs": 5, "echo": True}, 2),
        ("chat_logprobs", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3}, 1)]:
    put("fuzz_openai_request", f"{name}.json", json.dumps(body).encode() + bytes([control]))


# ---- POST /trace/data bodies and --heads values (fuzz_trace_request) ----
for name, body in [
        ("prompt", {"prompt": "In the beginning"}),
        ("tokens_heads", {"tokens": [1, 2, 3, 99], "heads": "0:3,1:1,2:0", "detail_bytes": 1}),
        ("budget", {"tokens": [5] * 40, "detail_bytes": 4096})]:
    put("fuzz_trace_request", f"{name}.json", json.dumps(body).encode())
put("fuzz_trace_request", "heads.txt", b"0:1,1:0,0:1")


# ---- quantization_config + tensor bytes (fuzz_quantization: section 1 fills the stored tensors) ----
# The quant goldens' configs (reference/quant_goldens.py) are seeds too: each case's quantization_config
# with the same filler, written as <case>.txt.
def qargs(**kw):
    base = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 4,
            "observer": "minmax", "strategy": "group", "symmetric": True, "type": "int"}
    base.update(kw)
    return base


def ct_config(fmt, weights, ignore=("lm_head",)):
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": fmt}}}


filler = bytes((i * 73 + 41) % 256 for i in range(600))
for name, q in [
        ("int4_g32", ct_config("pack-quantized", qargs(group_size=32))),
        ("int4_asym_g16", ct_config("pack-quantized", qargs(group_size=16, symmetric=False))),
        ("int8_channel", ct_config("pack-quantized", qargs(num_bits=8, strategy="channel"))),
        ("fp8_block", ct_config("float-quantized", qargs(num_bits=8, type="float", strategy="block",
                                                          block_structure=[32, 32]))),
        ("nvfp4", ct_config("nvfp4-pack-quantized", qargs(type="float", strategy="tensor_group", group_size=16))),
        ("hf_fp8", {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                    "modules_to_not_convert": ["mlp.gate"], "activation_scheme": "dynamic"}),
        ("broken_actorder", ct_config("pack-quantized", qargs(group_size=32, actorder="group")))]:
    put("fuzz_quantization", f"{name}.txt", json.dumps(q).encode() + SEP + filler)
