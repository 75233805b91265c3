"""Our models outside this repository (model.export_hf: Hugging Face transformers) and released XLM checkpoints
inside it (--ckpt X.pth --xlm-codes CODES in align.py, cka.py, finetune.py)."""
import json
import os
import sys

import pytest
import regex

import bpe

torch = pytest.importorskip("torch")
import model as M  # noqa: E402

# Real sentences in five scripts (written for this test): accents, Cyrillic, Chinese, digits and punctuation, and
# one longer than the tiny models' 64 positions
REAL = {
    "latin": "Été comme hiver, l'élève français mangeait des crêpes à Noël près de la forêt.",
    "cyrillic": "Вчера в Москве шёл снег, и дети играли во дворе до самого вечера.",
    "chinese": "我们在2020年去了北京，天气很好，大家都很开心。",
    "digits": "Prix : 1,000.50 € (−15 %) — tél. +33 1 23-45-67 ; «d'accord» ?! [x=3.14]",
    "long": " ".join(["the river runs past the old mill and the children watch it"] * 8),
}
# Lines the test tokenizer learns its merges from beside the toy world: the same scripts, other sentences
LEARN = {
    "en": ["The weather was fine and the children played near the river until the evening came."] * 3,
    "fr": ["L'hiver dernier, les élèves ont fêté Noël à l'école près de la forêt enneigée."] * 3,
    "zh": ["我们去年在北京看到了很多人，他们都很开心。", "天气很好，我们在公园里走了很久。"] * 2,
    "ru": ["Дети играли во дворе, а взрослые говорили о погоде и снеге."] * 3,
}


# -----------------------------------------------------------------------------
# the pre-tokenisation regex of tokenizer.json is bpe.pretokenize (known answer, no transformers needed)

TRICKY = ["Hello, world! 1,000.50 and 3.14", "don't l'homme week-end ’tis", "我们2020年去了北京ABC中文",
          "a\x1cb\x1dc\u3000d\u00a0e\u2028f\tg\u200bh", "👍🏽 family 👨‍👩‍👧 e\u0301te\u0301 किताब",
          "<s> </s> <special1> @@ </w>", "  ", ""]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_hf_pretokenize_pattern_is_bpe_pretokenize(lang):
    """The Oniguruma pattern written into tokenizer.json gives bpe.pretokenize's tokens (run here with `regex`,
    whose V1 set syntax reads Oniguruma's `&&`; tests below run it in `tokenizers` itself)."""
    pattern = regex.compile("(?V1)" + M.HF_PRETOKENIZE["zh" if lang == "zh" else ""])
    for line in TRICKY + list(REAL.values()):
        assert pattern.findall(line) == bpe.pretokenize(line, lang), line


