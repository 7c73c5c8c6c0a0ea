"""Bad usage of `onnxopt batch` is one line and exit 2, before anything is written; sources and output paths."""

import os
import subprocess
import sys

import pytest
from batch_models import add_relu_mul, tree_hashes

from onnxopt.batch.sources import collect_sources
from onnxopt.cli.main import main


@pytest.fixture
def zoo(tmp_path):
    add_relu_mul(tmp_path / "zoo" / "a.onnx")
    add_relu_mul(tmp_path / "zoo" / "sub" / "a.onnx")
    return tmp_path / "zoo"


def one_line_error(capsys, argv) -> str:
    rc = main(["batch", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxopt: error: "), err
    return lines[0]


@pytest.mark.parametrize("args, words", [
    ([], "no sources"),
    (["{zoo}/missing.onnx"], "no such file"),
    (["{zoo}", "--timeout", "-1"], "--timeout -1"),
    (["{zoo}", "--timeout", "nan"], "--timeout nan"),
    (["{zoo}", "--memory-limit", "0"], "--memory-limit 0"),
    (["{zoo}", "--bench-time", "inf"], "--bench-time inf"),
    (["{zoo}", "--jobs", "0"], "--jobs 0"),
    (["{zoo}", "--jobs", "two"], "invalid int value"),
    (["{zoo}", "--threads", "0"], "--threads 0"),
    (["{zoo}", "--tune-budget", "nan"], "--tune-budget nan"),
    (["{zoo}", "--frobnicate"], "unrecognized arguments"),
    (["{zoo}", "--cost-cache", "x.sqlite", "--no-cost-cache"], "--no-cost-cache"),
    (["{zoo}/sub/a.onnx", "{zoo}/notes.md"], "not an .onnx model"),
    (["{zoo}/../empty"], "no .onnx files"),
    (["@{zoo}/../nolist.txt"], "no such list file"),
])
def test_bad_usage_is_one_line_and_exit_2(capsys, tmp_path, zoo, args, words):
    (zoo / "notes.md").write_text("x")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    line = one_line_error(capsys, [a.format(zoo=zoo) for a in args] + ["-o", str(out)])
    assert words in line
    assert not out.exists()  # nothing written


def test_output_folder_mistakes(capsys, tmp_path, zoo):
    before = tree_hashes(zoo)
    (tmp_path / "file").write_text("x")
    assert "is a file" in one_line_error(capsys, [str(zoo), "-o", str(tmp_path / "file")])
    assert "this source folder" in one_line_error(capsys, [str(zoo), "-o", str(zoo)])
    # the output of zoo/a.onnx into zoo/ would be zoo/a.onnx itself
    assert "overwrite the source" in one_line_error(capsys, [str(zoo / "a.onnx"), "-o", str(zoo)])
    # relative to zoo/, the output of zoo/a.onnx under zoo/sub/ is zoo/sub/a.onnx, the other source
    assert "overwrite the source" in one_line_error(capsys, [str(zoo / "a.onnx"), str(zoo / "sub" / "a.onnx"),
                                                             "-o", str(zoo / "sub")])
    assert tree_hashes(zoo) == before


def test_list_file_mistakes(capsys, tmp_path, zoo):
    bad = tmp_path / "bad.txt"
    bad.write_text("zoo/a.onnx\nzoo/sub/a.onnx --bogus 1\n")
    assert f"{bad}:2" in one_line_error(capsys, ["@" + str(bad), "-o", str(tmp_path / "out")])
    bad.write_text("zoo/a.onnx --timeout 0\n")
    assert "--timeout 0" in one_line_error(capsys, [str(bad), "-o", str(tmp_path / "out")])
    bad.write_text("zoo/a.onnx\nzoo/missing.onnx\n")
    assert f"{bad}:2: no such file" in one_line_error(capsys, [str(bad), "-o", str(tmp_path / "out")])


def test_ray_missing_says_what_to_install(capsys, monkeypatch, tmp_path, zoo):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    line = one_line_error(capsys, [str(zoo), "-o", str(tmp_path / "out"), "--ray", "auto"])
    assert "install onnxopt[ray]" in line


def test_the_command_line_itself(tmp_path):
    r = subprocess.run([sys.executable, "-m", "onnxopt", "batch", str(tmp_path / "nothing"), "-o",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file or folder" in r.stderr


def test_sources_mirror_folders_dedupe_and_read_list_files(tmp_path, zoo):
    add_relu_mul(tmp_path / "other" / "a.onnx")
    out = tmp_path / "out"
    srcs = collect_sources([str(zoo)], str(out))
    assert [s.rel for s in srcs] == ["a", "sub/a"]  # relative to the folder given
    assert srcs[0].output(str(out)) == str(out / "a.onnx")
    # two files of one name in different folders: relative to their common folder
    srcs = collect_sources([str(zoo / "a.onnx"), str(tmp_path / "other" / "a.onnx")], str(out))
    assert [s.rel for s in srcs] == ["zoo/a", "other/a"]
    # a list file: comments, blank lines, paths relative to it, per-model options; a model named twice counts once
    listing = tmp_path / "lists" / "zoo.txt"
    listing.parent.mkdir()
    listing.write_text("# models\n../zoo/a.onnx --input-shape x:1,64 --timeout 5  # the small one\n\n"
                       "'../zoo/sub' --memory-limit 2\n../zoo/a.onnx\n")
    srcs = collect_sources(["@" + str(listing)], str(out))
    assert [(s.rel, s.input_shape, s.timeout, s.memory_limit_gb) for s in srcs] == [
        ("a", ["x:1,64"], 5.0, None), ("sub/a", [], None, 2.0)]
    # an output folder inside a source folder: its models (an earlier batch's) are not sources
    add_relu_mul(zoo / "out" / "a.onnx")
    assert [s.rel for s in collect_sources([str(zoo)], str(zoo / "out"))] == ["a", "sub/a"]


def test_a_link_back_up_is_not_followed(tmp_path, zoo):
    os.symlink(tmp_path, zoo / "sub" / "loop")  # would find every model again, and their outputs, forever
    srcs = collect_sources([str(zoo)], str(tmp_path / "out"))
    assert [s.rel for s in srcs] == ["a", "sub/a"]
