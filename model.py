"""The masked language model of "Emerging Cross-lingual Structure in Pretrained Language Models"
(Conneau et al., ACL 2020): XLM's Transformer encoder (Lample & Conneau 2019) with the paper's
parameter-sharing switches (§4.3, Figure 1, Table 1 "Parameter sharing").

- post-LN blocks exactly as facebookresearch/XLM `model/transformer.py`: learned positions,
  embedding LayerNorm, erf GELU, LayerNorm eps 1e-12, no final LayerNorm, output projection tied
  to the token embedding with its own bias, no BERT transform head;
- `sep_emb`: every language has its own token table, position table and (tied) softmax;
  `sep_layers=(1, 2, 3)`: its own copy of layers 1-3; everything else is shared. Beyond the
  paper, either half of `sep_emb` alone (Dufter & Schütze 2020): `sep_tok`, `sep_pos`.

Only torch is imported, so this file can be copied alone:

    from model import ModelConfig, MLM, parse_sep
    model = MLM(ModelConfig(vocab_size=30000, **parse_sep("emb,1-3")))
    logits, loss = model(idx, lang=0, targets=targets)  # idx (B, T) int64, targets -1 = ignore
    layers = model.hidden_states(idx, lang=1)            # n_layers + 1 tensors (B, T, dim)
    hs, mask = encode_batch(model, [[1, 20, 21, 1], [1, 22, 1]], lang=0)  # a padded batch

Then §5.1.2's AlignedEncoder; below the `# ====` line the plumbing and two commands: `python
model.py export CKPT OUT_DIR` (for transformers), `python model.py curve RUN_DIR` (curve.png)."""

import hashlib
import json
import os
import re
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-12  # XLM model/transformer.py (BERT's value)
VOCAB_ALIGN = 64  # on CUDA the output projection pads the vocabulary to a multiple of this
# XLM's fixed special ids (<s> 0, </s> 1, <pad> 2, <unk> 3): bpe.py's, copied (copy alone)
EOS_ID = 1
PAD_ID = 2


class InputError(ValueError):
    """bpe.InputError's twin (model.py copies alone): a bad input, one line; code 2 = a flag's."""
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


@dataclass
class ModelConfig:
    vocab_size: int                  # token table size (from the tokenizer); sep_tok: vocab_sizes
    n_langs: int = 2                 # paper §3.1: bilingual models (langs[0] = English)
    n_layers: int = 8                # paper §3.1
    n_heads: int = 12                # paper §3.1 (head dim 64)
    dim: int = 768                   # paper §3.1
    ffn_dim: int = 3072              # paper §3.1 (XLM hard-codes 4 * dim)
    dropout: float = 0.1             # paper §3.1
    attention_dropout: float = 0.1   # paper §3.1, as XLM's recipes (its flag's default: 0)
    max_positions: int = 512         # paper §3.1: learned positions, XLM N_MAX_POSITIONS
    lang_emb: bool = False           # paper §3.1 is silent; off as mBERT and XLM-17/100
    sep_emb: bool = False            # paper §4.3: own token + position tables and softmax
    sep_layers: tuple = ()           # paper §4.3: own copies of these layers (1-based)
    vocab_sizes: tuple = ()          # sep_tok: a vocabulary size per language; () = vocab_size
    sep_tok: bool = False            # half of sep_emb: own token table and tied softmax only
    sep_pos: bool = False            # the other half: own position table only
    pad_id: int = 2                  # XLM's <pad>: its row starts at zero, gets no lookup grad

    def __post_init__(self):
        # lists come back from a checkpoint (plain types); keep tuples so configs compare equal
        self.sep_layers = tuple(map(int, self.sep_layers))
        self.vocab_sizes = tuple(map(int, self.vocab_sizes))
        # sep_emb (the paper's switch) is both halves; both halves are sep_emb
        self.sep_tok = self.sep_tok or self.sep_emb
        self.sep_pos = self.sep_pos or self.sep_emb
        self.sep_emb = bool(self.sep_tok and self.sep_pos)
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        bad = [i for i in self.sep_layers if not 1 <= i <= self.n_layers]
        if bad:
            raise ValueError(f"sep_layers {bad} outside 1..{self.n_layers}")
        if self.vocab_sizes and len(self.vocab_sizes) != self.n_langs:
            raise ValueError(f"vocab_sizes has {len(self.vocab_sizes)} entries for "
                             f"{self.n_langs} languages")
        if self.vocab_sizes and not self.sep_tok and set(self.vocab_sizes) != {self.vocab_size}:
            raise ValueError(f"vocab_sizes {self.vocab_sizes} differ from vocab_size "
                             f"{self.vocab_size} but token tables are shared (sep_tok=False)")


def parse_sep(spec, n_layers=8):
    """--sep: the language-specific parts (paper §4.3, Table 1) as ModelConfig keywords (or a
    usage InputError). "" -> all shared; "emb" -> token + position tables and softmax; "1-3" ->
    layers 1, 2, 3 (the paper's numbering); "tok" / "pos" -> the halves of "emb"."""
    parts = [p.strip() for p in spec.split(",")]
    tok = "emb" in parts or "tok" in parts
    pos = "emb" in parts or "pos" in parts
    layers = set()
    for part in parts:
        if part in ("", "emb", "tok", "pos"):
            continue
        if not re.fullmatch(r"\d+(\s*-\s*\d+)?", part):  # "N" or "N-M"
            raise InputError(f"bad --sep part {part!r} in {spec!r}: expected 'emb', 'tok', 'pos', "
                             "'N' or 'N-M'", 2)
        lo, _, hi = part.partition("-")
        lo, hi = int(lo), int(hi or lo)
        if lo > hi:
            raise InputError(f"bad --sep range {part!r}: start > end", 2)
        layers.update(range(lo, hi + 1))
    bad = sorted(i for i in layers if not 1 <= i <= n_layers)
    if bad:
        raise InputError(f"bad --sep {spec!r}: layers {bad} outside 1..{n_layers} "
                         "(paper numbering)", 2)
    return {"sep_emb": tok and pos, "sep_tok": tok, "sep_pos": pos,
            "sep_layers": tuple(sorted(layers))}

# -----------------------------------------------------------------------------
# the encoder, bottom-up

