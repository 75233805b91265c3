"""finetune.py, issue 48: one writer per --out; --table by content (the pretraining run its results record,
the step of a snapshot, fine-tuning seeds inside one pretraining seed, the rows that are not zero-shot); a
snapshot's stall judged at its run's end, alike in the table and the plot; a word beside a score on few items or
many <unk>; --max-len applied to XNLI.

Run: python -m pytest -q tests/test_finetune_48.py
"""
import json
import shutil

import pytest
import torch

import bpe
import finetune as ft

torch.set_num_threads(1)

NER = ["--task", "ner", "--toy", "--epochs", "1", "--batch-size", "32", "--lr", "1e-3"]


def _run(world, ckpt, out, *extra):
    ft.main(NER + ["--data", str(world), "--ckpt", str(ckpt), "--out", str(out), *extra])
    return json.loads((out / "results.json").read_text())


def test_a_second_run_in_one_out_is_refused(toy_world, toy_ckpt, tmp_path):
    """Two finetune.py runs in one --out both exited 0, one results.json silently replacing the other's: the
    second is refused in one line while the first holds --out, and writes nothing."""
    out = tmp_path / "o"
    with bpe.locked(str(out), "finetune.py"):  # the first run
        with pytest.raises(SystemExit, match=r"^error: --out .*o is in use by another finetune.py \(pid \d+") as e:
            _run(toy_world, toy_ckpt, out)
        assert "\n" not in str(e.value.code) and sorted(p.name for p in out.iterdir()) == [".lock"]
    _run(toy_world, toy_ckpt, out)  # once it ended
    assert not (out / ".lock").exists()


def test_one_checkpoint_fine_tuned_with_two_seeds_is_one_pretraining_seed(toy_world, toy_ckpt, tmp_path, capsys):
    """One checkpoint fine-tuned with --seed 0 and --seed 1 in two folders counted as 2 seeds (dev ppl ± 0.0):
    it is one pretraining run, its two fine-tuning seeds averaged."""
    scores = [_run(toy_world, toy_ckpt, tmp_path / f"m-s{seed}", "--seed", str(seed))["test"]["fr"]["f1"]
              for seed in (0, 1)]
    capsys.readouterr()
    ft.main(["--table", str(tmp_path / "m-s0"), str(tmp_path / "m-s1")])
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:3] == ["m", "1", "0"] and row[3] == f"{50 * sum(scores):.1f}"


def _run_dir(root, model, ckpt_ppl, best_ppl, step=20):
    """A pretraining run folder as pretrain.py writes it: best.pt and step{step}.pt (a --snapshots checkpoint)
    with their dev perplexities and the count models (left bigram 30)."""
    from model import load_model, save_model
    m, extra = load_model(str(model))
    root.mkdir()
    counts = {"en": {"unigram": 150.0, "left": 30.0, "both": 13.0}}
    flags = {"seed": 0, "snapshots": [step], "max_steps": 100}
    for name, at, ppl in ((f"step{step}.pt", step, ckpt_ppl), ("best.pt", 90, best_ppl)):
        save_model(root / name, m, tokenizer=extra["tokenizer"], langs=["en", "fr"], args=flags, step=at,
                   dev_ppl={"en": ppl, "fr": ppl}, count_ppl=counts, count_models=counts)
    return root / f"step{step}.pt"


def test_a_snapshot_is_tabled_at_its_step_and_judged_by_its_run(toy_world, toy_ckpt, tmp_path, capsys, monkeypatch):
    """A step-20 snapshot fine-tuned in a folder named default-s0-step500 was tabled and plotted at 500, and
    judged stalled by its own early perplexity (45 > the left bigram's 30) in the table but drawn in the plot.
    Its step comes from results.json now, and a snapshot is judged by its run's end (best.pt beside it): this
    run left the plateau (best 10); another run whose best.pt stayed above the count model stalled, which the
    fine-tuning says in one line kept in results.json, and both the table and the plot leave it out."""
    healthy = _run_dir(tmp_path / "pt-a", toy_ckpt, 45.0, 10.0)
    stalled = _run_dir(tmp_path / "pt-b", toy_ckpt, 45.0, 40.0)
    res = _run(toy_world, healthy, tmp_path / "default-s0-step500")
    assert res["pretrain"]["step"] == 20 and res["pretrain"]["snapshot"] and not res["pretrain"]["stalled"]
    assert "checkpoint" not in res["notes"] and "stalled" not in capsys.readouterr().out
    res = _run(toy_world, stalled, tmp_path / "flat-s0-step500")
    note = (f"note: {tmp_path / 'pt-b' / 'best.pt'}: its MLM stalled (en dev ppl 40.00 above the left-bigram "
            "count model's 30.0); its scores measure an unconverged model")
    assert res["pretrain"]["stalled"] and res["notes"]["checkpoint"] == note
    assert note in capsys.readouterr().out
    dirs = [str(tmp_path / "default-s0-step500"), str(tmp_path / "flat-s0-step500")]
    ft.main(["--table", *dirs])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["model", "updates", "seeds", "stalled"]
    assert lines[1].split()[:5] == ["default", "20", "1", "0", "45.0"]
    assert lines[2].split()[:4] == ["flat", "20", "0", "1"]
    pytest.importorskip("matplotlib", reason="matplotlib is optional (only --plot needs it)")
    from matplotlib.axes import Axes
    drawn = []
    monkeypatch.setattr(Axes, "errorbar", lambda self, xs, ys, **k: drawn.append((k["label"], list(xs))))
    ft.main(["--table", *dirs, "--plot", str(tmp_path / "c.png")])
    assert drawn and all(line == ("default", [20]) for line in drawn)  # the stalled run: not drawn either
    drawn.clear()
    ft.main(["--table", *dirs, "--plot", str(tmp_path / "c.png"), "--with-stalled"])
    assert ("flat", [20]) in drawn


