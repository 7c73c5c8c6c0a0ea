"""The outputs on a hostile filesystem: `-o`, `<out>.so`, `<out>.data` and `--report` onto FIFOs, sockets, device
nodes and folders, symlinks planted at every output and at the old predictable temporary names, read-only folders,
/proc and /sys, a full disk (RLIMIT_FSIZE), failures after the outputs were staged, a name the loader refuses, and
`optimize(model_proto)` without an output.

Every case asserts that nothing was lost (a file at a destination keeps its bytes unless the run succeeded), nothing
followed (the target of a planted link is unchanged, and a dangling link's target is not created), nothing left
behind (the folder holds what it held plus, on success, the outputs: no `.onnxopt-*` folder, no `*.tmp`) and nothing
left running (the CLI runs in its own session; no process of that session outlives it).

Real files in the test's own folder, the CLI as a user runs it (`python -m onnxopt`), a small elementwise chain."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import const, make_model

import onnxopt
from onnxopt.emit.model import META_LIBRARY
from onnxopt.errors import UsageError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs, device nodes, /proc and /sys")

SHAPE = [1, 64, 32, 32]
QUICK = ["--no-measure", "--threads", "1", "-q"]
ROOT = os.geteuid() == 0


# ---- the models ----

def _chain(big: bool):
    """x -> Mul(a) -> Add(b) -> Sigmoid -> Mul(x): one fused elementwise kernel. `big`: `a` a full [1,64,32,32]
    tensor (256 KiB, more than the library), else a scalar."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Mul", ["x", "a"], ["t1"]), helper.make_node("Add", ["t1", "b"], ["t2"]),
             helper.make_node("Sigmoid", ["t2"], ["t3"]), helper.make_node("Mul", ["t3", "x"], ["y"])]
    a = (numpy_helper.from_array(np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32), "a") if big
         else const("a", 1.5))
    return make_model(nodes, [vi("x", TensorProto.FLOAT, SHAPE)], [vi("y", TensorProto.FLOAT, SHAPE)],
                      [a, const("b", 0.25)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """small.onnx (inline, scalar constants), ext.onnx + ext.onnx.data (its weights external: the output gets a
    .data too), big.onnx (inline, 256 KiB: larger than its library); and an input with the small model's answer."""
    d = tmp_path_factory.mktemp("inputs")
    onnx.save(_chain(False), str(d / "small.onnx"))
    onnx.save(_chain(True), str(d / "big.onnx"))
    onnx.save(_chain(True), str(d / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    np.save(d / "x.npy", x)
    z = x * 1.5 + 0.25
    want = (1 / (1 + np.exp(-z))) * x
    return {"small": str(d / "small.onnx"), "ext": str(d / "ext.onnx"), "big": str(d / "big.onnx"),
            "x": str(d / "x.npy"), "want": want}


# ---- what a folder holds, and what runs ----

def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(folder) -> dict:
    """name -> what it is, without following anything: ('file', sha256), ('link', target), ('fifo',), ('socket',),
    ('char', rdev), ('dir', its own snapshot)."""
    out = {}
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out[name] = ("link", os.readlink(p))
        elif stat.S_ISREG(st.st_mode):
            out[name] = ("file", _sha(p))
        elif stat.S_ISDIR(st.st_mode):
            out[name] = ("dir", tuple(sorted(snapshot(p).items())))
        elif stat.S_ISFIFO(st.st_mode):
            out[name] = ("fifo",)
        elif stat.S_ISSOCK(st.st_mode):
            out[name] = ("socket",)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            out[name] = ("char" if stat.S_ISCHR(st.st_mode) else "block", st.st_rdev)
        else:
            out[name] = ("other", stat.S_IFMT(st.st_mode))
    return out


def assert_clean(folder, before: dict, written=()) -> dict:
    """Nothing lost or left behind: every entry of `before` is as it was, except the names in `written` (the outputs
    of a run that succeeded), which are now regular files; nothing else appeared."""
    after = snapshot(folder)
    stray = [n for n in after if n.startswith(".onnxopt-") or n.endswith(".tmp") and n not in before]
    assert not stray, f"left behind in {folder}: {stray}"
    assert set(after) == set(before) | set(written), \
        f"{folder}: new {sorted(set(after) - set(before) - set(written))}, gone {sorted(set(before) - set(after))}"
    for name, was in before.items():
        if name not in written:
            assert after[name] == was, f"{name} changed: {was} -> {after[name]}"
    for name in written:
        assert after[name][0] == "file", f"{name} is {after[name]}, not a regular file"
    return after


def _session_members(sid: int) -> list[str]:
    """The live processes of session `sid` (the CLI is started as a session leader: its workers stay in it)."""
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(f"{pid} {head.split('(', 1)[1]}")
    return left


def cli(*args, fsize: int | None = None, timeout: float = 120):
    """`python -m onnxopt ARGS` in a session of its own (RLIMIT_FSIZE `fsize` bytes); asserts that nothing of the
    session is left running once it exits. A run that blocks (a FIFO opened for writing) is killed and fails."""
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    p = subprocess.Popen([sys.executable, "-m", "onnxopt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=limit)  # noqa: PLW1509
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"onnxopt {' '.join(args)} hung for {timeout} s (blocked on a FIFO or device?)")
    left = _session_members(p.pid)
    if left:
        for entry in left:
            try:
                os.kill(int(entry.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"left running after onnxopt exited: {left}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _children() -> set[int]:
    me, kids = os.getpid(), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.add(int(pid))
    return kids


@pytest.fixture
def no_new_children():
    """For in-process runs: no process started by the run outlives it."""
    before = _children()
    yield
    assert _children() <= before, f"left running: {_children() - before}"


def error_line(r, *names, alone=True) -> str:
    """The run's error line, its last (`alone`: its only one); it names every one of `names`; no traceback, no
    'internal error'."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("onnxopt: error: "), r.stderr
    assert len(lines) == 1 or not alone, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for name in names:
        assert str(name) in lines[-1], (name, lines[-1])
    return lines[-1]


@pytest.fixture
def outside(tmp_path):
    """A folder elsewhere with victim files: planted links point here."""
    d = tmp_path / "outside"
    d.mkdir()
    for i in range(12):
        (d / f"victim{i}").write_bytes(f"the victim's own bytes {i}\n".encode())
    return d


# ---- 1. destinations that are not regular files ----

def _make_node(kind: str, path: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        # An AF_UNIX name is at most 107 bytes: bind by a name relative to the folder.
        cwd = os.getcwd()
        os.chdir(os.path.dirname(path))
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.basename(path))
            s.close()
        finally:
            os.chdir(cwd)
    elif kind == "device":
        if not ROOT:
            pytest.skip("making a device node needs root (CAP_MKNOD)")
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("mknod refused here (no CAP_MKNOD in this container)")
    elif kind == "folder":
        os.mkdir(path)
        with open(os.path.join(path, "keep"), "wb") as f:
            f.write(b"a file in the folder\n")
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("where", ["", ".so", ".data", "report"])
@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "folder"])
def test_a_destination_that_is_not_a_regular_file_is_refused_before_any_work(models, tmp_path, kind, where):
    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "f.onnx"), str(d / "r.json")
    node = rep if where == "report" else out + where
    _make_node(kind, node)
    before = snapshot(d)
    r = cli(models["small"], "-o", out, "--report", rep, *QUICK)
    assert r.returncode == 2, r.stderr
    line = error_line(r, node)
    assert ("a folder" if kind == "folder" else "a FIFO" if kind == "fifo" else "a socket" if kind == "socket"
            else "a device node") in line
    assert_clean(d, before)


# ---- 2. planted symlinks ----

@pytest.mark.parametrize("target", ["victim", "dangling"])
def test_links_at_the_outputs_are_replaced_never_followed(models, tmp_path, outside, target):
    """A link at the model, its .data, its .so and the report, each to a file elsewhere (or to a name that does not
    exist there): the run writes regular files in their place; no victim changes, no dangling target appears."""
    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "e.onnx"), str(d / "r.json")
    names = ["e.onnx", "e.onnx.data", "e.onnx.so", "r.json"]
    for i, name in enumerate(names):
        os.symlink(str(outside / (f"victim{i}" if target == "victim" else f"created{i}")), str(d / name))
    before, victims = snapshot(d), snapshot(outside)
    r = cli(models["ext"], "-o", out, "--report", rep, *QUICK)
    assert r.returncode == 0, r.stderr
    assert snapshot(outside) == victims, "a planted link was followed"
    assert_clean(d, before, written=names)
    m = onnx.load(out, load_external_data=False)
    assert {p.key: p.value for p in m.metadata_props}[META_LIBRARY] == "e.onnx.so"
    with open(rep) as f:
        assert json.load(f)["output"]["path"] == out


def test_links_at_the_old_temporary_names_are_never_written(models, tmp_path, outside, no_new_children):
    """Links at every name the writers used to open (`.<out>.so.<pid>.tmp`, `<out>.so.tmp`, `.<name>.tmp`...), to
    victims and to names that do not exist: an in-process run (its pid is the one those names used) leaves all of
    them as they were."""
    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "f.onnx"), str(d / "r.json")
    pid = os.getpid()
    planted = [f".f.onnx.so.{pid}.tmp", "f.onnx.so.tmp", ".f.onnx.tmp", ".f.onnx.so.tmp", "f.onnx.tmp",
               ".f.onnx.data.tmp", "f.onnx.data.tmp", f".f.onnx.{pid}.tmp", ".r.json.tmp", "r.json.tmp",
               f".r.json.{pid}.tmp", f"f.onnx.so.{pid}.tmp"]
    for i, name in enumerate(planted):
        os.symlink(str(outside / (f"victim{i}" if i % 2 else f"created{i}")), str(d / name))
    before, victims = snapshot(d), snapshot(outside)
    res = onnxopt.optimize(models["small"], out, measure=False, threads=1, report_file=rep)
    assert res.report["fused_regions"] == 1 and res.library == out + ".so"
    assert snapshot(outside) == victims, "a planted link was followed"
    assert_clean(d, before, written=["f.onnx", "f.onnx.so", "r.json"])


# ---- 3. read-only folders, /proc and /sys ----

@pytest.fixture
def read_only(tmp_path):
    """A folder nobody can create files in: mode 0555 for a user; as root (whom mode bits do not stop) a read-only
    tmpfs mounted there, or a skip where mounting is not allowed."""
    d = tmp_path / "ro"
    d.mkdir()
    if not ROOT:
        (d / "earlier").write_bytes(b"here before\n")
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"as root, a read-only folder needs a read-only mount, and mount failed here: "
                    f"{r.stderr.decode().strip()[:200]}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_a_read_only_folder_is_exit_2_naming_it(models, read_only):
    before = snapshot(read_only)
    out = str(read_only / "f.onnx")
    r = cli(models["small"], "-o", out, *QUICK)
    assert r.returncode == 2, r.stderr
    error_line(r, read_only)
    assert_clean(read_only, before)


@pytest.mark.parametrize("folder", ["/proc/sys", "/sys/kernel", "/proc"])
def test_an_output_in_proc_or_sys_is_exit_2_naming_it(models, folder):
    if not os.path.isdir(folder):
        pytest.skip(f"no {folder} here")
    before = sorted(os.listdir(folder))
    out = os.path.join(folder, "f.onnx")
    r = cli(models["small"], "-o", out, *QUICK)
    assert r.returncode == 2, r.stderr
    error_line(r, out)
    assert not os.path.lexists(out) and not os.path.lexists(out + ".so")
    assert not [n for n in os.listdir(folder) if n.startswith(".onnxopt") and n not in before]


@pytest.mark.parametrize("report", ["/proc/r.json", "/sys/kernel/r.json", "/proc/sys/r.json"])
def test_a_report_in_proc_or_sys_is_exit_2_before_any_work(models, tmp_path, report):
    if not os.path.isdir(os.path.dirname(report)):
        pytest.skip(f"no {os.path.dirname(report)} here")
    d = tmp_path / "run"
    d.mkdir()
    (d / "f.onnx").write_bytes(b"an earlier model\n")
    before = snapshot(d)
    r = cli(models["small"], "-o", str(d / "f.onnx"), "--report", report, *QUICK)
    assert r.returncode == 2, r.stderr
    error_line(r, report)
    assert_clean(d, before)
    assert not os.path.lexists(report)


# ---- 4. a full disk ----

@pytest.mark.parametrize("model,limit", [("small", 20 << 10), ("big", 230 << 10)],
                         ids=["library-fails-20k", "model-fails-230k"])
def test_a_full_disk_is_a_clear_error_and_leaves_every_destination_as_it_was(models, tmp_path, model, limit):
    """RLIMIT_FSIZE: at 20 KiB the kernel library cannot be built (the compiler or linker is stopped); at 230 KiB
    the library (about 170 KiB) is written and the 256 KiB model is not. Either way one error line, exit 2 (a full
    disk is the destination's fault, not a bug: no 'internal error', no traceback), the earlier outputs intact.
    For the second, a run without the limit first fills the compiler caches (the kernel runtime's assembly alone is
    larger than 230 KiB), so that the limited run writes only the library and then the model."""
    d = tmp_path / "run"
    d.mkdir()
    if model == "big":
        (tmp_path / "warm").mkdir()
        onnxopt.optimize(models[model], str(tmp_path / "warm" / "f.onnx"), measure=False, threads=1)
    out, rep = str(d / "f.onnx"), str(d / "r.json")
    for name in ("f.onnx", "f.onnx.so", "f.onnx.data", "r.json"):
        (d / name).write_bytes(f"the earlier {name}\n".encode())
    before = snapshot(d)
    r = cli(models[model], "-o", out, "--report", rep, *QUICK, fsize=limit)
    assert r.returncode == 2, r.stderr
    line = error_line(r, alone=False)  # a warning may come first: the cost cache cannot be written either
    if model == "big":
        assert str(d) in line and "File too large" in line, line
    assert_clean(d, before)


# ---- 5 and 8. failures after the outputs were staged ----

def _earlier(d, names):
    for name in names:
        (d / name).write_bytes(f"the earlier {name}\n".encode())


def _main(args, capsys):
    from onnxopt.cli.main import main

    capsys.readouterr()
    code = main(args)
    return code, capsys.readouterr().err


def test_a_rename_that_fails_puts_every_earlier_file_back_exit_3(models, tmp_path, monkeypatch, capsys,
                                                                   no_new_children):
    """The model's rename (the last one) fails after the report and the library were published: exit 3, and the
    earlier model, library and report are back with their bytes; nothing new is left."""
    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "f.onnx"), str(d / "r.json")
    _earlier(d, ["f.onnx", "f.onnx.so", "r.json"])
    before = snapshot(d)
    rename = os.rename
    failed = []

    def flaky(src, dst, *a, **k):
        if os.fspath(dst) == out and os.path.basename(os.fspath(src)) == "f.onnx":  # the staged model
            failed.append(src)
            raise OSError(errno.EIO, "Input/output error (injected)")
        return rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", flaky)
    code, err = _main([models["small"], "-o", out, "--report", rep, *QUICK], capsys)
    assert failed and code == 3, err
    assert "internal error" in err and "nothing was written" in err and err.count("\n") == 1, err
    assert_clean(d, before)


@pytest.mark.parametrize("suffix", ["", ".so", ".data"])
def test_a_folder_made_at_an_output_during_the_run_is_exit_2_and_the_rest_put_back(models, tmp_path, monkeypatch,
                                                                                   capsys, no_new_children, suffix):
    """A folder appears at `<out><suffix>` between the first check and the publish: exit 2 naming it, the files
    published before it are taken back, the earlier ones (and the folder, which is not ours) left as they were."""
    from onnxopt.graph import publish

    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "e.onnx"), str(d / "r.json")
    _earlier(d, [n for n in ("e.onnx", "e.onnx.so", "e.onnx.data", "r.json") if n != "e.onnx" + suffix])
    real = publish.Staging.publish

    def racing(self, suffixes, remove=()):
        if self.destination == out:
            os.mkdir(out + suffix)
        return real(self, suffixes, remove)

    monkeypatch.setattr(publish.Staging, "publish", racing)
    before = snapshot(d)
    code, err = _main([models["ext"], "-o", out, "--report", rep, *QUICK], capsys)
    assert code == 2, err
    assert out + suffix in err and "a folder" in err and err.count("\n") == 1, err
    before["e.onnx" + suffix] = ("dir", ())  # the folder that appeared, not ours: left as it is
    assert_clean(d, before)


@pytest.mark.parametrize("how", ["write", "rename"])
def test_a_report_that_fails_at_the_end_leaves_no_model_library_or_report(models, tmp_path, monkeypatch, capsys,
                                                                         no_new_children, how):
    """The report is published first; it fails (its write: no room, exit 2; its rename: an I/O error, exit 3):
    no model, library or report is left, the earlier ones keep their bytes."""
    from onnxopt.driver import outputs

    d = tmp_path / "run"
    d.mkdir()
    out, rep = str(d / "f.onnx"), str(d / "r.json")
    _earlier(d, ["f.onnx.so", "r.json"])  # an earlier library and report; no model yet
    before = snapshot(d)
    if how == "write":
        def full(path, *a, **k):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(outputs, "create_new", full)
    else:
        rename = os.rename

        def flaky(src, dst, *a, **k):
            if os.fspath(dst) == rep and os.path.basename(os.fspath(src)) == "r.json":
                raise OSError(errno.EIO, "Input/output error (injected)")
            return rename(src, dst, *a, **k)

        monkeypatch.setattr(os, "rename", flaky)
    code, err = _main([models["small"], "-o", out, "--report", rep, *QUICK], capsys)
    assert code == (2 if how == "write" else 3), err
    assert "nothing was written" in err and err.count("\n") == 1, err
    if how == "write":
        assert err.startswith("onnxopt: error: ") and "No space left" in err, err
    assert_clean(d, before)


# ---- 6. a name the loader refuses ----

def test_a_backslash_in_the_output_name_is_refused_before_any_work(models, tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    before = snapshot(d)
    out = str(d / "a\\b.onnx")
    r = cli(models["small"], "-o", out, *QUICK)
    assert r.returncode == 2, r.stderr
    error_line(r, out)
    assert_clean(d, before)


# ---- 7. optimize(model_proto) without an output, then Result.save ----

_LOAD = """
import json, sys
import numpy as np
import onnxopt.runtime as rt
sess = rt.InferenceSession(sys.argv[1])
lib = rt.registered_library(sess)
y = sess.run(None, {"x": np.load(sys.argv[2])})[0]
print(json.dumps({"library": lib and str(lib), "y": y.ravel()[:4096].tolist()}))
"""


def test_optimize_without_an_output_writes_nothing_and_save_writes_a_model_that_loads(models, tmp_path, monkeypatch,
                                                                                      outside, no_new_children):
    cwd, tmp, d = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "saved"
    for f in (cwd, tmp, d):
        f.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    res = onnxopt.optimize(onnx.load(models["small"]), measure=False, threads=1)
    assert res.report["fused_regions"] == 1
    assert os.listdir(cwd) == [] and os.listdir(tmp) == [], "optimize without an output left files behind"
    assert res.output is None and res.library is None
    assert META_LIBRARY not in {p.key for p in res.model.metadata_props}, "the model names a library that is gone"
    assert res.library_data and res.library_data[:4] == b"\x7fELF"

    # save: the model and its library, named in its metadata; nothing else; through a planted link, never into it
    path = str(d / "s.onnx")
    os.symlink(str(outside / "victim0"), path)
    victims = snapshot(outside)
    written = res.save(path)
    assert sorted(written) == [path, path + ".so"]
    assert snapshot(outside) == victims
    assert_clean(d, {}, written=["s.onnx", "s.onnx.so"])
    assert {p.key: p.value for p in onnx.load(path).metadata_props}[META_LIBRARY] == "s.onnx.so"
    assert META_LIBRARY not in {p.key for p in res.model.metadata_props}, "save changed the Result's model"
    assert os.listdir(tmp) == []

    # a fresh process loads it through the public loader, registers the library and gives the original's answers
    r = subprocess.run([sys.executable, "-c", _LOAD, path, models["x"]], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["library"], "onnxopt.runtime did not register the saved library"
    np.testing.assert_allclose(np.array(got["y"], np.float32), models["want"].ravel()[:4096], rtol=1e-4, atol=1e-5)

    # refused, and nothing written: a FIFO, a backslash, a folder at <path>.so
    after = snapshot(d)
    os.mkfifo(str(d / "p.onnx"))
    os.mkdir(str(d / "q.onnx.so"))
    after = snapshot(d)
    for bad in (str(d / "p.onnx"), str(d / "a\\b.onnx"), str(d / "q.onnx")):
        with pytest.raises(UsageError):
            res.save(bad)
    assert_clean(d, after)


def test_save_of_a_result_written_elsewhere_copies_its_library(models, tmp_path, no_new_children):
    """A Result of optimize(model, output) saved to another folder: the copy names and carries its own library
    (not the first output's, which is not beside it), and the loader registers it."""
    import onnxopt.runtime as rt

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    res = onnxopt.optimize(models["small"], str(a / "f.onnx"), measure=False, threads=1)
    first = snapshot(a)
    written = res.save(str(b / "g.onnx"))
    assert sorted(written) == [str(b / "g.onnx"), str(b / "g.onnx.so")]
    assert snapshot(a) == first
    after = assert_clean(b, {}, written=["g.onnx", "g.onnx.so"])
    assert after["g.onnx.so"] == first["f.onnx.so"]
    assert {p.key: p.value for p in onnx.load(str(b / "g.onnx")).metadata_props}[META_LIBRARY] == "g.onnx.so"
    sess = rt.InferenceSession(str(b / "g.onnx"))
    assert rt.registered_library(sess) is not None
    got = sess.run(None, {"x": np.load(models["x"])})[0]
    np.testing.assert_allclose(got, models["want"], rtol=1e-4, atol=1e-5)


# ---- 9. batch: its own files in the output folder ----

@pytest.mark.parametrize("planted", ["m.log", ".batch.lock"])
def test_batch_never_writes_through_a_link_planted_at_its_own_files(models, tmp_path, outside, planted):
    """`onnxopt batch` writes a lock and a log per model in OUT: a link planted at either name is refused (exit 2,
    one line), never written through."""
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(onnx.load(models["small"]), str(src / "m.onnx"))
    out = tmp_path / "out"
    out.mkdir()
    victim = outside / "victim0"
    before = victim.read_bytes()
    os.symlink(victim, out / planted)
    r = cli("batch", str(src), "-o", str(out), "--no-bench", *QUICK)
    assert victim.read_bytes() == before
    assert r.returncode == 2 and ("symbolic link" in r.stderr or "outside" in r.stderr), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
