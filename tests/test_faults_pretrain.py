"""pretrain.py and bpe.py under user mistakes and accidents (GitHub issue 14): every one ends in one
clear line, never a traceback, a half-written file or a result that looks valid but is not."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from model import pick_device
from test_pretrain import ENV, ROOT, TINY, read_log, run

# -----------------------------------------------------------------------------
# 1. device and precision: one pure function, every case on a CPU (CUDA faked with monkeypatch)


def fake_cuda(monkeypatch, n_gpus, bf16=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n_gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n_gpus)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


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
    ("cuda", None, 0, True, "no CUDA device is available"),
    ("cuda", 0, 0, True, "no CUDA device is available"),
    ("cuda:1", None, 0, True, "no CUDA device is available"),
    ("cuda:1", None, 1, True, "GPU 1 does not exist"),
    ("cuda:1", 0, 2, True, "under torchrun"),
    ("auto", 2, 2, True, "LOCAL_RANK 2 but only 2 GPU"),
    ("gpu", None, 1, True, "expected auto, cpu, cuda or cuda:N"),
    ("cuda:x", None, 1, True, "expected auto, cpu, cuda or cuda:N"),
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
    with pytest.raises(ValueError, match="does not support bfloat16"):
        pick_device("cuda", "bfloat16")
    assert pick_device("cpu", "bfloat16") == ("cpu", "bfloat16", "gloo")  # CPU autocast has bf16
    with pytest.raises(ValueError, match="--dtype"):
        pick_device("cpu", "fp8")


def test_device_cuda_without_cuda_is_one_line(monkeypatch, tmp_path, capsys):
    fake_cuda(monkeypatch, 0)
    with pytest.raises(SystemExit, match="^error: --device cuda: no CUDA device"):
        run(TINY + ["--out", tmp_path, "--device", "cuda"])
    assert not os.listdir(tmp_path), "nothing is written before the device is known to work"
