"""User-side faults in finetune.py, align.py and cka.py (issue 14): every mistake ends in one clear line
naming the flag, or the file and line; none leaves a half-written file or a results file that looks valid.

Run: python -m pytest -q tests/test_faults_finetune.py
"""
import re
import shlex

import pytest
import torch

import finetune as ft

torch.set_num_threads(1)  # tiny tensors: extra threads only spin on a shared 2-core machine

# -----------------------------------------------------------------------------
# readers: file:line errors (XNLI labels, UTF-8, CoNLL-U trees)

GOOD_XNLI = "A man.\tA person.\tentailment\nB.\tC.\tneutral\n"
GOOD_NER = "Paris\tB-LOC\nis\tO\n\nRome\tB-LOC\n"
# word ids 1..4, a valid tree: 2 is the root, 1 -> 2, 3 -> 2, 4 -> 3
GOOD_CONLLU = ("# sent_id = a\n1\tA\ta\tDET\t_\t_\t2\tdet\t_\t_\n2\tdog\tdog\tNOUN\t_\t_\t0\troot\t_\t_\n\n"
               "# sent_id = b\n# text = x\n1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_\n2\tsee\tsee\tVERB\t_\t_\t0\troot\t_\t_\n"
               "3\tit\tit\tPRON\t_\t_\t2\tobj\t_\t_\n4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_\n")


def _conllu_heads(heads):
    """Second sentence of GOOD_CONLLU (starting at line 5) with the given HEAD column for words 1..4."""
    lines = GOOD_CONLLU.split("\n")
    for k, h in enumerate(heads):
        cols = lines[6 + k].split("\t")
        cols[6] = str(h)
        lines[6 + k] = "\t".join(cols)
    return "\n".join(lines)


READER_FAULTS = [
    # (reader, file content (bytes or str), expected message; {p} = the file's path)
    (ft.read_xnli, "A.\tB.\tentailment\nC.\tD.\tneutrall\n",
     "{p}:2: unknown XNLI label 'neutrall' (expected entailment, neutral, contradiction)"),
    (ft.read_xnli, GOOD_XNLI.encode() + b"caf\xe9\tx\tneutral\n", "{p}:3: not valid UTF-8"),
    (ft.read_ner, GOOD_NER.encode() + b"\nM\xfcnchen\tB-LOC\n", "{p}:6: not valid UTF-8"),
    (ft.read_conllu, GOOD_CONLLU.encode().replace(b"dog\tdog", b"d\xc3g\tdog"), "{p}:3: not valid UTF-8"),
    (ft.read_conllu, _conllu_heads([2, 0, 2, 4]), "{p}:5: sentence is not a tree: words 4 -> 4 form a cycle"),
    (ft.read_conllu, _conllu_heads([2, 0, 0, 3]), "{p}:5: sentence is not a tree: 2 words on ROOT"),
    (ft.read_conllu, _conllu_heads([2, 3, 2, 3]), "{p}:5: sentence is not a tree: 0 words on ROOT"),
    (ft.read_conllu, _conllu_heads([2, 0, 4, 3]), "{p}:5: sentence is not a tree: words 3 -> 4 -> 3 form a cycle"),
    (ft.read_conllu, _conllu_heads([2, 0, 2, 5]), "{p}:10: head 5 outside 0..4"),
    # issue 37: a line of spaces inside a sentence was read as its end, the error then named line 2
    (ft.read_conllu, GOOD_CONLLU.replace("\n2\tdog", "\n   \n2\tdog", 1), "{p}:3: a line of only spaces or tabs"),
]


@pytest.mark.parametrize("reader, content, msg", READER_FAULTS, ids=[
    "xnli-label", "xnli-utf8", "ner-utf8", "conllu-utf8", "conllu-self-loop", "conllu-two-roots", "conllu-no-root",
    "conllu-cycle", "conllu-head-range", "conllu-line-of-spaces"])
def test_reader_faults_name_file_and_line(tmp_path, reader, content, msg):
    p = tmp_path / "data.txt"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=re.escape(msg.format(p=p))) as e:
        reader(str(p))
    assert "\n" not in str(e.value)


def test_readers_accept_the_good_files(tmp_path):
    for reader, text in ((ft.read_xnli, GOOD_XNLI), (ft.read_ner, GOOD_NER), (ft.read_conllu, GOOD_CONLLU)):
        p = tmp_path / "ok.txt"
        p.write_text(text)
        assert len(reader(str(p))) == 2
    p.write_text(GOOD_CONLLU)
    assert ft.read_conllu(str(p))[1]["heads"] == [2, 0, 2, 3]


# -----------------------------------------------------------------------------
# finetune.py CLI: bad flags and files, checked before any work


@pytest.fixture(scope="module")
def toy_ckpt(toy_world, tmp_path_factory):
    """A tiny random-init checkpoint with a tokenizer (as tests/test_finetune.py builds it)."""
    import bpe
    from model import MLM, ModelConfig, save_model
    tok = bpe.Tokenizer.build({l: str(toy_world / f"mono/{l}.train.txt") for l in ("en", "fr")},
                              num_merges=300, verbose=False)
    torch.manual_seed(0)
    m = MLM(ModelConfig(vocab_size=tok.vocab_size("en"), n_layers=2, n_heads=2, dim=32, ffn_dim=64, max_positions=24))
    path = tmp_path_factory.mktemp("faults_ckpt") / "best.pt"
    save_model(path, m, tokenizer=tok.to_dict(), langs=["en", "fr"])
    return path


