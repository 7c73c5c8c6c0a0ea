"""OptiFX Algorithm 1: candidates, their costs, GraphSplit and the roofline pruning (OptiFX §3-4)."""

from __future__ import annotations

import time

import pytest

from onnxopt.models import build_model
from onnxopt.models.conv_shapes import optifx_model

from onnxopt.errors import UsageError
from onnxopt.fusion.search import fusion_order, generate_candidates, graph_split
from onnxopt.hardware.presets import get_preset
from search_nets import Net

A6000 = get_preset("rtx-6000-ada")  # the paper's A6000 Ada: 91.1 TFLOP/s, 960 GB/s


def fire_net(fires=3):
    """SqueezeNet's fire2..: 96 channels at 55x55, squeeze 16, expand 64 + 64."""
    n = Net()
    h, c = n.input("x", [1, 96, 55, 55]), 96
    for i in range(fires):
        h, c = n.fire(f"fire{i}", h, c, 16, 64), 128
    return n.model(h)


def mobilenet_block():
    """MobileNetV2's first c=32 block: 1x1 24 -> 144 + Relu6, depthwise 3x3 /2 + Relu6 (G4's dw), 1x1 -> 32."""
    n = Net()
    x = n.input("x", [1, 24, 56, 56])
    e = n.clip6("expand_act", n.conv("expand", x, 24, 144, 1, bias=True))
    d = n.clip6("dw_act", n.conv("dw", e, 144, 144, 3, stride=2, group=144, bias=True))
    y = n.conv("project", d, 144, 32, 1, bias=True)
    return n.model(y)


def conv_only_chain(name):
    """The paper's tensors only: the two convs of an OptiFX SISO sub-graph, no bias, no Relu."""
    sub = {"G1": (73, [(64, 80, 1, 1, 0, 1), (80, 192, 3, 1, 0, 1)]),
           "G3": (32, [(60, 48, 1, 1, 0, 1), (48, 12, 3, 1, 1, 1)]),
           "G4": (56, [(144, 144, 3, 2, 1, 144), (144, 32, 1, 1, 0, 1)])}[name]
    h, ops = sub
    n = Net()
    x = n.input("x", [1, ops[0][0], h, h])
    for i, (c, k, r, st, pad, g) in enumerate(ops):
        x = n.conv(f"conv{i}", x, c, k, r, st, pad, g)
    return n.model(x)


GOLDEN = {"G1": (157.09, 249.72), "G3": (22.93, 50.70), "G4": (3.27, 4.82)}  # Table 4, FLOP/byte


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_intensities(name):
    before, after = GOLDEN[name]
    # Only the convs: the candidate's own intensities are the paper's.
    (c,) = generate_candidates(conv_only_chain(name), A6000).unpruned
    assert (c.kind, c.pattern) == ("afusion", "SISO")
    assert c.intensity_before == pytest.approx(before, abs=0.01)
    assert c.intensity_after == pytest.approx(after, rel=0.01)
    # optifx_model adds a Relu after each conv (CBR); its ROPs alone reproduce the table all the same.
    r = generate_candidates(optifx_model(name, bias=False), A6000)
    (a,) = [c for c in r.unpruned if c.kind == "afusion"]
    assert len(a.rops) == 2 and len(a.members) == 4
    assert a.rop_intensity_before == pytest.approx(before, abs=0.01)
    assert a.rop_intensity_after == pytest.approx(after, rel=0.01)
    assert a.bytes_saved > 0 and a.predicted_speedup > 1