def test_model_py_imports_no_project_file():
    """model.py copies alone (torch only; its loader no longer imports bpe.py): every import, also inside functions."""
    import ast
    with open(M.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
             for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert names <= {"argparse", "contextlib", "dataclasses", "hashlib", "importlib", "json", "os", "re", "torch",
                     "safetensors", "matplotlib"}


# a tiny tokenizer record by hand: its tokenizer.json vocabulary is known
TINY_RECORD = {"format": "bpe.Tokenizer/1", "langs": ["en", "fr"], "mode": "joint", "lowercase": False,
               "separate_vocab": False, "bpes": [[["l", "o"], ["lo", "w</w>"], ["e", "r</w>"], ["n", "e"], ["l", "o"]]],
               "bpe_of": {"en": 0, "fr": 0},
               "vocabs": [{"tokens": ["low", "er", "n@@", "e@@", "l@@", "o@@", "w"], "counts": [9, 8, 7, 6, 5, 4, 3]}],
               "vocab_of": {"en": 0, "fr": 0}}


def test_hf_tokenizer_json_known_answer():
    tok, n_extra = M.hf_tokenizer_json(TINY_RECORD, "en", vocab_size=21)
    want = {s: i for i, s in enumerate(M.XLM_SPECIALS)}
    # our 'ab@@' (the word goes on) is 'ab', our 'ab' (the word ends) is 'ab</w>', at our ids 14..20; the symbols
    # the merges need that our vocabulary lacks follow from 21 on
    want.update({"low</w>": 14, "er</w>": 15, "n": 16, "e": 17, "l": 18, "o": 19, "w</w>": 20,
                 "lo": 21, "r</w>": 22, "ne": 23})
    assert tok["model"]["vocab"] == want and n_extra == 3
    assert tok["model"]["merges"] == [["l", "o"], ["lo", "w</w>"], ["e", "r</w>"], ["n", "e"]]  # repeat dropped
    assert tok["model"]["end_of_word_suffix"] == "</w>" and tok["model"]["unk_token"] == "<unk>"
    assert tok["post_processor"]["single"][0] == tok["post_processor"]["single"][2] == \
        {"SpecialToken": {"id": "</s>", "type_id": 0}}
    assert tok["normalizer"] is None
    lower = M.hf_tokenizer_json({**TINY_RECORD, "lowercase": True}, "en", 21)[0]["normalizer"]
    assert [n["type"] for n in lower["normalizers"]] == ["Lowercase", "NFD", "Replace", "Lowercase"]
    prefixed = {**TINY_RECORD, "mode": "prefixed", "vocabs": [{"tokens": ["en:low", "fr:low", "en:l@@"], "counts": [3, 2, 1]}]}
    vocab = M.hf_tokenizer_json(prefixed, "fr", 17)[0]["model"]["vocab"]
    assert vocab["low</w>"] == 15 and "l" not in [k for k, v in vocab.items() if v < 17]   # fr's tokens only


def tiny_model(vocab_size, n_langs=2, lang_emb=True, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = M.ModelConfig(vocab_size=vocab_size, n_langs=n_langs, n_layers=2, n_heads=2, dim=16, ffn_dim=64,
                        max_positions=64, lang_emb=lang_emb, **kw)
    model = M.MLM(cfg).eval()
    with torch.no_grad():
        for b in model.pred_bias:
            b.normal_()  # the bias must travel too
    return model


def test_export_hf_files_known_answer(tmp_path):
    """Without transformers: config.json says what XLMWithLMHeadModel needs, and the weights file holds our
    weights under its names (read back by MLM.from_xlm: same logits); extra rows repeat <unk>'s."""
    model = tiny_model(21)
    M.save_model(tmp_path / "m.pt", model, tokenizer=TINY_RECORD, langs=["en", "fr"])
    files = M.export_hf(str(tmp_path / "m.pt"), str(tmp_path / "hf"))
    names = sorted(os.path.basename(f) for f in files)
    weights = "model.safetensors" if "model.safetensors" in names else "pytorch_model.bin"
    assert names == sorted([weights, "config.json", "tokenizer.json", "tokenizer_config.json",
                            "special_tokens_map.json"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "vocab_size", "emb_dim", "n_layers", "n_heads", "n_langs",
                                   "use_lang_emb", "max_position_embeddings", "gelu_activation", "causal",
                                   "pad_token_id", "eos_token_id", "mask_token_id", "layer_norm_eps")} == \
        {"model_type": "xlm", "vocab_size": 24, "emb_dim": 16, "n_layers": 2, "n_heads": 2, "n_langs": 2,
         "use_lang_emb": True, "max_position_embeddings": 64, "gelu_activation": True, "causal": False,
         "pad_token_id": 2, "eos_token_id": 1, "mask_token_id": 5, "layer_norm_eps": 1e-12}
    tc = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert tc["model_input_names"] == ["input_ids", "attention_mask"] and tc["model_max_length"] == 64
    if weights == "model.safetensors":
        from safetensors.torch import load_file
        sd = load_file(str(tmp_path / "hf" / weights))
    else:
        sd = torch.load(tmp_path / "hf" / weights, weights_only=True)
    emb = sd["transformer.embeddings.weight"]
    assert emb.shape == (24, 16) and torch.equal(emb[21:], emb[3:4].expand(3, -1))
    assert (sd["pred_layer.proj.bias"][21:] == M.HF_UNUSED_BIAS).all()
    back = {k: v[:21] if k in ("transformer.embeddings.weight", "pred_layer.proj.bias") else v for k, v in sd.items()}
    again = M.MLM.from_xlm(back, model.config).eval()
    x = torch.tensor([[1, 14, 16, 3, 20, 1]])
    assert torch.equal(again(x, 1)[0], model(x, 1)[0])


def test_export_hf_full_disk_leaves_the_earlier_export_whole(tmp_path, monkeypatch):
    """Issue 37: every file goes to a temporary first and all are renamed together: a full disk midway (here the
    second json file) leaves an earlier export as it was (no new weights beside the old tokenizer.json), no
    temporary, no new empty directory, and one line; weights of the other format from an earlier export go."""
    import errno
    M.save_model(tmp_path / "m.pt", tiny_model(21), tokenizer=TINY_RECORD, langs=["en", "fr"])
    M.export_hf(str(tmp_path / "m.pt"), str(tmp_path / "hf"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    M.save_model(tmp_path / "m2.pt", tiny_model(21, seed=1), tokenizer=TINY_RECORD, langs=["en", "fr"])
    real, calls = json.dump, []

    def dump(obj, f, **kw):
        calls.append(1)
        if len(calls) == 2:
            f.write("{")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(obj, f, **kw)
    monkeypatch.setattr(json, "dump", dump)
    for out in ("hf", "new"):
        calls.clear()
        with pytest.raises(SystemExit, match=r"^error: cannot write the export to .*: OSError: \[Errno 28\] No sp") as e:
            M.main(["export", str(tmp_path / "m2.pt"), str(tmp_path / out)])
        assert "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == before and not (tmp_path / "new").exists()
    monkeypatch.undo()
    other = "pytorch_model.bin" if "model.safetensors" in before else "model.safetensors"
    (tmp_path / "hf" / other).write_bytes(b"weights of an earlier export")
    M.export_hf(str(tmp_path / "m2.pt"), str(tmp_path / "hf"))
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == sorted(before)
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == before["tokenizer.json"]


def test_export_hf_refuses_sep_and_bad_lang(tmp_path):
    M.save_model(tmp_path / "sep.pt", tiny_model(21, **M.parse_sep("1")), tokenizer=TINY_RECORD, langs=["en", "fr"])
    with pytest.raises(SystemExit, match=r"language-specific parts \(--sep 1\) has no transformers") as e:
        M.main(["export", str(tmp_path / "sep.pt"), str(tmp_path / "out")])
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    M.save_model(tmp_path / "m.pt", tiny_model(21), tokenizer=TINY_RECORD, langs=["en", "fr"])
    with pytest.raises(SystemExit, match="--lang de: not one of"):
        M.main(["export", str(tmp_path / "m.pt"), str(tmp_path / "out"), "--lang", "de"])
    with pytest.raises(SystemExit, match=r"m\.pt: exists and is not a directory \(the export's output directory\)$"):
        M.main(["export", str(tmp_path / "m.pt"), str(tmp_path / "m.pt")])  # was "[Errno 17] File exists"


# -----------------------------------------------------------------------------
# transformers itself (installed beside the project, never a dependency)

@pytest.fixture(scope="module")
def learned(toy_world, tmp_path_factory):
    """(Tokenizer, checkpoint path) of a joint en/fr/zh tokenizer learned on toy text plus real sentences
    (LEARN), so that real text gets merges, unknown characters and pieces outside the vocabulary."""
    pytest.importorskip("transformers", reason="transformers is not a dependency: pip install transformers")
    d = tmp_path_factory.mktemp("learned")
    files = {}
    for lang in ("en", "fr", "zh"):
        toy = (toy_world / f"mono/{lang}.train.txt").read_text(encoding="utf-8").splitlines()[:40] if lang != "zh" else []
        files[lang] = d / f"{lang}.txt"
        files[lang].write_text("\n".join(toy + LEARN[lang] + LEARN["ru"][:1]) + "\n", encoding="utf-8")
    tok = bpe.Tokenizer.build({k: str(v) for k, v in files.items()}, num_merges=300, verbose=False)
    model = tiny_model(tok.vocab_size("en"), n_langs=3)
    M.save_model(d / "best.pt", model, tokenizer=tok.to_dict(), langs=tok.langs)
    return tok, d / "best.pt", model


def test_export_hf_cli_transformers_same_ids_and_logits(learned, toy_world, tmp_path, capsys):
    pytest.importorskip("transformers", reason="transformers is not a dependency: pip install transformers")
    from transformers import PreTrainedTokenizerFast, XLMWithLMHeadModel
    torch.set_num_threads(1)
    tok, ckpt, model = learned
    V = model.config.vocab_size
    M.main(["export", str(ckpt), str(tmp_path / "hf")])                       # python model.py export CKPT OUT
    assert "wrote" in capsys.readouterr().out
    M.export_hf(str(ckpt), str(tmp_path / "hf_zh"), lang="zh")
    dev = [line for lang in ("en", "fr") for line in
           (toy_world / f"mono/{lang}.dev.txt").read_text(encoding="utf-8").splitlines()[:30]]
    shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "monolingual")
    real = list(REAL.values()) + [line for name in sorted(os.listdir(shared)) if name.endswith(".txt")
                                  for line in list(bpe.read_lines(os.path.join(shared, name), 10))] \
        if os.path.isdir(shared) else list(REAL.values())
    n_tokens = n_unk_alias = 0
    for lang, out in (("en", "hf"), ("zh", "hf_zh")):
        hf_tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / out))
        for line in dev + real:
            ours = [M.EOS_ID] + tok.encode(line, lang) + [M.EOS_ID]
            theirs = hf_tok(line)["input_ids"]
            # the same ids; where ours says <unk> (3), HF may give one of the BPE symbols our vocabulary lacks
            # (ids >= V), whose embedding row IS <unk>'s
            assert [i if i < V else bpe.UNK_ID for i in theirs] == ours, (lang, line)
            assert all(o == bpe.UNK_ID for o, t in zip(ours, theirs) if t >= V)
            n_tokens, n_unk_alias = n_tokens + len(ours), n_unk_alias + sum(t >= V for t in theirs)
    assert n_unk_alias < 0.05 * n_tokens
    hf = XLMWithLMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "hf"))
    for lang, lines in (("en", dev[:4] + real[:5]), ("fr", dev[-4:] + real[:5])):
        enc = hf_tok(lines, padding=True, truncation=True, return_tensors="pt")   # cut to the 64 positions
        li = tok.langs.index(lang)
        with torch.no_grad():
            theirs = hf(**enc, langs=torch.full_like(enc["input_ids"], li)).logits
            ids = torch.where(enc["input_ids"] >= V, bpe.UNK_ID, enc["input_ids"])
            ours = model(ids, li, attn_mask=enc["attention_mask"].bool())[0]
        assert (theirs[..., V:] <= M.HF_UNUSED_BIAS / 2).all()                    # never predicted
        mask = enc["attention_mask"].bool()
        assert (theirs[..., :V][mask] - ours[mask]).abs().max() < 1e-5
        rows = [[M.EOS_ID] + tok.encode(s, lang)[:62] + [M.EOS_ID] for s in lines]  # as iter_states cuts them
        assert [[i if i < V else 3 for i in r[:len(o)]] for r, o in zip(enc["input_ids"].tolist(), rows)] == rows
    assert len(rows[-1]) == 64 and len(tok.encode(REAL["long"], "fr")) > 64


