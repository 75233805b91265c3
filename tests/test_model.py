"""
Tests for model.py: sharing switches, parameter counts, tied softmax, attention, XLM loading, checkpoints.
Run: python -m pytest -q tests/test_model.py   (tiny configs; one paper-size model for the §7 count)
"""
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from model import MLM, ModelConfig, load_model, parse_sep, project, save_model

torch.set_num_threads(1)

TINY = dict(vocab_size=37, n_layers=3, n_heads=2, dim=16, ffn_dim=24, max_positions=20)


def tiny(**kw):
    torch.manual_seed(0)
    return MLM(ModelConfig(**{**TINY, **kw}))


def batch(B=3, T=9, V=37, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g)


def block_params(d, f):
    # paper formula per layer: 4d² + 2df + 9d + f
    return 4 * d * d + 2 * d * f + 9 * d + f


def n_params(m):
    # every parameter once: the tied softmax weight is the token table
    return sum(p.numel() for p in m.parameters())

# -----------------------------------------------------------------------------
# --sep parsing and config checks


@pytest.mark.parametrize("spec, expected", [  # (tok, pos, layers)
    ("", (False, False, ())),
    ("emb", (True, True, ())),
    ("1-3", (False, False, (1, 2, 3))),
    ("emb,1-3", (True, True, (1, 2, 3))),
    ("1-6", (False, False, (1, 2, 3, 4, 5, 6))),
    ("2, 5,emb", (True, True, (2, 5))),
    ("8", (False, False, (8,))),
    ("1-3,2-4", (False, False, (1, 2, 3, 4))),
    ("tok", (True, False, ())),
    ("pos,1-3", (False, True, (1, 2, 3))),
    ("tok,pos", (True, True, ())),
])
def test_parse_sep(spec, expected):
    tok, pos, layers = expected
    assert parse_sep(spec) == {"sep_emb": tok and pos, "sep_tok": tok, "sep_pos": pos, "sep_layers": layers}


@pytest.mark.parametrize("spec", ["0", "9", "0-3", "3-1", "1-9", "embs", "layers", "1-", "-2", "1--3", "1-2-3",
                                  "emb;1", "x1", "tokens", "position"])
def test_parse_sep_rejects_bad_specs(spec):
    with pytest.raises(ValueError):
        parse_sep(spec)


def test_parse_sep_respects_n_layers():
    assert parse_sep("1-12", n_layers=12)["sep_layers"] == tuple(range(1, 13))
    with pytest.raises(ValueError):
        parse_sep("4", n_layers=3)


@pytest.mark.parametrize("kw", [dict(sep_layers=(4,)), dict(sep_layers=(0,)), dict(n_heads=5),
                                dict(vocab_sizes=(37,)), dict(vocab_sizes=(37, 30))])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        ModelConfig(**{**TINY, **kw})


def test_config_defaults_are_the_paper_values():
    c = ModelConfig(vocab_size=100)
    assert (c.n_layers, c.n_heads, c.dim, c.ffn_dim, c.max_positions) == (8, 12, 768, 3072, 512)
    assert (c.dropout, c.attention_dropout, c.lang_emb, c.sep_emb, c.sep_layers) == (0.1, 0.1, False, False, ())

# -----------------------------------------------------------------------------
# parameter counts and sharing


def test_param_count_paper_config():
    """Paper §3.1 sizes: 8 layers = 56,702,976; + positions 393,216 + emb LN 1,536 + V·d + V."""
    V = 100
    m = MLM(ModelConfig(vocab_size=V))
    assert 8 * block_params(768, 3072) == 56_702_976
    assert n_params(m) == 56_702_976 + 393_216 + 1_536 + V * 768 + V
    assert sum(p.numel() for p in m.blocks[0].parameters()) == 7_087_872


@pytest.mark.parametrize("lang_emb", [False, True])
def test_param_count_shared_formula(lang_emb):
    V, P, d, f, L = 37, 20, 16, 24, 3
    m = tiny(lang_emb=lang_emb)
    expected = V * d + P * d + 2 * d + V + L * block_params(d, f) + (2 * d if lang_emb else 0)
    assert n_params(m) == expected
    assert m.lang_specific_parameters(0) == [] and not m.has_lang_specific()


