"""pretrain.py and bpe.py under user mistakes and accidents (GitHub issue 14): every one ends in one
clear line, never a traceback, a half-written file or a result that looks valid but is not."""
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from model import pick_device
import test_pretrain
from test_pretrain import ENV, ROOT, TINY, TINY_WORLD, read_log, run

# -----------------------------------------------------------------------------
# 1. device and precision: one pure function, every case on a CPU (CUDA faked with monkeypatch)


def fake_cuda(monkeypatch, n_gpus, bf16=True):
    """n_gpus fake GPUs; bf16: native bfloat16 on all (compute capability 8.0, A100) or none (7.0, V100), or one
    bool per GPU. torch.cuda.is_bf16_supported() says True everywhere, as torch's does by default (emulated bf16),
    and cuda:0 is the current device: only the chosen GPU's capability may decide."""
    caps = [(8, 0) if b else (7, 0) for b in (bf16 if isinstance(bf16, list) else [bf16] * n_gpus)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n_gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n_gpus)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    index = lambda d=None: 0 if d is None else d if isinstance(d, int) else torch.device(d).index or 0  # noqa: E731
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps[index(d)])


# (device flag, LOCAL_RANK or None, GPUs, bf16) -> (device, dtype of --dtype auto, backend) or an error
CASES = [
    ("auto", None, 0, False, ("cpu", "float32", "gloo")),
    ("auto", 1, 0, False, ("cpu", "float32", "gloo")),          # torchrun on a CPU machine
    ("auto", None, 1, True, ("cuda:0", "bfloat16", "nccl")),     # the 1-GPU run of issue 14
    ("auto", None, 1, False, ("cuda:0", "float16", "nccl")),     # V100: fp16 + GradScaler
    ("auto", 3, 4, True, ("cuda:3", "bfloat16", "nccl")),
    ("cpu", None, 2, True, ("cpu", "float32", "gloo")),
    ("cpu", 1, 2, True, ("cpu", "float32", "gloo")),
    ("cuda", None, 2, True, ("cuda:0", "bfloat16", "nccl")),
    ("cuda", 1, 2, False, ("cuda:1", "float16", "nccl")),
    ("cuda:1", None, 2, True, ("cuda:1", "bfloat16", "nccl")),
    ("cuda:1", None, 2, [True, False], ("cuda:1", "float16", "nccl")),  # the chosen GPU decides, not cuda:0
    ("cuda", 1, 2, [True, False], ("cuda:1", "float16", "nccl")),       # torchrun rank 1 on the V100
    ("cuda", 0, 2, [False, True], ("cuda:0", "float16", "nccl")),
    ("auto", 1, 2, [False, True], ("cuda:1", "bfloat16", "nccl")),
    ("cuda", None, 0, True, "CUDA is not available on this machine"),
    ("cuda", 0, 0, True, "CUDA is not available on this machine"),
    ("cuda:1", None, 0, True, "CUDA is not available on this machine"),
    ("cuda:1", None, 1, True, "GPU 1 does not exist"),
    ("cuda:1", 0, 2, True, "under torchrun"),
    ("auto", 2, 2, True, "LOCAL_RANK 2 but only 2 GPU"),
    ("gpu", None, 1, True, "expected auto, cpu, cuda, cuda:N or mps"),
    ("cuda:x", None, 1, True, "expected auto, cpu, cuda, cuda:N or mps"),
]


@pytest.mark.parametrize("flag, local_rank, n_gpus, bf16, want", CASES)
def test_pick_device(monkeypatch, flag, local_rank, n_gpus, bf16, want):
    fake_cuda(monkeypatch, n_gpus, bf16)
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want) as e:
            pick_device(flag, "auto", local_rank)
        assert "\n" not in str(e.value) and str(e.value).startswith("--device")
        return
    assert pick_device(flag, "auto", local_rank) == want
    assert pick_device(flag, "float32", local_rank) == (want[0], "float32", want[2])


def test_pick_device_explicit_dtype(monkeypatch):
    fake_cuda(monkeypatch, 1, bf16=False)
    assert pick_device("cuda", "float16") == ("cuda:0", "float16", "nccl")
    with pytest.raises(ValueError, match=r"^--dtype bfloat16: GPU 0 has no native bfloat16 \(compute capability 7.0"):
        pick_device("cuda", "bfloat16")
    assert pick_device("cpu", "bfloat16") == ("cpu", "bfloat16", "gloo")  # CPU autocast has bf16
    with pytest.raises(ValueError, match="--dtype"):
        pick_device("cpu", "fp8")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="^--device mps: MPS is not available on this machine"):
        pick_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device("mps") == ("mps", "float32", "gloo")


def test_device_cuda_without_cuda_is_one_line(monkeypatch, tmp_path, capsys):
    fake_cuda(monkeypatch, 0)
    with pytest.raises(SystemExit, match="^error: --device cuda: CUDA is not available on this machine"):
        run(TINY_WORLD + ["--out", tmp_path, "--device", "cuda"])
    assert not os.listdir(tmp_path), "nothing is written before the device is known to work"