@pytest.fixture(scope="module")
def nan_ckpt(toy_ckpt):
    raw = torch.load(toy_ckpt, weights_only=True)
    raw["model"]["blocks.0.0.attn.qkv.weight"][0, 0] = float("nan")
    path = toy_ckpt.parent / "nan.pt"
    torch.save(raw, path)
    return path


# (extra argv, expected message); argparse errors go to stderr as `finetune.py: error: argument --flag: ...`
FT_BAD_FLAGS = [
    (["--batch-size", "0"], "argument --batch-size: expected one integer in [1, inf), got '0'"),
    (["--batch-sizes", ","], "argument --batch-sizes: expected a comma list of integers in [1, inf), got ','"),
    (["--batch-sizes", "16,0.5"], "argument --batch-sizes: expected a comma list of integers in [1, inf), got '16,0.5'"),
    (["--epochs", "0"], "argument --epochs: expected one integer in [1, inf), got '0'"),
    (["--epochs", "-3"], "argument --epochs: expected one integer in [1, inf)"),
    (["--epochs", "2.5"], "argument --epochs: expected one integer in [1, inf), got '2.5'"),
    (["--epoch-size", "-1"], "argument --epoch-size: expected one integer in [0, inf)"),
    (["--lrs", ","], "argument --lrs: expected a comma list of numbers in (0, inf), got ','"),
    (["--lr=-1e-3"], "argument --lr: expected one number in (0, inf)"),
    (["--lr", "nan"], "argument --lr: expected one number in (0, inf)"),
    (["--lr", "inf"], "argument --lr: expected one number in (0, inf)"),
    (["--lrs", "1e-3,x"], "argument --lrs: expected a comma list of numbers in (0, inf), got '1e-3,x'"),
    (["--head-lr", ""], "argument --head-lr: expected one number in (0, inf)"),
    # issue 22: a learning rate of 0 trains nothing; a repeated value trains one set twice and counts it twice in
    # the mean of the best two; --seed -1 was refused by torch after the files were read (leaving an empty sets/)
    (["--lr", "0"], "argument --lr: expected one number in (0, inf), got '0'"),
    (["--lrs", "1e-3,0"], "argument --lrs: expected a comma list of numbers in (0, inf), got '1e-3,0'"),
    (["--head-lr", "0"], "argument --head-lr: expected one number in (0, inf), got '0'"),
    (["--batch-sizes", "16,16"], "argument --batch-sizes: '16,16' gives a value twice"),
    (["--lrs", "1e-3,0.001"], "argument --lrs: '1e-3,0.001' gives a value twice"),
    # issue 47: a comma list in a one-value flag (deprecated) is refused; the grid flags take lists
    (["--lr", "1e-3,3e-4"], "argument --lr: expected one number in (0, inf), got '1e-3,3e-4'"),
    (["--batch-size", "8", "--batch-sizes", "16"], "argument --batch-sizes: not allowed with argument --batch-size"),
    (["--seed", "-1"], "argument --seed: expected one integer in [0, 4294967296), got '-1'"),
    (["--seed", str(10 ** 30)], "argument --seed: expected one integer in [0, 4294967296)"),
    (["--threads", "100000"], "argument --threads: expected one integer in [0, 1025)"),  # was libgomp's abort
    (["--max-len", "1"], "argument --max-len: expected one integer in [2, inf)"),
    (["--head-dropout", "1.5"], "argument --head-dropout: expected one number in [0, 1)"),
    (["--head-dropout", "nan"], "argument --head-dropout: expected one number in [0, 1)"),
    (["--clip", "-1"], "argument --clip: expected one number in [0, inf)"),
    (["--threads", "-2"], "argument --threads: expected one integer in [0, 1025)"),
    (["--align-layer", "-1"], "argument --align-layer: expected one integer in [0, inf)"),
]


@pytest.mark.parametrize("extra, msg", FT_BAD_FLAGS, ids=[" ".join(a) for a, _ in FT_BAD_FLAGS])
def test_finetune_bad_flag_values(toy_world, toy_ckpt, tmp_path, capsys, extra, msg):
    with pytest.raises(SystemExit) as e:
        ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world),
                 "--out", str(tmp_path / "o")]
                + extra)
    assert e.value.code == 2 and msg in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