def dropout(x, p, training=True):
    """F.dropout(x, p, training); on the CPU 5x faster: the keep mask is four 16-bit integers per
    64-bit draw of torch's generator against p rounded to 2^-16 (0.1 -> 0.1000061)."""
    # compiled: the in-place random_ below would break the graph
    if (not training or p < 0.01 or p >= 1.0 or x.device.type != "cpu"
            or torch.compiler.is_compiling()):
        return F.dropout(x, p, training)
    n = x.numel()
    # every 64-bit value equally likely
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-2 ** 63, None)
    keep = bits.view(torch.int16)[:n].view(x.shape) >= round(p * 2 ** 16) - 2 ** 15
    # one pass, in x's dtype
    return x * torch.where(keep, x.new_full((), 1.0 / (1.0 - p)), x.new_zeros(()))


class SelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.attention_dropout = config.attention_dropout
        # XLM has separate q_lin, k_lin, v_lin; one fused (dim, 3*dim) matmul computes the same
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.out = nn.Linear(config.dim, config.dim)

    def forward(self, x, mask=None):
        B, T, C = x.size()
        nh = self.n_heads
        hs = C // nh
        p = self.attention_dropout if self.training else 0.0
        # (B, nh, T, hs) each
        q, k, v = self.qkv(x).view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)
        if p and mask is None and x.device.type == "cpu":
            # training on the CPU: written out; scaled_dot_product_attention with dropout falls
            # back there to its slow unfused path (bernoulli_ masks, copies of q, k, v)
            q, k, v = (t.reshape(B * nh, T, hs) for t in (q, k, v))
            att = torch.bmm(q, k.transpose(1, 2)).mul_(hs ** -0.5).softmax(-1)  # (B * nh, T, T)
            y = torch.bmm(dropout(att, p), v).view(B, nh, T, hs)
        else:
            # softmax(q k^T / sqrt(hs)) v; mask (B, 1, 1, T): True at real keys (XLM: -inf else)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FFN(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.lin1 = nn.Linear(config.dim, config.ffn_dim)
        self.lin2 = nn.Linear(config.ffn_dim, config.dim)

    def forward(self, x):
        # XLM: no dropout between the activation and lin2; GELU is the exact erf form
        return self.lin2(F.gelu(self.lin1(x)))


class Block(nn.Module):
    """One post-LN layer: x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x))). attn_mask (B, T),
    True at real tokens: padded keys get no attention, padded positions are zeroed (XLM)."""

    def __init__(self, config):
        super().__init__()
        self.attn = SelfAttention(config)
        self.ln1 = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.ffn = FFN(config)
        self.ln2 = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.p = config.dropout  # after attention and after the FFN

    def forward(self, x, attn_mask=None):
        # mask (B, 1, 1, T): over heads and queries
        mask = None if attn_mask is None else attn_mask[:, None, None]
        x = self.ln1(x + dropout(self.attn(x, mask), self.p, self.training))
        x = self.ln2(x + dropout(self.ffn(x), self.p, self.training))
        return x if attn_mask is None else x * attn_mask.unsqueeze(-1).to(x.dtype)


def project(x, W, b, align=None):
    """Logits x W^T + b, W and b padded with zero rows to a multiple of `align` (CUDA: VOCAB_ALIGN;
    a V no multiple of 8 misses cuBLAS's best kernels: H200 42.5 ms at V 59,579, 36.6 at 59,584)."""
    V = W.size(0)
    if align is None:
        align = VOCAB_ALIGN if x.is_cuda else 1
    pad = -V % align
    if not pad:
        return F.linear(x, W, b)
    return F.linear(x, F.pad(W, (0, 0, 0, pad)), F.pad(b, (0, pad)))[..., :V]


def _pick(copies, lang):
    """Language `lang`'s copy of a part (a list by language), or its one shared copy."""
    return copies[lang] if len(copies) > 1 else copies[0]


