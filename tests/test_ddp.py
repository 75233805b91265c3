"""Data parallelism (issue: the paper's run is `torchrun --nproc_per_node 8 pretrain.py --sep emb,1-3`):
1. one update is the same however its micro-batches are split between ranks and --accumulate, with --sep's
   private parameters (their gradients are absent on a rank whose micro-batches were all the other language);
2. the design card's command shape on 8 CPU ranks (gloo): the ranks agree on the weights, and --resume is exact."""
import os
import socket
import subprocess
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import pretrain
from model import MLM, ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# four micro-batches of 2 streams x 8 tokens, their languages as a sampler might draw them: en, fr, en, en
LANGS = (0, 1, 0, 0)


def micro_batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for lang in LANGS:
        x = torch.randint(14, 40, (2, 8), generator=g)
        inputs, targets = pretrain.mask_tokens(x, 40, g, at_least_one=True)
        out.append((lang, (inputs, targets, (targets.view(-1) != -1).nonzero().squeeze(1), None)))
    return out


def one_update(batches, accumulate, rank=0, world_size=1):
    """One pretrain.update() of a tiny --sep emb,1-3 model (no dropout: the same masks in every split) on the given
    micro-batches of this rank. SGD instead of Adam: the step is then the averaged, clipped gradient itself (Adam's
    first step is lr x sign(g), which turns float noise in a gradient near 0 into a whole step). -> (loss, grad
    norm, the parameters after the update)."""
    torch.manual_seed(0)
    m = MLM(ModelConfig(vocab_size=40, n_layers=4, n_heads=2, dim=16, ffn_dim=32, max_positions=16, sep_emb=True,
                        sep_layers=(1, 2, 3), dropout=0.0, attention_dropout=0.0))
    run = pretrain.Run(args=SimpleNamespace(accumulate=accumulate, batch_size=2, bptt=8, pos_offsets=0, clip=1.0),
                       langs=["en", "fr"], rank=rank, world_size=world_size, ddp=world_size > 1,
                       stop=SimpleNamespace(signum=None), raw_model=m, model=m, params=list(m.parameters()),
                       optimizer=torch.optim.SGD(m.parameters(), lr=0.5), amp=nullcontext(),
                       scaler=torch.amp.GradScaler("cpu", enabled=False))
    if run.ddp:
        run.model = run.ddp_model = DDP(m)
    queue = list(batches) + [batches[-1]]  # update() draws one micro-batch ahead
    run.next_batch = queue.pop(0)
    real, pretrain.next_micro_batch = pretrain.next_micro_batch, lambda run, update: queue.pop(0)
    try:
        loss, norm, seen, _, stepped, _ = pretrain.update(run)
    finally:
        pretrain.next_micro_batch = real
    assert stepped and seen == [lang for lang, _ in batches]
    return loss, norm, {k: v.detach().clone() for k, v in m.state_dict().items()}


def _rank(rank, world_size, port, out):
    """one_update with --accumulate 2, then 1, rank r taking micro-batches r x accumulate ... (r + 1) x accumulate - 1
    of micro_batches(); rank 0 saves both results."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    results = [one_update(micro_batches()[rank * a:(rank + 1) * a], a, rank, world_size) for a in (2, 1)]
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def two_ranks(tmp_path):
    """_rank on 2 gloo processes -> [2 ranks x --accumulate 2, 2 ranks x 1]."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "two_ranks.pt")
    mp.spawn(_rank, args=(2, port, out), nprocs=2)
    return torch.load(out, weights_only=False)


def same(a, b):
    (loss_a, norm_a, pa), (loss_b, norm_b, pb) = a, b
    assert loss_a == pytest.approx(loss_b, rel=1e-6) and norm_a == pytest.approx(norm_b, rel=1e-5)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6, msg=k)


def test_one_update_however_it_is_split(tmp_path):
    """The same micro-batches give the same update as 2 ranks x 1 micro-batch and 1 rank x --accumulate 2, and as
    2 ranks x --accumulate 2 and 1 x 4 -- fr's private parameters included, which only rank 0's micro-batches (en,
    fr) reach in the 2 x 2 split (rank 1 draws en, en). It is not trivially so: the update moves every parameter
    group, and rank 0's micro-batch alone (no gradient all-reduce) fails the comparison."""
    batches, (two_by_two, two_by_one) = micro_batches(), two_ranks(tmp_path)
    whole = one_update(batches, accumulate=4)
    same(two_by_two, whole)
    same(two_by_one, one_update(batches[:2], accumulate=2))
    torch.manual_seed(0)
    init = MLM(ModelConfig(vocab_size=40, n_layers=4, n_heads=2, dim=16, ffn_dim=32, max_positions=16, sep_emb=True,
                           sep_layers=(1, 2, 3), dropout=0.0, attention_dropout=0.0)).state_dict()
    moved = {k for k in init if not torch.equal(init[k], whole[2][k])}
    assert {"tok_emb.0.weight", "tok_emb.1.weight", "blocks.0.1.attn.qkv.weight", "blocks.3.0.attn.qkv.weight"} <= moved
    wrong = one_update(batches[:1], accumulate=1)  # rank 0's micro-batch alone: the update without DDP's all-reduce
    with pytest.raises(AssertionError):
        same(two_by_one, wrong)


TINY8 = ["--toy", "--sep", "emb,1-3", "--n-layers", "4", "--dim", "32", "--n-heads", "2",
         "--ffn-dim", "64", "--bptt", "32", "--batch-size", "8", "--merges", "500", "--threads", "1"]


def torchrun8(args, out):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "8",
           os.path.join(ROOT, "pretrain.py")] + TINY8 + [str(a) for a in args] + ["--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_eight_ranks_agree_and_resume_exactly(toy_world, tmp_path):
    """The paper's command shape on 8 CPU processes: every rank ends with the same weights (pretrain.py compares
    them and says so), and a run stopped at update 2 and resumed to 4 under 8 ranks ends bit for bit where a
    straight 4-update run does (weights, Adam, every rank's RNG states)."""
    data = ["--data", str(toy_world), "--prep-dir", str(tmp_path / "prep")]
    text = torchrun8(data + ["--max-steps", 4], tmp_path / "straight")
    assert "8 processes" in text and "ranks agree: the 8 processes hold the same weights" in text
    torchrun8(data + ["--max-steps", 2], tmp_path / "resumed")
    torchrun8(data + ["--max-steps", 4, "--resume"], tmp_path / "resumed")
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False) for d in ("straight", "resumed"))
    assert a["step"] == b["step"] == 4 and len(a["rng"]) == 8
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert repr(a["rng"]) == repr(b["rng"])
