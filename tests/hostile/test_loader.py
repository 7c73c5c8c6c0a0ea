"""The loader on a hostile filesystem: it never follows a link out of the model's folder, never loads a file other
than the one it checked, and never trusts a library that someone else can write. Real files in the test's own
folder, real onnxruntime sessions."""

import hashlib
import os
import shutil
import stat
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxopt
import onnxopt.runtime as rt
from onnxopt.emit.model import META_LIBRARY, META_SHA256
from onnx_builders import const, make_model

SHAPE = [1, 32, 16, 16]


def _chain(ops):
    """x -> op(x, c) -> Relu-like unary -> op(., x): a small elementwise chain that onnxopt fuses into one kernel."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node(ops[0], ["x", "c"], ["t"]), helper.make_node(ops[1], ["t"], ["u"]),
             helper.make_node("Mul", ["u", "x"], ["y"])]
    return make_model(nodes, [vi("x", TensorProto.FLOAT, SHAPE)], [vi("y", TensorProto.FLOAT, SHAPE)],
                      [const("c", 0.5)])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two fused models with two different libraries: A (served in the tests) and B (the impostor)."""
    d = tmp_path_factory.mktemp("loader")
    out = {}
    for key, ops in (("a", ("Add", "Relu")), ("b", ("Sub", "Sigmoid"))):
        src = str(d / f"{key}.onnx")
        onnx.save(_chain(ops), src)
        fused = str(d / key / "fused.onnx")
        os.makedirs(os.path.dirname(fused))
        res = onnxopt.optimize(src, fused, measure=False)
        assert res.report["fused_regions"] > 0 and os.path.isfile(fused + ".so")
        out[key] = fused
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    want = x * np.maximum(x + 0.5, 0)
    assert _sha(out["a"] + ".so") != _sha(out["b"] + ".so")
    return out, x, want


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _serve(built, folder, name="fused.onnx.so", lib_name=None):
    """Model A and a copy of its library in `folder` (mode 755, files 644); `lib_name`: the name the model's
    metadata gives (its sha256 stays A's)."""
    (paths, _, _) = built
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)
    model = onnx.load(paths["a"])
    if lib_name is not None:
        for p in model.metadata_props:
            if p.key == META_LIBRARY:
                p.value = lib_name
    path = os.path.join(folder, "fused.onnx")
    onnx.save(model, path)
    if name:
        shutil.copy(paths["a"] + ".so", os.path.join(folder, name))
        os.chmod(os.path.join(folder, name), 0o644)
    return path


def _mapped():
    """(major, minor, inode) of every file mapped into this process."""
    seen = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[4] != "0":
                major, minor = parts[3].split(":")
                seen.add((int(major, 16), int(minor, 16), int(parts[4])))
    return seen


def _file_id(path):
    st = os.stat(path)
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _run_refused(built, model, match, **kw):
    """The library is refused with a warning that says why, and the model still answers right (function bodies)."""
    _, x, want = built
    with pytest.warns(rt.LibraryNotUsedWarning, match=match):
        sess = rt.InferenceSession(model, **kw)
    assert rt.registered_library(sess) is None
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def _run_loaded(built, model, lib, **kw):
    """The library is registered (no warning), the very content checked is what is mapped, and it answers right."""
    _, x, want = built
    with warnings.catch_warnings():
        warnings.simplefilter("error", rt.LibraryNotUsedWarning)
        sess = rt.InferenceSession(model, **kw)
    assert rt.registered_library(sess) == os.path.realpath(lib)
    loaded = rt.registered_library(sess, loadable=True)
    assert _sha(loaded) == _sha(built[0]["a"] + ".so") and _file_id(loaded) in _mapped()
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    return sess


def test_a_library_in_the_models_folder_loads(built, tmp_path):
    model = _serve(built, str(tmp_path / "m"))
    _run_loaded(built, model, model + ".so")


def test_a_model_reached_through_a_linked_folder_loads_its_library_from_the_real_folder(built, tmp_path):
    model = _serve(built, str(tmp_path / "real"))
    os.symlink(tmp_path / "real", tmp_path / "link")
    _run_loaded(built, str(tmp_path / "link" / "fused.onnx"), model + ".so")


def test_a_library_linked_out_of_the_models_folder_is_refused_even_when_its_hash_matches(built, tmp_path):
    elsewhere = _serve(built, str(tmp_path / "elsewhere"))
    model = _serve(built, str(tmp_path / "m"), name=None)
    os.symlink(elsewhere + ".so", model + ".so")
    assert _sha(model + ".so") == dict((p.key, p.value) for p in onnx.load(model).metadata_props)[META_SHA256]
    _run_refused(built, model, "symbolic link")


