#!/usr/bin/env python3
"""Decode time of Kimi K3 under tensor parallelism over P ranks, from the model in
docs/distributed.md ("K3 over N nodes"):

    t(P) = (B_w / P + r) / BW  +  F  +  C * (a + b * (P - 1))

B_w: weight bytes a token streams; r: bytes every rank reads whole; BW: one rank's achieved read
bandwidth; F: per-rank work that does not shrink with P; C: gathers per token; a, b: a gather's
fixed and per-peer latency. The calibration (B_w, BW, F, a, b) is the published libxsmm cluster's
(Xeon 8592+, one rank per socket, NDR; ../shared/design/scale-out.md section 4.3): with its own
C = 581 and r = 0.2 GB the model gives its measured 57.0 ms at 16 ranks and 47.6 ms at 32 (the check).
lineage's C comes from its own gather count per layer kind (measured with LINEAGE_TP_MIN_BYTES=0 on
the tiny K3 checkpoint, counted for K3's 93 layers), and r from `lineage info --ranks`.

    scripts/tp-model.py            # the table in docs/distributed.md
"""
import math

B_W = 137.6e9      # bytes streamed per token (bf16 trunk + MXFP4 experts)
BW = 307e9         # achieved bytes/s per rank (socket)
F = 23.3e-3        # s per token that no rank count shrinks (AttnRes, norms, router, KDA recurrence)
A, B = 1.3e-6, 0.49e-6  # a gather's latency: fixed, per peer

# K3 (its published config): 93 layers, 24 MLA and 69 KDA; layer 0 a dense MLP, 92 latent MoE of
# 16 routed experts a token.
KDA, MLA, DENSE, MOE, K = 69, 24, 1, 92, 16


def lineage_gathers(moe_per_layer, kda=4, mla=6):
    # per decoded token: KDA 4 (the projections' group, f_b, the heads' outputs of the recurrence,
    # o_proj; 3 before the heads were split by rank), MLA 6 (q_a, q_b, kv_a, gate, the heads'
    # context, o_proj; 5 before the heads were split; the per-head absorbed products are under 1 MiB
    # and run whole), the dense MLP 2 (gate + up, down), each MoE layer `moe_per_layer` (the router,
    # the latent down and up projections, the shared expert's 2, and the routed experts' 2, or 2
    # each), the head 1.
    return KDA * kda + MLA * mla + DENSE * 2 + MOE * moe_per_layer + 1


# KDA's recurrent state a sequence: 69 layers of 96 heads' 128 x 128 f32 matrices (434 MB), read and
# written each token. The calibration's F has it split by heads (libxsmm splits them); a design that
# runs every head on every rank reads and writes all of it on each: (1 - 1/P) of it more than F holds.
KDA_STATE = 69 * 96 * 128 * 128 * 4


def t(P, C, r, heads_split=True):
    replicated = 0.0 if heads_split else 2 * KDA_STATE * (1 - 1 / P) / BW
    return (B_W / P + r) / BW + F + replicated + C * (A + B * (P - 1))


# What every rank holds whole (`lineage info --model ../shared/data/kimi-k3 --ranks 16`): 2.22 GiB,
# the embedding table in bf16 and the norms, convolutions and small matrices.
EMBED = 2.22 * 2**30
rows = [
    ("libxsmm/kimi-k3-in-c (published)", 581, 0.2e9, True),
    ("lineage, each routed expert gathered on its own (first version)", lineage_gathers(5 + 2 * K, 3, 5), EMBED, False),
    ("lineage, the routed experts in two gathers", lineage_gathers(5 + 2, 3, 5), EMBED, False),
    ("lineage, and the KDA and MLA heads split by rank (now)", lineage_gathers(5 + 2), EMBED, True),
]
print("| design | gathers per token | 8 | 16 | 32 | 64 | best P |")
print("|---|---|---|---|---|---|---|")
for name, C, r, split in rows:
    cells = " | ".join(f"{1e3 * t(P, C, r, split):.1f} ms" for P in (8, 16, 32, 64))
    Pb = min(range(2, 129), key=lambda P: t(P, C, r, split))
    print(f"| {name} | {C} | {cells} | {Pb} ({1e3 * t(Pb, C, r, split):.1f} ms) |")
