"""The command lines a newcomer meets first (issue 25): one meaning per flag, the previous release's spellings
accepted with one note on stderr, every --help line with its default, messages that name the flag and the paths
the user gave, and progress bars on a terminal only."""
import argparse
import re

import pytest

import align
import bpe
import cka
import finetune as ft
import pretrain
import toydata


def parsers():
    """(name, parser) of every script, align.py's sub-commands each."""
    top = align.build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    return ([("pretrain.py", pretrain.build_parser()), ("finetune.py", ft.build_parser()),
             ("cka.py", cka.build_parser()), ("toydata.py", toydata.build_parser()),
             ("bpe.py prepare", bpe.build_parser().prepare)] + [(f"align.py {k}", p) for k, p in subs.items()])


@pytest.mark.parametrize("name, parser", parsers(), ids=[n for n, _ in parsers()])
def test_every_flag_has_help_and_its_default(name, parser):
    """Each flag has help text, and the --help line shows its default: "(default: X)" appended, or the help
    says what happens when it is not given (unset: "default ...", "required", "with --x"), or it is a switch."""
    text = parser.format_help()
    assert "../shared" not in text and "LAYOUTS" not in text
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[-1]
        assert action.help, f"{name} {flag}: no help text"
        switch = action.nargs == 0 or action.const is True
        shown = parser._get_formatter()._get_help_string(action)
        assert switch or "(default" in shown or "default:" in shown or "required" in shown \
            or "deprecated" in shown or "with --" in shown, f"{name} {flag}: the default is not shown: {shown!r}"


def test_finetune_old_spellings_work_with_a_note(capsys):
    """--toy DIR still works with a note; a one-value flag is a grid of one, and a comma list there (the
    deprecated spelling, removed in issue 47) is refused: the grid flags take lists."""
    args = ft.build_parser().parse_args(["--toy", "W", "--batch-sizes", "16,32", "--lrs", "1e-3,3e-4",
                                         "--head-lr", "1e-3"])
    assert bpe.toy_data(args) == "--toy" and (args.toy, args.data) == (True, "W")
    assert (args.batch_size, args.lr, args.head_lr) == ([16, 32], [1e-3, 3e-4], [1e-3])
    assert capsys.readouterr().err.splitlines() == ["note: --toy W is deprecated and will be removed; use --toy --data W"]
    args = ft.build_parser().parse_args(["--toy", "--data", "W", "--batch-size", "8", "--lrs", "1e-3,2e-3"])
    assert bpe.toy_data(args) == "--data"  # this release's spellings: no note; one --batch-size is a grid of one
    assert (args.toy, args.data, args.batch_size, args.lr, args.head_lr) == (True, "W", [8], [1e-3, 2e-3], None)
    assert capsys.readouterr().err == ""
    for argv in (["--batch-size", "16,32"], ["--lr", "1e-3,3e-4"], ["--batch-size", "8", "--batch-sizes", "16"]):
        with pytest.raises(SystemExit):
            ft.build_parser().parse_args(argv)
    with pytest.raises(bpe.InputError, match=re.escape("--toy W and --data V: give one data directory")):
        bpe.toy_data(ft.build_parser().parse_args(["--toy", "W", "--data", "V"]))


def _world(tmp_path):
    """A toydata-shaped folder with only the tatoeba pair, and an (empty) checkpoint file."""
    world = tmp_path / "w"
    (world / "tatoeba").mkdir(parents=True)
    (world / "parallel").mkdir()
    for side, text in (("en", "a b\nc d\n"), ("fr", "e f\ng h\n")):
        (world / f"tatoeba/tatoeba.fr-en.{side}").write_text(text)
        (world / f"parallel/en-fr.train.{side}").write_text(text)
    (world / "world.json").write_text("{}\n")
    (tmp_path / "x.pt").write_bytes(b"")
    return world, str(tmp_path / "x.pt")


@pytest.mark.parametrize("script", ["cka", "align"])
def test_align_cka_toy_and_data(tmp_path, capsys, script):
    """--toy DIR still works (a note on stderr); --toy without --data and a --tgt the world lacks name the flags
    the user gave; --plot into a missing folder says which folder."""
    world, ckpt = _world(tmp_path)
    run = (lambda argv: cka.main(argv)) if script == "cka" else (lambda argv: align.main(["sentences"] + argv))
    with pytest.raises(SystemExit, match="empty file"):  # got past the data flags to the checkpoint
        run(["--toy", str(world), "--ckpt", ckpt])
    assert f"note: --toy {world} is deprecated and will be removed; use --toy --data {world}" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--toy and --data DIR go together"):
        run(["--toy", "--ckpt", ckpt])
    with pytest.raises(SystemExit, match=re.escape(f"--data {world} with --src en --tgt fe: no such file {world}/")):
        run(["--toy", "--data", str(world), "--ckpt", ckpt, "--tgt", "fe"])
    with pytest.raises(SystemExit, match=re.escape(f"--plot {tmp_path}/no/p.png: no such directory {tmp_path}/no")):
        run(["--toy", "--data", str(world), "--ckpt", ckpt, "--plot", str(tmp_path / "no" / "p.png")])


def test_finetune_messages_name_the_flag_and_the_paths(tmp_path):
    """The run folder given instead of the world: the message names the flag given and the paths searched, and
    does not suggest --train-file; a language the checkpoint lacks names --eval-langs."""
    with pytest.raises(bpe.InputError) as e:
        ft.resolve_files("ner", str(tmp_path), "en", ["fr"], flag="--toy")
    msg = str(e.value)
    assert msg.startswith(f"ner: no en train file under --toy {tmp_path} (looked for {tmp_path}/ner/en.train.tsv")
    assert "--train-file" not in msg and "toydata.py world" in msg
    with pytest.raises(bpe.InputError, match=re.escape("--eval-langs fe: not one of the checkpoint's languages")):
        ft.lang_index(["en", "fr"], "fe", "x.pt", "--eval-langs")


def test_bpe_prepare_needs_prep_dir(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bpe.main(["prepare", "--data", str(tmp_path)])
    assert "required: --prep-dir" in capsys.readouterr().err


def test_toydata_refusal_names_the_flag(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(SystemExit, match=r"is not empty; pass --force to overwrite it"):
        toydata.main(["--out", str(tmp_path), "--size", "tiny"])


@pytest.mark.parametrize("script", ["pretrain", "finetune", "align", "cka"])
def test_a_world_cut_short_is_refused_by_every_reader(toy_world, tiny_ckpt, tmp_path, capsys, script):
    """A toydata.py world without world.json (written last: the writer was interrupted)."""
    import shutil
    world = tmp_path / "cut"
    shutil.copytree(toy_world, world)
    (world / "world.json").unlink()
    argv = {"pretrain": ["--toy", "--data", world, "--out", tmp_path / "pt"],
            "finetune": ["--toy", "--data", world, "--ckpt", tiny_ckpt, "--out", tmp_path / "ft"],
            "align": ["sentences", "--toy", "--data", world, "--ckpt", tiny_ckpt],
            "cka": ["--toy", "--data", world, "--ckpt", tiny_ckpt]}[script]
    module = __import__(script)
    with pytest.raises(SystemExit) as stop:
        module.main([str(a) for a in argv])
    said = f"{stop.value.code} {capsys.readouterr().err}"  # the message: exit's or printed
    assert f"--data {world}: no world.json, not a whole toydata.py world" in said, said
    assert not (tmp_path / "pt").exists() and not (tmp_path / "ft").exists()
