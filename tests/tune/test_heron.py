"""Heron's constrained space on the packed-B matmul: the model derived from the schedule (a changed schedule, a
changed model, no constraint code touched), CP-SAT's space against a brute-force enumeration, RandSAT's diversity
and reproducibility, CGA's children always solutions, and sampled schedules compiled, run through the library's C
entry point and checked; a chosen schedule carried into the op onnxruntime runs."""

from __future__ import annotations

import itertools
import json
import os
import random

import numpy as np
import pytest

from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.glue.library import link_library, library_source
from onnxopt.codegen.microkernel.register_tile import RegisterTile
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import parse_target
from onnxopt.fusion.compute import retile
from onnxopt.measure import region_models
from onnxopt.annotate.shapes import tensor_info
from onnxopt.runtime.kernel_calls import kernel_calls
from onnxopt.timing import make_session
from onnxopt.tune.heron import cpsat, packed_matmul as pm, rules, search
from onnxopt.tune.heron.constraints import TYPES, In, satisfied, type_name
from onnxopt.tune.heron.rules import Capacities
from onnxopt.tune.heron.schedule import Cache, Split

TARGET = parse_target(None)
CAP = Capacities(16, 8, {"L1": 32768, "L2": 1 << 20})  # AVX2's register file, fixed caches: host-independent


def model_of(M, K, N, cap=CAP):
    return rules.derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)


def test_the_model_has_heron_six_types_and_reports_its_size():
    csp = model_of(256, 512, 384)
    types = {type_name(c) for c in csp.constraints}
    assert types == set(TYPES)
    size = csp.size()
    assert size["variables"] == len(csp.vars) and size["constraints"] == len(csp.constraints)
    assert set(size["by_kind"]) == {"arch", "loop", "knob", "aux"}
    assert csp.knobs and set(pm.KNOBS) == set(csp.knobs)
    # the register file, L1 and L2 each bound by a LE on their sum
    assert {"registers_used", "L1_used", "L2_used"} <= set(csp.vars)


def test_changing_the_schedule_changes_the_model():
    s = pm.schedule(256, 512, 384, CAP)
    base = rules.derive(s, CAP, pm.ROLES)
    # the B panels no longer held in L2: the L2 level, its SUM and LE disappear
    no_l2 = rules.derive(s.with_steps([x for x in s.steps if not (isinstance(x, Cache) and x.level == "L2")]),
                         CAP, pm.ROLES)
    assert "L2_used" in base.vars and "L2_used" not in no_l2.vars
    assert len(no_l2.constraints) < len(base.constraints)
    # K split exactly instead of with a partial last block: the padded and slack auxiliaries go
    exact = rules.derive(s.with_steps([Split("k", x.parts, cover=False) if isinstance(x, Split) and x.axis == "k"
                                       else x for x in s.steps]), CAP, pm.ROLES)
    assert "k_padded" in base.vars and "k_padded" not in exact.vars
    # another shape, another model; a smaller register file, a tighter bound
    assert model_of(64, 128, 64).vars["m"].hi == 64
    small = model_of(256, 512, 384, Capacities(8, 8, CAP.levels))
    assert cpsat.enumerate_knobs(small, limit=1)  # still solvable
    big_tiles = [p for p in (cpsat.randsat(small, random.Random(i)) for i in range(20))]
    assert all(a["mi"] * a["ni"] + a["ni"] + a["mii"] <= 8 for a in big_tiles)