def test_param_count_sep_layers_adds_whole_blocks():
    d, f = 16, 24
    for n_langs in (2, 3):
        shared = n_params(tiny(n_langs=n_langs))
        sep = tiny(n_langs=n_langs, sep_layers=(1, 2, 3))
        assert n_params(sep) - shared == 3 * (n_langs - 1) * block_params(d, f)
        assert sum(p.numel() for p in sep.lang_specific_parameters(1)) == 3 * block_params(d, f)


def test_param_count_sep_emb_adds_table_positions_bias():
    V, P, d = 37, 20, 16
    shared = n_params(tiny())
    assert n_params(tiny(sep_emb=True)) - shared == V * d + P * d + V
    # per-language vocabularies: language l adds V_l·d + P·d + V_l
    sizes = (37, 25, 11)
    m = tiny(n_langs=3, sep_emb=True, vocab_sizes=sizes)
    assert n_params(m) - n_params(tiny(n_langs=3)) == sum(v * d + P * d + v for v in sizes[1:])
    assert [m.tok_emb[l].weight.shape[0] for l in range(3)] == list(sizes)


def test_sep_tok_and_sep_pos_are_the_two_halves_of_sep_emb():
    """--sep tok: own token table + softmax bias, shared positions; --sep pos: own positions only."""
    P, d = 20, 16
    shared = n_params(tiny())
    tok, pos = tiny(sep_tok=True, vocab_sizes=(37, 30)), tiny(sep_pos=True)
    assert n_params(tok) - shared == 30 * d + 30 and (len(tok.tok_emb), len(tok.pos_emb)) == (2, 1)
    assert n_params(pos) - shared == P * d and (len(pos.tok_emb), len(pos.pos_emb)) == (1, 2)
    assert tiny(sep_tok=True, sep_pos=True).config.sep_emb and tiny(sep_emb=True).config.sep_tok
    assert [p.shape for p in pos.lang_specific_parameters(1)] == [(P, d)]
    assert [p.shape for p in tok.lang_specific_parameters(1)] == [(30, d), (30,)]
    # the halves change what a language computes: language 1 reads its own position table
    x = batch(V=30)
    with torch.no_grad():
        pos.pos_emb[1].weight.add_(1.0)
    pos.eval()
    assert not torch.allclose(pos(x, 0)[0], pos(x, 1)[0])


def test_pos_offset_shifts_the_positions_of_each_row():
    """pos_offset[b] = k: row b reads position rows k .. k+T-1 (pretrain.py --pos-offsets)."""
    m = tiny().eval()
    x = batch(B=2, T=5)
    with torch.no_grad():
        base = m.hidden_states(x, 0)
        same = m.hidden_states(x, 0, pos_offset=torch.zeros(2, dtype=torch.long))
        shifted = m.hidden_states(x, 0, pos_offset=torch.tensor([0, 3]))
        m.pos_emb[0].weight[:5] = m.pos_emb[0].weight[3:8].clone()   # row 1's positions, moved to 0..4
        moved = m.hidden_states(x, 0)
    for a, b, c, d in zip(base, same, shifted, moved):
        assert torch.equal(a, b) and torch.equal(c[0], a[0])
        assert torch.allclose(c[1], d[1], atol=1e-6) and not torch.allclose(c[1], a[1])


def test_target_index_gives_the_boolean_selections_result_bit_for_bit():
    """MLM.forward's target_index (pretrain.py computes it on the host) and its own index equal the boolean mask
    selection x[targets != -1] it replaced: logits, loss and every gradient, bit for bit."""
    torch.manual_seed(0)
    m = MLM(ModelConfig(vocab_size=50, n_layers=2, n_heads=2, dim=16, ffn_dim=32, max_positions=16, dropout=0.0,
                        attention_dropout=0.0))
    x = torch.randint(14, 50, (3, 10))
    y = torch.where(torch.rand(3, 10) < 0.3, x, torch.full_like(x, -1))
    h = m.hidden_states(x, 0)[-1]
    ref = F.cross_entropy(F.linear(h[y != -1], m.tok_emb[0].weight, m.pred_bias[0]).float(), y[y != -1])
    ref.backward()
    want = [p.grad.clone() for p in m.parameters()]
    for index in (None, (y.view(-1) != -1).nonzero().squeeze(1)):
        m.zero_grad()
        _, loss = m(x, 0, y, target_index=index)
        loss.backward()
        assert torch.equal(loss, ref) and all(torch.equal(p.grad, g) for p, g in zip(m.parameters(), want))