def test_rows_not_zero_shot_are_marked(tmp_path, capsys):
    """A run fine-tuned on French (--train-lang fr) and tested on French, or with --allow-overlap, sat in the
    zero-shot columns unmarked."""
    for run, args in (("zs-s0", {"train_lang": "en"}), ("fr-s0", {"train_lang": "fr"}),
                      ("ov-s0", {"train_lang": "en", "allow_overlap": True})):
        (tmp_path / run).mkdir()
        (tmp_path / run / "results.json").write_text(json.dumps(
            {"task": "ner", "metric": "f1", "test": {"fr": {"f1": 0.5}}, "args": args}))
    ft.main(["--table"] + [str(tmp_path / r) for r in ("zs-s0", "fr-s0", "ov-s0")])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["zs", "fr", "ov"]
    assert "(not zero-shot)" not in lines[1] and "fr (not zero-shot)" in lines[2] and "ov (not zero-shot)" in lines[3]
    assert "(not zero-shot): fine-tuned on a test language (--train-lang) or with --allow-overlap" in lines[-1]


def test_a_word_beside_a_score_on_few_items_or_many_unk(toy_world, toy_ckpt, tmp_path, capsys):
    """A test set of 20 sentences, a third of whose tokens are unknown to the vocabulary, got a score with no
    word: each is said beside its score, and kept in results.json."""
    world = tmp_path / "w"
    shutil.copytree(toy_world / "ner", world / "ner")
    blocks = (world / "ner/fr.test.tsv").read_text().strip().split("\n\n")[:20]
    odd = ["\n".join(("ЖЖ" + line if k % 3 == 0 else line) for k, line in enumerate(b.split("\n"))) for b in blocks]
    (world / "ner/fr.test.tsv").write_text("\n\n".join(odd) + "\n")
    res = _run(world, toy_ckpt, tmp_path / "o")
    note = res["notes"]["fr test"]
    assert "% of the fr test tokens are <unk> (the vocabulary was learned on other text)" in note
    assert note.endswith("20 examples only (fewer than 50); the score means little")
    assert "en dev" not in res["notes"]  # 120 sentences, no <unk>
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fr "))
    assert row.endswith(note)


def test_max_len_is_applied_to_xnli(toy_world, toy_ckpt, tmp_path, monkeypatch):
    """--task xnli --max-len 4 was silently ignored (pairs cut only to the checkpoint's positions): a pair now
    holds at most 4 subwords besides its three </s>."""
    lengths = {}
    real = ft.XNLITask.featurize

    def featurize(self, examples, tok, lang, max_positions):
        feats = real(self, examples, tok, lang, max_positions)
        lengths.setdefault(tuple(argv), []).extend(len(ids) for ids, _ in feats)
        return feats
    monkeypatch.setattr(ft.XNLITask, "featurize", featurize)
    for argv in ([], ["--max-len", "4"]):
        ft.main(["--task", "xnli", "--toy", "--data", str(toy_world), "--ckpt", str(toy_ckpt), "--epochs", "1",
                 "--batch-size", "32", "--lr", "1e-3", "--head-lr", "1e-3", "--out", str(tmp_path / str(len(argv)))]
                + argv)
    assert max(lengths[()]) > 7 and max(lengths[("--max-len", "4")]) == 7
    # a grid begun without --max-len is not continued with it (its pairs were cut otherwise)
    with pytest.raises(SystemExit, match="from another run \\(other max_len, positions\\)"):
        ft.main(["--task", "xnli", "--toy", "--data", str(toy_world), "--ckpt", str(toy_ckpt), "--epochs", "1",
                 "--batch-size", "32", "--lr", "1e-3", "--head-lr", "1e-3", "--out", str(tmp_path / "0"),
                 "--max-len", "4"])


def test_an_xnli_run_is_told_by_the_positions_its_pairs_are_cut_to():
    """With a 512-position checkpoint, --max-len 128 (pairs cut to 131 positions) and no --max-len (cut to 512)
    share max_len 128: the run's identity must still tell them apart, or one resumes the other's grid."""
    import argparse
    files = {"train": None, "dev": None, "test": {}}
    args = argparse.Namespace(ckpt=None, target_ckpt=None, align_maps=None, xlm_codes=None,
                              **{k: 128 for k in ft.JOB_FLAGS}, positions=131)
    cut = ft.run_identity("xnli", files, args)
    args.positions = 512
    assert ft.run_identity("xnli", files, args) != cut