def brute_force(M, K, N, cap):
    """The packed-B kernel's valid knob assignments from its rules, written directly: register file, L1 and L2
    footprints, NI a divisor of the 64-float block within the tile record, MII dividing MI, no tile beyond its loop,
    tasks within the limit."""
    kcs = sorted({k for k in pm.KC_CANDIDATES if k < K} | {K})
    panels_max = -(-N // cap.lanes)
    out = set()

    def powers(n):
        return sorted({1 << e for e in range(n.bit_length()) if 1 << e <= n} | {n})

    for ni in (1, 2, 3, 4):
        if 64 % (ni * cap.lanes):
            continue
        panel = ni * cap.lanes
        n_panels = -(-N // panel)
        if panel > N:
            continue
        for mi, mii in itertools.product(range(1, cap.registers + 1), range(1, 5)):
            if mi % mii or mi > M or mi * ni + ni + mii > cap.registers:
                continue
            m_blocks = -(-M // mi)
            for kc, pp, mb, group, b_at in itertools.product(kcs, powers(panels_max), powers(M),
                                                              powers(panels_max), (0, 1)):
                if pp > n_panels or mb > m_blocks or group > pp:
                    continue
                pt, mt = -(-n_panels // pp), -(-m_blocks // mb)
                if pt * mt > cap.max_tasks:
                    continue
                if 4 * (kc * panel + mi * kc) > cap.levels["L1"]:
                    continue
                l2 = (group if b_at == 0 else pp) * kc * panel * 4
                if l2 > cap.levels["L2"]:
                    continue
                out.add({"mi": mi, "ni": ni, "mii": mii, "kc": kc, "pp": pp, "mb": mb, "group": group,
                         "b_at": b_at}.__repr__())
    return out


@pytest.mark.parametrize("shape,cap", [((4, 16, 8), Capacities(8, 4, {"L1": 1024, "L2": 4096})),
                                       ((8, 40, 24), Capacities(10, 8, {"L1": 4096, "L2": 16384}, max_tasks=6))])
def test_cp_sat_space_equals_brute_force(shape, cap):
    csp = model_of(*shape, cap)
    solver = {repr({k: dict(zip(csp.knobs, p))[k] for k in pm.KNOBS}) for p in cpsat.enumerate_knobs(csp)}
    want = {repr(eval(x)) for x in brute_force(*shape, cap)}  # noqa: S307 - our own reprs of dicts of ints
    assert solver == want and len(want) > 10


def test_randsat_is_diverse_and_reproducible():
    csp = model_of(256, 512, 384)
    draws = [cpsat.randsat(csp, random.Random(7 * 1000 + i)) for i in range(100)]
    keys = [tuple(a[k] for k in csp.knobs) for a in draws]
    assert len(set(keys)) >= 80
    again = [cpsat.randsat(csp, random.Random(7 * 1000 + i)) for i in range(100)]
    assert again == draws
    rng = random.Random(3)
    seq1 = [cpsat.randsat(csp, rng) for _ in range(10)]
    rng = random.Random(3)
    assert [cpsat.randsat(csp, rng) for _ in range(10)] == seq1
    for a in draws:
        assert satisfied(csp, a) == []
    for knob in ("b_at", "ni"):  # every candidate of a small knob is drawn
        cands = next(c.values for c in csp.constraints if isinstance(c, In) and c.var == knob) \
            if any(isinstance(c, In) and c.var == knob for c in csp.constraints) else range(2)
        assert {a[knob] for a in draws} == set(cands)


def test_crossover_children_keep_a_parent_value_on_every_key_but_the_dropped_one():
    csp = model_of(256, 512, 384)
    rng = random.Random(1)
    keys = ["mi", "ni", "kc", "pp", "mb", "group", "b_at"]
    for _ in range(30):
        p1, p2 = cpsat.randsat(csp, rng), cpsat.randsat(csp, rng)
        extra = [In(v, tuple(sorted({p1[v], p2[v]}))) for v in keys]
        dropped = extra.pop(rng.randrange(len(extra)))
        kid = cpsat.randsat(csp, rng, extra)
        assert satisfied(csp, kid) == []
        assert all(kid[c.var] in (p1[c.var], p2[c.var]) for c in extra)
        assert dropped.var in kid


def analytic(a):
    """A stand-in for measurement in the search's own tests: faster with a denser tile, a K block near 128 and
    eight tasks."""
    cols = a["ni"] * 8
    return (a["mi"] + cols) / (a["mi"] * cols) * (1 + abs(np.log2(a["kc"] / 128)) / 8) * \
        (1 + abs(a["pt"] * a["mt"] - 8) / 16)


def test_cga_children_are_all_solutions():
    M, K, N = 256, 512, 384
    csp = model_of(M, K, N)
    p = search.Problem(csp, analytic, lambda a: pm.features(a, M, K, N, 8), pm.FEATURE_DEPS)
    run = search.cga(p, 96, seed=0, pop=48, gens=3, batch=16)
    assert run.children >= 200 and run.invalid == 0
    assert len(run.measured) == 96 and len({k for k, _ in run.measured}) == 96
    # the plain GA breaks the model: its invalid children are why CGA exists
    ga = search.penalty_ga(p, 96, seed=0)
    assert ga.invalid > 0 and len(ga.measured) == 96


def test_sampled_schedules_compile_run_and_match():
    """Every sampled schedule of an odd-sized GEMM (partial row blocks, panels and K blocks) builds, runs through
    the C entry point on one and two threads and matches numpy."""
    M, K, N = 37, 150, 44
    cap = pm.capacities(TARGET, levels={"L1": 32768, "L2": 1 << 20})
    csp = rules.derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)
    rng = random.Random(11)
    points = [pm.kernel_point(cpsat.randsat(csp, rng)) for _ in range(12)]
    bench = pm.MatmulBench(M, K, N, TARGET, threads=2, min_time=0.001, repeats=1)
    try:
        tiles = set()
        for threads in (1, 2):
            bench.threads = threads
            for point in points[:8] if threads == 1 else points:
                m = bench.measure(point)
                assert m.error is None and m.seconds > 0, (point, m.error)
                tiles.add(point["tile"])
        assert len(tiles) >= 3
    finally:
        bench.close()


def test_a_chosen_schedule_is_the_kernel_onnxruntime_runs(tmp_path):
    """A region given a register tile and a schedule: its library's descriptor carries the schedule, and the fused
    op, run by onnxruntime, matches the original MatMul."""
    model = pm.matmul_model(50, 96, 72, bias=True)
    region = pm.matmul_region(model, TARGET)
    lanes = select(TARGET).lanes
    v = retile(region, RegisterTile(3, 1, 1, lanes))
    v.compute.attrs.schedule = (32, 2, 3, 2)
    v.compute_op_type(TARGET.name)
    assert v.op_type != region.op_type
    objs, desc = build_compute(v, TARGET)
    assert desc.schedule == (32, 2, 3, 2) and desc.packed_b == lanes
    assert ".sched = {32, 2, 3, 2}" in library_source([desc], TARGET)
    lib = str(tmp_path / "k.so")
    link_library([desc], [objs], TARGET, lib)
    info = tensor_info(model)
    orig, fused = region_models(v, model, info)
    x = np.random.default_rng(0).standard_normal((50, 96)).astype(np.float32)
    want = make_session(orig, 2).run(None, {"A": x})[0]
    session = make_session(fused, 2, library=lib)  # kept open: the library stays loaded to be asked
    got = session.run(None, {"A": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert kernel_calls(lib).get(v.op_type, 0) >= 1


@pytest.mark.parametrize("N,ni", [(16, 4), (48, 1), (100, 2), (64, 4)])
def test_retiled_panels_and_their_fallback(N, ni, tmp_path):
    """A packed B repacked for another register tile's panels (a slice added where the new panels pad N and the old
    did not): the whole written model, with the kernel and through the function body, against onnxruntime."""
    import onnx

    from onnxopt.emit.model import build_fused_model, fallback_key

    lanes = select(TARGET).lanes
    if 64 % (ni * lanes):
        pytest.skip(f"{ni} vectors of {lanes} lanes do not divide the 64-float block")
    model = pm.matmul_model(21, 33, N, bias=True)
    region = pm.matmul_region(model, TARGET)
    v = retile(region, RegisterTile(2, ni, 2, lanes))
    v.compute.attrs.schedule = (16, 1, 2, 2)
    v.fallback_key = fallback_key(v, model)
    v.compute_op_type(TARGET.name)
    assert v.compute.attrs.packed_b == ni * lanes
    objs, desc = build_compute(v, TARGET)
    lib = str(tmp_path / "k.so")
    link_library([desc], [objs], TARGET, lib)
    m = build_fused_model(model, [v], None, None, {}, [])
    onnx.checker.check_model(m)
    x = np.random.default_rng(1).standard_normal((21, 33)).astype(np.float32)
    want = make_session(model, 1).run(None, {"A": x})[0]
    sessions = [make_session(m, 1, library=library) for library in (lib, None)]  # open: the library stays loaded
    for session in sessions:
        np.testing.assert_allclose(session.run(None, {"A": x})[0], want, rtol=1e-4, atol=1e-4)
    assert kernel_calls(lib).get(v.op_type, 0) >= 1  # the kernel ran, not its function body


REPLAY = os.path.join(os.path.dirname(__file__), "data", "heron_gemm_64x128x64.json")


def test_cga_beats_random_and_a_penalty_ga_on_a_measured_space():
    """Replay of one exhaustively measured space (benchmarks/heron_replay_space.py wrote it: every point of the
    64 x 128 x 64 matmul's model built, checked and timed): at 300 trials over 5 seeds, CGA's mean best is at
    least as fast as constrained random search's and the penalty GA's. The space is derived again here from the
    capacities the file records, and must be the one measured."""
    with open(REPLAY) as f:
        data = json.load(f)
    M, K, N = data["shape"]
    c = data["capacities"]
    cap = Capacities(c["registers"], c["lanes"], c["levels"], c["max_tasks"])
    csp = rules.derive(pm.schedule(M, K, N, cap), cap, pm.ROLES)
    assert csp.knobs == data["knobs"]
    table = {tuple(p): s for p, s in data["points"]}
    assert len(table) == len(data["points"]) > 1000

    def measure(a):
        return table[tuple(a[k] for k in csp.knobs)]  # a KeyError: the solver left the measured space

    problem = search.Problem(csp, measure, lambda a: pm.features(a, M, K, N, cap.lanes), pm.FEATURE_DEPS)
    best = min(s for s in table.values() if s)
    means = {}
    for name, run in (("cga", lambda s: search.cga(problem, 300, s, pop=32, gens=3)),
                      ("random", lambda s: search.constrained_random(problem, 300, s)),
                      ("penalty-ga", lambda s: search.penalty_ga(problem, 300, s))):
        means[name] = float(np.mean([run(seed).best(300) / best for seed in range(5)]))
    assert means["cga"] <= means["random"] and means["cga"] <= means["penalty-ga"], means