class MLM(nn.Module):
    """Sharing layout: each part that can be language-specific is a list by language, one entry
    when shared, n_langs when not: tok_emb[l] and pred_bias[l] (sep_tok), pos_emb[l] (sep_pos),
    blocks[i][l] (layer i+1, sep_layers), e.g. `blocks.0.1.attn.qkv.weight` (layer 1, language 1).
    A batch of language A never uses B's parameters (`lang_specific_parameters`, for DDP)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        d, L = config.dim, config.n_langs
        n_tok = L if config.sep_tok else 1
        n_pos = L if config.sep_pos else 1
        vocab = config.vocab_sizes or (config.vocab_size,) * n_tok
        # paper §4.3: separate embeddings = own token table, positions, tied softmax (and bias)
        self.tok_emb = nn.ModuleList(
            nn.Embedding(vocab[l], d, padding_idx=config.pad_id) for l in range(n_tok))
        self.pos_emb = nn.ModuleList(nn.Embedding(config.max_positions, d) for _ in range(n_pos))
        self.lang_emb = nn.Embedding(L, d) if config.lang_emb else None
        self.ln_emb = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.blocks = nn.ModuleList(
            nn.ModuleList(Block(config) for _ in range(L if i + 1 in config.sep_layers else 1))
            for i in range(config.n_layers))
        # the output weight IS tok_emb[l].weight (Press & Wolf tying, XLM share_inout_emb); the
        # bias is its own, initialised as XLM's nn.Linear(dim, n_words) bias: U(-1/√d, 1/√d)
        self.pred_bias = nn.ParameterList(
            nn.Parameter(torch.empty(vocab[l]).uniform_(-d ** -0.5, d ** -0.5))
            for l in range(n_tok))
        # XLM init: embeddings N(0, d^-0.5), pad row zero; Linear and LayerNorm keep PyTorch's
        for emb in self.modules():
            if isinstance(emb, nn.Embedding):
                nn.init.normal_(emb.weight, std=d ** -0.5)
        for emb in self.tok_emb:
            nn.init.zeros_(emb.weight[config.pad_id])

    def has_lang_specific(self):
        c = self.config
        return c.sep_tok or c.sep_pos or bool(c.sep_layers)

    def lang_specific_parameters(self, lang):
        """Parameters only language `lang` uses (empty for a fully shared model)."""
        params = []
        if self.config.sep_tok:
            params += [self.tok_emb[lang].weight, self.pred_bias[lang]]
        if self.config.sep_pos:
            params.append(self.pos_emb[lang].weight)
        for copies in self.blocks:
            if len(copies) > 1:
                params += copies[lang].parameters()
        return params

    def hidden_states(self, idx, lang, attn_mask=None, pos_offset=None):
        """idx (B, T) ids of language `lang` (an int), attn_mask (B, T) True at real tokens ->
        n_layers + 1 tensors (B, T, dim): L0 = embeddings after their LayerNorm (and dropout),
        L1..Ln = block outputs, as Figures 5-7 number layers; padding zeroed (XLM). pos_offset:
        (B,), row b at positions pos_offset[b] .. + T - 1 (--pos-offsets)."""
        B, T = idx.size()
        c = self.config
        if not 0 <= lang < c.n_langs:
            raise ValueError(f"lang {lang} outside 0..{c.n_langs - 1}")
        if T > c.max_positions:
            raise ValueError(f"sequence length {T} > max_positions {c.max_positions}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        if pos_offset is not None:  # the caller keeps offset + T <= max_positions
            pos = pos_offset.view(B, 1) + pos  # (B, T)
        x = _pick(self.tok_emb, lang)(idx) + _pick(self.pos_emb, lang)(pos)  # (B, T, C)
        if self.lang_emb is not None:
            x = x + self.lang_emb.weight[lang]
        x = dropout(self.ln_emb(x), c.dropout, self.training)
        if attn_mask is not None:
            x = x * attn_mask.unsqueeze(-1).to(x.dtype)  # padding zeroed, as after every block
        hs = [x]
        for copies in self.blocks:
            hs.append(_pick(copies, lang)(hs[-1], attn_mask))
        return hs

    def forward(self, idx, lang, targets=None, attn_mask=None, pos_offset=None, target_index=None):
        """With targets (B, T) (-1 = not a target): logits (N, V_lang) of the N targets only, in
        the order of targets[targets != -1] (as XLM), and their mean cross-entropy; without: logits
        (B, T, V_lang), None. target_index: the targets' flat positions (the GPU need not count)."""
        x = self.hidden_states(idx, lang, attn_mask, pos_offset)[-1]
        W = _pick(self.tok_emb, lang).weight
        b = _pick(self.pred_bias, lang)
        if targets is None:  # padded on CUDA, the logits are a view: made whole
            return project(x, W, b).contiguous(), None
        if target_index is None:
            target_index = (targets.view(-1) != -1).nonzero().squeeze(1)
        logits = project(x.flatten(0, 1).index_select(0, target_index), W, b)  # (N, V)
        # no target: zero loss, graph kept (the bias too: DDP sees every parameter used)
        if logits.size(0) == 0:
            return logits, (x.sum() + b.sum()) * 0.0
        return logits, F.cross_entropy(logits.float(), targets.view(-1)[target_index])

    @classmethod
    def from_xlm(cls, state_dict, config):
        """A model from a facebookresearch/XLM TransformerModel state dict (also under DDP's
        `module.` or HF's `transformer.` prefix) and the fully shared config describing it."""
        model = cls(config)
        if model.has_lang_specific():
            raise ValueError("from_xlm: XLM checkpoints are fully shared; use sep_emb=False, "
                             "sep_layers=()")
        sd = {re.sub(r"^(module\.)?(transformer\.)?", "", k): v for k, v in state_dict.items()}
        # pred_layer.proj.weight is the tied embedding (saved twice by XLM); position_ids is HF's
        tied = sd.pop("pred_layer.proj.weight", None)
        sd.pop("position_ids", None)
        # XLM key -> the part of our weights it is (q, k, v: the thirds of our qkv)
        parts = xlm_parts(config, model.state_dict())
        missing = [n for n in parts if n not in sd]
        unexpected = sorted(set(sd) - set(parts))
        if missing or unexpected:
            raise KeyError(f"from_xlm: state dict does not fit the config: missing {missing}, "
                           f"unexpected {unexpected}")
        # every XLM tensor against its part of ours, then copied into it (a view of the model's)
        for name, part in parts.items():
            if sd[name].shape != part.shape:
                raise InputError(f"from_xlm: shapes do not match the config: {name} is "
                                 f"{tuple(sd[name].shape)}, the config's {tuple(part.shape)}")
            part.copy_(sd[name])
        if tied is not None and not torch.equal(tied, sd["embeddings.weight"]):
            raise ValueError("from_xlm: pred_layer.proj.weight differs from embeddings.weight "
                             "(untied model)")
        return model


def xlm_parts(config, state):
    """A fully shared model's state dict -> {XLM's key (no `transformer.` prefix): the part of our
    tensor it is}, views: from_xlm's and export_hf's."""
    names = {"tok_emb.0.weight": ["embeddings.weight"],
             "pos_emb.0.weight": ["position_embeddings.weight"],
             "ln_emb.weight": ["layer_norm_emb.weight"], "ln_emb.bias": ["layer_norm_emb.bias"],
             "pred_bias.0": ["pred_layer.proj.bias"]}
    if config.lang_emb:
        names["lang_emb.weight"] = ["lang_embeddings.weight"]
    layer = {"attn.qkv": ["attentions.{i}.q_lin", "attentions.{i}.k_lin", "attentions.{i}.v_lin"],
             "attn.out": ["attentions.{i}.out_lin"], "ln1": ["layer_norm1.{i}"],
             "ffn.lin1": ["ffns.{i}.lin1"], "ffn.lin2": ["ffns.{i}.lin2"],
             "ln2": ["layer_norm2.{i}"]}
    for i in range(config.n_layers):
        for w in ("weight", "bias"):
            for k, v in layer.items():
                names[f"blocks.{i}.0.{k}.{w}"] = [f"{x.format(i=i)}.{w}" for x in v]
    return {n: t for ours, theirs in names.items()
            for n, t in zip(theirs, state[ours].chunk(len(theirs)))}

# -----------------------------------------------------------------------------
# The encoder of §5.1.2 (Figure 5): two pretrained models cut at layer i, one mapped, 4 new layers

class AlignedEncoder(nn.Module):
    """§5.1.2's encoder, with MLM.hidden_states' interface: English runs through the frozen English
    model up to layer i, then 4 NEW layers trained with the task head; a target language through
    its own model up to layer i, mapped into English space by the orthogonal W (x_tgt @ W ~ x_en,
    align.py's Procrustes), then the same new layers. encoders[code] = (model, index, W or None)."""

    def __init__(self, encoders, layer):
        super().__init__()
        self.encoders = encoders  # a plain dict: the frozen models are not submodules
        models = [m for m, _, _ in encoders.values()]
        for m in models:
            m.eval().requires_grad_(False)
        base = models[0].config
        self.config = replace(base, max_positions=min(m.config.max_positions for m in models))
        self.layer = layer
        self.blocks = nn.ModuleList(Block(base) for _ in range(4))  # §5.1.2: 4 new layers

    def lang_specific_parameters(self, lang):
        return []  # below layer i everything is frozen anyway; the new layers are shared

    def hidden_states(self, idx, lang, attn_mask):  # attn_mask (B, T) as encode_batch passes it
        model, lang_id, W = self.encoders[lang]
        with torch.no_grad():
            x = model.hidden_states(idx, lang_id, attn_mask)[self.layer]
            x = x @ W.to(x) if W is not None else x
        hs = [x]
        for block in self.blocks:
            hs.append(block(hs[-1], attn_mask))
        return hs

