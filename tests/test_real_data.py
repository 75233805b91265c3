"""The official distributions as unpacked (README "Real data"): every format is written here by the test itself, read
to exactly the examples of the equivalent simple-format file, and a wrong file is answered with file:line."""
import glob
import json
import os

import pytest

import bpe
import finetune as ft

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason="../shared/data not present")

BOM = "\ufeff"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


# -----------------------------------------------------------------------------
# a UTF-8 byte order mark is stripped once, by the reader (failing-first: it used to stay on the first line)

def test_bom_is_stripped_by_read_lines(tmp_path):
    p = write(tmp_path / "a.txt", BOM + "Hello world\n" + BOM + "keeps a second one\n")
    assert list(bpe.read_lines(p)) == ["Hello world", BOM + "keeps a second one"]  # only the file's first bytes


def test_bom_never_becomes_a_vocabulary_token(tmp_path):
    files = {lang: write(tmp_path / f"{lang}.txt", BOM + "the cat sat on the mat\nthe dog sat\n" * 3)
             for lang in ("en", "fr")}
    tok = bpe.Tokenizer.build(files, num_merges=20, verbose=False)
    assert not any(BOM in t for lang in tok.langs for t in tok.vocabs[lang].tokens)


def test_conllu_with_bom_reads(tmp_path):
    text = "# sent_id = 1\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n2\t!\t!\tPUNCT\t_\t_\t1\tpunct\t_\t_\n\n"
    assert ft.read_conllu(write(tmp_path / "bom.conllu", BOM + text)) == ft.read_conllu(write(tmp_path / "a.conllu", text))


# -----------------------------------------------------------------------------
# model.flops_per_token: the cost table's FLOPs, checked against torch's own count of a training step

@pytest.mark.parametrize("sep", ["", "emb,1"])
def test_flops_per_token_equals_torch_flop_counter(sep):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    import model as M
    extra = M.parse_sep(sep, 2) | ({"vocab_sizes": (100, 90)} if sep else {})
    c = M.ModelConfig(vocab_size=100, n_layers=2, dim=32, n_heads=2, ffn_dim=64, **extra)
    m = M.MLM(c)
    B, T = 4, 20
    idx = torch.randint(14, 90, (B, T))
    targets = torch.full((B, T), -1)
    targets[:, :5] = idx[:, :5]  # a quarter of the positions are targets
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # MATH: attention as matmuls
        m(idx, 1, targets)[1].backward()
    assert counter.get_total_flops() == B * T * M.flops_per_token(c, T, target_frac=0.25, lang=1)
