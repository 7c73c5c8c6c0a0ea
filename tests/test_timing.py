"""The interleaved timing loop (onnxopt/timing.py): blocks alternate between the sides, and a side is warmed before
each of its blocks only when its runs are short (WARM_RUN_BELOW_S)."""

import time

import pytest

from onnxopt.timing import WARM_RUN_BELOW_S, time_interleaved


class SleepingRunner:
    """Stands in for an inference session whose run takes a known time: the timing loop is what is tested."""

    def __init__(self, seconds: float):
        self.seconds, self.runs = seconds, 0

    def run(self, names, feeds):
        self.runs += 1
        time.sleep(self.seconds)


def test_long_runs_are_not_warmed_before_each_block():
    short, long = SleepingRunner(0.001), SleepingRunner(WARM_RUN_BELOW_S * 1.5)
    stats = time_interleaved([short, long], {}, min_time=0.0, block=2, max_blocks=4, min_blocks=4)
    assert [s["blocks"] for s in stats] == [4, 4]
    # the first run and the one that measures how long a run takes, then per block: the short side a warm run
    # and its block, the long side its block only
    assert short.runs == 2 + 4 * (1 + 2)
    assert long.runs == 2 + 4 * 2


def test_the_medians_are_the_runs_seconds():
    short, long = SleepingRunner(0.002), SleepingRunner(0.03)
    stats = time_interleaved([short, long], {}, min_time=0.0, block=1, max_blocks=5, min_blocks=5)
    assert stats[0]["median"] == pytest.approx(0.002, abs=0.002)
    assert stats[1]["median"] == pytest.approx(0.03, abs=0.01)
    assert stats[1]["median"] > stats[0]["median"]


def test_the_block_holds_about_block_s_of_the_first_side():
    fast = SleepingRunner(0.001)
    stats = time_interleaved([fast, SleepingRunner(0.001)], {}, min_time=0.0, max_blocks=2, min_blocks=2,
                             block_s=0.005)
    assert 1 <= stats[0]["runs_per_block"] <= 5


def test_a_settled_ratio_stops_the_timing_early():
    """settled_outside: once the first side's median over the second's is outside the band after min_blocks, no
    more blocks; inside it, the timing runs to min_time."""
    slow, fast = SleepingRunner(0.004), SleepingRunner(0.0004)
    stats = time_interleaved([slow, fast], {}, min_time=10.0, block=1, max_blocks=20, min_blocks=3,
                             settled_outside=(0.5, 2.0))
    assert [s["blocks"] for s in stats] == [3, 3]
    even = time_interleaved([SleepingRunner(0.001), SleepingRunner(0.001)], {}, min_time=10.0, block=1,
                            max_blocks=8, min_blocks=3, settled_outside=(0.5, 2.0))
    assert [s["blocks"] for s in even] == [8, 8]


def _matmul_chain(path, count: int):
    """A model of `count` 256x256 matrix products: more of them, more time."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((256, 256), 1e-3, np.float32), "w")
    nodes, x = [], "x"
    for i in range(count):
        nodes.append(helper.make_node("MatMul", [x, "w"], [f"y{i}"]))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [256, 256])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return str(path)


def test_a_pair_is_timed_in_a_new_process(tmp_path):
    """time_pair_in_new_process: both models load and run in a child Python (real onnxruntime sessions), and the
    medians come back; the model with eight times the work takes longer."""
    import numpy as np

    from onnxopt.timing import time_pair_in_new_process

    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.ones((256, 256), np.float32))
    one, eight = _matmul_chain(tmp_path / "one.onnx", 1), _matmul_chain(tmp_path / "eight.onnx", 8)
    t_one, t_eight = time_pair_in_new_process((one, None, None), (eight, None, None), str(feeds), 1, min_time=0.1)
    assert 0 < t_one < t_eight


def test_a_pair_that_cannot_load_says_why(tmp_path):
    import numpy as np

    from onnxopt.timing import time_pair_in_new_process

    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.ones((256, 256), np.float32))
    one = _matmul_chain(tmp_path / "one.onnx", 1)
    with pytest.raises(RuntimeError, match="timing in a new process failed"):
        time_pair_in_new_process((one, None, None), (str(tmp_path / "missing.onnx"), None, None), str(feeds), 1)


def test_sessions_run_on_the_provider_they_are_given():
    """make_session's provider is the target's (Target.execution_provider); one onnxruntime lacks is refused, not
    silently replaced by the CPU."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from onnxopt.codegen.target import host_target
    from onnxopt.timing import make_session

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    provider = host_target().execution_provider
    assert make_session(model, 1, provider=provider).get_providers() == [provider]
    missing = next(p for p in ("CUDAExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider")
                   if p not in ort.get_available_providers())
    with pytest.raises(Exception, match=missing.removesuffix("ExecutionProvider")):
        make_session(model, 1, provider=missing)
