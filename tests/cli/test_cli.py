"""The onnxopt command: exit codes, one-line errors, the sub-commands."""

import json
import os
import re
import subprocess
import sys

import onnx
import pytest

from onnxopt.models import build_model


def onnxopt(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "onnxopt", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    p = str(d / "m.onnx")
    onnx.save(build_model("mobilenetv3", image_size=32), p)
    return d, p


def test_optimize_report_and_bench(model):
    d, src = model
    out = str(d / "fused.onnx")
    r = onnxopt(src, "-o", out, "--report", str(d / "r.json"), "--no-measure")
    assert r.returncode == 0, r.stderr
    assert "Original Model" in r.stderr and "verified" in r.stderr
    rep = json.load(open(d / "r.json"))
    assert rep["fused_regions"] > 0 and rep["verification"]["ok"]
    b = onnxopt("bench", src, out, "--min-time", "0.2", "--json")
    assert b.returncode == 0, b.stderr
    res = json.loads(b.stdout)
    assert res["outputs_match"] and res["speedup"] > 0 and res["b"]["library"] and not res["spinning"]
    # spinning on (onnxruntime's default): one session alive at a time, in rounds
    b = onnxopt("bench", src, out, "--min-time", "0.4", "--spinning", "--json")
    assert b.returncode == 0, b.stderr
    res = json.loads(b.stdout)
    assert res["spinning"] and res["outputs_match"] and res["speedup"] > 0
    assert res["a"]["rounds"] == res["b"]["rounds"] == 4 and res["a"]["runs"] >= 4
    assert "spinning on" in onnxopt("bench", src, out, "--min-time", "0.2", "--spinning").stdout


def test_time_in_turns_keeps_one_session_alive(model):
    """timing.time_in_turns makes each session in turn, times it, and lets it go before the next: at most one
    session exists at a time, each side gets every round."""
    import weakref

    from onnxopt.timing import make_session, time_in_turns
    from onnxopt.verify import make_inputs

    _, src = model
    feeds = make_inputs(onnx.load(src), {}, 0, None)
    alive, made = [], []

    def maker():
        assert not any(r() is not None for r in alive), "a session from an earlier turn is still alive"
        s = make_session(src, 1, spinning=True)
        alive.append(weakref.ref(s))
        made.append(1)
        return s

    out = time_in_turns([maker, maker], feeds, min_time=0.2, rounds=3)
    assert len(made) == 6 and all(o["rounds"] == 3 and o["runs"] >= 3 and o["median"] > 0 for o in out)


def test_flushed_timing_times_single_runs_after_a_flush(model):
    """time_interleaved with flush_bytes: after one warm-up run each, the sessions run once in turn, and each
    sample is that single run (the flush before it is not timed)."""
    from onnxopt.timing import make_session, time_interleaved
    from onnxopt.verify import make_inputs

    _, src = model
    feeds = make_inputs(onnx.load(src), {}, 0, None)
    order = []

    class Recorder:
        def __init__(self, name):
            self.name, self.session = name, make_session(src, 1)

        def run(self, names, f):
            order.append(self.name)
            return self.session.run(names, f)

    out = time_interleaved([Recorder("a"), Recorder("b")], feeds, min_time=0.0, min_blocks=4, max_blocks=4,
                           flush_bytes=1 << 20)
    assert order == ["a", "b"] + ["a", "b"] * 4  # one warm-up run each, then single runs in turn
    assert all(o["blocks"] == 4 and o["runs_per_block"] == 1 and o["flushed_bytes"] == 1 << 20 for o in out)


def test_inspect_and_machine(model):
    d, src = model
    r = onnxopt("inspect", src, "--top", "5")
    assert r.returncode == 0, r.stderr
    assert "Conv" in r.stdout
    r = onnxopt("inspect", src, "--json")
    assert json.loads(r.stdout)["nodes"]
    r = onnxopt("machine", "--quick", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["peak_flops"]["float32"] > 0
    r = onnxopt("machine", "--preset", "a6000-ada")
    assert r.returncode == 0 and "94.9" in r.stdout


@pytest.mark.parametrize("args,code,msg", [
    (["missing.onnx", "-o", "x.onnx"], 2, "no such file"),
    (["{src}", "-o", "{src}"], 2, "never writes over its input"),
    (["{src}", "-o", "nodir/x.onnx"], 2, "does not exist"),
    (["{src}", "-o", "x.onnx", "--target", "z80"], 2, "unknown --target"),
    (["{src}", "-o", "x.onnx", "--skip-fusion", "magic"], 2, "known fusion kinds"),
    (["{src}", "-o", "x.onnx", "--rtol", "abc"], 2, "--rtol"),
    (["{src}", "-o", "x.onnx", "--scale-tol", "x"], 2, "--scale-tol"),
    (["machine", "--preset", "cray-1"], 2, "known"),
])
def test_usage_errors_exit_2_with_one_line(model, args, code, msg):
    d, src = model
    r = onnxopt(*[a.format(src=src) for a in args], cwd=str(d))
    assert r.returncode == code, (r.stdout, r.stderr)
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_failed_verification_exits_1(tmp_path):
    src = str(tmp_path / "bert.onnx")
    onnx.save(build_model("bert"), src)
    r = onnxopt(src, "-o", str(tmp_path / "f.onnx"), "--no-measure", "--rtol", "0", "--atol", "0", "--scale-tol", "0")
    assert r.returncode == 1, r.stderr
    assert "verification failed" in r.stderr
    assert not os.path.exists(tmp_path / "f.onnx") and not os.path.exists(tmp_path / "f.onnx.so")


def test_version():
    r = onnxopt("-v")
    assert r.returncode == 0 and "onnxopt" in r.stdout


def _help(*args) -> str:
    r = onnxopt(*args, "--help")
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())  # argparse wraps lines: compare as one line


def test_top_level_help_lists_every_command():
    from onnxopt.cli.main import SUBCOMMANDS

    text = _help()
    for cmd in SUBCOMMANDS:
        if cmd != "optimize":
            assert f"onnxopt {cmd}" in text, cmd
    assert "onnxopt batch SRC" in text


def test_skip_fusion_help_lists_every_kind():
    from onnxopt.driver.policy import FUSION_KINDS

    for args in ((), ("batch",)):
        text = _help(*args)
        listed = text.split("--skip-fusion KIND", 2)[-1]
        for kind in FUSION_KINDS:
            assert re.search(rf"\b{kind}\b", listed), (args, kind)


def test_machine_help_lists_the_presets_by_their_names():
    from onnxopt.hardware.presets import PRESETS

    text = _help("machine")
    for name in PRESETS:
        assert name in text, name
    assert "rtx4090" not in text
    for name in PRESETS:  # each name listed is one get_preset takes
        assert onnxopt("machine", "--preset", name, "--json").returncode == 0, name


def test_batch_target_help_names_the_aarch64_targets():
    text = _help("batch")
    target = text.split("--target T", 2)[-1].split("--skip-fusion", 1)[0]
    assert "aarch64" in target and "aarch64-dotprod" in target and "x86-64-v3" in target


def test_tables_without_a_terminal_keep_words_whole(model):
    """Piped (no terminal, no COLUMNS), rich would lay a table out at 80 columns and split words across lines."""
    d, src = model
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "onnxopt", "inspect", src, "--top", "8"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("│")]
    assert any("predicted µs" in line for line in r.stdout.splitlines())
    names = [n.name for n in onnx.load(src).graph.node]
    # every row names a whole node: no name cut and carried over to a continuation row
    for line in rows:
        first = line.split("│")[1].strip()
        assert first in names, line