# -----------------------------------------------------------------------------
# shared: a tiny prepared world (as test_pretrain.py's) and a run that has a checkpoint at step 2


world = test_pretrain.world  # the tiny toy world and its joint preparation (a module-scoped fixture)


def flags_of(world):
    return TINY + ["--data", world["joint"], "--lr", 1e-3, "--warmup", 100]


@pytest.fixture
def at_step_2(world, tmp_path):
    """OUT with checkpoint.pt, best.pt, log.jsonl of 2 updates; returns (OUT, flags, {file: bytes})."""
    out = tmp_path / "run"
    flags = flags_of(world) + ["--out", out]
    run(flags + ["--max-steps", 2])
    return out, flags, {f: (out / f).read_bytes() for f in ("checkpoint.pt", "best.pt", "log.jsonl")}


def step_of(path):
    return torch.load(path, weights_only=True)["step"]


def no_temp_files(out):
    return not [f for f in os.listdir(out) if ".tmp" in f]

# -----------------------------------------------------------------------------
# 2. SIGTERM / Ctrl-C: finish the update, save checkpoint.pt, exit 128 + signal with a --resume hint


def start(cmd, out):
    """Popen cmd, then wait until OUT/log.jsonl has 5 records (5 updates with --log-every 1)."""
    p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ((out / "log.jsonl").exists() and len((out / "log.jsonl").read_text().splitlines()) >= 5):
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            raise AssertionError("the run did not start: " + "".join(p.communicate())[-3000:])
        time.sleep(0.05)
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_checkpoint_and_resume_is_exact(world, tmp_path, sig):
    flags = flags_of(world) + ["--sep", "1"]
    out = tmp_path / "run"
    p = start([sys.executable, os.path.join(ROOT, "pretrain.py")] + flags + ["--out", out, "--max-steps", 100000],
              out)
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr
    assert f"stopped by {signal.Signals(sig).name}" in stderr and "--resume" in stderr
    k = step_of(out / "checkpoint.pt")
    assert k >= 5 and no_temp_files(out)
    assert [r["step"] for r in read_log(out) if "loss" in r] == list(range(1, k + 1)), "every update logged once"
    run(flags + ["--out", out, "--max-steps", k + 3, "--resume"])
    run(flags + ["--out", tmp_path / "straight", "--max-steps", k + 3])
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(out / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == k + 3
    assert all(torch.equal(a["model"][n], b["model"][n]) for n in a["model"])
    strip = lambda log: [{x: y for x, y in r.items() if x not in ("tok_per_s", "time")} for r in log]  # noqa: E731
    assert strip(read_log(out)) == strip(read_log(tmp_path / "straight"))


def signals_during_first_save(monkeypatch, *sigs):
    """Send `sigs` to this process while checkpoint.pt is being written for the first time (a preempted job's
    scheduler and torchrun both forward SIGTERM; a user presses Ctrl-C twice)."""
    save, sent = torch.save, []

    def save_and_signal(obj, f, *a, **k):
        if "checkpoint.pt" in str(f) and not sent:
            sent.append(1)
            for sig in sigs:
                os.kill(os.getpid(), sig)
                time.sleep(0.01)  # the handler runs between two bytecodes, here
        return save(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", save_and_signal)


def test_repeated_sigterm_does_not_abort_the_save(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    flags = flags_of(world) + ["--out", out, "--eval-every", 2, "--max-steps", 10]
    signals_during_first_save(monkeypatch, signal.SIGTERM, signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        run(flags)
    assert e.value.code == 128 + signal.SIGTERM
    # the signals came during step 2's save, after the loop had read its stop flags: it stops after the next update
    assert "stopped by SIGTERM after step 3" in capsys.readouterr().err
    assert step_of(out / "checkpoint.pt") == 3 and no_temp_files(out)


def test_second_ctrl_c_stops_at_once_and_says_how_to_go_on(world, tmp_path, monkeypatch):
    out = tmp_path / "run"
    flags = flags_of(world) + ["--out", out, "--eval-every", 2, "--max-steps", 4, "--overwrite"]
    run(flags[:-1] + ["--max-steps", 1])  # an earlier run's files, which --overwrite removes
    signals_during_first_save(monkeypatch, signal.SIGINT, signal.SIGINT)
    with pytest.raises(SystemExit) as e:
        run(flags)
    message = str(e.value.code)
    assert message.startswith("error: stopped by a second SIGINT without saving") and "\n" not in message
    assert not (out / "checkpoint.pt").exists() and no_temp_files(out)
    monkeypatch.undo()
    run(advised_command(message))  # nothing was saved: a new run, which must not be refused for log.jsonl
    assert step_of(out / "checkpoint.pt") == 4


def test_sigterm_to_one_torchrun_rank_stops_every_rank(world, tmp_path):
    """Only rank 1 gets the signal: the ranks agree (all_reduce of a stop flag) and stop after the same update."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(ROOT, "pretrain.py")] + flags_of(world) + ["--out", out, "--max-steps", 100000]
    p = start(cmd, out)
    rank1 = [pid for pid in os.listdir("/proc") if pid.isdigit() and is_rank(int(pid), p.pid, "1")]
    assert len(rank1) == 1
    os.kill(int(rank1[0]), signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert "stopped by SIGTERM" in stderr and "exitcode  : 143" in stderr, stderr[-3000:]
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["step"] >= 5 and len(ck["rng"]) == 2


def is_rank(pid, parent, local_rank):
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return ppid == parent and f"LOCAL_RANK={local_rank}".encode() in env

# -----------------------------------------------------------------------------
# 3. an --out with an earlier run's files is refused unless --resume or --overwrite


def test_out_with_an_earlier_run_is_refused(at_step_2, capsys):
    out, flags, before = at_step_2
    (out / "checkpoint.pt").unlink()
    with pytest.raises(SystemExit, match="holds best.pt, log.jsonl of an earlier run.*--overwrite") as e:
        run(flags + ["--max-steps", 3])
    assert "--resume" not in str(e.value.code), "no checkpoint.pt: --resume would be refused, so it is not offered"
    assert (out / "best.pt").read_bytes() == before["best.pt"]
    assert (out / "log.jsonl").read_bytes() == before["log.jsonl"]
    with pytest.raises(SystemExit) as e:
        run(flags + ["--max-steps", 3, "--overwrite", "--resume"])
    assert e.value.code == 2 and "cannot be combined with --resume" in capsys.readouterr().err
    run(flags + ["--max-steps", 3, "--overwrite"])
    assert [r.get("step") for r in read_log(out)] == [None, 1, 2, 3, 3, 3], \
        "a fresh log: the count models, progress 1-3, the eval of 3, the end"
    assert step_of(out / "checkpoint.pt") == 3


def test_toy_rerun_after_a_crash_before_the_first_checkpoint_reuses_world_and_data(tmp_path, capsys):
    out = tmp_path / "toy"
    run(TINY_WORLD + ["--out", out, "--max-steps", 1])
    for name in ("checkpoint.pt", "best.pt", "log.jsonl"):  # what a crash at step 0 leaves: toy/ and data/ only
        (out / name).unlink()
    capsys.readouterr()
    run(TINY_WORLD + ["--out", out, "--max-steps", 2])
    assert "using prepared data" in capsys.readouterr().out
    assert step_of(out / "checkpoint.pt") == 2


def test_toy_world_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import pretrain

    def full(out_dir, **knobs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(out_dir, "mono", "en.train.txt"))
    monkeypatch.setattr(pretrain, "write_world", full)
    out = tmp_path / "toy"
    with pytest.raises(SystemExit, match=f"^error: cannot write the toy world: {out}/toy/mono/en.train.txt: No space"):
        run(TINY_WORLD + ["--out", out])
    assert not (out / "toy.json").exists()

# -----------------------------------------------------------------------------
# 4. divergence: an overflowing perplexity is inf, a non-finite one never overwrites the saved files


def test_evaluate_ppl_overflow_is_inf():
    from pretrain import evaluate_ppl

    class Diverged(torch.nn.Module):
        def forward(self, idx, lang, targets):
            return None, torch.tensor(self.loss)

    ids = torch.arange(14, 100).numpy()
    for loss, want in ((800.0, float("inf")), (float("inf"), float("inf")), (2.0, 7.38905609893065)):
        m = Diverged()
        m.loss = loss
        assert evaluate_ppl(m, ids, 0, 100, 8, "cpu", torch.no_grad()) == pytest.approx(want)
    m.loss = float("nan")
    assert evaluate_ppl(m, ids, 0, 100, 8, "cpu", torch.no_grad()) != evaluate_ppl(m, ids, 0, 100, 8, "cpu",
                                                                                     torch.no_grad())  # NaN


def test_divergence_keeps_the_last_good_files_and_resume_may_lower_lr(at_step_2, capsys):
    out, flags, before = at_step_2
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # a huge learning rate from step 2 on: NaN dev perplexity at step 3
        run(flags + ["--max-steps", 4, "--eval-every", 1, "--resume", "--lr", 1e30])
    message = str(e.value.code)
    assert message.startswith("error:") and "\n" not in message
    assert "holds step 2" in message and "--resume --lr" in message
    assert "not overwritten" in capsys.readouterr().out
    assert (out / "checkpoint.pt").read_bytes() == before["checkpoint.pt"]
    assert (out / "best.pt").read_bytes() == before["best.pt"]
    advice = advised_command(message)  # the printed command is accepted: it diverges again (lr 5e29), not refused
    assert advice[-3:] == ["--resume", "--lr", "5e+29"] and "--dtype" not in advice
    with pytest.raises(SystemExit, match="^error: the dev perplexity is not finite at step 3; .*holds step 2"):
        run(advice)
    run(flags + ["--max-steps", 4, "--resume", "--lr", 5e-4])  # a lower rate goes on
    assert "--lr 0.001 -> 0.0005" in capsys.readouterr().out
    assert step_of(out / "checkpoint.pt") == 4
    assert all(math_finite(r) for r in read_log(out)), "the diverged records were cut from log.jsonl"


def nan_weights(out):
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    next(iter(ck["model"].values())).fill_(float("nan"))
    torch.save(ck, out / "checkpoint.pt")


def truncate(out):
    os.truncate(out / "checkpoint.pt", os.path.getsize(out / "checkpoint.pt") // 2)


# (setup of OUT at step 2, flags, the one line expected): refused before any update, OUT unchanged (issue 22)
RUN_FAULTS = [
    ("nan-weights", nan_weights, ["--resume"], r"checkpoint.pt: weight .* contains NaN or inf.*cannot be continued.*--overwrite"),
    ("truncated", truncate, ["--resume"], r"cannot read .*checkpoint.pt: .*truncated or damaged.*; it cannot be continued: start again with .*--overwrite$"),
    ("no-checkpoint", lambda out: (out / "checkpoint.pt").unlink(), ["--resume"], r"no checkpoint.pt to go on from"),
    # issue 48: a resume that would train nothing (it said done and rewrote args.json)
    ("max-steps-reached", None, ["--resume", "--max-steps", 2],
     r"--resume: .*checkpoint.pt is at step 2 already; --max-steps 2 would train nothing"),
    ("huge-batch", None, ["--overwrite", "--batch-size", 10**9],
     r"--batch-size 1000000000 x --bptt 32 is more than the en training data \(\d+ tokens\)"),
]


@pytest.mark.parametrize("setup, flags, message", [c[1:] for c in RUN_FAULTS], ids=[c[0] for c in RUN_FAULTS])
def test_run_fault_is_one_line_and_changes_nothing(at_step_2, setup, flags, message):
    out, base, _ = at_step_2
    if setup:
        setup(out)
    before = {f: (out / f).read_bytes() for f in os.listdir(out) if (out / f).is_file()}
    with pytest.raises(SystemExit) as e:
        run(base + ["--max-steps", 4] + flags)
    assert re.search("^error: .*" + message, str(e.value.code)) and "\n" not in str(e.value.code), e.value.code
    assert {f: (out / f).read_bytes() for f in os.listdir(out) if (out / f).is_file()} == before


def test_resume_names_the_snapshots_it_can_no_longer_write(world, tmp_path, capsys):
    """issue 48: --resume --snapshots listing an update already passed: one line names the snapshots not written
    then (step1.pt was: not named); the later ones are still written."""
    flags = flags_of(world) + ["--out", tmp_path]
    run(flags + ["--max-steps", 2, "--snapshots", 1])
    capsys.readouterr()
    run(flags + ["--max-steps", 4, "--snapshots", "1,2,3", "--resume"])
    notes = [line for line in capsys.readouterr().out.splitlines() if "--snapshots" in line]
    assert notes == [f"note: --snapshots: {tmp_path / 'checkpoint.pt'} is at step 2; step2.pt can no longer be "
                     "written"]
    assert sorted(p.name for p in tmp_path.glob("step*.pt")) == ["step1.pt", "step3.pt"]


def test_overwrite_removes_every_file_of_the_earlier_run(at_step_2):
    out, flags, _ = at_step_2
    run(flags + ["--max-steps", 3, "--snapshots", "1,3", "--overwrite"])
    assert (out / "step1.pt").exists() and (out / "step3.pt").exists()
    run(flags + ["--max-steps", 2, "--overwrite"])
    assert not (out / "step1.pt").exists() and not (out / "step3.pt").exists(), "the earlier run's snapshots"
    run(flags + ["--max-steps", 1, "--snapshots", "1", "--overwrite"])
    for f in ("checkpoint.pt", "best.pt", "log.jsonl"):
        (out / f).unlink()
    with pytest.raises(SystemExit, match="holds step1.pt of an earlier run"):  # a snapshot alone is a run's file
        run(flags + ["--max-steps", 1])


def advised_command(message):
    """The argv of the `python pretrain.py ...` command a message advises (it must be one this program accepts)."""
    assert "python pretrain.py " in message, message
    return shlex.split(message.split("python pretrain.py ", 1)[1].split(";")[0])


def math_finite(record):
    import math
    return all(math.isfinite(v) for v in record.get("dev_ppl", {}).values())


# -----------------------------------------------------------------------------
# 5. every flag and input file is checked before any work


def bad_number(flag, value, span, kind="integer"):
    """A bad number flag and its one line (bpe.number, every numeric flag's type): the flag, the range, the value."""
    return [flag, value], f"argument {flag}: expected one {kind} in {span}, got {str(value)!r}"


BAD_FLAGS = [
    bad_number("--lr", -1, "(0, inf)", "number"),
    bad_number("--lr", 0, "(0, inf)", "number"),
    bad_number("--lr", "nan", "(0, inf)", "number"),
    bad_number("--warmup", -5, "[0, inf)"),
    bad_number("--dropout", 1.5, "[0, 1)", "number"),
    bad_number("--attention-dropout", -0.1, "[0, 1)", "number"),
    bad_number("--clip", -1, "[0, inf)", "number"),
    bad_number("--threads", -1, "[1, inf)"),
    bad_number("--log-every", 0, "[1, inf)"),
    bad_number("--eval-every", -1, "[0, inf)"),
    bad_number("--max-bad-steps", 0, "[1, inf)"),
    bad_number("--workers", 0, "[1, inf)"),
    bad_number("--seed", -1, "[0, 4294967296)"),
    bad_number("--merges", 0, "[1, inf)"),
    (["--langs", "en,en"], "--langs en,en: expected distinct languages"),
    (["--langs", "en,"], "--langs en,: expected distinct languages"),
    (["--toy-order", "xyz"], "--toy-order"),
    bad_number("--toy-overlap", 2, "[0, 1]", "number"),
    bad_number("--ffn-dim", 0, "[1, inf)"),                     # issue 22 item 9: tracebacks before
    bad_number("--ffn-dim", -4, "[1, inf)"),
    bad_number("--seed", 10**17, "[0, 4294967296)"),
    bad_number("--pos-offsets", 10**9, "[0, 16384]"),
    bad_number("--bptt", 10**9, "[1, 16384]"),
    bad_number("--epochs", 2.5, "[1, inf)"),
    (["--bptt", 1], "--bptt 1: a stream's first token is never predicted"),  # issue 37: ZeroDivisionError before
    (["--snapshots", "50", "--max-steps", 20], "--snapshots 50: the run ends after 20 updates"),
    (["--snapshots", "5", "--epochs", 1, "--epoch-size", 8], "--snapshots 5: the run ends after 2 updates"),
    (["--snapshots", "x,5"], "--snapshots x,5: expected 500,1000"),
    (["--pos-offsets", 0, "--pos-offsets-from", 5], "--pos-offsets-from 5: no offsets to start"),
    # issue 48: the world flags with --data (a world already written) would change nothing
    (["--toy-overlap", "0.9", "--max-steps", 1], "--toy-overlap: the --toy-* flags shape only the world"),
    (["--toy-size", "tiny", "--toy-cyrillic", "--max-steps", 1], "--toy-size --toy-cyrillic: the --toy-* flags"),
]


def test_toy_world_of_three_languages_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        run(TINY_WORLD + ["--langs", "en,fr,de", "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "the toy world is bilingual" in err and not out.exists()


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[" ".join(map(str, f)) for f, _ in BAD_FLAGS])
def test_bad_flag_is_one_line_before_any_work(world, tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        run(TINY + ["--data", world["joint"], "--out", out] + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert not out.exists()


def test_bad_dictionary_fails_before_bpe_and_bad_dev_file_is_one_line(world, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(world["raw"] / "mono", data)
    bad_dict = tmp_path / "dict.txt"
    bad_dict.write_text("chat cat\nchien\n")
    with pytest.raises(SystemExit, match=r"--code-switch .*dict.txt:2: expected 'source target'"):
        run(TINY + ["--data", data, "--out", tmp_path / "a", "--code-switch", bad_dict])
    assert "learning BPE" not in capsys.readouterr().out
    assert not (tmp_path / "a" / "data").exists()
    with pytest.raises(SystemExit, match="--data .*nothing: no such directory"):
        run(TINY + ["--data", tmp_path / "nothing", "--out", tmp_path / "a"])
    good = (data / "fr.dev.txt").read_bytes()
    (data / "fr.dev.txt").write_bytes(good + b"caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(SystemExit, match=r"fr.dev.txt:\d+: not valid UTF-8"):
        run(TINY + ["--data", data, "--out", tmp_path / "a"])
    assert "learning BPE" not in capsys.readouterr().out  # issue 37: every input is read before any work
    (data / "fr.dev.txt").write_bytes(good)
    run(TINY + ["--data", data, "--out", tmp_path / "a", "--max-steps", 1])  # fixed: the same command goes on
    assert step_of(tmp_path / "a" / "checkpoint.pt") == 1

def test_a_failed_data_check_leaves_no_empty_out(tmp_path, capsys):
    """A --data that does not exist or is empty is refused in one line, and the --out (with its parents and OUT/data)
    that this run created is removed again; an --out that existed before is kept, and so are its files."""
    (tmp_path / "empty").mkdir()
    for data, why in (("nonexist", "no such directory"), ("empty", "no en.train.txt")):
        with pytest.raises(SystemExit, match=f"^error: --data {tmp_path / data}: {why}"):
            run(TINY + ["--data", tmp_path / data, "--out", tmp_path / "new" / "a"])
        assert os.listdir(tmp_path) == ["empty"], data
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit, match="no such directory"):
        run(TINY + ["--data", tmp_path / "nonexist", "--out", tmp_path / "old"])
    with pytest.raises(SystemExit, match="no such directory"):
        run(TINY + ["--data", tmp_path / "nonexist", "--out", tmp_path / "old" / "b", "--prep-dir", tmp_path / "p"])
    assert sorted(os.listdir(tmp_path)) == ["empty", "old"] and os.listdir(tmp_path / "old") == []


# -----------------------------------------------------------------------------
# 6. log.jsonl after a kill and a resume: every record once, the checkpoint's eval record kept


def test_resume_cuts_the_log_back_to_the_checkpoint(world, tmp_path):
    flags = flags_of(world) + ["--eval-every", 2]
    run(flags + ["--out", tmp_path / "straight", "--max-steps", 4])
    out = tmp_path / "killed"
    run(flags + ["--out", out, "--max-steps", 2])
    at_2 = (out / "checkpoint.pt").read_bytes()
    run(flags + ["--out", out, "--max-steps", 4, "--resume"])
    # a kill between the log records of steps 3-4 and the rename of checkpoint.pt leaves the step-2 checkpoint
    (out / "checkpoint.pt").write_bytes(at_2)
    run(flags + ["--out", out, "--max-steps", 4, "--resume"])
    strip = lambda log: [{x: y for x, y in r.items() if x not in ("tok_per_s", "time")} for r in log]  # noqa: E731
    assert strip(read_log(out)) == strip(read_log(tmp_path / "straight"))
    assert [(r.get("step"), "dev_ppl" in r) for r in read_log(out)] == [
        (None, False), (1, False), (2, False), (2, True), (3, False), (4, False), (4, True), (4, False)]

# -----------------------------------------------------------------------------
# 8. disk full and unusable --out paths


@pytest.mark.parametrize("victim", ["best.pt", "checkpoint.pt"])
@pytest.mark.parametrize("error", ["ENOSPC", "torch"])
def test_disk_full_keeps_old_files_and_leaves_no_temp_file(at_step_2, monkeypatch, victim, error):
    out, flags, before = at_step_2
    save = torch.save

    def full_disk(obj, f, *a, **k):
        if str(f).startswith(str(out / victim)):
            with open(f, "wb") as h:
                h.write(b"PK\x03\x04 half a checkpoint")
            if error == "ENOSPC":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        return save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as e:
        run(flags + ["--max-steps", 4, "--resume"])
    message = str(e.value.code)
    assert message.startswith("error:") and str(out / victim) in message and "\n" not in message
    assert "no space left writing" in message
    assert no_temp_files(out)
    assert (out / "checkpoint.pt").read_bytes() == before["checkpoint.pt"]
    monkeypatch.setattr(torch, "save", save)
    run(flags + ["--max-steps", 4, "--resume"])  # once there is room again, the run goes on
    assert step_of(out / "checkpoint.pt") == 4


def test_unusable_out_is_one_line(world, tmp_path):
    (tmp_path / "file").write_text("x")
    for out, why in ((tmp_path / "file", "exists and is not a directory"),
                     (tmp_path / "file" / "sub", "cannot create the directory"),
                     ("/proc/pretrain-test", "cannot create the directory")):
        with pytest.raises(SystemExit, match=f"^error: --out {out}: {why}"):
            run(flags_of(world) + ["--out", out, "--max-steps", 1])

# -----------------------------------------------------------------------------
# 7. bpe.py's command line: a mistake is one line naming the flag (or the file)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe_cli")
    (d / "en.txt").write_text("the cat sat on the mat\nthe dog sat\n" * 3)
    (d / "fr.txt").write_text("le chat est sur le tapis\nle chien\n" * 3)
    return d


def bpe_cli(cwd, *argv):
    """python bpe.py ARGV in directory cwd, in this process; returns the exit code."""
    import bpe
    here = os.getcwd()
    os.chdir(cwd)
    try:
        bpe.main(list(argv))
        return 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        return e.code
    finally:
        os.chdir(here)


BPE_MISTAKES = [
    (["prepare", "--train-files", "en=en.txt,en=fr.txt", "--dev-files", "en=en.txt", "--prep-dir", "p"],
     "--train-files: language 'en' given twice"),
    (["prepare", "--train-files", "en=nope.txt,fr=fr.txt", "--dev-files", "en=en.txt,fr=fr.txt", "--prep-dir", "p"],
     "--train-files en=nope.txt: no such file"),
    (["prepare", "--data", ".", "--merges", "-5", "--prep-dir", "p"],
     "argument --merges: expected one integer in [1, inf), got '-5'"),
    (["prepare", "--data", ".", "--workers", "0", "--prep-dir", "p"],
     "argument --workers: expected one integer in [1, inf), got '0'"),
    (["prepare", "--data", ".", "--max-lines", "-1", "--prep-dir", "p"],
     "argument --max-lines: expected one integer in [1, inf)"),
    (["prepare", "--prep-dir", "p"], "give --data, or --train-files with --dev-files"),
    (["prepare", "--data", ".", "--code-switch", "en.txt", "--separate-vocab", "--prep-dir", "p"],
     "--code-switch needs two --langs and one shared vocabulary"),
    (["prepare", "--train-files", "en=en.txt,fr=fr.txt", "--dev-files", "en=en.txt,fr=fr.txt",
      "--allow-overlap", "--prep-dir", "en.txt"],
     "--prep-dir en.txt/joint-80000-"),  # a file, not a directory: named by its flag
]


@pytest.mark.parametrize("argv, message", BPE_MISTAKES, ids=[" ".join(a[:3]) for a, _ in BPE_MISTAKES])
def test_bpe_cli_mistake_is_one_line(bpe_dir, capsys, argv, message):
    before = sorted(os.listdir(bpe_dir))
    assert bpe_cli(bpe_dir, *argv) in (1, 2)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) < 300, "one readable line"
    assert sorted(os.listdir(bpe_dir)) == before and no_temp_files(bpe_dir), "nothing written, no temp file"

# -----------------------------------------------------------------------------
# 9. issue 37: two processes in one --out, what OUT claims, a dev set that is the training text, the environment


def test_a_second_run_on_the_same_out_is_refused_and_a_dead_ones_lock_is_taken_over(world, tmp_path):
    out = tmp_path / "run"
    p = start([sys.executable, os.path.join(ROOT, "pretrain.py")] + flags_of(world) + ["--out", out, "--max-steps",
                                                                                         100000], out)
    try:
        with pytest.raises(SystemExit) as e:
            run(flags_of(world) + ["--out", out, "--max-steps", 3, "--resume"])
        message = str(e.value.code)
        assert message.startswith(f"error: --out {out} is in use by another pretrain.py (pid {p.pid} ") and \
            "\n" not in message
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
    assert not (out / ".lock").exists(), "removed at exit"
    (out / ".lock").write_text("999999999\n")  # a killed run's lock: nobody holds it
    run(flags_of(world) + ["--out", out, "--max-steps", step_of(out / "checkpoint.pt") + 1, "--resume"])
    assert not (out / ".lock").exists()


def test_workers_do_not_inherit_the_stop_handler(tmp_path):
    """--workers 2: bpe.binarize's pool is terminated (SIGTERM) after each file; its workers used to run pretrain.py's
    handler ("error: stopped by SIGTERM before training started") and one could outlive the run holding its stdout."""
    cmd = [sys.executable, os.path.join(ROOT, "pretrain.py")] + TINY_WORLD + ["--out", tmp_path / "w",
                                                                              "--max-steps", 1, "--workers", 2]
    r = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "stopped by" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert "preparing data" in r.stdout and step_of(tmp_path / "w" / "checkpoint.pt") == 1


@pytest.mark.parametrize("env", [{"RANK": "0", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "2"},  # the loss halved
                                 {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"},  # no LOCAL_RANK
                                 # issue 48: no MASTER_PORT (a torch.distributed traceback after the data)
                                 {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost"}])
def test_rank_in_the_environment_without_torchrun_is_one_line(world, tmp_path, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in {"LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} - set(env):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit, match="^error: RANK / WORLD_SIZE are set in the environment.*unset them, or launch "
                       "with torchrun$") as e:
        run(flags_of(world) + ["--out", tmp_path / "run"])
    assert "MASTER_PORT" in str(e.value.code)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("ranks", [("x", "0", "1"), ("1", "0", "1"), ("0", "0", "-2")])
def test_torchrun_environment_of_bad_ranks_is_one_line(world, tmp_path, monkeypatch, ranks):
    """issue 48's half torchrun environment, its neighbours: a RANK that is no number (a ValueError traceback), RANK 1
    of WORLD_SIZE 1 (init_process_group waited for ever)."""
    for k, v in zip(("RANK", "LOCAL_RANK", "WORLD_SIZE"), ranks):
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29531")
    with pytest.raises(SystemExit, match=rf"^error: RANK={ranks[0]} LOCAL_RANK=0 WORLD_SIZE={ranks[2]} in the "
                       r"environment: expected whole numbers, RANK below WORLD_SIZE \(as torchrun sets them\)$"):
        run(flags_of(world) + ["--out", tmp_path / "run"])
    assert not (tmp_path / "run").exists()


def test_resume_past_its_epochs_is_refused_in_one_line(world, tmp_path):
    """issue 48's --resume past --max-steps, its neighbour --epochs: it trained nothing, said done, rewrote args.json."""
    flags = flags_of(world) + ["--out", tmp_path, "--epoch-size", 8]  # 2 updates an epoch
    run(flags + ["--max-steps", 4])
    before = {f: (tmp_path / f).read_bytes() for f in ("checkpoint.pt", "args.json", "log.jsonl")}
    with pytest.raises(SystemExit, match=r"^error: --resume: [^\n]*checkpoint.pt is at epoch 2 already; --epochs 2 "
                       r"would train nothing \(give a larger one\)$"):
        run(flags + ["--max-steps", 10, "--epochs", 2, "--resume"])
    assert {f: (tmp_path / f).read_bytes() for f in before} == before


def test_dev_set_equal_to_the_training_text_is_refused_unless_allowed(world, tmp_path):
    mono = world["raw"] / "mono"
    (tmp_path / "fr.copy.txt").write_bytes((mono / "fr.train.txt").read_bytes())  # the same contents, another file
    for fr_dev in (mono / "fr.train.txt", tmp_path / "fr.copy.txt"):
        files = ["--train-files", f"en={mono / 'en.train.txt'},fr={mono / 'fr.train.txt'}",
                 "--dev-files", f"en={mono / 'en.dev.txt'},fr={fr_dev}"]
        with pytest.raises(SystemExit, match="^error: the fr dev set is its training text.*--allow-overlap"):
            run(TINY + files + ["--out", tmp_path / "a", "--max-steps", 1])
        assert not (tmp_path / "a" / "checkpoint.pt").exists()
    run(TINY + files + ["--out", tmp_path / "a", "--max-steps", 1, "--allow-overlap"])
    assert step_of(tmp_path / "a" / "checkpoint.pt") == 1
    data = tmp_path / "data"  # a --data folder whose en.dev.txt is a copy of en.train.txt
    shutil.copytree(mono, data)
    shutil.copy(data / "en.train.txt", data / "en.dev.txt")
    with pytest.raises(SystemExit, match="^error: the en dev set is its training text"):
        run(TINY + ["--data", data, "--out", tmp_path / "b", "--max-steps", 1])


def test_dev_files_mostly_training_lines_are_refused_a_few_counted(world, tmp_path, capsys):
    """issue 48: --dev-files compared line by line with the training text, both normalised (whitespace collapsed,
    Unicode NFC): mostly training lines -> refused before any work (unless --allow-overlap); some -> a note with
    their count."""
    import unicodedata
    mono = world["raw"] / "mono"
    train = (mono / "fr.train.txt").read_text(encoding="utf-8").splitlines()
    dev = (mono / "fr.dev.txt").read_text(encoding="utf-8").splitlines()
    by_chance = len(set(dev) & set(train))  # the toy grammar repeats a short sentence now and then
    spaced = [" " + unicodedata.normalize("NFD", line).replace(" ", " \t ") for line in train[:150]]
    (tmp_path / "mostly.txt").write_text("\n".join(spaced + dev[:50]) + "\n", encoding="utf-8")
    (tmp_path / "some.txt").write_text("\n".join(dev + train[:10]) + "\n", encoding="utf-8")
    spec = lambda fr_dev: ["--train-files", f"en={mono / 'en.train.txt'},fr={mono / 'fr.train.txt'}",  # noqa: E731
                           "--dev-files", f"en={mono / 'en.dev.txt'},fr={fr_dev}"]
    shared = 150 + len(set(dev[:50]) & set(train))
    with pytest.raises(SystemExit, match=rf"^error: the fr dev set is mostly its training text \({shared} of its 200 "
                       r"lines are training lines, whitespace collapsed, Unicode NFC\).*--allow-overlap"):
        run(TINY + spec(tmp_path / "mostly.txt") + ["--out", tmp_path / "a", "--max-steps", 1])
    assert "learning BPE" not in capsys.readouterr().out and not (tmp_path / "a").exists()
    run(TINY + spec(tmp_path / "some.txt") + ["--out", tmp_path / "b", "--max-steps", 1])
    assert f"note: {by_chance + 10} of the {len(dev) + 10} fr dev lines are training lines too" in capsys.readouterr().out


def test_resume_with_other_dev_files_is_refused(world, tmp_path):
    mono = world["raw"] / "mono"
    (tmp_path / "fr.dev.txt").write_text("".join((mono / "fr.dev.txt").read_text().splitlines(True)[:-3]))
    spec = lambda fr_dev: ["--train-files", f"en={mono / 'en.train.txt'},fr={mono / 'fr.train.txt'}",  # noqa: E731
                           "--dev-files", f"en={mono / 'en.dev.txt'},fr={fr_dev}", "--out", tmp_path / "run"]
    run(TINY + spec(mono / "fr.dev.txt") + ["--max-steps", 2])
    with pytest.raises(SystemExit, match="^error: --resume: the data in .* are not .*\\(training or dev sets\\)$"):
        run(TINY + spec(tmp_path / "fr.dev.txt") + ["--max-steps", 3, "--resume"])
    assert step_of(tmp_path / "run" / "checkpoint.pt") == 2


def test_resume_without_best_pt_makes_a_new_one_and_says_so(at_step_2, capsys):
    out, flags, _ = at_step_2
    moved = out.parent / "moved"
    moved.mkdir()
    os.replace(out / "checkpoint.pt", moved / "checkpoint.pt")  # checkpoint.pt moved alone to a new folder
    capsys.readouterr()
    run(flags[:-1] + [moved, "--max-steps", 3, "--resume"])
    printed = capsys.readouterr().out
    assert f"no best.pt in {moved}" in printed and "checkpoint.pt, best.pt, log.jsonl in" in printed
    from model import load_model
    assert load_model(moved / "best.pt")[1]["step"] == 3


def test_overwrite_replaces_a_toy_world_of_other_flags(tmp_path, capsys):
    out = tmp_path / "toy"
    run(TINY_WORLD + ["--out", out, "--max-steps", 1])
    for name in ("checkpoint.pt", "best.pt", "log.jsonl"):  # the world is refused even with no run's file beside it
        (out / name).unlink()
    with pytest.raises(SystemExit, match="other --toy-\\* flags; add --overwrite"):
        run(TINY_WORLD + ["--out", out, "--max-steps", 1, "--toy-seed", 1])
    old = (out / "toy" / "mono" / "en.train.txt").read_bytes()
    run(TINY_WORLD + ["--out", out, "--max-steps", 1, "--toy-seed", 1, "--overwrite"])
    assert json.loads((out / "toy.json").read_text())["seed"] == 1
    assert (out / "toy" / "mono" / "en.train.txt").read_bytes() != old and len(os.listdir(out / "data")) == 1