FT_BAD_INPUTS = [
    # (extra argv, expected message); {w} = the toy world, {c} = the checkpoint's folder, {t} = tmp_path
    (["--eval-langs", "de"], "error: --eval-langs de: not one of the checkpoint's languages"),
    (["--eval-langs", ","], "error: --eval-langs ',': no target language"),
    (["--train-lang", "xx"], "error: --train-lang xx: not one of the checkpoint's languages"),
    (["--eval-langs", "fr,fr"], "error: --eval-langs fr,fr: a language is given twice"),  # was dropped quietly
    (["--batch-size", "1000000000"], "error: --batch-size 1000000000 is more than the 300 ner training examples"),
    (["--max-len", "1000"], "error: --max-len 1000: the checkpoint has 24 positions, a window at most 22"),  # was 22
    (["--train-file", "{t}/missing.tsv"], "error: --train-file {t}/missing.tsv: not a file"),
    (["--train-file", "{t}"], "error: --train-file {t}: not a file"),
    (["--data", "{t}/nodata"], "error: --data {t}/nodata: no such directory"),
    (["--data", "{t}"], "error: ner: no en train file under --data {t}"),
    (["--toy", "{t}", "--data", "{w}"], "error: --toy {t} and --data {w}: give one data directory"),
    (["--device", "gpu0"], "error: --device gpu0: expected auto, cpu, cuda, cuda:N or mps"),
    (["--device", "xpu"], "error: --device xpu: expected auto, cpu, cuda, cuda:N or mps"),
    (["--dtype", "float16"], "error: --dtype float16: fine-tuning has no GradScaler"),
    (["--target-ckpt", "{c}/best.pt"], "error: --align-layer, --target-ckpt and --align-maps go together"),
    (["--align-layer", "1"], "error: --align-layer, --target-ckpt and --align-maps go together"),
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt"], "error: --align-layer, --target-ckpt and --align-maps go"),
    (["--align-layer", "9", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/maps.npz"],
     "error: --align-layer 9 outside 0..2"),
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/missing.npz"],
     "error: --align-maps: cannot read {t}/missing.npz"),
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/nan.npz"],
     "error: --align-maps: {t}/nan.npz: no finite layer-1 map"),
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/bad.npz"],
     "error: --align-maps: cannot read {t}/bad.npz: KeyError"),
    (["--align-layer", "1", "--target-ckpt", "{c}/nan.pt", "--align-maps", "{t}/maps.npz"],
     "error: --target-ckpt: {c}/nan.pt: weight 'blocks.0.0.attn.qkv.weight' contains NaN or inf"),
    # issue 37: maps fitted on other models were accepted (the .npz named only the language pair)
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/other-en.npz"],
     "error: --align-maps {t}/other-en.npz: its en side was fitted on the checkpoint sha256:0000000000000000, not on "
     "--ckpt {c}/best.pt (sha256:"),
    (["--align-layer", "1", "--target-ckpt", "{c}/best.pt", "--align-maps", "{t}/other-fr.npz"],
     "error: --align-maps {t}/other-fr.npz: its fr side was fitted on the checkpoint sha256:0000000000000000, not on "
     "--target-ckpt {c}/best.pt"),
    # issue 37: the epoch and the sets chosen on the training data; a grid axis that does not apply to the task
    (["--train-file", "{w}/ner/en.dev.tsv"], "error: ner: the train file {w}/ner/en.dev.tsv holds 120 of the 120 "
     "examples of the en dev file {w}/ner/en.dev.tsv: scores on training data (--allow-overlap if meant)"),
    (["--train-file", "{t}/train+dev.tsv"], "error: ner: the train file {t}/train+dev.tsv holds 120 of the 120 "
     "examples of the en dev file {w}/ner/en.dev.tsv"),  # MUSE's case: a train file that holds the dev set
    (["--data", "{t}/w1"], "error: ner: {t}/w1/ner/en.dev.tsv: one example; a score on one example is not a result"),
    (["--head-lrs", "1e-3"], "error: --head-lr(s) is the XNLI classifier's learning rate: --task ner has no such"),
]


@pytest.mark.parametrize("extra, msg", FT_BAD_INPUTS, ids=[" ".join(a) for a, _ in FT_BAD_INPUTS])
def test_finetune_bad_inputs_one_line_before_any_work(toy_world, toy_ckpt, nan_ckpt, tmp_path, extra, msg):
    import numpy as np
    eye = np.stack([np.eye(32, dtype=np.float32)] * 3)
    np.savez(tmp_path / "maps.npz", src_to_tgt=eye, tgt_to_src=eye, src="en", tgt="fr")
    np.savez(tmp_path / "nan.npz", src_to_tgt=eye * np.nan, tgt_to_src=eye * np.nan, src="en", tgt="fr")
    np.savez(tmp_path / "bad.npz", maps=eye, src="en", tgt="fr")
    (tmp_path / "train+dev.tsv").write_text((toy_world / "ner/en.train.tsv").read_text() + "\n"
                                             + (toy_world / "ner/en.dev.tsv").read_text())
    (tmp_path / "w1/ner").mkdir(parents=True)
    for split in ("en.train", "fr.test"):
        (tmp_path / f"w1/ner/{split}.tsv").write_text((toy_world / f"ner/{split}.tsv").read_text())
    (tmp_path / "w1/ner/en.dev.tsv").write_text("Paris\tB-LOC\n")
    ours, other = ft.digest(str(toy_ckpt)), "sha256:" + "0" * 16  # the digests align.py records
    for src, tgt in (("en", "fr"), ("fr", "en")):
        np.savez(tmp_path / f"other-{src}.npz", src_to_tgt=eye, tgt_to_src=eye, src=src, tgt=tgt,
                 src_ckpt_digest=other, tgt_ckpt_digest=ours)
    fill = lambda x: x.format(w=toy_world, c=toy_ckpt.parent, t=tmp_path)  # noqa: E731
    if "--align-layer" in extra:
        extra = extra + ["--eval-langs", "fr"]
    toy = [] if "--data" in extra else ["--toy", "--data", str(toy_world)]
    with pytest.raises(SystemExit, match=re.escape(fill(msg))) as e:
        ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--out", str(tmp_path / "o"), "--epochs", "1", "--lr",
                 "1e-3", "--batch-size", "32"] + toy + [fill(a) for a in extra])
    assert "\n" not in str(e.value.code)
    assert not list(tmp_path.glob("o/**/*.json"))