def test_recompute_flops_of_a_halo():
    # G1: 1x1 -> 3x3 (valid), 73 -> 71 rows; the band that fits the A6000's 100 KiB of shared memory is 2 rows:
    # 36 bands, and at each of the 35 borders 2 rows of the 1x1's output are computed twice.
    (c,) = generate_candidates(conv_only_chain("G1"), A6000).unpruned
    assert c.band_height == 2 and c.scratch_bytes <= 100 * 1024
    conv1_flops_per_row = 2 * 80 * 73 * 64
    assert c.recompute_flops == 35 * 2 * conv1_flops_per_row
    assert c.flops_after == c.flops_before + c.recompute_flops
    # G4 (depthwise /2 -> 1x1) needs no halo.
    (c4,) = generate_candidates(conv_only_chain("G4"), A6000).unpruned
    assert c4.recompute_flops == 0


def test_squeezenet_fire_gives_simo():
    r = generate_candidates(fire_net(3), A6000)
    simo = [c for c in r.candidates if c.pattern == "SIMO"]
    assert len(simo) == 3  # one per fire, kept by GraphSplit and by the roofline
    assert all(c.kind == "afusion" and len(c.rops) == 3 for c in simo)
    assert simo[0].rops == ("fire0.squeeze", "fire0.e1", "fire0.e3")
    assert set(simo[0].removed_tensors) == {"fire0.squeeze.y", "fire0.sr.y", "fire0.e1.y", "fire0.e3.y"}
    horizontal = [c for c in r.candidates if c.kind == "horizontal"]
    assert [c.shared_inputs for c in horizontal] == [(f"fire{i}.sr.y",) for i in range(3)]
    # Identical fires 1 and 2 (same shapes) share a key: a kernel cache costs them once. Fire 0 reads 96 channels.
    assert simo[1].key == simo[2].key != simo[0].key
    assert simo[1].id != simo[2].id


def test_mobilenetv2_block_fuses_dw_and_pw():
    r = generate_candidates(mobilenet_block(), A6000)
    by_rops = {c.rops: c for c in r.candidates}
    g4 = by_rops[("dw", "project")]
    assert g4.kind == "afusion" and g4.pattern == "SISO"
    assert g4.members == ("dw", "dw_act", "project")  # Relu6 (Clip) in the epilogue
    assert g4.bytes_saved == 2 * 2 * 144 * 28 * 28 * 4  # dw's output and its Clip's: written + read, fp32
    assert g4.predicted_speedup > 1.05
    assert by_rops[("expand",)].kind == "vertical"
    # The whole block (3 ROPs) needs 3 rows of expand's 144 x 56 output and a row of dw's for one output row:
    # 110 KiB, over the A6000's 100 KiB of shared memory per SM; a CPU core's half L2 holds it.
    refusal = next(f for f in r.refused if f.rops == ("expand", "dw", "project"))
    assert refusal.reason == ("the intermediate tiles of a 1-row band take 112896 bytes; the scratch limit is "
                              "102400 bytes")
    cpu = generate_candidates(r.graph.model, get_preset("xeon-gold-6240"))
    assert ("expand", "dw", "project") in {c.rops for c in cpu.enumerated}


def test_pruning_with_theta_opt():
    model = fire_net(2)
    r = generate_candidates(model, A6000)
    assert r.count_before >= r.count_after
    c = r.counts()
    assert c["before"]["total"] == sum(c["before"][k] for k in ("vertical", "horizontal", "afusion"))
    # Kept exactly when the fused roofline performance beats the unfused by theta_opt.
    for theta in (1.0, 1.5, 2.0, 3.0):
        kept = generate_candidates(r.graph, A6000, theta_opt=theta).candidates
        assert kept == [x for x in r.unpruned if x.attainable_after > theta * x.attainable_before]
    assert generate_candidates(r.graph, A6000, theta_opt=1e9).candidates == []
    assert generate_candidates(r.graph, A6000, prune=False).candidates == r.unpruned
    # A compute-bound conv with its Relu: the per-kernel roofline keeps it (the Relu kernel goes away), Eq.2 on
    # the summed intensity (the paper's literal reading) does not.
    big = generate_candidates(optifx_model("G1", bias=False), A6000)
    v = next(x for x in big.unpruned if x.id == "vertical:single:/conv2/Conv")
    assert v in big.candidates
    assert v not in generate_candidates(big.graph, A6000, roofline="aggregate").candidates


