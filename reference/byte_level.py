"""GPT-2's byte-level alphabet: each of the 256 bytes as the printable character byte-level BPE
vocabularies spell it (printable Latin-1 bytes as themselves, the others as U+0100 onwards, in byte
order). Shared by reference/gguf_mirror.py (Kimi's tiktoken ranks as byte-level tokens) and
fuzz/make_corpus.py (the tokenizer seeds)."""


def byte_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