def test_padded_output_projection_gives_the_same_logits_and_gradients():
    """model.project pads the vocabulary to a multiple of `align` (on CUDA, VOCAB_ALIGN) and slices the extra
    logits off: the V logits and every gradient equal the unpadded F.linear's, the pad rows get no gradient. On the
    CPU (align None) it pads nothing: the result is F.linear's bit for bit."""
    torch.manual_seed(0)
    V, d = 203, 16                                   # 203 = 3 x 64 + 11: 53 pad rows at align 64
    x = torch.randn(7, d, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, d, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, dtype=torch.float64, requires_grad=True)
    y = torch.randint(V, (7,))
    results = []
    for align in (1, 64, None):
        logits = project(x, W, b, align)
        F.cross_entropy(logits, y).backward()
        results.append((logits.detach(), x.grad, W.grad, b.grad))
        x.grad = W.grad = b.grad = None
    (l1, *g1), (l64, *g64), (lcpu, *gcpu) = results
    assert l64.shape == (7, V) and torch.allclose(l64, l1, rtol=0, atol=1e-12)
    assert all(torch.allclose(a, c, rtol=0, atol=1e-12) for a, c in zip(g64, g1))
    assert torch.equal(lcpu, F.linear(x, W, b).detach()) and all(torch.equal(a, c) for a, c in zip(gcpu, g1))
    assert not torch.equal(project(x, W, b, 64).detach(), project(x, W, b + 1, 64).detach())  # the bias is used


def test_output_weight_is_the_token_embedding():
    """Tied softmax: no separate output matrix; logits = h·Eᵀ + b with E the token table itself."""
    for kw in (dict(), dict(sep_emb=True, vocab_sizes=(37, 30))):
        m = tiny(**kw).eval()
        names = [n for n, _ in m.named_parameters()]
        assert not any("proj" in n or "head" in n for n in names)
        for lang in (0, 1):
            x = batch(V=30)
            logits, _ = m(x, lang)
            E = m.tok_emb[lang if kw else 0].weight
            ref = m.hidden_states(x, lang)[-1] @ E.t() + m.pred_bias[lang if kw else 0]
            torch.testing.assert_close(logits, ref)
    # a softmax-only loss gives gradient to embedding rows that are not in the input
    m = tiny()
    x = torch.full((1, 4), 7)
    targets = torch.tensor([[-1, 11, -1, -1]])
    m(x, 0, targets)[1].backward()
    assert m.tok_emb[0].weight.grad[11].abs().sum() > 0


def test_pad_row_starts_at_zero_and_init_scale():
    m = MLM(ModelConfig(vocab_size=3000, dim=256, n_heads=4, ffn_dim=64, n_layers=1, lang_emb=True))
    E = m.tok_emb[0].weight
    assert E[2].abs().sum() == 0
    for W in (E[3:], m.pos_emb[0].weight):
        assert abs(W.std().item() - 256 ** -0.5) < 0.05 * 256 ** -0.5


def test_lang_specific_params_get_no_gradient_from_other_language():
    m = tiny(sep_emb=True, sep_layers=(1, 2), vocab_sizes=(37, 29))
    assert m.has_lang_specific()
    x = batch(V=29)
    targets = torch.where(torch.rand(x.shape, generator=torch.Generator().manual_seed(3)) < 0.3, x, -1)
    targets[0, 0] = x[0, 0]
    for lang, other in ((0, 1), (1, 0)):
        m.zero_grad(set_to_none=True)
        m(x, lang, targets)[1].backward()
        mine = {id(p) for p in m.lang_specific_parameters(lang)}
        theirs = {id(p) for p in m.lang_specific_parameters(other)}
        assert mine.isdisjoint(theirs) and len(mine) > 0
        for p in m.parameters():
            if id(p) in theirs:
                assert p.grad is None
            else:   # own and shared parameters all learn (the pad row aside)
                assert p.grad is not None and p.grad.abs().sum() > 0
    # language 1's copies really are separate modules: same input, different output
    m.eval()
    h0, h1 = m.hidden_states(x, 0)[1], m.hidden_states(x, 1)[1]
    assert not torch.allclose(h0, h1)