def test_graph_split_leaves():
    r = generate_candidates(fire_net(3), A6000)
    g = r.graph
    assert all(lf.rops <= 3 for lf in r.leaves)
    assert sorted(n for lf in r.leaves for n in lf.node_ids) == list(range(len(g.nodes)))  # a partition
    for lf in r.leaves:
        assert g.cycle_through(lf.node_ids) == []  # every leaf contracts without a cycle
    leaf_of = {n: k for k, lf in enumerate(r.leaves) for n in lf.node_ids}
    assert all(len({leaf_of[m] for m in c.node_ids}) == 1 for c in r.unpruned)
    # Cutting by plain bytes splits each fire at its narrow squeezed tensor and loses the SIMO candidates.
    by_bytes = generate_candidates(g, A6000, cut_weight="bytes")
    assert not [c for c in by_bytes.unpruned if c.pattern == "SIMO"]
    assert len(by_bytes.enumerated) == len(r.enumerated)
    order = fusion_order(g, r.enumerated)
    assert sorted(order) == list(range(len(g.nodes)))
    pos = {x: k for k, x in enumerate(order)}
    assert all(pos[i] < pos[s] for i in range(len(g.nodes)) for s in g.successors(i))  # topological
    assert graph_split(g, 100) == [graph_split(g, 100)[0]] and graph_split(g, 100)[0].rops == 9


def test_kinds_refusals_and_arguments():
    r = generate_candidates(fire_net(1), "rtx-6000-ada", kinds={"afusion"})
    assert {c.kind for c in r.enumerated} == {"afusion"}
    # Each expand alone is refused: the squeezed tensor is still read by the other expand.
    assert any(f.rops == ("fire0.squeeze", "fire0.e1") and "also read by fire0.e3" in f.reason for f in r.refused)
    with pytest.raises(UsageError, match="unknown candidate kinds"):
        generate_candidates(fire_net(1), A6000, kinds={"diagonal"})
    with pytest.raises(UsageError, match="cut_weight"):
        generate_candidates(fire_net(1), A6000, cut_weight="random")
    with pytest.raises(UsageError, match="unknown machine preset"):
        generate_candidates(fire_net(1), "my-laptop")
    assert "before pruning" in r.summary()


def test_cpu_preset_scratch_limit():
    xeon = get_preset("xeon-gold-6240")  # 1 MiB of L2 per core; the CPU kernel keeps half for its band
    r = generate_candidates(conv_only_chain("G1"), xeon)
    (c,) = r.unpruned
    assert c.band_height == 8 and c.scratch_bytes <= 512 * 1024


@pytest.mark.parametrize("name", ["resnet50", "densenet_bc", "nasnet_a", "squeezenet", "mobilenetv2"])
def test_networks_fast_and_consistent(name):
    model = build_model(name)
    start = time.perf_counter()
    r = generate_candidates(model, A6000)
    seconds = time.perf_counter() - start
    assert seconds < 5.0, f"generate_candidates took {seconds:.1f} s on {name}"
    assert 0 < r.count_after <= r.count_before <= len(r.enumerated)
    assert len({c.id for c in r.enumerated}) == len(r.enumerated)
    if name == "squeezenet":  # a SIMO candidate in every fire
        assert len([c for c in r.candidates if c.pattern == "SIMO"]) == 8
    if name == "mobilenetv2":  # dw 3x3 -> pw 1x1 (G4) with bytes saved
        dw_pw = [c for c in r.candidates if c.kind == "afusion" and len(c.rops) == 2
                 and r.graph.attrs[r.graph.resolve(c.rops[0])].get("group", 1) > 1]
        assert dw_pw and all(c.bytes_saved > 0 for c in dw_pw)
