#!/usr/bin/env bash
# The accuracy table of docs/quantization.md: models of the lineage trained by lineage on the King James
# Bible (the shipped GPT-2, and a Gated DeltaNet, a KDA, a Kimi-Linear hybrid with MoE and a Qwen3.5
# hybrid trained here for a few hundred steps), each quantized with every lineage quantize scheme, then
# lineage perplexity on held-out verses against the bf16 model's exact logits (--kld-base): size,
# perplexity, mean and 99th-percentile KLD, same top-1, and decode tok/s (lineage bench, depth 0);
# the int8-activation mode (--int8-dot) beside the int4 and int8 schemes it takes, and MXFP4's bf16 dot
# mode beside its exact products (also against them alone: WORK_DIR/mxfp4_dot.md).
#   scripts/quant-accuracy.sh [WORK_DIR]     (default build/quant-acc; ~20 min on 2 cores)
# Needs build/lineage; installs Debian's bible-kjv for the text as scripts/train-kjv.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/quant-acc}
bin=build/lineage
steps=${QUANT_ACC_STEPS:-300}
mkdir -p "$work"
command -v bible >/dev/null || { s=""; [ "$(id -u)" -ne 0 ] && s=sudo; $s apt-get install -y -qq bible-kjv >/dev/null; }
tok=models/kjv-gpt2  # its trimmed GPT-2 tokenizer (11,349 tokens)
if [ ! -f "$work/train.bin" ]; then
  bible -f 'gen1:1-rev22:21' | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$work/kjv.txt"
  # Held out: the last 1,500 verses (the end of the New Testament, as train-kjv.sh's validation split).
  head -n -1500 "$work/kjv.txt" >"$work/train.txt"
  tail -n 1500 "$work/kjv.txt" >"$work/eval.txt"
  $bin tokenize --model "$tok" --file "$work/train.txt" --out "$work/train.bin" >/dev/null
fi

# Small models of the lineage's rows, at the shipped model's vocabulary; widths multiples of 128 so
# every scheme's groups fit.
cat >"$work/gated_deltanet.json" <<'EOF'
{"model_type": "gated_deltanet", "vocab_size": 11349, "hidden_size": 256, "num_hidden_layers": 4, "num_heads": 4,
 "head_dim": 64, "expand_v": 1, "intermediate_size": 768, "tie_word_embeddings": true, "bos_token_id": 11348,
 "eos_token_id": 11348}
EOF
cat >"$work/kda.json" <<'EOF'
{"model_type": "kda", "vocab_size": 11349, "hidden_size": 256, "num_hidden_layers": 4, "num_heads": 4,
 "head_dim": 64, "expand_v": 1, "intermediate_size": 768, "tie_word_embeddings": true, "bos_token_id": 11348,
 "eos_token_id": 11348}
EOF
cat >"$work/kimi_linear.json" <<'EOF'
{"model_type": "kimi_linear", "vocab_size": 11349, "hidden_size": 256, "num_hidden_layers": 4, "head_dim": 64,
 "intermediate_size": 768, "first_k_dense_replace": 1, "kv_lora_rank": 128, "q_lora_rank": null,
 "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "mla_use_nope": true, "num_attention_heads": 4,
 "num_key_value_heads": 4, "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 64,
 "num_heads": 4, "short_conv_kernel_size": 4}, "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 256,
 "num_shared_experts": 1, "moe_layer_freq": 1, "moe_renormalize": true, "moe_router_activation_func": "sigmoid",
 "num_expert_group": 1, "topk_group": 1, "use_grouped_topk": true, "routed_scaling_factor": 2.446,
 "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "model_max_length": 4096, "bos_token_id": 11348, "eos_token_id": 11348}
EOF
cat >"$work/qwen3_5.json" <<'EOF'
{"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": true,
 "text_config": {"model_type": "qwen3_5_text", "vocab_size": 11349, "hidden_size": 256, "num_hidden_layers": 4,
  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "attn_output_gate": true,
  "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
  "linear_conv_kernel_dim": 4, "intermediate_size": 768, "hidden_act": "silu", "rms_norm_eps": 1e-6,
  "max_position_embeddings": 4096, "tie_word_embeddings": true, "bos_token_id": 11348, "eos_token_id": 11348,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}}