def test_lang_emb_changes_the_output_of_a_shared_model():
    m = tiny(lang_emb=True).eval()
    x = batch()
    assert not torch.allclose(m(x, 0)[0], m(x, 1)[0])
    with pytest.raises(ValueError):
        m(x, 2)

# -----------------------------------------------------------------------------
# forward: attention, masked-position logits, hidden states, padding


def reference_attention(q, k, v, key_mask):
    """softmax(QKᵀ/√d_k + mask) V written out; q, k, v (B, nh, T, hs), key_mask (B, T) True = real."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1) @ v


def test_sdpa_attention_equals_reference():
    m = tiny().eval()
    attn = m.blocks[0][0].attn
    B, T, C, nh = 3, 7, 16, 2
    x = torch.randn(B, T, C)
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[1, 5:] = False
    key_mask[2, 2:] = False
    q, k, v = attn.qkv(x).split(C, dim=2)
    heads = lambda t: t.view(B, T, nh, C // nh).transpose(1, 2)
    y = reference_attention(heads(q), heads(k), heads(v), key_mask).transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(attn(x, key_mask.view(B, 1, 1, T)), attn.out(y), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attn(x), attn.out(reference_attention(heads(q), heads(k), heads(v),
                                                                    torch.ones(B, T, dtype=torch.bool))
                                                 .transpose(1, 2).reshape(B, T, C)), atol=1e-6, rtol=1e-5)


def test_dropout_only_in_training():
    m = tiny(dropout=0.0, attention_dropout=0.5)
    x = batch()
    m.eval()
    torch.testing.assert_close(m(x, 0)[0], m(x, 0)[0])
    m.train()
    torch.manual_seed(1)
    a = m(x, 0)[0]
    torch.manual_seed(2)
    assert not torch.allclose(a, m(x, 0)[0])


def test_cpu_dropout_is_bernoulli_with_inverted_scaling():
    """model.dropout (the CPU masks from 16-bit integers): kept elements scaled by 1/(1-p), the kept fraction 1-p
    in each of the four 16-bit lanes of a 64-bit draw, the gradient the same mask, x's dtype and shape kept (odd
    sizes too); the identity in eval mode or with p = 0; torch's global generator decides."""
    from model import dropout
    x = torch.ones(400_000, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    kept = y != 0
    for lane in range(4):  # a draw with a constant top bit would keep every element of one lane
        assert abs(kept[lane::4].float().mean().item() - 0.9) < 0.004, lane
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1).detach(), y.detach())
    assert dropout(x, 0.1, training=False) is x and torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # F.dropout's answer for p = 1
    assert abs((dropout(torch.ones(400_000), 0.5) == 0).float().mean().item() - 0.5) < 0.003
    odd = dropout(torch.ones(3, 5, 7, dtype=torch.bfloat16), 0.5)
    assert odd.shape == (3, 5, 7) and odd.dtype == torch.bfloat16 and set(odd.unique().tolist()) <= {0.0, 2.0}
    for p in (1e-4, 0.009):  # a p that 16 bits would round by more than 0.1 %: F.dropout itself
        torch.manual_seed(4)
        small = dropout(torch.ones(1000), p)
        torch.manual_seed(4)
        assert torch.equal(small, torch.nn.functional.dropout(torch.ones(1000), p))


def test_training_attention_written_out_equals_sdpa_without_its_dropout(monkeypatch):
    """Training on the CPU without a key mask, SelfAttention computes softmax(q k^T / sqrt(hs)) v itself (to draw
    its dropout mask with model.dropout): with that dropout made the identity it equals the eval path (SDPA)."""
    import model
    m = tiny(dropout=0.0, attention_dropout=0.3)
    attn = m.blocks[0][0].attn
    x = torch.randn(3, 7, 16)
    expected = attn.eval()(x)
    calls = []
    monkeypatch.setattr(model, "dropout", lambda t, p, training=True: calls.append((tuple(t.shape), p)) or t)
    torch.testing.assert_close(attn.train()(x), expected, atol=1e-6, rtol=1e-5)
    assert calls == [((3 * 2, 7, 7), 0.3)]