# -----------------------------------------------------------------------------
# padded batches: the one forward pass that align.py, cka.py and finetune.py share

def encode_batch(model, rows, lang):
    """B id lists in input form (`</s> ids </s>`, XNLI's `</s> a </s> b </s>`) as one right-padded
    batch -> (hs, mask): n_layers + 1 tensors (B, T, dim), zeros at padding, mask (B, T) True at
    real tokens; padding is masked out of attention (row b's states are row b's alone)."""
    device = next(model.parameters()).device
    T = max(map(len, rows))
    idx = torch.tensor([list(r) + [PAD_ID] * (T - len(r)) for r in rows], dtype=torch.long,
                       device=device)
    mask = torch.tensor([[t < len(r) for t in range(T)] for r in rows], device=device)
    return model.hidden_states(idx, lang, attn_mask=mask), mask

# =============================================================================
# Below, the plumbing: FLOPs, id lists, checkpoints, --device/--dtype, analyses, figures, export.

def flops_per_token(config, seq_len, target_frac=0.15, lang=0):
    """Forward + backward (= 3 forwards) matmul FLOPs per input token of MLM training (README "Real
    data"), a multiply-add as 2; the softmax at the target positions only (target_frac), over
    language `lang`'s vocabulary. Embeddings, LayerNorm, GELU and dropout: < 1 %."""
    d = config.dim
    V = config.vocab_sizes[lang] if config.vocab_sizes else config.vocab_size
    per_layer = 8 * d * d + 4 * d * config.ffn_dim + 4 * seq_len * d
    return 3 * (config.n_layers * per_layer + target_frac * 2 * d * V)

# -----------------------------------------------------------------------------
# id lists of any length and number through encode_batch: finetune.py's words, the sentences

def windows(n, size):
    """n subwords in windows of at most `size`, each starting size // 2 before the last ended
    (shijie-wu/crosslingual-nlp `dataset/tagging.py`) -> [(start, end, keep_from)], [keep_from,
    end) taking their states from it: windows(10, 4) -> [(0, 4, 0), (2, 6, 4), (4, 8, 6), ...]"""
    out = [(0, min(n, size), 0)]
    while out[-1][1] < n:
        start = out[-1][1] - size // 2
        out.append((start, min(start + size, n), out[-1][1]))
    return out


def encode_states(model, seqs, lang, max_len):
    """Last-layer states (B, 1 + L, d) of id lists, L the longest, in windows of max_len subwords:
    position 0 = the leading </s> (the parser's ROOT), 1 + k = subword k, zeros after."""
    rows = []
    # (window row, window col, sentence row, sentence col) of every state kept
    moves = []
    for b, ids in enumerate(seqs):
        for s, e, keep in windows(max(len(ids), 1), max_len):
            # -1: the first window's </s> (the only window that keeps from 0)
            ks = range(keep or -1, min(e, len(ids)))
            moves += [(len(rows), 1 + k - s, b, 1 + k) for k in ks]
            rows.append([EOS_ID, *ids[s:e], EOS_ID])
    h = encode_batch(model, rows, lang)[0][-1]
    window, window_col, sentence, col = torch.tensor(moves, device=h.device).unbind(1)
    out = h.new_zeros(len(seqs), 1 + max(map(len, seqs)), h.size(-1))
    return out.index_put((sentence, col), h[window, window_col])


@torch.no_grad()
def iter_states(model, id_lists, lang, batch_size):
    """Yield (k, states (n_layers + 1, len_k + 2, dim) float32 numpy of `</s> ids </s>`) per id
    list k, in padded batches of similar length; lists beyond the model's positions are cut."""
    order = sorted(range(len(id_lists)), key=lambda k: len(id_lists[k]))
    model.eval()
    for a in range(0, len(order), batch_size):
        ks = order[a:a + batch_size]
        longest = model.config.max_positions - 2
        rows = [[EOS_ID, *id_lists[k][:longest], EOS_ID] for k in ks]
        # (B, n_layers + 1, T, dim)
        hs = torch.stack(encode_batch(model, rows, lang)[0], dim=1).float().cpu().numpy()
        for k, row, H in zip(ks, rows, hs):
            yield k, H[:, :len(row)]


def pool_sentences(model, id_lists, lang, batch_size=32, progress=None):
    """Sentence vectors (pooling left open by the paper): the mean state of each id list without
    its two </s> (empty: their mean) -> n_layers + 1 arrays (n, dim); progress: e.g. a tqdm bar."""
    out = torch.zeros(model.config.n_layers + 1, len(id_lists), model.config.dim).numpy()
    states = iter_states(model, id_lists, lang, batch_size)
    if progress:
        states = progress(states, len(id_lists))
    for k, H in states:
        out[:, k] = (H[:, 1:-1] if H.shape[1] > 2 else H).mean(axis=1)
    return list(out)

# -----------------------------------------------------------------------------
# checkpoints as plain types (load under torch.load(weights_only=True), never a pickled object)

@contextmanager
def _atomic_paths(*paths):
    """bpe.atomic_path's copy (model.py copies alone): temporaries, renamed together at the end."""
    tmps = [f"{p}.{os.getpid()}.tmp" for p in paths]  # the pid: two processes never share one
    try:
        yield tmps
        for tmp, path in zip(tmps, paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in filter(os.path.exists, tmps):
            os.remove(tmp)
        raise


def save_model(path, model, **extra):
    """Atomically write {"model": state_dict, "config": asdict(config), **extra} of a raw model."""
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(model.config).items()}
    with _atomic_paths(path) as (tmp,):
        torch.save({"model": model.state_dict(), "config": config, **extra}, tmp)


CKPT_HINT = ("expected a checkpoint of pretrain.py (best.pt or checkpoint.pt), model.save_model or "
             "XLM's train.py")


def _first_line(e):
    """`Type: first sentence` of an exception (torch's load errors run long)."""
    msg = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:100]
    return type(e).__name__ + (f": {msg}" if msg else "")