@pytest.mark.parametrize("kind", ["zero bytes", "truncated", "NaN weights", "plain tensor", "directory"])
def test_finetune_damaged_checkpoint(toy_world, toy_ckpt, nan_ckpt, tmp_path, kind):
    path = {"NaN weights": nan_ckpt, "directory": tmp_path}.get(kind, tmp_path / "bad.pt")
    if kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(toy_ckpt.read_bytes()[:1000])
    elif kind == "plain tensor":
        torch.save(torch.ones(2), path)
    with pytest.raises(SystemExit, match=f"^error: --ckpt: .*{re.escape(str(path))}") as e:
        ft.main(["--task", "ner", "--ckpt", str(path), "--toy", "--data", str(toy_world), "--out", str(tmp_path / "o")])
    assert "\n" not in str(e.value.code)
    assert not (tmp_path / "o").exists()


def test_finetune_bad_data_file_stops_before_training(toy_world, toy_ckpt, tmp_path, monkeypatch):
    """A bad test file of the LAST task (parsing) stops the --toy run before XNLI trains at all."""
    world = tmp_path / "world"
    import shutil
    shutil.copytree(toy_world, world)
    conllu = world / "ud/fr.test.conllu"
    text = conllu.read_text().replace("\t0\troot\t", "\t1\troot\t", 1)  # the first sentence's root -> word 1
    conllu.write_text(text)
    trained = []
    monkeypatch.setattr(ft, "finetune_one", lambda *a, **k: trained.append(1))
    with pytest.raises(SystemExit, match=re.escape(str(conllu)) + r":1: .*not a tree"):
        ft.main(["--toy", "--data", str(world), "--ckpt", str(toy_ckpt), "--epochs", "1", "--lr", "1e-3", "--out",
                 str(tmp_path / "o")])
    assert trained == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_finetune_device_cuda_without_cuda(toy_world, toy_ckpt, tmp_path):
    for dev in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit, match=f"^error: --device {dev}: CUDA is not available on this machine"):
            ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world),
                     "--out", str(tmp_path),
                     "--device", dev])


def test_finetune_unwritable_out_and_table_inputs(toy_world, toy_ckpt, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, msg in ((afile, "exists and is not a directory"), (afile / "sub", "cannot create the directory")):
        with pytest.raises(SystemExit, match=f"^error: --out {re.escape(str(out))}: {msg}"):
            ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out)])
    with pytest.raises(SystemExit, match=f"^error: --table: no results.json under {re.escape(str(tmp_path / 'no'))}"):
        ft.main(["--table", str(tmp_path / "no")])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text("{not JSON")
    with pytest.raises(SystemExit, match=f"^error: --table: cannot read {re.escape(str(tmp_path / 'run'))}"):
        ft.main(["--table", str(tmp_path / "run")])
    (tmp_path / "run" / "results.json").write_text("[1, 2]")  # JSON, but not finetune.py's
    with pytest.raises(SystemExit, match="no results.json under"):
        ft.main(["--table", str(tmp_path / "run")])


GOOD_RESULTS = {"task": "ner", "metric": "f1", "test": {"fr": {"f1": 0.5, "precision": 0.5, "recall": 0.5}},
                "pretrain": {"step": 30, "dev_ppl": {"en": 10.0, "fr": 11.0}}}
TABLE_EDITS = [
    # (a hand edit of a results.json, read by --table); issue 22: each was a traceback (KeyError, TypeError, ...)
    ("as written", lambda r: r),
    ("score as text", lambda r: r["test"]["fr"].update(f1="50%")),
    ("score null", lambda r: r["test"]["fr"].update(f1=None)),
    ("score not a dict", lambda r: r["test"].update(fr=0.5)),
    ("score removed", lambda r: r["test"]["fr"].pop("f1")),
    ("other metric", lambda r: r.update(metric="acc")),
    ("ppl as text", lambda r: r["pretrain"].update(dev_ppl={"en": "ten"})),
    ("pretrain a list", lambda r: r.update(pretrain=[1])),
    ("no test language", lambda r: r.update(test={})),  # was "no results.json under DIR"
]


@pytest.mark.parametrize("edit", [e for _, e in TABLE_EDITS], ids=[name for name, _ in TABLE_EDITS])
def test_table_refuses_a_hand_edited_results_json(tmp_path, capsys, edit):
    import copy
    import json
    r = copy.deepcopy(GOOD_RESULTS)
    edit(r)
    run = tmp_path / "default-s0"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(r))
    if r == GOOD_RESULTS:
        ft.main(["--table", str(run)])
        assert "50.0" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit, match=f"^error: --table: {re.escape(str(run / 'results.json'))}: not a "
                                         "results.json as finetune.py writes it") as e:
        ft.main(["--table", str(run)])
    assert "\n" not in str(e.value.code)


@pytest.fixture(scope="module")
def finished_ner(toy_world, toy_ckpt, tmp_path_factory):
    """--out of a finished one-set NER run (sets/bs-32-lr-0.001.json and results.json) and its argv."""
    out = tmp_path_factory.mktemp("finished") / "o"
    argv = NER_RUN[:-2] + ["--lr", "1e-3", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out)]
    ft.main(argv)
    return out, argv


SET_EDITS = [
    # (a hand edit of the finished set's record, sets/*.json); the same command again would have averaged it
    ("score as text", lambda rec: rec["test"]["fr"].update(f1="high")),
    ("dev removed", lambda rec: rec.pop("dev")),
    ("other lr", lambda rec: rec.update(lr=5.0)),
    ("other language", lambda rec: rec.update(test={"de": rec["test"]["fr"]})),
    ("record null", None),
]