@pytest.mark.parametrize("explicit", [False, True], ids=["model's library", "library="])
def test_a_library_swapped_between_check_and_load_is_not_loaded(built, tmp_path, monkeypatch, explicit):
    """Right after the hash, the file at the path is replaced by another real library: the session must run the
    content that was checked, and the impostor must never be mapped."""
    model = _serve(built, str(tmp_path / "m"))
    lib = model + ".so"
    impostor = str(tmp_path / "impostor.so")
    shutil.copy(built[0]["b"] + ".so", impostor)  # a fresh inode no one has loaded
    os.chmod(impostor, 0o644)
    impostor_id = _file_id(impostor)
    hash_fd = rt._sha256_fd
    swapped = []

    def hash_then_swap(fd):
        digest = hash_fd(fd)
        os.replace(impostor, lib)
        swapped.append(True)
        return digest

    monkeypatch.setattr(rt, "_sha256_fd", hash_then_swap)
    _run_loaded(built, model, lib, **({"library": lib} if explicit else {}))
    assert swapped and _file_id(lib) == impostor_id and impostor_id not in _mapped()


def test_without_proc_a_private_copy_of_the_checked_bytes_is_loaded(built, tmp_path, monkeypatch):
    monkeypatch.setattr(rt, "_PROC_FD", str(tmp_path / "no-proc"))
    model = _serve(built, str(tmp_path / "m"))
    sess = _run_loaded(built, model, model + ".so")
    loaded = rt.registered_library(sess, loadable=True)
    assert not loaded.startswith("/proc/") and stat.S_IMODE(os.stat(os.path.dirname(loaded)).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o664, 0o646], ids=["group-writable", "world-writable"])
def test_a_library_others_can_write_is_refused(built, tmp_path, mode):
    model = _serve(built, str(tmp_path / "m"))
    os.chmod(model + ".so", mode)
    _run_refused(built, model, "writable by other users")
    _run_refused(built, model, "writable by other users", library=model + ".so")


def test_a_folder_others_can_write_is_refused_unless_sticky(built, tmp_path):
    folder = str(tmp_path / "m")
    model = _serve(built, folder)
    os.chmod(folder, 0o777)
    _run_refused(built, model, "writable by other users")
    os.chmod(folder, 0o1777)  # as /tmp: others cannot replace our files in it
    _run_loaded(built, model, model + ".so")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root (chown)")
@pytest.mark.parametrize("what", ["library", "folder"])
def test_a_library_or_folder_owned_by_another_user_is_refused(built, tmp_path, what):
    folder = str(tmp_path / "m")
    model = _serve(built, folder)
    os.chown(model + ".so" if what == "library" else folder, 65534, 65534)  # nobody
    _run_refused(built, model, "owned by another user")


@pytest.mark.parametrize("name", ["../fused.onnx.so", "ABS", "sub\\fused.onnx.so"])
def test_a_model_naming_a_library_outside_its_folder_is_refused(built, tmp_path, name):
    """The named file exists with the right hash; the name alone is refused."""
    folder = str(tmp_path / "m")
    if name == "ABS":
        name = str(tmp_path / "fused.onnx.so")
    model = _serve(built, folder, name=None, lib_name=name)
    shutil.copy(built[0]["a"] + ".so", tmp_path / "fused.onnx.so")
    shutil.copy(built[0]["a"] + ".so", os.path.join(folder, name))
    _run_refused(built, model, "not a file in the model's own folder")


def test_a_library_the_caller_names_may_lie_anywhere(built, tmp_path):
    model = _serve(built, str(tmp_path / "m"), name=None)
    lib = _serve(built, str(tmp_path / "libs")) + ".so"
    _run_loaded(built, model, lib, library=lib)


def test_a_fifo_or_folder_at_the_librarys_name_is_refused_without_blocking(built, tmp_path):
    model = _serve(built, str(tmp_path / "m"), name=None)
    os.mkfifo(model + ".so")
    _run_refused(built, model, "not a regular file")
    os.unlink(model + ".so")
    os.mkdir(model + ".so")
    _run_refused(built, model, "not a regular file")


def test_a_tampered_library_is_refused(built, tmp_path):
    model = _serve(built, str(tmp_path / "m"))
    with open(model + ".so", "ab") as f:
        f.write(b"\0")
    _run_refused(built, model, "does not match")


def test_the_loaded_name_stays_bound_to_the_checked_file(built, tmp_path):
    """dlopen reuses a loaded library by name: the name a session was loaded by must not come to mean another file
    (a /proc/self/fd/N whose N was closed and reused), or a later model would get an earlier model's kernels."""
    import ctypes

    model = _serve(built, str(tmp_path / "m"))
    sess = _run_loaded(built, model, model + ".so")
    loaded = rt.registered_library(sess, loadable=True)
    del sess
    shutil.copy(built[0]["b"] + ".so", tmp_path / "other.so")
    fds = [os.open(tmp_path / "other.so", os.O_RDONLY) for _ in range(8)]  # take the lowest free numbers
    try:
        assert _sha(loaded) == _sha(built[0]["a"] + ".so")
        assert ctypes.CDLL(loaded)._handle == ctypes.CDLL(os.path.realpath(model + ".so"))._handle
    finally:
        for fd in fds:
            os.close(fd)
    assert stat.S_ISREG(os.stat(loaded).st_mode)