def test_export_hf_without_safetensors_writes_pytorch_model_bin(learned, tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not a dependency: pip install transformers")
    from transformers import XLMWithLMHeadModel
    tok, ckpt, model = learned
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)                # as if not installed
    files = M.export_hf(str(ckpt), str(tmp_path / "hf"))
    assert os.path.basename(files[0]) == "pytorch_model.bin"
    monkeypatch.undo()
    hf = XLMWithLMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.tensor([[1] + tok.encode("Été comme hiver", "fr") + [1]])
    with torch.no_grad():
        assert (hf(x, langs=torch.ones_like(x)).logits[..., :model.config.vocab_size] - model(x, 1)[0]).abs().max() < 1e-5


# -----------------------------------------------------------------------------
# released XLM checkpoints in align.py, cka.py and finetune.py: a checkpoint in XLM's layout, written here

def write_xlm_release(d, toy_world, use_lang_emb=True):
    """What XLM publishes for a model such as mlm_enfr_1024, made as XLM's tools make it: fastBPE codes
    ('left right count' lines, no header), the vocabulary of the BPE'd training text by count (XLM
    data/dictionary.py: specials first, pieces that a word continues end in '@@') and train.py's checkpoint
    {model, dico_id2word, dico_word2id, dico_counts, params} with XLM's state-dict names (2 layers, d 16)."""
    from collections import Counter

    from test_model import xlm_state_dict
    lines = [s for lang in ("en", "fr") for s in (toy_world / f"mono/{lang}.train.txt").read_text("utf-8").splitlines()[:300]]
    counts = Counter(w for s in lines for w in s.split())                     # Moses output: words between spaces
    merges = bpe.learn_bpe(counts, 300)
    (d / "codes_enfr").write_text("".join(f"{a} {b} {10 ** 6 - i}\n" for i, (a, b) in enumerate(merges)), "utf-8")
    pieces = Counter()
    for w, c in counts.items():
        for p in bpe.BPE(merges).apply_words([w]):
            pieces[p] += c
    words = M.XLM_SPECIALS + [w for w, _ in sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0]))]
    sd = xlm_state_dict(len(words), 512, 16, 64, 2, n_langs=2)
    if not use_lang_emb:
        del sd["lang_embeddings.weight"]
    params = {"emb_dim": 16, "n_layers": 2, "n_heads": 2, "n_langs": 2, "langs": ["en", "fr"],
              "id2lang": {0: "en", 1: "fr"}, "lang2id": {"en": 0, "fr": 1}, "use_lang_emb": use_lang_emb,
              "gelu_activation": True, "sinusoidal_embeddings": False, "share_inout_emb": True, "asm": False,
              "dropout": 0.1, "attention_dropout": 0.1, "n_words": len(words), "mlm_steps": [("en", None), ("fr", None)]}
    torch.save({"model": sd, "dico_id2word": dict(enumerate(words)), "dico_word2id": {w: i for i, w in enumerate(words)},
                "dico_counts": {w: pieces.get(w, 0) for w in words}, "params": params}, d / "mlm_enfr.pth")
    return d / "mlm_enfr.pth", d / "codes_enfr", sd, words, lines


