"""
Speed of the --toy training step (pretrain.py's preset: 8 layers, d 64, 4 heads, FFN 256, 64 streams x 16 tokens
at random position offsets, 15 % targets, dropout 0.1) as a fraction of the same core's 256^3 fp32 matmul rate
measured in the same process, so that the figure holds across machines and load. Run by hand (not collected by
pytest):

    python tests/bench_toy_step.py                  # 5 rounds of 50 steps, one thread
    python tests/bench_toy_step.py --profile 20     # + a torch.profiler table of 20 steps
    python tests/bench_toy_step.py --compile        # the model under torch.compile (pretrain.py --compile)
    python tests/bench_toy_step.py --dropout 0      # without dropout (the preset's is 0.1), eager or compiled
    git show COMMIT:model.py > /tmp/old_model.py    # an older model.py, then this one's speed-up over it:
    python tests/bench_toy_step.py --against /tmp/old_model.py

One step is what pretrain.py does per update on the CPU: mask_tokens and the targets' positions, forward with
targets, backward, gradient clipping, Adam (pretrain.build_adam: fused), zero_grad. Model FLOPs per step: 6 x the
non-embedding parameters per token (forward + backward) plus 6 x d x V per target position for the tied softmax.
Each round times `--steps` steps and then 256^3 matmuls for about as long; the fraction is (step FLOP/s) / (matmul
FLOP/s) of the same round, and the median over rounds is printed (process CPU time, so waiting for a core on a
shared machine does not count; wall time beside it).

--against FILE alternates blocks of 5 steps of this model.py's model and FILE's (another version of model.py, the
same seeds) in one process and prints the median ratio of their CPU times: the two see the same load, so a change
of a few per cent can be measured on a busy machine.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import MLM, ModelConfig  # noqa: E402
from pretrain import TOY, build_adam, mask_tokens  # noqa: E402


def matmul_rate(n=256, seconds=0.5):
    """FLOP/s of an n x n fp32 matmul (per CPU second, per wall second), repeated for about `seconds`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(5):
        a @ b
    reps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.process_time() - c0 < seconds:
        for _ in range(20):
            a @ b
        reps += 20
    return 2 * n ** 3 * reps / (time.process_time() - c0), 2 * n ** 3 * reps / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=2800, help="vocabulary size (the toy world's joint BPE: ~2,800)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds (step timing + matmul timing each)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="then profile N steps (torch.profiler)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (its compile time is not timed)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout and attention dropout (the preset's: 0.1)")
    p.add_argument("--against", metavar="FILE", help="another model.py: then its speed-up in paired blocks of 5 steps")
    p.add_argument("--pairs", type=int, default=40, help="paired blocks with --against")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    B, T, offsets = TOY["batch_size"], TOY["bptt"], TOY["pos_offsets"]
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(14, args.vocab, (1000, B, T), generator=gen)
    n_targets = []

    def make_step(mlm, model_config):  # one toy update of a model built by (MLM, ModelConfig) of some model.py
        torch.manual_seed(0)
        config = model_config(vocab_size=args.vocab, n_layers=TOY["n_layers"], dim=TOY["dim"], n_heads=TOY["n_heads"],
                              ffn_dim=TOY["ffn_dim"], max_positions=512, dropout=args.dropout,
                              attention_dropout=args.dropout)
        model = mlm(config).train()
        forward = torch.compile(model) if args.compile else model
        params = list(model.parameters())
        opt = build_adam(params, 1e-3, "cpu")  # pretrain.py's optimizer
        return model, lambda i: step(i, forward, params, opt)

    def step(i, forward, params, opt):
        inputs, targets = mask_tokens(data[i % len(data)], args.vocab, gen)
        where = (targets.view(-1) != -1).nonzero().squeeze(1)
        offset = torch.randint(offsets - T + 1, (B,), generator=gen)
        _, loss = forward(inputs, 0, targets, pos_offset=offset, target_index=where)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        n_targets.append(int((targets != -1).sum()))
        return float(loss.detach())

    model, this = make_step(MLM, ModelConfig)
    if args.against:
        spec = importlib.util.spec_from_file_location("model_against", args.against)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        _, that = make_step(other.MLM, other.ModelConfig)
        for i in range(10):
            this(i), that(i)
        ratios = []
        for k in range(args.pairs):  # alternate which goes first
            times = {}
            for name, f in ((("this", this), ("that", that)) if k % 2 else (("that", that), ("this", this))):
                c0 = time.process_time()
                for i in range(5):
                    f(i)
                times[name] = time.process_time() - c0
            ratios.append(times["that"] / times["this"])
        q = statistics.quantiles(ratios, n=4)
        print(f"speed-up over {args.against}: median {statistics.median(ratios):.3f}x "
              f"(quartiles {q[0]:.3f}-{q[2]:.3f}) over {args.pairs} paired blocks of 5 steps, "
              f"load average {os.getloadavg()[0]:.2f}")
        return
    for i in range(10):  # warm-up: Adam state, allocator, and with --compile the compiles (two: shapes then dynamic)
        this(i)
    d, V = model.config.dim, model.config.vocab_size
    non_emb = sum(p.numel() for n, p in model.named_parameters() if "emb" not in n and "pred_bias" not in n)
    fractions, rates, walls = [], [], []
    for r in range(args.rounds):
        n_targets.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(args.steps):
            this(i)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        flops = args.steps * 6 * non_emb * B * T + 6 * d * V * sum(n_targets)
        mm_cpu, mm_wall = matmul_rate(seconds=min(cpu, 2.0))
        fractions.append(flops / cpu / mm_cpu)
        rates.append(mm_cpu)
        walls.append(B * T * args.steps / wall)
        print(f"round {r}: {1e3 * cpu / args.steps:.1f} ms/step CPU ({B * T * args.steps / cpu:,.0f} tok/s), "
              f"{flops / cpu / 1e9:.1f} GFLOP/s; 256^3 matmul {mm_cpu / 1e9:.1f} GFLOP/s -> fraction "
              f"{fractions[-1]:.3f}; wall {walls[-1]:,.0f} tok/s", flush=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {'compiled' if args.compile else 'eager'}, dropout "
          f"{args.dropout}, load average {os.getloadavg()[0]:.2f}; "
          f"{non_emb:,} non-embedding parameters, {6 * non_emb / 1e6:.2f} MFLOP/token + softmax; "
          f"median over {args.rounds} rounds: fraction of the 256^3 matmul rate {statistics.median(fractions):.3f} "
          f"(matmul {statistics.median(rates) / 1e9:.1f} GFLOP/s per CPU second)")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(args.profile):
                this(i)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