@pytest.mark.parametrize("edit", [e for _, e in SET_EDITS], ids=[name for name, _ in SET_EDITS])
def test_a_hand_edited_set_is_refused_before_training(finished_ner, tmp_path, monkeypatch, edit):
    import json
    import shutil
    old, argv = finished_ner
    out = tmp_path / "o"
    shutil.copytree(old, out)
    path = out / "sets" / "bs-32-lr-0.001.json"
    saved = json.loads(path.read_text())
    edit(saved["record"]) if edit else saved.update(record=None)
    path.write_text(json.dumps(saved))
    before = (out / "results.json").read_bytes()
    monkeypatch.setattr(ft, "finetune_one", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit, match=f"^error: {re.escape(str(path))}: not a finished set as finetune.py "
                                         "writes it .*remove it to train that set again, or pass --overwrite"):
        ft.main(argv[:-1] + [str(out)])
    assert (out / "results.json").read_bytes() == before


def test_write_json_full_disk_leaves_no_file(tmp_path, monkeypatch):
    import errno
    import json

    def full(obj, f, **kw):
        f.write('{"half": ')
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(json, "dump", full)
    target = tmp_path / "results.json"
    with pytest.raises(SystemExit, match=f"^error: no space left writing {re.escape(str(target))}$"):
        ft.write_json(target, {"a": 1})
    assert list(tmp_path.iterdir()) == []


# -----------------------------------------------------------------------------
# finetune.py: each finished set on disk at once, resume, results.json policy, diverged sets

NER_RUN = ["--task", "ner", "--epochs", "1", "--batch-size", "32", "--lrs", "1e-3,3e-4"]


def test_interrupted_grid_resumes_and_other_flags_are_refused(toy_world, toy_ckpt, tmp_path, monkeypatch, capsys):
    import json
    out = tmp_path / "o"
    argv = NER_RUN + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out)]
    real = ft.finetune_one
    calls = []

    def interrupted(*a, **k):  # the machine goes down during the second set
        calls.append(a[4]["lr"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(ft, "finetune_one", interrupted)
    with pytest.raises(SystemExit) as e:  # Ctrl-C: one line saying what is kept (was a KeyboardInterrupt traceback)
        ft.main(argv)
    assert e.value.code == 130 and capsys.readouterr().err == (
        f"finetune.py: interrupted; 1 finished hyper-parameter set(s) kept in {out} (the set in progress starts "
        f"again); to go on, run python finetune.py {shlex.join(str(a) for a in argv)}\n")
    sets = sorted(p.name for p in (out / "sets").iterdir())
    assert sets == ["bs-32-lr-0.001.json"] and not (out / "results.json").exists()  # the first set is kept

    calls.clear()
    monkeypatch.setattr(ft, "finetune_one", lambda *a, **k: calls.append(a[4]["lr"]) or real(*a, **k))
    ft.main(argv)  # same flags: resume, only the second set trains
    text = capsys.readouterr().out
    assert calls == [3e-4] and text.count("finished in an earlier run") == 1
    res = json.loads((out / "results.json").read_text())
    assert [c["lr"] for c in res["configs"]] == [1e-3, 3e-4] and sorted(res["best_two"]) == [0, 1]
    assert sorted(p.name for p in (out / "sets").iterdir()) == ["bs-32-lr-0.0003.json", "bs-32-lr-0.001.json"]

    # the same command again: nothing trains, results.json is written again from the finished sets, unchanged
    calls.clear()
    before = (out / "results.json").read_bytes()
    ft.main(argv)
    assert calls == [] and capsys.readouterr().out.count("finished in an earlier run") == 2
    assert (out / "results.json").read_bytes() == before

    # other flags: results.json is refused, and so are the sets of the other run
    with pytest.raises(SystemExit, match=r"results.json already exists, from another run \(other epochs\)"
                                         r".*--overwrite"):
        ft.main(argv + ["--epochs", "2"])
    (out / "results.json").unlink()
    with pytest.raises(SystemExit, match=r"sets/bs-32-lr-0.0003.json already exists, from another run "
                                         r"\(other seed\)"):
        ft.main(argv + ["--seed", "1"])
    assert calls == []
    # --overwrite: a fresh grid; the old sets are gone, every record is of the new flags
    ft.main(argv + ["--seed", "1", "--overwrite"])
    assert calls == [1e-3, 3e-4]
    res = json.loads((out / "results.json").read_text())
    assert res["args"]["seed"] == 1 and res["job"]["seed"] == 1
    for p in (out / "sets").iterdir():
        assert json.loads(p.read_text())["job"]["seed"] == 1


def test_results_json_of_another_job_is_not_overwritten(toy_world, toy_ckpt, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.json").write_text('{"task": "ner", "note": "an earlier, precious run"}')
    argv = NER_RUN + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out), "--lrs", "1e-3"]
    with pytest.raises(SystemExit, match=f"^error: {re.escape(str(out / 'results.json'))} already exists"):
        ft.main(argv)
    assert "precious" in (out / "results.json").read_text()
    ft.main(argv + ["--overwrite"])
    assert "precious" not in (out / "results.json").read_text()


@pytest.mark.parametrize("epoch_size", [100, 10 ** 12])
def test_epoch_stream_is_drawn_as_it_is_reached(toy_world, toy_ckpt, tmp_path, monkeypatch, epoch_size):
    """The epochs cut one endless stream of permutations of the train set (XLM); it is drawn batch by batch, so
    --epoch-size 10**12 starts training (the whole epoch's order was built first: memory for 10**12 indices)."""
    import numpy as np
    seen = []

    def run(self, model, head, batch, lang, predict=False):
        if not predict:
            seen.append([id(x) for x in batch])
            if len(seen) == 7:
                raise InterruptedError
        return real(self, model, head, batch, lang, predict)
    real = ft.NERTask.run
    monkeypatch.setattr(ft.NERTask, "run", run)
    order = {}
    real_prepare = ft.prepare_task

    def prepare(*a, **k):
        task, data = real_prepare(*a, **k)
        order.update({id(x): i for i, x in enumerate(data["train"][1])})
        return task, data
    monkeypatch.setattr(ft, "prepare_task", prepare)
    monkeypatch.setattr(ft, "evaluate", lambda *a, **k: {"f1": 0.0})  # the dev score between the epochs
    with pytest.raises(InterruptedError):
        ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", str(toy_world), "--out", str(tmp_path / "o"),
                 "--epochs", "2", "--lr", "1e-3", "--batch-size", "32", "--epoch-size", str(epoch_size)])
    rng = np.random.default_rng(0)  # --seed 0: the stream is permutations of the 300 examples, one after another
    stream = np.concatenate([rng.permutation(300) for _ in range(2)])
    sizes = [32, 32, 32, 4, 32, 32, 32] if epoch_size == 100 else [32] * 7  # epoch 1 ends after 100 examples
    want = [x.tolist() for x in np.split(stream[:sum(sizes)], np.cumsum(sizes)[:-1])]
    assert [[order[i] for i in b] for b in seen] == want