def test_xlm_checkpoint_ids_and_forward_are_xlms(toy_world, tmp_path):
    from test_model import xlm_forward
    pth, codes, sd, words, lines = write_xlm_release(tmp_path, toy_world)
    model, extra = M.load_model(str(pth))
    c = model.config
    assert (c.vocab_size, c.n_langs, c.dim, c.ffn_dim, c.max_positions, c.lang_emb) == (len(words), 2, 16, 64, 512, True)
    tok, langs = bpe.checkpoint_tokenizer(extra, str(pth), str(codes))
    assert langs == ["en", "fr"] and not tok.lowercase                         # the vocabulary has capitals
    fast = bpe.BPE.load(str(codes))                                            # fastBPE codes read again
    word2id = {w: i for i, w in enumerate(words)}
    for k, line in enumerate(lines[:20] + lines[-20:] + ["Qux zorglub !"]):
        lang = "en" if k < 20 else "fr"
        # XLM's route: apply the codes to the (already tokenised) line, '@@' pieces, then the dictionary
        assert tok.encode(line, lang) == [word2id.get(p, 3) for p in fast.apply(line).split()], line
    x = [1] + tok.encode(lines[-1], "fr") + [1]
    ref = xlm_forward(sd, torch.tensor([x]).t(), torch.tensor([len(x)]), torch.ones(len(x), 1, dtype=torch.long), 2, 2)
    with torch.no_grad():
        assert (model(torch.tensor([x]), 1)[0][0] - ref[:, 0]).abs().max() < 1e-5  # language 1 = fr
    low = bpe.checkpoint_tokenizer({"xlm_vocab": M.XLM_SPECIALS + ["ete", "noel"], "langs": ["en"]}, "x", str(codes))[0]
    assert low.lowercase                                                       # XLM-15 style: lowercased, no accents
    pth2, *_ = write_xlm_release(tmp_path, toy_world, use_lang_emb=False)
    assert not M.load_model(str(pth2))[0].config.lang_emb


