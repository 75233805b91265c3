"""
Speed of pretrain.py's training step at the paper's size on one GPU: tokens/s, MFU, peak memory and the split of a
step into forward, backward and optimizer, eager and with torch.compile, under bf16 autocast (issue 24 item 3).
Run by hand on a CUDA machine (the suite runs it on the CPU at a tiny size, tests/test_pretrain.py):

    python tests/bench_gpu.py                          # paper config: 8 x 768, 96 streams x 256, vocab 80k
    python tests/bench_gpu.py --modes eager --steps 20
    python tests/bench_gpu.py --tiny --device cpu      # what the test runs
    python tests/bench_gpu.py --modes eager --vocab 80014,80000 --vocab-align 1,64   # odd vocabulary, padded or not

The step is pretrain.py's: MLM on streams with 15 % of positions predicted (pretrain.mask_tokens, target
positions computed on the host as pretrain.next_micro_batch does), Adam (fused on CUDA), clipping at 5.
Tokens/s is timed over --steps steps with no sync inside them; the split is timed apart, with a sync after
each phase (so its sum is a little above the step time). FLOPs: matmuls only, 3 x forward, counted by
tests/bench_model.py's step_flops (a local count, not a project-wide FLOPs function). MFU is achieved FLOP/s over
the card's dense bf16 peak (a table of data-sheet values by device name; --peak-tflops overrides it); on the CPU over
the rate of a large fp32 matmul measured in the same run.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_model import matmul_flops_per_s, rss_mib, step_flops  # noqa: E402
from bpe import number  # noqa: E402
import model as model_module  # noqa: E402 (its VOCAB_ALIGN, which --vocab-align sets)
from model import MLM, ModelConfig, autocast  # noqa: E402
from pretrain import ADAM, mask_tokens  # noqa: E402

# dense bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets (no sparsity), by a substring of the name
PEAK_BF16_TFLOPS = [("H200", 989), ("H100 NVL", 835), ("H100 PCIe", 756), ("H100", 989), ("A100", 312),
                    ("L40S", 362), ("L4", 121), ("A10", 125), ("RTX 4090", 165), ("RTX 3090", 71)]


def peak_flops(device, override=None, tiny=False):
    """(FLOP/s to measure MFU against, what it is)."""
    if override:
        return override * 1e12, f"--peak-tflops {override}"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        for key, tflops in PEAK_BF16_TFLOPS:
            if key in name:
                return tflops * 1e12, f"{name} dense bf16 peak {tflops} TFLOP/s"
        raise SystemExit(f"error: no bf16 peak known for {name}; pass --peak-tflops")
    wall, _ = matmul_flops_per_s(512 if tiny else 2048, reps=3)
    return wall, f"this CPU's fp32 matmul rate {wall / 1e9:.1f} GFLOP/s"


def batches(n, B, T, V, device, seed=0):
    """n pinned host batches (inputs, targets, target positions) as pretrain.py feeds them."""
    g, out = torch.Generator().manual_seed(seed), []
    for _ in range(n):
        x = torch.randint(14, V, (B, T), generator=g)
        inputs, targets = mask_tokens(x, V, g)
        where = (targets.view(-1) != -1).nonzero().squeeze(1)
        out.append([t.pin_memory() if device.startswith("cuda") else t for t in (inputs, targets, where)])
    return out


def bench(mode, args, device, dtype, V):
    """One mode ("eager" or "compile") at vocabulary V: -> dict of the measured numbers."""
    cuda = device.startswith("cuda")
    torch.manual_seed(0)
    size = dict(n_layers=2, dim=32, n_heads=2, ffn_dim=64) if args.tiny else {}
    model = MLM(ModelConfig(vocab_size=V, **size)).to(device).train()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-4, fused=True if cuda else None, **ADAM)
    fwd = torch.compile(model) if mode == "compile" else model
    ctx = autocast(device, dtype)
    data = batches(4, args.batch_size, args.bptt, V, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def phases(k):  # forward, backward, optimizer of step k; returns the loss tensor
        inputs, targets, where = (t.to(device, non_blocking=True) for t in data[k % len(data)])
        with ctx:
            loss = fwd(inputs, 0, targets, target_index=where)[1]
        yield loss
        loss.backward()
        yield loss
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield loss

    def step(k):
        for loss in phases(k):
            pass
        return loss

    t0 = time.perf_counter()
    for k in range(args.warmup_steps):  # compilation, cuDNN/cuBLAS autotuning, allocator warm-up
        step(k)
    sync()
    compile_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for k in range(args.steps):
        loss = step(k)
    sync()
    step_s = (time.perf_counter() - t0) / args.steps
    split = {"forward": [], "backward": [], "optimizer": []}
    for k in range(min(args.steps, 5)):
        sync()
        t = time.perf_counter()
        for name, _ in zip(split, phases(k)):
            sync()
            split[name].append(time.perf_counter() - t)
            t = time.perf_counter()
    n_projected = statistics.mean(len(d[2]) for d in data)
    flops = step_flops(V, model.config.dim, model.config.ffn_dim, model.config.n_layers, args.batch_size,
                       args.bptt, n_projected)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else rss_mib("VmHWM") / 1024
    return {"mode": mode, "step_s": step_s, "tok_s": args.batch_size * args.bptt / step_s, "flop_s": flops / step_s,
            "memory_gib": memory, "warmup_s": compile_s, "loss": float(loss.detach()),
            "split": {k: statistics.median(v) for k, v in split.items()}}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cuda, cuda:N, cpu")
    p.add_argument("--modes", default=None, help="eager,compile (default on CUDA; on the CPU: eager)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer d=32 model (the suite's CPU run)")
    p.add_argument("--batch-size", type=int, default=96, help="streams per step (paper: 96 per GPU)")
    p.add_argument("--bptt", type=int, default=256)
    p.add_argument("--vocab", type=number(1, many=True), default=[80000], help="vocabulary, or several comma-separated (paper: 80k joint BPE "
                   "merges, which leave a vocabulary of about 80,014)")
    p.add_argument("--vocab-align", type=number(1, many=True), default=None, help="pad the vocabulary to a multiple of N on CUDA "
                   "(model.VOCAB_ALIGN, default its value; 1 = off), or several comma-separated")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--threads", type=int, help="CPU threads for torch (default torch's)")
    p.add_argument("--peak-tflops", type=float, help="the card's dense bf16 peak, if not in the table")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    device = "cuda:0" if device == "cuda" else device
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    modes = (args.modes or ("eager,compile" if device.startswith("cuda") else "eager")).split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    peak, what = peak_flops(device, args.peak_tflops, args.tiny)
    print(f"device {device}, dtype {dtype}, {args.batch_size} x {args.bptt} tokens per step"
          f"{', tiny model' if args.tiny else ', paper model 8 x 768'}; MFU against {what}")
    cuda, default_align = device.startswith("cuda"), model_module.VOCAB_ALIGN
    aligns = (args.vocab_align or [default_align]) if cuda else [1]  # model.project pads on CUDA only
    for mode, V, align in [(m, v, a) for m in modes for v in args.vocab for a in aligns]:
        model_module.VOCAB_ALIGN = align
        try:
            r = bench(mode, args, device, dtype, V)
        finally:
            model_module.VOCAB_ALIGN = default_align
        s = r["split"]
        print(f"{mode:8s} V {V} align {align if cuda else 'off (CPU)'} {r['tok_s']:,.0f} tok/s{' per GPU' if cuda else ''}"
              f" | step {r['step_s'] * 1e3:.1f} ms | MFU "
              f"{100 * r['flop_s'] / peak:.1f} % | peak memory {r['memory_gib']:.2f} GiB | split forward "
              f"{s['forward'] * 1e3:.1f} / backward {s['backward'] * 1e3:.1f} / optimizer {s['optimizer'] * 1e3:.1f} "
              f"ms | warm-up {r['warmup_s']:.1f} s | loss {r['loss']:.3f}")


if __name__ == "__main__":
    main()