def test_masked_logits_equal_full_logits_at_targets():
    m = tiny().eval()
    x = batch()
    targets = torch.full_like(x, -1)
    where = [(0, 1), (0, 8), (1, 4), (2, 0), (2, 5)]
    for b, t in where:
        targets[b, t] = x[b, t]
    full, none = m(x, 0)
    assert none is None and full.shape == (3, 9, 37)
    logits, loss = m(x, 0, targets)
    assert logits.shape == (len(where), 37)
    torch.testing.assert_close(logits, torch.stack([full[b, t] for b, t in where]))
    torch.testing.assert_close(loss, F.cross_entropy(full.view(-1, 37), targets.view(-1), ignore_index=-1))
    # no target at all: zero loss that still backpropagates
    logits, loss = m(x, 0, torch.full_like(x, -1))
    assert logits.shape == (0, 37) and loss.item() == 0.0
    loss.backward()


def test_hidden_states_layers():
    m = tiny().eval()
    x = batch()
    hs = m.hidden_states(x, 0)
    assert len(hs) == 4 and all(h.shape == (3, 9, 16) for h in hs)
    emb = m.tok_emb[0](x) + m.pos_emb[0].weight[:9]
    torch.testing.assert_close(hs[0], F.layer_norm(emb, (16,), m.ln_emb.weight, m.ln_emb.bias, 1e-12))
    torch.testing.assert_close(hs[-1] @ m.tok_emb[0].weight.t() + m.pred_bias[0], m(x, 0)[0])


def test_padding_does_not_change_real_positions():
    m = tiny().eval()
    x = batch(B=2, T=9)
    short = x[1:, :5]
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    padded = x.clone()
    padded[1, 5:] = 2
    hs_pad = m.hidden_states(padded, 0, mask)
    hs_short = m.hidden_states(short, 0)
    for a, b in zip(hs_pad, hs_short):
        torch.testing.assert_close(a[1:, :5], b, atol=1e-5, rtol=1e-5)
        assert a[1, 5:].abs().sum() == 0
    torch.testing.assert_close(hs_pad[-1][0], m.hidden_states(x[:1], 0)[-1][0], atol=1e-5, rtol=1e-5)

# -----------------------------------------------------------------------------
# loading facebookresearch/XLM weights


