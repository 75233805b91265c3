# attn.py -- python attn.py CKPT PREPARED_DIR: per layer, the best left / right neighbour head's share of attention
import json, os, sys
import numpy as np, torch
import model as M

rec = []
def sdpa(q, k, v, attn_mask=None, dropout_p=0.0):   # eval mode: no mask, no dropout
    att = (q @ k.transpose(-1, -2) * q.size(-1) ** -0.5).softmax(-1)   # (B, heads, T, T)
    rec.append(att)
    return att @ v
M.F.scaled_dot_product_attention = sdpa

ckpt, prep = sys.argv[1], sys.argv[2]                # e.g. $T/pt/default-s5/best.pt $T/pt/default-s5/data/joint-*
model, _ = M.load_model(ckpt)
ids = np.memmap(os.path.join(prep, "en.dev.bin"), mode="r",
                dtype=json.load(open(os.path.join(prep, "en.dev.json")))["dtype"])
x = torch.from_numpy(np.array(ids[:16 * 256], dtype=np.int64)).view(256, 16)   # 256 dev streams of 16 tokens
off = torch.randint(0, 33, (256,), generator=torch.Generator().manual_seed(0))  # offsets as in training
with torch.no_grad():
    model.hidden_states(x, 0, pos_offset=off)
for i, a in enumerate(rec, 1):
    ent = -(a.clamp_min(1e-12).log() * a).sum(-1).mean().item()
    left = torch.diagonal(a, offset=-1, dim1=-2, dim2=-1).mean(-1).mean(0).max().item()
    right = torch.diagonal(a, offset=1, dim1=-2, dim2=-1).mean(-1).mean(0).max().item()
    print(f"L{i} entropy {ent:.2f} left {left:.2f} right {right:.2f}")