def test_a_diverged_set_is_left_out_and_all_diverged_writes_nothing(toy_world, toy_ckpt, tmp_path, monkeypatch, capsys):
    """NaN loss in the set with the larger learning rate: that set stops (named, with the epoch), the
    selection uses the other; NaN in every set: no results.json at all, one error line."""
    import json
    real = ft.NERTask.run
    nan_if = {"lr": 1e-3}

    def run(self, model, head, batch, lang, predict=False):
        opt_lr = nan_if["lr"]
        out = real(self, model, head, batch, lang, predict)
        return out * float("nan") if not predict and (opt_lr is None or current["lr"] == opt_lr) else out
    current = {}
    real_one = ft.finetune_one
    monkeypatch.setattr(ft, "finetune_one", lambda *a, **k: current.update(a[4]) or real_one(*a, **k))
    monkeypatch.setattr(ft.NERTask, "run", run)
    argv = NER_RUN + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world)]
    ft.main(argv + ["--out", str(tmp_path / "a")])
    text = capsys.readouterr().out
    assert "set 1/2 stopped: non-finite training loss (nan) at epoch 1, update 1" in text
    assert "1 diverged set(s) left out" in text
    res = json.loads((tmp_path / "a/results.json").read_text())
    assert "failed" in res["configs"][0] and res["best_two"] == [1]
    assert res["dev"] == res["configs"][1]["dev"]

    nan_if["lr"] = None  # every set diverges
    with pytest.raises(SystemExit, match="every hyper-parameter set diverged"):
        ft.main(argv + ["--out", str(tmp_path / "b")])
    assert not (tmp_path / "b/results.json").exists()


# -----------------------------------------------------------------------------
# align.py and cka.py CLIs: bad flags and inputs, one line each, before the encoders run

ALIGN_BAD_FLAGS = [
    (["sentences", "--batch-size", "0"], "argument --batch-size: expected one integer in [1, inf), got '0'"),
    (["sentences", "--max-sents", "0"], "argument --max-sents: expected one integer in [1, inf)"),
    (["words", "--max-sents", "x"], "argument --max-sents: expected one integer in [1, inf), got 'x'"),
]


@pytest.mark.parametrize("argv, msg", ALIGN_BAD_FLAGS, ids=[" ".join(a) for a, _ in ALIGN_BAD_FLAGS])
def test_align_bad_flag_values(argv, msg, capsys):
    import align
    with pytest.raises(SystemExit) as e:
        align.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


BAD_UTF8 = b"le chat\nl'\xe9t\xe9\n"