def xlm_state_dict(V, P, d, f, n_layers, n_langs, seed=0):
    """Random tensors under XLM's TransformerModel key names (pred_layer.proj.weight tied)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3
    sd = {"position_embeddings.weight": r(P, d), "lang_embeddings.weight": r(n_langs, d),
          "embeddings.weight": r(V, d), "layer_norm_emb.weight": 1 + r(d), "layer_norm_emb.bias": r(d)}
    for i in range(n_layers):
        for n in ("q", "k", "v", "out"):
            sd[f"attentions.{i}.{n}_lin.weight"], sd[f"attentions.{i}.{n}_lin.bias"] = r(d, d), r(d)
        sd[f"layer_norm1.{i}.weight"], sd[f"layer_norm1.{i}.bias"] = 1 + r(d), r(d)
        sd[f"ffns.{i}.lin1.weight"], sd[f"ffns.{i}.lin1.bias"] = r(f, d), r(f)
        sd[f"ffns.{i}.lin2.weight"], sd[f"ffns.{i}.lin2.bias"] = r(d, f), r(d)
        sd[f"layer_norm2.{i}.weight"], sd[f"layer_norm2.{i}.bias"] = 1 + r(d), r(d)
    sd["pred_layer.proj.weight"] = sd["embeddings.weight"]
    sd["pred_layer.proj.bias"] = r(V)
    return sd


def xlm_forward(sd, x, lengths, langs, n_layers, n_heads):
    """
    An independent re-statement of XLM's TransformerModel.fwd + PredLayer in XLM's own layout:
    x (slen, bs) ids, lengths (bs,), langs (slen, bs); returns scores (slen, bs, V). Eval mode.
    """
    slen, bs = x.size()
    w = lambda name: sd[name]
    ln = lambda t, p: F.layer_norm(t, t.shape[-1:], w(p + ".weight"), w(p + ".bias"), eps=1e-12)
    lin = lambda t, p: t @ w(p + ".weight").t() + w(p + ".bias")
    gelu = lambda t: 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0)))
    mask = torch.arange(slen)[None, :] < lengths[:, None]                       # (bs, slen)
    x, langs = x.t(), langs.t()                                                 # (bs, slen)
    positions = torch.arange(slen)[None, :].expand(bs, slen)
    tensor = w("embeddings.weight")[x] + w("position_embeddings.weight")[positions]
    tensor = tensor + w("lang_embeddings.weight")[langs]
    tensor = ln(tensor, "layer_norm_emb") * mask.unsqueeze(-1).float()
    dim = tensor.size(-1)
    dh = dim // n_heads
    for i in range(n_layers):
        shape = lambda t: t.view(bs, -1, n_heads, dh).transpose(1, 2)           # (bs, nh, slen, dh)
        q = shape(lin(tensor, f"attentions.{i}.q_lin")) / math.sqrt(dh)
        k = shape(lin(tensor, f"attentions.{i}.k_lin"))
        v = shape(lin(tensor, f"attentions.{i}.v_lin"))
        scores = q @ k.transpose(2, 3)
        scores = scores.masked_fill((mask == 0).view(bs, 1, 1, slen), -float("inf"))
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        context = (weights @ v).transpose(1, 2).contiguous().view(bs, -1, dim)
        tensor = ln(tensor + lin(context, f"attentions.{i}.out_lin"), f"layer_norm1.{i}")
        ffn = lin(gelu(lin(tensor, f"ffns.{i}.lin1")), f"ffns.{i}.lin2")
        tensor = ln(tensor + ffn, f"layer_norm2.{i}") * mask.unsqueeze(-1).float()
    tensor = tensor.transpose(0, 1)                                             # (slen, bs, dim)
    return tensor @ w("pred_layer.proj.weight").t() + w("pred_layer.proj.bias")


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_from_xlm_matches_xlm_forward(prefix):
    V, P, d, f, n_layers, n_heads = 41, 16, 24, 40, 2, 3
    sd = xlm_state_dict(V, P, d, f, n_layers, n_langs=2)
    config = ModelConfig(vocab_size=V, max_positions=P, dim=d, ffn_dim=f, n_layers=n_layers,
                         n_heads=n_heads, lang_emb=True)
    m = MLM.from_xlm({prefix + k: v for k, v in sd.items()}, config).eval()
    slen, bs, lang = 11, 3, 1
    x = torch.randint(0, V, (slen, bs), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([11, 7, 4])
    ref = xlm_forward(sd, x, lengths, torch.full((slen, bs), lang), n_layers, n_heads)
    mask = (torch.arange(slen)[None, :] < lengths[:, None])                    # (bs, slen)
    ours, _ = m(x.t(), lang, attn_mask=mask)                                   # (bs, slen, V)
    for b in range(bs):
        n = lengths[b]
        torch.testing.assert_close(ours[b, :n], ref[:n, b], atol=1e-5, rtol=1e-5)


def test_from_xlm_reports_missing_and_unknown_keys():
    sd = xlm_state_dict(41, 16, 24, 40, 2, 2)
    config = ModelConfig(vocab_size=41, max_positions=16, dim=24, ffn_dim=40, n_layers=2, n_heads=3,
                         lang_emb=True)
    bad = dict(sd)
    del bad["ffns.1.lin2.bias"], bad["attentions.0.k_lin.weight"]
    bad["memories.0.keys"] = torch.zeros(1)
    with pytest.raises(KeyError) as e:
        MLM.from_xlm(bad, config)
    assert "ffns.1.lin2.bias" in str(e.value) and "attentions.0.k_lin.weight" in str(e.value)
    assert "memories.0.keys" in str(e.value)
    with pytest.raises(KeyError, match="lang_embeddings"):   # config without language embeddings
        MLM.from_xlm(sd, ModelConfig(**{**config.__dict__, "lang_emb": False}))
    with pytest.raises(ValueError, match="shapes"):
        MLM.from_xlm(sd, ModelConfig(**{**config.__dict__, "vocab_size": 40}))

def test_from_xlm_names_the_tensor_whose_shape_does_not_fit(tmp_path):
    """Issue 48: a weight of the wrong shape was a torch.cat traceback (q, k, v of one layer that do
    not fit together) or torch's many-line size mismatch; now one line naming the key and shapes."""
    sd = xlm_state_dict(41, 16, 24, 40, 2, 2)
    config = ModelConfig(vocab_size=41, max_positions=16, dim=24, ffn_dim=40, n_layers=2, n_heads=3,
                         lang_emb=True)
    for key, shape in (("attentions.1.k_lin.weight", (24, 25)), ("ffns.0.lin1.weight", (40, 23))):
        bad = {**sd, key: torch.zeros(shape)}
        want = (shape[0], 24) if key.startswith("ffns") else (24, 24)
        with pytest.raises(ValueError, match=rf"^from_xlm: shapes do not match the config: "
                           rf"{re.escape(key)} is {re.escape(str(shape))}, the config's "
                           rf"{re.escape(str(want))}$"):
            MLM.from_xlm(bad, config)
    # through load_model, a released XLM checkpoint: one InputError line naming the file
    params = {"emb_dim": 24, "n_layers": 2, "n_heads": 3, "n_langs": 2, "id2lang": {0: "en", 1: "fr"}}
    words = ["<s>", "</s>", "<pad>", "<unk>"] + [f"<special{i}>" for i in range(10)]
    words += [f"w{i}" for i in range(41 - len(words))]
    # XLM's checkpoints have an FFN of 4 x emb_dim
    bad = {**xlm_state_dict(41, 16, 24, 96, 2, 2), "attentions.1.k_lin.weight": torch.zeros(24, 25)}
    torch.save({"model": bad, "params": params, "dico_word2id": {w: i for i, w in enumerate(words)}},
               tmp_path / "x.pth")
    with pytest.raises(ValueError, match=r"x\.pth: from_xlm: shapes do not match the config: "
                       r"attentions\.1\.k_lin\.weight is \(24, 25\)") as e:
        load_model(str(tmp_path / "x.pth"))
    assert "\n" not in str(e.value)

