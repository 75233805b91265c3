"""`python model.py curve RUN_DIR`: a pretraining run's learning curve from its log.jsonl (dev
perplexity per language against updates, the count models as horizontal lines). The log's parsing
runs without matplotlib; the figure's tests skip when it is absent (not a requirement)."""
import json
import sys

import pytest

import model as M

COUNTS = {"en": {"unigram": 155.9, "left": 24.3, "both": 13.1},
          "fr": {"unigram": 160.2, "left": 26.0, "both": 14.5}}
TRAIN = {"step": 500, "epoch": 0, "lang": "en", "loss": 4.9, "lr": 0.002, "time": 1.0}
EVALS = [{"step": 500, "epoch": 1, "dev_ppl": {"en": 154.3, "fr": 167.2}, "best": True,
          "plateau": True, "time": 2.0},
         {"step": 1000, "epoch": 2, "dev_ppl": {"en": 132.9, "fr": 132.3}, "best": True,
          "plateau": True, "time": 3.0}]


def write_log(run, records):
    run.mkdir(exist_ok=True)
    lines = [json.dumps(r) + "\n" for r in records]
    (run / "log.jsonl").write_text("".join(lines))
    return run


def test_read_curve_gives_the_series_and_the_count_models(tmp_path):
    run = write_log(tmp_path / "run", [{"count_models": COUNTS}, TRAIN, EVALS[0], TRAIN, EVALS[1]])
    curve = M.read_curve(str(run))
    assert curve.dev_ppl == {"en": [(500, 154.3), (1000, 132.9)], "fr": [(500, 167.2), (1000, 132.3)]}
    assert curve.count_models == COUNTS


def test_read_curve_of_an_older_log_has_no_count_models(tmp_path):
    run = write_log(tmp_path / "run", [TRAIN, EVALS[0]])
    curve = M.read_curve(str(run))
    assert curve.dev_ppl == {"en": [(500, 154.3)], "fr": [(500, 167.2)]}
    assert curve.count_models == {}


def test_curve_bad_runs_are_one_error_line(tmp_path):
    """No log, a log without an evaluation, a damaged line: one `error:` line each."""
    with pytest.raises(SystemExit, match=r"^error: .*No such file or directory.*log\.jsonl"):
        M.main(["curve", str(tmp_path / "none")])
    run = write_log(tmp_path / "run", [{"count_models": COUNTS}, TRAIN])
    with pytest.raises(SystemExit, match=r"^error: \S*log\.jsonl: no evaluation \(dev_ppl\)"):
        M.main(["curve", str(run)])
    (run / "log.jsonl").write_text(json.dumps(EVALS[0]) + "\n" + '{"step": 10')
    with pytest.raises(SystemExit, match=r"^error: \S*log\.jsonl:2: not a JSON line$"):
        M.main(["curve", str(run)])


def test_curve_without_matplotlib_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a fresh machine: not installed
    run = write_log(tmp_path / "run", [EVALS[0]])
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        M.main(["curve", str(run)])
    assert not (run / "curve.png").exists()


def test_curve_writes_a_png_with_the_count_models(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is optional (only the figures need it)")
    import matplotlib.axes
    drawn = []
    real = matplotlib.axes.Axes.axhline

    def spy(ax, y, **k):
        drawn.append((k["label"], y))
        return real(ax, y, **k)
    run = write_log(tmp_path / "run", [{"count_models": COUNTS}, TRAIN, EVALS[0], TRAIN, EVALS[1]])
    matplotlib.axes.Axes.axhline = spy
    try:
        M.main(["curve", str(run)])
    finally:
        matplotlib.axes.Axes.axhline = real
    assert (run / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {run / 'curve.png'}" in capsys.readouterr().out
    assert ("en unigram", 155.9) in drawn and ("fr left bigram", 26.0) in drawn
    assert ("en both neighbours", 13.1) in drawn and len(drawn) == 6
    # an older log (no count models): the curve alone, to the --plot file
    old = write_log(tmp_path / "old", [TRAIN, EVALS[0], EVALS[1]])
    M.main(["curve", str(old), "--plot", str(tmp_path / "old.png")])
    assert (tmp_path / "old.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.rglob("*.tmp"))