def file_digest(path):
    """A file's contents as 'sha256:' + 16 hex digits (align.py and finetune.py name models so)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()[:16]


def load_model(path, map_location="cpu"):
    """-> (model in eval mode, save_model's extra entries), also of a released XLM checkpoint; any
    way a file can be wrong is one InputError naming it."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        why = "empty file (0 bytes), not a checkpoint"
        if not os.path.exists(path):
            why = "no such file"
        elif os.path.isdir(path):
            why = "is a directory"
        raise InputError(f"{path}: {why} ({CKPT_HINT})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    # torch raises many types here (RuntimeError, UnpicklingError, KeyError, EOFError)
    except Exception as e:
        raise InputError(f"cannot read {path}: {_first_line(e)} (a truncated or damaged file? "
                         f"{CKPT_HINT})") from None
    is_dict = isinstance(ckpt, dict)
    if is_dict and {"model", "dico_word2id", "params"} <= set(ckpt):  # a released XLM model
        model, ckpt = _from_xlm_checkpoint(path, ckpt)
    elif not (is_dict and isinstance(ckpt.get("model"), dict)
              and isinstance(ckpt.get("config"), dict)):
        got = f"keys {sorted(map(str, ckpt))[:8]}" if is_dict else f"a {type(ckpt).__name__}"
        raise InputError(f"{path}: not a model checkpoint (got {got}; {CKPT_HINT})")
    else:
        try:
            model = MLM(ModelConfig(**ckpt.pop("config")))
        except (TypeError, ValueError) as e:
            raise InputError(f"{path}: bad model config: {e}") from None
        mismatch = f"{path}: the weights do not match the checkpoint's config"
        try:
            keys = model.load_state_dict(ckpt.pop("model"), strict=False)
        except RuntimeError as e:  # shapes that do not fit the config, a weight that is no tensor
            raise InputError(f"{mismatch}: {_first_line(e)}") from None
        missing, unexpected = map(sorted, keys)
        if missing or unexpected:
            raise InputError(f"{mismatch} ({len(missing)} missing, {len(unexpected)} unexpected "
                             f"keys, e.g. {(missing + unexpected)[0]!r})")
    bad = [k for k, v in model.state_dict().items() if not torch.isfinite(v).all()]
    if bad:
        raise InputError(f"{path}: weight {bad[0]!r} contains NaN or inf (a diverged run?); "
                         "refusing to use it")
    return model.to(map_location).eval(), ckpt


def load_encoder(path, device, checkpoint_tokenizer, xlm_codes):
    """load_model, bpe.checkpoint_tokenizer -> (model, tokenizer, languages, the other entries)."""
    model, extra = load_model(path, device)
    return (model, *checkpoint_tokenizer(extra, path, xlm_codes), extra)


def same_weights(a, b):
    """Two models with the same parameter names and values: two files of one model (best.pt and
    checkpoint.pt of a run)."""
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(map(torch.equal, mine.values(), theirs.values()))


def stall_note(path, extra):
    """A note if load_model's extra says the MLM stalled (English dev ppl above pretrain.py's
    left-bigram count model, finetune.py's rule); else None."""
    ppl = extra.get("dev_ppl") or {}
    en = next(iter(ppl), None)
    counts = extra.get("count_models") or extra.get("count_ppl") or {}  # count_ppl: older
    left = counts.get(en, {}).get("left")
    if left and ppl[en] > left:
        return (f"note: {path}: its MLM stalled ({en} dev ppl {ppl[en]:.2f} above the left-bigram "
                f"count model's {left:.1f}); its scores measure an unconverged model")


# XLM data/dictionary.py's special words, ids 0..13
XLM_SPECIALS = ["<s>", "</s>", "<pad>", "<unk>"] + [f"<special{i}>" for i in range(10)]


def _from_xlm_checkpoint(path, ckpt):
    """An XLM train.py checkpoint -> (model, {"langs": id2lang, "xlm_vocab": words by id})."""
    params = ckpt["params"]
    word2id = ckpt["dico_word2id"]
    state = ckpt["model"]
    if not all(isinstance(x, dict) for x in (params, word2id, state)):
        raise InputError(f"{path}: an XLM checkpoint's model, dico_word2id, params must be dicts")
    need = [k for k in ("emb_dim", "n_layers", "n_heads", "n_langs", "id2lang") if k not in params]
    if need:
        raise InputError(f"{path}: the XLM params lack {need}")
    words = sorted(word2id, key=word2id.get)
    id2lang = {int(k): v for k, v in params["id2lang"].items()}
    n_langs = int(params["n_langs"])
    pos = next((v for k, v in state.items() if k.endswith("position_embeddings.weight")), None)
    if not params.get("gelu_activation", True) or params.get("asm", False):
        raise InputError(f"{path}: XLM params with ReLU (gelu_activation false) or an adaptive "
                         "softmax (asm): not the architecture MLM reproduces")
    if (sorted(word2id.values()) != list(range(len(words)))
            or words[:len(XLM_SPECIALS)] != XLM_SPECIALS):
        raise InputError(f"{path}: dico_word2id is not an XLM dictionary (ids 0..n-1, "
                         f"{' '.join(XLM_SPECIALS[:5])} ... first)")
    if sorted(id2lang) != list(range(n_langs)):
        raise InputError(f"{path}: the XLM params' id2lang {params['id2lang']} does not number "
                         f"its n_langs {n_langs} languages")
    if pos is None:
        raise InputError(f"{path}: the XLM state dict has no position_embeddings.weight")
    try:
        dim = int(params["emb_dim"])
        drop = {k: float(params.get(k, 0.0)) for k in ("dropout", "attention_dropout")}
        config = ModelConfig(vocab_size=len(words), n_langs=n_langs, **drop, dim=dim,
                             n_layers=int(params["n_layers"]), n_heads=int(params["n_heads"]),
                             ffn_dim=4 * dim, max_positions=pos.size(0),
                             lang_emb=n_langs > 1 and bool(params.get("use_lang_emb", True)))
        model = MLM.from_xlm(state, config)
    except (KeyError, ValueError) as e:
        raise InputError(f"{path}: {str(e).strip(chr(39) + chr(34))[:300]}") from None
    return model, {"langs": [id2lang[i] for i in range(n_langs)], "xlm_vocab": words}

# -----------------------------------------------------------------------------
# device and precision: --device and --dtype mean the same in every script

DTYPES = ("float32", "bfloat16", "float16")


def pick_device(device="auto", dtype="auto", local_rank=None):
    """-> (device, dtype, backend), e.g. ("cuda:0", "bfloat16", "nccl"); torchrun: local_rank."""
    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    kind, colon, index = device.partition(":")
    gpu = kind == "cuda" and (not colon or index.isdigit())  # cuda or cuda:N
    n = torch.cuda.device_count()
    i = int(index) if gpu and colon else (local_rank or 0)
    build = "a CPU-only torch build" if torch.version.cuda is None else "no CUDA device visible"
    if not gpu and device not in ("cpu", "mps"):
        raise InputError(f"--device {device}: expected auto, cpu, cuda, cuda:N or mps")
    if device == "mps" and not torch.backends.mps.is_available():
        raise InputError("--device mps: MPS is not available on this machine; use --device cpu "
                         "or auto")
    if gpu and not cuda:
        raise InputError(f"--device {device}: CUDA is not available on this machine ({build}); "
                         "use --device cpu or auto")
    if gpu and colon and local_rank is not None:
        raise InputError(f"--device {device}: under torchrun each process takes the GPU of its "
                         "LOCAL_RANK; use --device cuda (and CUDA_VISIBLE_DEVICES to choose GPUs)")
    if gpu and i >= n:
        raise InputError(f"--device {device}: GPU {i} does not exist ({n} visible)" if colon else
                         f"--device {device}: LOCAL_RANK {i} but only {n} GPU(s) visible; use "
                         f"--nproc_per_node {n} or less")
    device = f"cuda:{i}" if gpu else device
    # native bfloat16 from compute capability 8.0 (A100), of the chosen GPU; not
    # torch.cuda.is_bf16_supported(), which also counts the emulated (slow) bf16 of a V100 or T4
    cc = torch.cuda.get_device_capability(i) if gpu else None
    if dtype == "auto":
        dtype = "float32" if not gpu else "bfloat16" if cc >= (8, 0) else "float16"
    elif dtype not in DTYPES:
        raise InputError(f"--dtype {dtype}: expected auto, float32, bfloat16 or float16")
    elif dtype == "bfloat16" and gpu and cc < (8, 0):
        raise InputError(f"--dtype bfloat16: GPU {i} has no native bfloat16 (compute "
                         f"capability {cc[0]}.{cc[1]}, 8.0 needed); use --dtype float16 or auto")
    return device, dtype, "nccl" if gpu else "gloo"


def autocast(device, dtype):
    """The context of every forward pass: nothing for float32 (bit-identical), else autocast."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, getattr(torch, dtype))

# -----------------------------------------------------------------------------
# align.py's and cka.py's shared command line: input files, per-layer tables, figures (Figs. 4-7)

@contextmanager
def analysis_run(args, toy_paths, check_src_tgt, toy_data, optional=()):
    """align.py's and cka.py's run: first the flags, --toy --data DIR filling each unset flag of
    toy_paths ({flag: file}, all but `optional` needed); then the work under autocast."""
    try:
        check_src_tgt(args)  # one text on both sides measures nothing (P@1 100, CKA 1.000)
        args.device, args.dtype, _ = pick_device(args.device, args.dtype)
        if args.plot:
            check_plot(args.plot)
        data_flag = toy_data(args)  # --data, or the deprecated --toy DIR
        if bool(args.toy) != (args.data is not None):
            raise InputError("--toy and --data DIR go together (a toydata.py world; real data: "
                             "give each file's flag)")
        if args.toy and not os.path.isdir(args.data):
            raise InputError(f"{data_flag} {args.data}: no such directory (a toydata.py world)")
        # toydata.py writes mono/ first and world.json last: mono/ alone was cut short
        if args.toy and not os.path.isfile(os.path.join(args.data, "world.json")):
            if os.path.isdir(os.path.join(args.data, "mono")):
                raise InputError(f"{data_flag} {args.data}: no world.json, not a whole toydata.py "
                                 "world (cut short? write it again with toydata.py --force)")
        from_world = [f for f in toy_paths if args.toy and getattr(args, f) is None]
        for f in from_world:
            setattr(args, f, os.path.join(args.data, toy_paths[f].format(l0=args.src, l1=args.tgt)))
        for f in ["ckpt", "ckpt2", "xlm_codes", *toy_paths]:
            path = getattr(args, f)
            flag = "--" + f.replace("_", "-")
            if path is None and f not in ("ckpt2", "xlm_codes", *optional):
                raise InputError(f"missing {flag} (or give --toy --data WORLD)")
            if path is not None and not os.path.isfile(path):
                # named by --src and --tgt, not given as a file
                if f in from_world:
                    raise InputError(f"{data_flag} {args.data} with --src {args.src} --tgt "
                                     f"{args.tgt}: no such file {path}")
                raise InputError(f"{flag} {path}: "
                                 f"{'not a file' if os.path.exists(path) else 'no such file'}")
            # the same model is told by its contents, not by its path (before the data's files)
            if f == "ckpt2":
                args.digests = [file_digest(p) for p in (args.ckpt, path or args.ckpt)]
                if path and args.digests[0] == args.digests[1]:
                    raise InputError(f"--ckpt2 {path} holds the same model as --ckpt {args.ckpt} "
                                     f"({args.digests[0]}): one model on both sides measures "
                                     "nothing; give a second one or leave --ckpt2 out")
        with autocast(args.device, args.dtype):
            yield
    except (OSError, MemoryError, RuntimeError) as e:
        if isinstance(e, MemoryError) or re.search("out of memory|allocate memory", str(e)):
            raise InputError("out of memory; try a smaller --batch-size (or --max-sents)") from None
        # a file's error (unreadable, missing, a directory, a full disk); any other is a bug
        if not (isinstance(e, OSError) and e.errno):
            raise
        raise InputError(f"{e.filename}: {e.strerror}" if e.filename else e.strerror) from None


def check_plot(path):
    """--plot FILE.png, checked before any work: matplotlib importable, the directory writable."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d) or os.path.isdir(path) or not os.access(d, os.W_OK):
        why = "cannot write a file there" if os.path.isdir(d) else f"no such directory {d}"
        raise InputError(f"--plot {path}: {why}")
    from importlib.util import find_spec  # matplotlib is only looked for, not imported
    if find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib (not a requirement): pip install matplotlib")


def markdown_table(header, rows, fmt):
    """A per-layer table in markdown: floats written with `fmt`, anything else with str()."""
    cells = [[fmt.format(v) if isinstance(v, float) else str(v) for v in r] for r in rows]
    lines = ["| " + " | ".join(r) + " |" for r in [header, *cells]]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines)


def _save_figure(ax, path, title):
    """Title, grid and legend (beside the plot, never over a line); the PNG written atomically."""
    ax.set_title(re.sub(r"\S*/(\S+)", r"\1", title), fontsize=9)  # files without their directories
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.figure.tight_layout()
    with _atomic_paths(path) as (tmp,):
        ax.figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


def _axes():
    from matplotlib.figure import Figure  # not pyplot: no window, no backend to choose
    return Figure(figsize=(7, 3.6)).subplots()


def plot_layers(path, title, header, rows, ylabel):
    """A per-layer table as a PNG (after check_plot): one line per column of floats."""
    ax = _axes()
    for c in range(1, len(header)):
        points = [(str(r[0]), r[c]) for r in rows if isinstance(r[c], float)]
        if points:
            ax.plot(*zip(*points), marker="o", label=header[c])
    ax.set(xlabel="layer", ylabel=ylabel)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    _save_figure(ax, path, title)

# -----------------------------------------------------------------------------
# python model.py curve RUN_DIR: a pretraining run's learning curve, from its log.jsonl

# pretrain.py's {"count_models": {lang: {key: ppl}}} record: names in the figure, line styles
COUNT_MODELS = {"unigram": ("unigram", ":"), "left": ("left bigram", "-."),
                "both": ("both neighbours", "--")}


@dataclass
class Curve:
    dev_ppl: dict       # language -> [(update, dev perplexity)] of every evaluation
    count_models: dict  # language -> {"unigram": ppl, "left": ppl, "both": ppl}; {}: an old log


def read_curve(run_dir):
    """RUN_DIR/log.jsonl -> Curve; one InputError if it has no evaluation."""
    path = os.path.join(run_dir, "log.jsonl")
    dev_ppl = {}
    count_models = {}
    with open(path, encoding="utf-8") as f:  # missing: main's one OSError line
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                raise InputError(f"{path}:{n}: not a JSON line") from None
            count_models = record.get("count_models", count_models)
            for lang, ppl in record.get("dev_ppl", {}).items():
                dev_ppl.setdefault(lang, []).append((record["step"], ppl))
    if not dev_ppl:
        raise InputError(f"{path}: no evaluation (dev_ppl) logged yet")
    return Curve(dev_ppl, count_models)


def plot_curve(run_dir, path=None):
    """Dev perplexity per language against updates (log y), each language's count models as lines
    in its colour, to `path` (default RUN_DIR/curve.png)."""
    path = path or os.path.join(run_dir, "curve.png")
    curve = read_curve(run_dir)
    check_plot(path)
    ax = _axes()
    for i, (lang, points) in enumerate(curve.dev_ppl.items()):
        ax.plot(*zip(*points), color=f"C{i}", label=f"{lang} dev")
        counts = curve.count_models.get(lang, {})
        for key, (name, style) in COUNT_MODELS.items():
            if key in counts:
                ax.axhline(counts[key], color=f"C{i}", linestyle=style, label=f"{lang} {name}")
    # _save_figure keeps the run directory's own name
    title = f"{os.path.abspath(run_dir)}: dev perplexity"
    if not curve.count_models:
        title += " (no count models in this log)"
    ax.set(xlabel="updates", ylabel="dev perplexity", yscale="log")
    _save_figure(ax, path, title)

# -----------------------------------------------------------------------------
# export to Hugging Face transformers: XLMWithLMHeadModel weights + a `tokenizers` tokenizer.json

# bpe.pretokenize's regex in the Oniguruma syntax `tokenizers` runs: str.isspace()'s whitespace
# spelled out (\uHHHH, which both read), the zh set difference as an intersection
_HF_SPACE = r"\t-\r\x1c-\x20\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_HF_TOKEN = r"\p{N}+(?:[.,]\p{N}+)+|WORD+(?:['’\-]WORD+)*|(?![" + _HF_SPACE + r"])\X"
HF_PRETOKENIZE = {"": _HF_TOKEN.replace("WORD", r"[\p{L}\p{M}\p{N}]"),
                  "zh": r"\p{Han}|" + _HF_TOKEN.replace("WORD", r"[\p{L}\p{M}\p{N}&&\P{Han}]")}
HF_UNUSED_BIAS = -1e4  # output bias of the BPE symbols our vocabulary lacks: never predicted
# the files' fixed entries (export_hf fills in the nulls and the model's); no token_type_ids in
# the tokenizer: XLM adds the token embedding of a type id to every position
HF_FILES = """{
 "config.json": {"architectures": ["XLMWithLMHeadModel"], "model_type": "xlm",
  "gelu_activation": true, "sinusoidal_embeddings": false, "causal": false, "asm": false,
  "is_encoder": true, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "unk_index": 3,
  "mask_index": 5, "mask_token_id": 5,
  "tie_word_embeddings": true},
 "tokenizer.json": null, "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
  "model_input_names": ["input_ids", "attention_mask"], "clean_up_tokenization_spaces": false},
 "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
  "cls_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<special1>"}
}"""
# tokenizer.json less what hf_tokenizer_json fills in; the normalizer, bpe.lowercase_and_strip_
# accents (lower, NFD, no non-spacing marks Mn, lower), goes when the text keeps its case
HF_TOKENIZER = r"""{
 "version": "1.0", "truncation": null, "padding": null, "added_tokens": {"single_word": false,
  "lstrip": false, "rstrip": false, "normalized": false, "special": true},
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, {"type": "NFD"},
  {"type": "Replace", "pattern": {"Regex": "\\p{Mn}"}, "content": ""}, {"type": "Lowercase"}]},
 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": null}, "behavior": "Removed",
  "invert": true},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "</s>",
  "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>",
  "type_id": 0}}], "pair": [{"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id":
  "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"Sequence": {"id": "B",
  "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
  "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
 "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
 "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
  "end_of_word_suffix": "</w>", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
  "vocab": null, "merges": null}
}"""


def hf_tokenizer_json(record, lang, vocab_size):
    """Tokenizer.to_dict's record -> (tokenizer.json giving Tokenizer.encode(line, lang)'s ids
    between two </s>, number of extra ids). Our 'ab@@' and 'ab' are its 'ab' and 'ab</w>'; merge
    symbols ours lacks get ids vocab_size, vocab_size + 1, ... (<unk>'s row in export_hf)."""
    # a prefixed vocabulary: this language's tokens
    prefix = f"{lang}:" if record["mode"] == "prefixed" else ""
    tokens = record["vocabs"][record["vocab_of"][lang]]["tokens"]
    vocab = {t: i for i, t in enumerate(XLM_SPECIALS)}
    for i, t in enumerate(tokens, len(XLM_SPECIALS)):
        if t.startswith(prefix):
            piece = t.removeprefix(prefix)
            vocab[piece[:-2] if piece.endswith("@@") else piece + "</w>"] = i
    # the first rank counts
    merges = list(dict.fromkeys(tuple(m) for m in record["bpes"][record["bpe_of"][lang]]))
    symbols = dict.fromkeys(s for a, b in merges for s in (a, b, a + b))
    extra = [s for s in symbols if s not in vocab]
    vocab |= {s: i for i, s in enumerate(extra, vocab_size)}
    tok = json.loads(HF_TOKENIZER)
    tok["added_tokens"] = [{"id": i, "content": t, **tok["added_tokens"]}
                           for i, t in enumerate(XLM_SPECIALS)]
    if not record.get("lowercase"):
        tok["normalizer"] = None
    tok["pre_tokenizer"]["pattern"]["Regex"] = HF_PRETOKENIZE["zh" if lang == "zh" else ""]
    tok["model"] |= {"vocab": vocab, "merges": [list(m) for m in merges]}
    return tok, len(extra)


def export_hf(ckpt_path, out_dir, lang=None):
    """best.pt as files that transformers loads with no code of ours (-> their paths); the
    tokenizer is `lang`'s (default: the first)."""
    model, extra = load_model(ckpt_path)
    c = model.config
    record = extra.get("tokenizer")
    langs = extra.get("langs")
    if not record or not langs:
        raise InputError(f"{ckpt_path}: no tokenizer record in the checkpoint (pretrain.py's "
                         "best.pt has one)")
    lang = lang or langs[0]
    sep = ",".join(["tok"] * c.sep_tok + ["pos"] * c.sep_pos + [str(i) for i in c.sep_layers])
    if model.has_lang_specific():
        raise InputError(f"{ckpt_path}: a model with language-specific parts (--sep {sep}) has no "
                         "transformers equivalent (XLM shares everything); only fully shared "
                         "models are exported")
    if c.ffn_dim != 4 * c.dim:
        raise InputError(f"{ckpt_path}: ffn_dim {c.ffn_dim}, but transformers' XLM has 4 x dim "
                         f"{c.dim}")
    if lang not in langs:
        raise InputError(f"--lang {lang}: not one of the checkpoint's languages {langs}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: exists and is not a directory (the export's output "
                         "directory)")
    tok, n_extra = hf_tokenizer_json(record, lang, c.vocab_size)
    files = json.loads(HF_FILES)
    files["config.json"] |= {
        "vocab_size": c.vocab_size + n_extra, "emb_dim": c.dim, "n_layers": c.n_layers,
        "n_heads": c.n_heads, "dropout": c.dropout, "attention_dropout": c.attention_dropout,
        "n_langs": c.n_langs, "use_lang_emb": c.lang_emb,
        "max_position_embeddings": c.max_positions, "layer_norm_eps": LAYER_NORM_EPS,
        "lang_id": langs.index(lang), "lang2id": {l: i for i, l in enumerate(langs)},
        "id2lang": dict(enumerate(langs))}  # keys written as strings
    files["tokenizer.json"] = tok
    files["tokenizer_config.json"] |= {**files["special_tokens_map.json"],
                                       "model_max_length": c.max_positions}
    # XLMWithLMHeadModel's weights (float32); the n_extra rows copy <unk>'s, bias HF_UNUSED_BIAS
    sd = model.state_dict()
    emb = sd["tok_emb.0.weight"]
    sd["tok_emb.0.weight"] = torch.cat([emb, emb[[3] * n_extra]])
    sd["pred_bias.0"] = F.pad(sd["pred_bias.0"], (0, n_extra), value=HF_UNUSED_BIAS)
    sd = {("" if n.startswith("pred_layer.") else "transformer.") + n: t.clone()
          for n, t in xlm_parts(c, sd).items()}
    # the weights' file; an earlier export's file of the other format is removed
    weights = ["model.safetensors", "pytorch_model.bin"]
    try:
        from safetensors.torch import save_file  # optional, as transformers prefers
        write = lambda tmp: save_file(sd, tmp, metadata={"format": "pt"})  # noqa: E731
    except ImportError:
        weights.reverse()
        write = lambda tmp: torch.save(sd, tmp)  # noqa: E731
    paths = [os.path.join(out_dir, name) for name in [weights[0], *files]]
    new_dir = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    # every file goes to a temporary first, then all are renamed: a failure leaves no mix
    try:
        with _atomic_paths(*paths) as tmps:
            write(tmps[0])
            for tmp, content in zip(tmps[1:], files.values()):
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(content, f, ensure_ascii=False, indent=1)
    except Exception as e:  # OSError, or safetensors' own error
        if new_dir and not os.listdir(out_dir):
            os.rmdir(out_dir)
        raise InputError(f"cannot write the export to {out_dir}: {_first_line(e)} (any earlier "
                         "export there is left as it was)") from None
    # transformers could load it instead
    with suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, weights[1]))
    return paths

# -----------------------------------------------------------------------------
# the command line: export and curve

def build_parser():
    """python model.py export CKPT OUT_DIR [--lang L] | curve RUN_DIR [--plot FILE.png]."""
    import argparse
    ap = argparse.ArgumentParser(prog="model.py", description="Export a checkpoint for Hugging "
                                 "Face transformers, or draw a pretraining run's learning curve.")
    commands = ap.add_subparsers(dest="cmd", required=True)
    ex = commands.add_parser("export", help="best.pt -> a transformers directory")
    ex.add_argument("ckpt", help="pretrain.py's best.pt (a fully shared model)")
    ex.add_argument("out", help="output directory (created; its files are replaced)")
    ex.add_argument("--lang", help="whose tokenizer (pre-tokenisation differs for zh only; "
                    "default: the first)")
    cu = commands.add_parser("curve", help="dev perplexity per language against updates, with "
                             "the count models (needs matplotlib)")
    cu.add_argument("run_dir", metavar="RUN_DIR", help="pretrain.py's --out (its log.jsonl)")
    cu.add_argument("--plot", metavar="FILE.png", help="the figure (default: RUN_DIR/curve.png)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    # as bpe.reported: one `error: ...` line (a failed write too)
    try:
        if args.cmd == "curve":
            plot_curve(args.run_dir, args.plot)
        else:
            files = export_hf(args.ckpt, args.out, args.lang)
            print("wrote " + ", ".join(files))
    except (InputError, OSError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