# -----------------------------------------------------------------------------
# checkpoints


def test_save_load_round_trip(tmp_path):
    m = tiny(n_langs=3, sep_emb=True, sep_layers=(1, 3), vocab_sizes=(37, 30, 20), lang_emb=True).eval()
    path = tmp_path / "best.pt"
    extra = dict(tokenizer={"mode": "separate", "merges": [["a", "b"]]}, langs=["en", "fr", "ru"], step=7)
    save_model(path, m, **extra)
    assert sorted(os.listdir(tmp_path)) == ["best.pt"]
    # plain types only: the raw file loads under weights_only=True
    raw = torch.load(path, weights_only=True)
    assert raw["config"]["sep_layers"] == [1, 3]
    m2, extra2 = load_model(path)
    assert m2.config == m.config and m2.config.sep_layers == (1, 3) and m2.config.vocab_sizes == (37, 30, 20)
    assert extra2 == extra and not m2.training
    x = batch(V=20)
    for lang in range(3):
        torch.testing.assert_close(m2(x, lang)[0], m(x, lang)[0])


def test_load_model_rejects_other_files(tmp_path):
    torch.save({"weights": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a model checkpoint"):
        load_model(tmp_path / "x.pt")


def _damage(path, kind, tmp_path):
    """Write one kind of wrong file at `path` (next to a good checkpoint in tmp_path/good.pt)."""
    good = (tmp_path / "good.pt").read_bytes()
    if kind == "truncated":
        path.write_bytes(good[:len(good) // 2])
    elif kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "plain tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "dict without model/config":
        torch.save({"state_dict": {}}, path)
    elif kind == "wrong weights":
        raw = torch.load(tmp_path / "good.pt", weights_only=True)
        raw["model"].pop("ln_emb.weight")
        torch.save(raw, path)
    elif kind == "wrong shapes":
        raw = torch.load(tmp_path / "good.pt", weights_only=True)
        raw["config"]["dim"] = 8
        raw["config"]["n_heads"] = 2
        torch.save(raw, path)
    elif kind == "bad config":
        raw = torch.load(tmp_path / "good.pt", weights_only=True)
        raw["config"]["n_layerz"] = raw["config"].pop("n_layers")
        torch.save(raw, path)
    elif kind == "NaN weight":
        raw = torch.load(tmp_path / "good.pt", weights_only=True)
        raw["model"]["blocks.1.0.ffn.lin1.weight"][0, 0] = float("nan")
        torch.save(raw, path)
    elif kind == "inf weight":
        raw = torch.load(tmp_path / "good.pt", weights_only=True)
        raw["model"]["tok_emb.0.weight"][3, 1] = float("inf")
        torch.save(raw, path)


DAMAGED = {"truncated": "cannot read .*truncated or damaged", "zero bytes": "empty file",
           "random bytes": "cannot read", "text": "cannot read", "plain tensor": "not a model checkpoint .*Tensor",
           "dict without model/config": "not a model checkpoint .*state_dict", "wrong weights": "1 missing",
           "wrong shapes": "do not match", "bad config": "bad model config", "NaN weight": "blocks.1.0.ffn.lin1.weight",
           "inf weight": "tok_emb.0.weight' contains NaN or inf", "missing": "no such file",
           "directory": "is a directory"}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_load_model_damaged_files_give_one_line_naming_the_file(tmp_path, kind):
    save_model(tmp_path / "good.pt", tiny())
    path = tmp_path / "bad.pt"
    if kind == "directory":
        path.mkdir()
    elif kind != "missing":
        _damage(path, kind, tmp_path)
    with pytest.raises(ValueError, match=DAMAGED[kind]) as e:
        load_model(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_load_model_reads_pretrain_checkpoint_pt(tiny_ckpt):
    """pretrain.py's resumable checkpoint.pt also holds model + config: it loads like best.pt."""
    m, extra = load_model(tiny_ckpt.parent / "checkpoint.pt")
    m2, _ = load_model(tiny_ckpt)
    assert m.config == m2.config and "optimizer" in extra and "tokenizer" in extra


def test_save_model_leaves_no_temp_file_on_failure(tmp_path, monkeypatch):
    def full_disk(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        save_model(tmp_path / "best.pt", tiny())
    assert os.listdir(tmp_path) == []


def test_training_step_compiles_as_one_graph():
    """Under torch.compile the training forward (CPU dropout masks, written-out attention, targets given by
    position as pretrain.py gives them) is one graph: an in-place random_ in model.dropout broke it at every
    mask, which made --compile slower than eager on the CPU."""
    torch._dynamo.reset()
    m = tiny().train()
    idx = batch(2, 6)
    targets = torch.full((2, 6), -1)
    targets[:, 2] = idx[:, 2]
    where = (targets.view(-1) != -1).nonzero().squeeze(1)
    report = torch._dynamo.explain(m)(idx, 0, targets, target_index=where)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


def test_stall_note_reads_the_checkpoints_count_models():
    """Issue 48: load_model's extra of a pretrain.py checkpoint says whether its MLM stalled (the
    English dev ppl above the left-bigram count model); older files keep them as count_ppl; an XLM
    checkpoint or a bare save_model file has neither, and gets no note."""
    from model import stall_note
    counts = {"en": {"unigram": 150.0, "left": 20.0, "both": 12.0}}
    stalled = {"dev_ppl": {"en": 31.25, "fr": 40.0}, "count_models": counts, "count_ppl": counts}
    assert stall_note("run/best.pt", stalled) == (
        "note: run/best.pt: its MLM stalled (en dev ppl 31.25 above the left-bigram count model's "
        "20.0); its scores measure an unconverged model")
    older = {"dev_ppl": {"en": 31.25}, "count_ppl": counts}
    assert stall_note("old.pt", older).startswith("note: old.pt: its MLM stalled")
    assert stall_note("ok.pt", {"dev_ppl": {"en": 9.0}, "count_models": counts}) is None
    assert stall_note("xlm.pth", {"langs": ["en", "fr"], "xlm_vocab": []}) is None
    assert stall_note("bare.pt", {"langs": ["en"], "dev_ppl": {"en": 99.0}}) is None
