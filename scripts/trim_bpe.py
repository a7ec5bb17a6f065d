"""Restricts a GPT-2 byte-level BPE (vocab.json + merges.txt) to the tokens a corpus needs.

Kept: the 256 byte tokens, every token of the corpus's encoding (ids from `lineage tokenize --out`,
uint16 .bin), every intermediate token the merges build them from, and the special tokens. Kept
merges: those whose two parts and result are all kept, in their original order. The corpus then
encodes exactly as before (every merge applied to it builds a kept token), other text still encodes
(bytes are always there), ids are renumbered in the original order.
Usage: python3 scripts/trim_bpe.py VOCAB_DIR CORPUS.bin OUT_DIR
"""
import json
import os
import struct
import sys


def main() -> int:
    src, corpus, out = sys.argv[1:4]
    vocab = json.load(open(os.path.join(src, "vocab.json"), encoding="utf-8"))
    by_id = {i: t for t, i in vocab.items()}
    lines = open(os.path.join(src, "merges.txt"), encoding="utf-8").read().split("\n")
    header = lines[0] if lines[0].startswith("#") else None
    merges = [tuple(l.split(" ")) for l in lines[1 if header else 0:] if l]
    parts = {a + b: (a, b) for a, b in merges}

    data = open(corpus, "rb").read()
    used = {by_id[i] for i in struct.unpack(f"<{len(data) // 2}H", data)}
    kept = set()
    stack = list(used) + [t for t in vocab if t.startswith("<|") and t.endswith("|>")]
    while stack:
        t = stack.pop()
        if t in kept:
            continue
        kept.add(t)
        if t in parts:
            stack.extend(parts[t])
    # The byte alphabet: the 256 tokens of one character each that GPT-2's byte map produces.
    kept.update(t for t in vocab if len(t) == 1)
    new_vocab = {t: n for n, t in enumerate(sorted(kept, key=lambda t: vocab[t]))}
    new_merges = [f"{a} {b}" for a, b in merges if a in kept and b in kept and a + b in kept]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(new_vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write((header + "\n" if header else "") + "\n".join(new_merges) + "\n")
    print(f"{len(new_vocab)} tokens ({len(used)} in the corpus), {len(new_merges)} merges -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
