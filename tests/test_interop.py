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
    torch.testing.assert_close(again(x, 1)[0], model(x, 1)[0], rtol=0, atol=0)


def test_export_hf_refuses_sep_and_bad_lang(tmp_path):
    M.save_model(tmp_path / "sep.pt", tiny_model(21, **M.parse_sep("1")), tokenizer=TINY_RECORD, langs=["en", "fr"])
    with pytest.raises(SystemExit, match=r"language-specific parts \(--sep 1\) has no transformers") as e:
        M.main(["export", str(tmp_path / "sep.pt"), str(tmp_path / "out")])
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    M.save_model(tmp_path / "m.pt", tiny_model(21), tokenizer=TINY_RECORD, langs=["en", "fr"])
    with pytest.raises(SystemExit, match="--lang de: not one of"):
        M.main(["export", str(tmp_path / "m.pt"), str(tmp_path / "out"), "--lang", "de"])


# -----------------------------------------------------------------------------
# transformers itself (installed beside the project, never a dependency)

@pytest.fixture(scope="module")
def learned(toy_world, tmp_path_factory):
    """(Tokenizer, checkpoint path) of a joint en/fr/zh tokenizer learned on toy text plus real sentences
    (LEARN), so that real text gets merges, unknown characters and pieces outside the vocabulary."""
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