def test_xlm_checkpoint_runs_through_cka_align_and_finetune(toy_world, tmp_path, capsys):
    import align
    import cka
    import finetune
    torch.set_num_threads(1)
    pth, codes, *_ = write_xlm_release(tmp_path, toy_world)
    header, rows = cka.main(["--toy", str(toy_world), "--ckpt", str(pth), "--xlm-codes", str(codes), "--max-sents", "40"])
    assert header == ["layer", "bilingual", "random"] and [r[0] for r in rows] == ["L0", "L1", "L2", "avg"]
    align.main(["sentences", "--toy", str(toy_world), "--ckpt", str(pth), "--xlm-codes", str(codes), "--max-sents", "40"])
    out = capsys.readouterr().out
    assert "| L2 |" in out and "| avg |" in out
    model, tok, langs, _ = finetune.load_ckpt(str(pth), "--ckpt", "cpu", str(codes))
    assert langs == ["en", "fr"] and model.config.lang_emb
    # mistakes: one line each
    with pytest.raises(SystemExit, match=r"an XLM checkpoint; give its fastBPE codes file with --xlm-codes") as e:
        cka.main(["--toy", str(toy_world), "--ckpt", str(pth)])
    assert "\n" not in str(e.value)
    ours = tmp_path / "ours.pt"
    M.save_model(ours, tiny_model(21), tokenizer=TINY_RECORD, langs=["en", "fr"])
    with pytest.raises(SystemExit, match=r"--xlm-codes .*ours\.pt is not an XLM checkpoint"):
        align.main(["sentences", "--toy", str(toy_world), "--ckpt", str(ours), "--xlm-codes", str(codes)])
    with pytest.raises(SystemExit, match="--xlm-codes nope: no such file"):
        cka.main(["--toy", str(toy_world), "--ckpt", str(pth), "--xlm-codes", "nope"])
