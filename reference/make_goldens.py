"""Writes the golden data the C++ tests compare against: DIR/<family>/<case>/ is an HF model directory
and DIR/<family>/<case>/golden/ holds tokens, float64-reference intermediates and manifest.json.
Run with the system interpreter (it has torch): /usr/bin/python3 reference/make_goldens.py --out DIR
A family is a module (or object) exposing CASES (objects with .name) and build_case(case, case_dir) -> summary;
delta_family_goldens contributes one family per model type (linear_attn, delta_net, gated_deltanet, kda);
kimi_linear_goldens the family kimi_linear, kimi_k3_goldens the family kimi_k3, qwen_goldens the families
qwen3_next, qwen3_5 and qwen3_5_moe, adamw_goldens the family adamw (torch.optim.AdamW's own steps), quant_goldens
the family quant (compressed-tensors / HF fp8 quantized Qwen3-Next checkpoints, goldens on the dequantized weights).
After a case named in grad_goldens.GRAD_CASES (a list per family) is written, grad_goldens.build_grad adds
DIR/<family>/<case>/grad/: parameter gradients of a next-token loss from torch autograd."""

import argparse
import os
import shutil
import sys
import time
import traceback

import torch

import delta_family_goldens
import gpt2_goldens
import grad_goldens
import kimi_k3_goldens
import kimi_linear_goldens
import qwen_goldens
import adamw_goldens
import quant_goldens

FAMILIES = [
    ("gpt2", gpt2_goldens),
    *delta_family_goldens.FAMILIES,
    ("kimi_linear", kimi_linear_goldens),
    ("kimi_k3", kimi_k3_goldens),
    *qwen_goldens.FAMILIES,
    *adamw_goldens.FAMILIES,
    ("quant", quant_goldens),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--only", action="append", choices=[name for name, _ in FAMILIES],
                        help="build only this family (repeatable)")
    parser.add_argument("--except", dest="skip", action="append", default=[], choices=[name for name, _ in FAMILIES],
                        help="build every family but this one (repeatable)")
    args = parser.parse_args()
    # One thread keeps float reductions in a fixed order, so re-runs are bit-identical.
    torch.set_num_threads(1)
    start = time.perf_counter()
    for family, module in FAMILIES:  # a renamed case must not silently drop its family's gradients
        for grad_case in grad_goldens.GRAD_CASES.get(family, []):
            if grad_case.case not in [case.name for case in module.CASES]:
                print(f"FAILED {family}: grad_goldens.GRAD_CASES names no case {grad_case.case!r}", file=sys.stderr)
                return 1
    for family, module in FAMILIES:
        if (args.only and family not in args.only) or family in args.skip:
            continue
        for case in module.CASES:
            case_dir = os.path.join(args.out, family, case.name)
            shutil.rmtree(case_dir, ignore_errors=True)
            t0 = time.perf_counter()
            grad_case = grad_goldens.find_grad_case(family, case.name)
            try:
                summary = module.build_case(case, case_dir)
                print(f"{family}/{case.name}: {summary} [{time.perf_counter() - t0:.2f}s]")
                if grad_case:
                    t0 = time.perf_counter()
                    summary = grad_goldens.build_grad(family, case_dir, grad_case)
                    print(f"{family}/{case.name}/{grad_goldens.GRAD_DIR}: {summary} [{time.perf_counter() - t0:.2f}s]")
            except Exception as e:
                traceback.print_exc()
                print(f"FAILED {family}/{case.name}: {e}", file=sys.stderr)
                return 1
    print(f"done in {time.perf_counter() - start:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