ALIGN_BAD_INPUTS = [
    # (argv after the sub-command, expected message); {w} toy world, {c} checkpoint folder, {t} tmp_path
    (["sentences", "--ckpt", "{t}/missing.pt", "--toy", "--data", "{w}"], "--ckpt {t}/missing.pt: no such file"),
    (["sentences", "--ckpt", "{t}/empty.pt", "--toy", "--data", "{w}"],
     "{t}/empty.pt: empty file (0 bytes), not a checkpoint"),
    (["sentences", "--ckpt", "{c}/nan.pt", "--toy", "--data", "{w}"],
     "{c}/nan.pt: weight 'blocks.0.0.attn.qkv.weight' contains NaN"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{t}/noworld"], "--data {t}/noworld: no such directory"),
    (["sentences", "--ckpt", "{c}/best.pt", "--test-src", "{t}/no.en", "--test-tgt", "{t}/bad.fr"],
     "--test-src {t}/no.en: no such file"),
    (["sentences", "--ckpt", "{c}/best.pt", "--test-src", "{t}/ok.en", "--test-tgt", "{t}/ok.en", "--train-src",
      "{t}/ok.en"], "--train-src and --train-tgt go together"),
    (["sentences", "--ckpt", "{c}/best.pt", "--test-src", "{t}/ok.en", "--test-tgt", "{t}/bad.fr"],
     "{t}/bad.fr:2: not valid UTF-8"),
    (["words", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--test-dict", "{t}/bad.fr"],
     "{t}/bad.fr:2: not valid UTF-8"),
    (["words", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--src-corpus", "{t}/bad.fr"],
     "{t}/bad.fr:2: not valid UTF-8"),
    (["contextual", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--save-maps", "{t}/nodir/maps.npz"],
     "--save-maps {t}/nodir/maps.npz: cannot write there"),
    (["contextual", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--save-maps", "{t}"], "is a directory"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--device", "gpu"],
     "--device gpu: expected auto, cpu, cuda, cuda:N or mps"),
    # issue 22: the same language on both sides measures nothing (was P@1 100); maps of another run are kept
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--tgt", "en"], "--src and --tgt are both 'en'"),
    (["words", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--src", "fr"], "--src and --tgt are both 'fr'"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--tgt", "f/r"], "--tgt 'f/r': expected a language code"),
    (["sentences", "--ckpt", "{c}/best.pt", "--test-src", "{t}/ok.en", "--test-tgt", "{t}/../{t.name}/ok.en"],
     "are the same file: both sides would be one text"),
    (["contextual", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--save-maps", "{t}/old.npz"],
     "--save-maps {t}/old.npz: exists (maps of an earlier run, perhaps of another checkpoint); pass --overwrite"),
    (["contextual", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--overwrite"],
     "--overwrite goes with --save-maps (it replaces that file)"),  # alone it replaced nothing (was accepted)
    # issue 37: a score on the training data, over one candidate, of one model twice; widths refused before encoding
    (["words", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--train-dict", "{w}/dict/en-fr.test.txt"],
     "--train-dict {w}/dict/en-fr.test.txt: all its pairs are in --test-dict {w}/dict/en-fr.test.txt"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--train-src", "{t}/tat.en", "--train-tgt",
      "{t}/tat.fr"], "--train-src/--train-tgt {t}/tat.en: all its pairs are in --test-src/--test-tgt"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--max-sents", "1"],
     "1 test pair; retrieval needs at least 2 candidates"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--tgt", "en", "--ckpt2", "{t}/copy.pt"],
     "--ckpt2 {t}/copy.pt holds the same model as --ckpt {c}/best.pt (sha256:"),
    (["sentences", "--ckpt", "{c}/best.pt", "--toy", "--data", "{w}", "--ckpt2", "{t}/wide.pt"],
     "--ckpt {c}/best.pt has width 32 but --ckpt2 {t}/wide.pt 64"),
    (["sentences", "--ckpt", "{c}/best.pt", "--test-src", "{t}/ok.en", "--test-tgt", "{t}/copy.fr"],
     "parallel files {t}/ok.en and {t}/copy.fr hold the same lines: both sides would be one text"),
]


@pytest.fixture
def bad_files(tmp_path, toy_world, toy_ckpt):
    from model import MLM, load_model, replace, save_model
    (tmp_path / "copy.pt").write_bytes(toy_ckpt.read_bytes())
    m, extra = load_model(toy_ckpt)
    save_model(tmp_path / "wide.pt", MLM(replace(m.config, dim=64, ffn_dim=128)), **extra)
    for lang in ("en", "fr"):  # a copy of the test pairs
        (tmp_path / f"tat.{lang}").write_bytes((toy_world / f"tatoeba/tatoeba.fr-en.{lang}").read_bytes())
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "bad.fr").write_bytes(BAD_UTF8)
    (tmp_path / "ok.en").write_text("the cat\nthe summer\n")
    (tmp_path / "copy.fr").write_text("the cat\nthe summer\n")
    (tmp_path / "old.npz").write_bytes(b"maps of an earlier run")
    return tmp_path


@pytest.mark.parametrize("argv, msg", ALIGN_BAD_INPUTS, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in ALIGN_BAD_INPUTS])
def test_align_bad_inputs_one_line(toy_world, toy_ckpt, nan_ckpt, bad_files, argv, msg):
    import align
    fill = lambda x: x.format(w=toy_world, c=toy_ckpt.parent, t=bad_files)  # noqa: E731
    with pytest.raises(SystemExit, match=re.escape(fill(msg))) as e:
        align.main([fill(a) for a in argv])
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
    assert [p.name for p in bad_files.rglob("*.npz*")] == ["old.npz"]
    assert (bad_files / "old.npz").read_bytes() == b"maps of an earlier run"


def test_align_save_maps_full_disk_leaves_no_file(tmp_path, monkeypatch):
    import errno
    import numpy as np
    import align

    def full(f, **kw):
        f.write(b"PK half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "savez", full)
    target = str(tmp_path / "maps.npz")
    with pytest.raises(SystemExit, match=f"^error: no space left writing {re.escape(target)}$"):
        align.save_maps(target, [np.eye(2)], "en", "fr")
    assert list(tmp_path.iterdir()) == []


CKA_BAD = [
    (["--max-sents", "1"], "argument --max-sents: expected one integer in [2, inf)"),
    (["--batch-size", "0"], "argument --batch-size: expected one integer in [1, inf)"),
    (["--ckpt", "{t}/empty.pt"], "{t}/empty.pt: empty file (0 bytes)"),
    (["--ckpt", "{c}/nan.pt"], "{c}/nan.pt: weight 'blocks.0.0.attn.qkv.weight' contains NaN"),
    (["--ckpt2", "{t}/none.pt"], "--ckpt2 {t}/none.pt: no such file"),
    (["--src-file", "{t}/bad.fr", "--tgt-file", "{t}/ok.en"], "{t}/bad.fr:2: not valid UTF-8"),
    (["--src-file", "{t}/ok.en", "--tgt-file", "{t}/nothere"], "--tgt-file {t}/nothere: no such file"),
    (["--toy", "--data", "{t}/noworld"], "--data {t}/noworld: no such directory"),
    (["--device", "cuda:x"], "--device cuda:x: expected auto, cpu, cuda, cuda:N or mps"),
    (["--tgt", "en"], "--src and --tgt are both 'en' in one model"),  # issue 22: was CKA 1.000
    (["--tgt", "en", "--ckpt2", "{t}/copy.pt"], "holds the same model as --ckpt"),  # issue 37: was CKA 1.000
    (["--src-file", "{t}/ok.en", "--tgt-file", "{t}/copy.fr"], "hold the same lines: both sides would be one text"),
    (["--src", "e n"], "--src 'e n': expected a language code of letters"),
    (["--src-file", "{t}/ok.en", "--tgt-file", "{t}/ok.en"], "are the same file: both sides would be one text"),
    (["--seed", "-1"], "argument --seed: expected one integer in [0, 4294967296), got '-1'"),  # was accepted
    # was "Overflow when unpacking long long"
    (["--seed", str(10 ** 23)], "argument --seed: expected one integer in [0, 4294967296)"),
]


@pytest.mark.parametrize("argv, msg", CKA_BAD, ids=[" ".join(a[:1]) for a, _ in CKA_BAD])
def test_cka_bad_inputs_one_line(toy_world, toy_ckpt, nan_ckpt, bad_files, capsys, argv, msg):
    import cka
    fill = lambda x: x.format(w=toy_world, c=toy_ckpt.parent, t=bad_files)  # noqa: E731
    given = "--toy" in argv or "--src-file" in argv
    base = ["--ckpt", str(toy_ckpt)] + ([] if given else ["--toy", "--data", str(toy_world)])
    with pytest.raises(SystemExit) as e:
        cka.main(base + [fill(a) for a in argv])
    text = str(e.value.code) if e.value.code != 2 else capsys.readouterr().err
    assert fill(msg) in text and (e.value.code == 2 or text.startswith("error: "))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_align_and_cka_device_cuda_without_cuda(toy_world, toy_ckpt):
    import align
    import cka
    for main, argv in ((align.main, ["sentences"]), (cka.main, [])):
        with pytest.raises(SystemExit, match="--device cuda: CUDA is not available on this machine"):
            main(argv + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--device", "cuda"])


def test_dtype_flags_mean_the_same_in_every_script():
    """--dtype takes pretrain.py's values in finetune.py, align.py and cka.py."""
    import align
    import cka
    import pretrain
    assert ft.build_parser().parse_args([]).dtype == "auto"
    for parse in (ft.build_parser().parse_args, cka.build_parser().parse_args,
                  lambda a: align.build_parser().parse_args(["words"] + a)):
        assert parse(["--dtype", "float16"]).dtype == "float16"
        with pytest.raises(SystemExit):
            parse(["--dtype", "fp8"])
    with pytest.raises(SystemExit):
        pretrain.get_args(["--dtype", "fp8"])


def test_the_advice_after_an_interrupt_or_out_of_memory_works(toy_world, toy_ckpt, tmp_path, monkeypatch, capsys):
    """Interrupted in a run given --overwrite: the command printed to go on has no --overwrite (it would remove the
    finished sets), and running it trains only the rest; out of memory: a smaller --batch-size is said to be another
    run (it is: the same --out refuses it)."""
    out = tmp_path / "o"
    (out / "sets").mkdir(parents=True)
    (out / "results.json").write_text('{"job": {"task": "ner", "seed": 7}}')  # another run's, to be replaced
    argv = NER_RUN + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out), "--overwrite"]
    real, calls = ft.finetune_one, []

    def interrupted(*a, **k):
        calls.append(a[4]["lr"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(ft, "finetune_one", interrupted)
    with pytest.raises(SystemExit):
        ft.main(argv)
    again = capsys.readouterr().err.split("to go on, run python finetune.py ")[1].strip()
    assert "--overwrite" not in again and not (out / "results.json").exists()
    calls.clear()
    monkeypatch.setattr(ft, "finetune_one", lambda *a, **k: calls.append(a[4]["lr"]) or real(*a, **k))
    ft.main(shlex.split(again))  # goes on: the finished set is kept, only the second trains
    assert calls == [3e-4] and (out / "results.json").exists()

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(ft, "finetune_one", oom)
    with pytest.raises(SystemExit, match="^error: out of memory; a smaller --batch-size or --max-len goes in another --out$"):
        ft.main(argv[:-1] + ["--out", str(tmp_path / "p")])
    with pytest.raises(SystemExit, match="already exists, from another run .other batch_size"):
        ft.main(argv[:-1] + ["--batch-size", "16"])


def test_sigterm_is_an_interrupt_that_names_what_is_kept(toy_world, toy_ckpt, tmp_path, monkeypatch, capsys):
    """A kill (a job's time limit) during the second set: the same line as Ctrl-C, the command that goes on (was a
    silent exit 143)."""
    import os
    import signal
    out = tmp_path / "o"
    argv = NER_RUN + ["--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--out", str(out)]
    real, calls = ft.finetune_one, []

    def killed(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(ft, "finetune_one", killed)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        ft.main(argv)
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler again after main
    assert e.value.code == 130 and "interrupted; 1 finished hyper-parameter set(s) kept" in capsys.readouterr().err