EOF
models=(gpt2)
for m in gated_deltanet kda kimi_linear qwen3_5; do
  if [ ! -f "$work/$m/model.safetensors" ]; then
    echo "training $m ($steps steps)" >&2
    $bin train --config "$work/$m.json" --tokenizer "$tok" --data "$work/train.bin" --out "$work/$m" --seed 1 \
      --threads 2 --batch 8 --seq-len 128 --steps "$steps" --warmup 30 --lr 2e-3 --min-lr 2e-4 --weight-decay 0.1 \
      --grad-clip 1.0 --val-fraction 0.02 --eval-every "$steps" --save-dtype bf16 --log-every 100 >/dev/null
  fi
  models+=("$m")
done
rm -rf "$work/gpt2" && cp -r models/kjv-gpt2 "$work/gpt2"

row() {  # model label dir [perplexity flags]
  local model=$1 label=$2 dir=$3
  shift 3
  local p size tg
  p=$($bin perplexity --model "$dir" --data "$work/eval.txt" --ctx 128 --chunks 60 --kld-base "$work/$model.base.npy" --json "$@")
  size=$(du -cb "$dir"/model*.safetensors | tail -1 | cut -f1)
  tg=$($bin bench --model "$dir" --prompt 0 --gen 64 --repetitions 3 --json "$@" |
       python3 -c 'import json,sys; r=[x for x in json.load(sys.stdin) if x.get("test","").startswith("tg")]; print("%.0f" % r[0]["tokens_per_s"] if r else "?")')
  python3 - "$model" "$label" "$size" "$tg" "$p" <<'EOF'
import json, sys
model, label, size, tg, p = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
k = p.get("kld", {})
print(f"| {model} | {label} | {size / 2**20:.1f} MiB | {p['ppl']:.2f} | {k.get('mean', 0):.2e} | "
      f"{k.get('p99', 0):.2e} | {100 * k.get('top1', 1):.1f} % | {tg} |")
EOF
}

printf '| model | mean KLD | KLD p99 | same top-1 |\n|---|---|---|---|\n' >"$work/mxfp4_dot.md"
echo "| model | weights | size | PPL | mean KLD | KLD p99 | same top-1 | decode tok/s |"
echo "|---|---|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  dir="$work/$m"
  # GPT-2's width (320) takes groups of 64; the others groups of 128.
  g=128
  [ "$m" = gpt2 ] && g=64
  $bin perplexity --model "$dir" --data "$work/eval.txt" --ctx 128 --chunks 60 --bf16-exact \
    --save-logits "$work/$m.base.npy" --json >/dev/null
  row "$m" "bf16 (--bf16-exact)" "$dir" --bf16-exact
  row "$m" "bf16 (bf16 dot products)" "$dir"
  for s in "W8A16 g$g|--scheme W8A16 --group $g" "W4A16 g$g|--scheme W4A16 --group $g" \
           "W4A16_ASYM g$g|--scheme W4A16_ASYM --group $g" "W4A16 per channel|--scheme W4A16 --group 0" \
           "FP8_BLOCK|--scheme FP8_BLOCK" "MXFP4|--scheme MXFP4" "NVFP4|--scheme NVFP4"; do
    label=${s%%|*}
    out="$work/$m-${label// /_}"
    rm -rf "$out"
    # shellcheck disable=SC2086
    $bin quantize "$dir" "$out" ${s#*|} >"$out.log" 2>&1
    row "$m" "$label" "$out" --bf16-exact
    # MXFP4 in the bf16 dot mode (the default where the CPU has AVX512_BF16): against the base, and
    # against the exact products of the same file (mxfp4_dot.md beside the table).
    if [ "$label" = MXFP4 ]; then
      row "$m" "$label, bf16 dot products" "$out"
      $bin perplexity --model "$out" --data "$work/eval.txt" --ctx 128 --chunks 60 --bf16-exact \
        --save-logits "$work/$m.mxfp4-exact.npy" --json >/dev/null
      $bin perplexity --model "$out" --data "$work/eval.txt" --ctx 128 --chunks 60 \
        --kld-base "$work/$m.mxfp4-exact.npy" --json |
        python3 -c 'import json,sys; k=json.load(sys.stdin)["kld"]; print("| %s | %.2e | %.2e | %.1f %% |" % (sys.argv[1], k["mean"], k["p99"], 100 * k["top1"]))' "$m" \
        >>"$work/mxfp4_dot.md"
    fi
    # The int8-activation mode where it runs (int4 groups of 128, int8 groups of 64 or more; AVX512_VNNI).
    case "$label" in
      "W8A16 g"* | "W4A16 g128") row "$m" "$label, --int8-dot" "$out" --bf16-exact --int8-dot ;;
    esac
  done
done
