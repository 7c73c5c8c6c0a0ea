"""Real processes, really killed: a SIGKILL of `onnxopt` or `onnxopt batch` (what CI timeouts and the OOM killer send)
while kernel-build workers are alive leaves no process running, no file in the output folder and no process holding
the cost cache; `--ray` at an address where nothing answers fails at once, in one line.

Every test records the processes it starts and their descendants, and kills what is left in `finally`, so a failing
test leaves nothing behind either."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and PR_SET_PDEATHSIG")

QUICK = ["--threads", "1", "--tune-budget", "0", "--search-budget", "5", "--min-speedup", "0"]


def several_kernels(path):
    """Convolutions of three shapes with their activations, a pool, and an elementwise chain after a Transpose:
    a dozen kernels to build."""
    rng = np.random.default_rng(0)
    inits, nodes, x, c = [], [], "x", 8
    for i, (co, k) in enumerate(((16, 3), (24, 1), (32, 3))):
        inits.append(numpy_helper.from_array(rng.standard_normal((co, c, k, k)).astype(np.float32) * 0.1, f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[k // 2] * 4),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"]),
                  helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"a{i}"])]
        x, c = f"a{i}", co
    inits.append(numpy_helper.from_array(np.full((1,), 0.5, np.float32), "half"))
    nodes += [helper.make_node("MaxPool", [x], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Relu", ["p"], ["r"]),
              helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
              helper.make_node("Mul", ["t", "half"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 32])], initializer=inits)
    import onnx

    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))


# ---- /proc ----

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid), or None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")  # a zombie has ended; only its exit status waits


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            children.setdefault(s[1], []).append(int(name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def build_workers_of(pid: int) -> list[int]:
    """Live forked copies of `pid` among its children: the kernel-build pool's workers."""
    me = cmdline(pid)
    return [c for c in descendants(pid) if _stat(c) and _stat(c)[1] == pid and alive(c) and cmdline(c) == me]


def holders(paths) -> list[str]:
    """Processes with one of `paths` open, as 'pid: path'."""
    paths, out = {os.path.realpath(p) for p in paths}, []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if target in paths:
                out.append(f"{name}: {target} ({cmdline(int(name))[:120]!r})")
    return out


def cache_files(path) -> list[str]:
    return [str(path) + s for s in ("", "-wal", "-shm", "-journal")]


def cache_holders_after_exit(path) -> list[str]:
    """Who holds the cost cache, once the killed processes have had time to finish exiting (bounded)."""
    deadline = time.monotonic() + 20
    while (held := holders(cache_files(path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


class Tree:
    """A process started in its own session and every descendant seen since; `kill_all` ends what is left."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, env=env)
        self.seen: dict[int, bytes] = {}

    def look(self) -> set[int]:
        now = descendants(self.proc.pid)
        for p in now:
            self.seen.setdefault(p, cmdline(p))
        return now

    def left(self) -> list[int]:
        # the same pid with the same command line (or none: one still exiting has let go of its memory but perhaps
        # not of its files yet): still ours, not a new process under a reused pid
        return [p for p, cmd in self.seen.items() if alive(p) and cmdline(p) in (cmd, b"")]

    def kill_all(self):
        for pgid in {os.getpgid(p) for p in self.left() if _safe_pgid(p)} | {self.proc.pid}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.left():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.proc.stderr.close()


def _safe_pgid(pid: int) -> bool:
    try:
        return os.getpgid(pid) != os.getpgid(0)  # never our own group
    except ProcessLookupError:
        return False


def kill_while_building(tree: Tree, builder_of) -> None:
    """Wait for build workers (`builder_of()`: the pid whose forked workers to wait for, or None yet), then SIGKILL
    the root and wait for every process seen to end."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        tree.look()
        root = builder_of()
        if root is not None and len(build_workers_of(root)) >= 1:
            break
        if tree.proc.poll() is not None:
            pytest.fail(f"it ended ({tree.proc.returncode}) before any build worker was seen: "
                        f"{tree.proc.stderr.read().decode(errors='replace')[-2000:]}")
        time.sleep(0.01)
    else:
        pytest.fail("no build worker was seen in 300 s")
    tree.look()
    workers = build_workers_of(root)
    tree.proc.kill()
    tree.proc.wait(30)
    deadline = time.monotonic() + 20
    while tree.left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers and not tree.left(), {p: tree.seen[p][:200] for p in tree.left()}


def _env(**extra):
    return dict(os.environ, ONNXOPT_BUILD_WORKERS="2", **extra)


def test_sigkill_of_onnxopt_with_live_build_workers_leaves_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    several_kernels(src / "m.onnx")
    cache = tmp_path / "costs.sqlite"
    tree = Tree([sys.executable, "-m", "onnxopt", str(src / "m.onnx"), "-o", str(out / "f.onnx"),
                 "--cost-cache", str(cache), *QUICK], _env())
    try:
        kill_while_building(tree, lambda: tree.proc.pid)
        assert os.listdir(out) == []  # no temporary, no half-written output
        assert os.listdir(src) == ["m.onnx"]
        assert cache_holders_after_exit(cache) == []
    finally:
        tree.kill_all()


def test_sigkill_of_onnxopt_batch_with_live_build_workers_leaves_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    several_kernels(src / "m.onnx")
    cache = tmp_path / "costs.sqlite"
    tree = Tree([sys.executable, "-m", "onnxopt", "batch", str(src / "m.onnx"), "-o", str(out), "--no-bench", "-q",
                 "--cost-cache", str(cache), *QUICK], _env())

    def optimizer():  # the batch's child that optimizes m.onnx: the build workers are its forks
        return next((p for p in tree.look() if b"-o\0" + str(out / "m.onnx").encode() in cmdline(p)
                     and _stat(p) and _stat(p)[1] == tree.proc.pid), None)

    try:
        kill_while_building(tree, optimizer)
        # the batch's own files (its lock, the model's log) may stay; no model output and no temporary
        assert set(os.listdir(out)) <= {".batch.lock", "m.log", "batch-state.json"}, os.listdir(out)
        assert os.listdir(src) == ["m.onnx"]
        assert cache_holders_after_exit(cache) == []
    finally:
        tree.kill_all()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is an optional extra: pip install "
                    "onnxopt[ray]")
def test_ray_at_an_address_where_nothing_answers_fails_at_once_in_one_line(tmp_path):
    src = tmp_path / "m.onnx"
    several_kernels(src)
    tree = Tree([sys.executable, "-m", "onnxopt", "batch", str(src), "-o", str(tmp_path / "out"), "--ray",
                 "127.0.0.1:1"], _env())
    try:
        t = time.monotonic()
        try:
            tree.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail("still running after 60 s")
        err = tree.proc.stderr.read().decode(errors="replace")
        assert time.monotonic() - t < 30 and tree.proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxopt: error: --ray 127.0.0.1:1"), err
        assert not os.path.exists(tmp_path / "out")
    finally:
        tree.kill_all()
