// @huggingface/gguf (Hugging Face's GGUF parser, no code of ours) reading a GGUF file: its version,
// metadata and tensor infos as JSON on stdout, for tests/gguf_test.cpp to hold `lineage gguf --json` to.
// Usage: node reference_read.mjs FILE.gguf
import { gguf } from "@huggingface/gguf";

const file = process.argv[2];
const { metadata, tensorInfos } = await gguf(file, { allowLocalFile: true });
const plain = (v) => (typeof v === "bigint" ? v.toString() : Array.isArray(v) ? v.map(plain) : v);
const kv = {};
for (const [k, v] of Object.entries(metadata)) kv[k] = plain(v);
const tensors = tensorInfos.map((t) => ({ name: t.name, ne: t.shape.map((d) => d.toString()), type: t.dtype,
                                          offset: t.offset.toString() }));
process.stdout.write(JSON.stringify({ metadata: kv, tensors }));
