"""`optimize()`: the whole pipeline, from a model to fused.onnx plus its kernel library.

load -> fold constants -> shape inference -> find regions -> generate and compile kernels -> check each kernel
against its region run by onnxruntime, and time both -> keep the ones that are right and faster -> link the library
-> write the model with fused nodes and function fallbacks -> check the whole model -> rename into place.
Nothing reaches the output path unless every check passed.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from onnxopt import __version__
from onnxopt.codegen.compute.build import build_compute, tile_sets_of
from onnxopt.codegen.compute.tile_sets import prebuild
from onnxopt.codegen.elementwise.build import build_elementwise
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.pool.build import build_pool
from onnxopt.codegen.microkernel.depthwise import depthwise_mi_for
from onnxopt.codegen.microkernel.registry import select as select_micro_kernel
from onnxopt.codegen.glue.library import INLINE_FLOPS, INLINE_FLOPS_WIDE, link_library
from onnxopt.codegen.target import Target, missing_cpu_flags, parse_target
from onnxopt.cost_cache import open_cost_cache
from onnxopt.emit.model import DOMAIN, build_fused_model, fallback_key, set_library_sha256
from onnxopt.emit.sequence import make_sequences
from onnxopt.errors import InputError, OnnxoptError, UsageError, VerificationError
from onnxopt.kinds import KINDS, kind_of
from onnxopt.fusion import blocked_passthrough
from onnxopt.fusion.blocked_copy import fuse_copies, plain_concats, plain_slices
from onnxopt.fusion.blocked_elementwise import blocked_elementwise
from onnxopt.fusion.afusion.plan import afusion_pairs, apply_pairs, greedy_pairs
from onnxopt.fusion.compute import ComputeRule, apply_tile
from onnxopt.fusion.elementwise import ElementwiseRule, _opset
from onnxopt.fusion.pool import PoolRule
from onnxopt.fusion.layout import (assign_blocked_layouts, blocked_inputs, blocked_outputs, from_blocked,
                                   is_depthwise, to_blocked, with_channel_vectors)
from onnxopt.fusion.region import Region
from onnxopt.fusion.siblings import Siblings, apply_siblings, sibling_groups
from onnxopt.graph.classifier_conv import classifiers_as_convs
from onnxopt.graph.infer import check_tensor_sizes as _check_tensor_sizes
from onnxopt.graph.infer import complete_output_types as _complete_output_types
from onnxopt.graph.infer import infer as _infer
from onnxopt.graph.infer import static_shapes as _static_shapes
from onnxopt.measure import bytes_moved as _bytes_moved
from onnxopt.measure import kernel_error_bound, runtime_inputs
from onnxopt.measure import region_feeds as _region_feeds
from onnxopt.measure import region_flops as _region_flops
from onnxopt.measure import region_models as _region_models
from onnxopt.measure import weight_bytes as _weight_bytes
from onnxopt.graph.cse import eliminate_common_subexpressions
from onnxopt.graph.fold import fold_constants
from onnxopt.graph.large import SharedWeights, check_model, inference_session, is_large, save_with_external_data
from onnxopt.graph.quantized import quantized_nodes
from onnxopt.graph.load import (check_no_overwrite, check_output_path, commit_files, load_model, parse_input_shapes,
                                save_model)
from onnxopt.graph.subsample_conv import fold_subsampling_into_convs
from onnxopt.graph.unary_through_concat import push_unary_through_concats
from onnxopt.timing import make_session, time_interleaved, time_pair_in_new_process
from onnxopt.fusion import winograd
from onnxopt.tune import search_tile
from onnxopt.tune.tile_search import kernel_tolerance
from onnxopt.verify import (KERNEL_ATOL, KERNEL_RTOL, Tolerance, check_given_inputs, compare, load_check_inputs,
                            make_inputs)

# Seconds for trying the fused model without one kernel type at a time (_whole_model_decision).
DROP_TRIALS_S = 6.0
# A drop trial's two looks must each measure the model this much faster without the kernel type (DROP_MARGIN), or,
# where the type's kernels sit between two of ours (so the drop ends a sequence), SPLIT_DROP_MARGIN. At 1% the noise
# of a 0.4 s timing dropped kernels in the middle of sequences: NASNet-A's factorized reductions' Concats on looks of
# 1.057x and 1.034x, in a build that then ran 6% slower than the one that kept them (the same benchmark run), and
# DenseNet-BC's last BatchNormalization -> Relu on 1.011x and 1.066x, splitting its one sequence in two.
DROP_MARGIN = 1.01
SPLIT_DROP_MARGIN = 1.05
WHOLE_MODEL_MARGIN = 1.02  # the fused model is emitted only if at least this much faster than --min-speedup asks
# A plan that fuses more (AFUSION over horizontal over compute-blocked ...) is kept over a less fused one only if it
# wins their head-to-head timing by this much; they are timed head to head when within PLAN_RUNOFF_WITHIN, whichever
# measured first (_plan_runoff).
# 2% was too little on this noisy 2-core host: DenseNet-BC's AFUSION plan won its runoff by 2.7%, and timed longer it
# ran 0.985x the speed of the compute-blocked plan of its --no-afusion run (0.93-0.95x with the wide inline library).
PLAN_MARGIN = 1.05
PLAN_RUNOFF_WITHIN = 1.08
# A runoff meets up to RUNOFF_OPPONENTS plans, RUNOFF_ROUNDS rounds each, every round in new sessions and
# each plan on the library it would be emitted with (_inline_choice). With one opponent timed once, NASNet's AFUSION
# plan beat the elementwise plan by 6% and was emitted; compute-blocked, which had measured 1.05x in its own 0.4 s
# plan timing, was not in the runoff, and the retimed benchmark ran the AFUSION model at 1.05x onnxruntime's speed
# and compute-blocked at 1.12x.
RUNOFF_OPPONENTS = 2
RUNOFF_FLOOR = 1.0  # no runoff when the fastest plan measured below this fraction of the bar (_whole_model_decision)
RUNOFF_ROUNDS = 3
PLAN_FALLBACKS = 1  # plans the final check tries after the chosen one fails it (1.5 s each)
# A final-check timing that passes by less than CONFIRM_BELOW (times need: --min-speedup times WHOLE_MODEL_MARGIN)
# is within this host's noise of the bar: the plan is timed twice more in new sessions and the median of the three
# decides, so that noise cannot pass a slower model.
CONFIRM_BELOW = 1.08
# A failure is timed again only when the plan's own timing had it at least CONTRADICTED_ABOVE times need: ResNet-50's
# horizontal plan measured 1.12x in its plan timing and 0.96x in one final check, and nothing was emitted (its
# --no-afusion run's compute-blocked plan, nearly the same kernels, got 1.18x). Retiming a plan that never measured a
# clear gain could at best find one within the noise; it cost Whisper's encoder (450 ms a run) 18 s.
CONTRADICTED_ABOVE = 1.03
# The chosen plan's library with more kernels on the calling thread must win by this much (_inline_choice): it won
# by 10-13% on NASNet's compute-blocked plan; on DenseNet-BC the same two libraries measured 1.08x in one
# interleaved timing and 0.97x in the next.
INLINE_MARGIN = 1.05
# A region judged alone whose constants are at least this big (one core's L2 here) is timed with cold weights in a
# model whose weights exceed the last-level cache (_check_regions).
COLD_REGION_BYTES = 1 << 20
# A kernel judged alone whose first blocks measure it this many times slower or faster than --min-speedup asks is
# not timed further (time_interleaved's settled_outside): the verdict stands, and its time is close enough for the
# report and the measured search.
SETTLED_BEYOND = 2.0
# Seconds of interleaved timing (both sides) for a kernel judged alone, in blocks of 5 ms: PicoDet has about 250 such
# checks, and at 0.1 s in 10 ms blocks they took 25 s of its 79 s without tuning. The whole-model decision has the
# last word on every kernel kept.
ALONE_CHECK_S = 0.06
# The plan models kept on disk for new sessions (_plan_session), in bytes: each holds the weights its regions carry.
PLAN_FILES_BYTES = 2 << 30
INLINE_REACH = 4  # report FLOPs per glue-counted FLOP at most (Winograd F(4x4, 3x3)); see _inline_choice
# The plans from the most fused to the least, for the runoffs: a plan is kept over a less fused one that measured
# within PLAN_RUNOFF_WITHIN only by winning their head-to-head timing by PLAN_MARGIN.
PLANS_BY_FUSION = ("afusion", "afusion-chains", "horizontal", "compute-blocked", "compute", "compute-dense", "pool",
                   "elementwise")
# Whole-graph plans, timed against each other (see _Optimizer._run).
PLANS = ("compute", "compute-dense", "compute-blocked", "afusion", "horizontal", "pool", "elementwise")
FUSION_KINDS = ("elementwise", "compute", "pool", "afusion", "horizontal", "copy") + tuple(k.name for k in KINDS)


@dataclass
class Result:
    model: onnx.ModelProto
    report: dict
    output: str | None = None
    library: str | None = None


WINOGRAD_MODES = ("auto", "off") + tuple(str(m) for m in winograd.SIZES)


@dataclass
class Options:
    input_shapes: dict = field(default_factory=dict)
    target: Target | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    check_inputs: dict = field(default_factory=dict)
    skip_fusion: tuple = ()
    threads: int | None = None
    verify: bool = True
    measure: bool = True
    min_speedup: float = 1.0
    seed: int = 0
    progress: object = None  # a callable(str) for status lines
    plan: str | None = None  # build only this plan (PLANS), instead of timing them all
    cost_cache: object = None  # measured-cost cache: a path, None (the default location) or False (off)
    tile_search: bool = True  # time a few register tiles per compute region (with measure)
    search_budget: float = 60.0  # seconds for the backtracking search over fusion plans (onnxopt/fusion/search)
    prune: bool = True  # prune fusion candidates by the roofline (OptiFX's theta_opt)
    # Seconds for the Winograd choices, then the register-tile and band searches (onnxopt/tune): the tile search
    # gets what the Winograd choices leave, but at least a third; regions past it keep the default tile.
    tune_budget: float = 12.0
    # Winograd tiles for blocked stride-1 3x3, 5x5, 1xk and kx1 convolutions (fusion/winograd.py): "auto" times them
    # per convolution (onnxopt/tune/winograd_search.py, with measure and the tile search), "off" never, a tile
    # length m on every one whose kernel offers it (ablations, tests).
    winograd: str = "auto"
    # Runs of fused ops with no onnxruntime op between them become one op that runs them in one parallel section
    # (onnxopt/emit/sequence.py).
    sequences: bool = True
    # Run the written model without the library too (its function bodies, as a host without it does) and compare.
    verify_fallback: bool = True
    input_files: tuple = ()  # files read besides the model (--check-input): never written over
    also_writes: tuple = ()  # files the caller writes besides the outputs (the CLI's --report)


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        key = f"{n.domain}::{n.op_type.split('_')[0]}" if n.domain == DOMAIN else n.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


def _channel_vector_kernel(mk) -> tuple[int, int] | None:
    """(lanes, NI) of the target's channel-vector kernel (what ConvTranspose runs on); None below 8 lanes."""
    return (mk.lanes, mk.tile.ni) if mk.lanes >= 8 else None


def optimize(model, output: str | None = None, **kwargs) -> Result:
    """Optimize a model (path or ModelProto). With `output`, writes it and `<output>.so`.

    Keyword options mirror the CLI: input_shape=["x:1,3,224,224"], target="native", rtol=, atol=, scale_tol=,
    check_input=["x:file.npy"], skip_fusion=["elementwise"], threads=, verify=True, measure=True, min_speedup=1.0.
    """
    opts = Options(
        input_shapes=parse_input_shapes(kwargs.pop("input_shape", None)),
        target=parse_target(kwargs.pop("target", None)),
        tolerance=Tolerance.parse(kwargs.pop("rtol", None), kwargs.pop("atol", None), kwargs.pop("scale_tol", None)),
        check_inputs=load_check_inputs(check_input_specs := kwargs.pop("check_input", None)),
        input_files=tuple(os.path.abspath(x.partition(":")[2]) for x in check_input_specs or ()),
        also_writes=tuple(os.path.abspath(x) for x in kwargs.pop("also_writes", None) or ()),
        skip_fusion=tuple(kwargs.pop("skip_fusion", None) or ()),
        threads=kwargs.pop("threads", None),
        verify=kwargs.pop("verify", True),
        measure=kwargs.pop("measure", True),
        min_speedup=float(kwargs.pop("min_speedup", 1.0)),
        seed=int(kwargs.pop("seed", 0)),
        progress=kwargs.pop("progress", None),
        plan=kwargs.pop("plan", None),
        cost_cache=kwargs.pop("cost_cache", None),
        tile_search=bool(kwargs.pop("tile_search", True)),
        search_budget=float(kwargs.pop("search_budget", 60.0)),
        tune_budget=float(kwargs.pop("tune_budget", 12.0)),
        prune=bool(kwargs.pop("prune", True)),
        sequences=bool(kwargs.pop("sequences", True)),
        winograd=str(kwargs.pop("winograd", "auto")),
        verify_fallback=bool(kwargs.pop("verify_fallback", True)),
    )
    _check_numbers(opts)
    if opts.winograd not in WINOGRAD_MODES:
        raise UsageError(f"--winograd {opts.winograd}: one of {', '.join(WINOGRAD_MODES)}")
    if kwargs:
        raise UsageError(f"unknown option(s) {', '.join(kwargs)} for onnxopt.optimize")
    if opts.plan is not None and opts.plan not in PLANS:
        raise UsageError(f"--plan {opts.plan}: known plans are {', '.join(PLANS)}")
    for k in opts.skip_fusion:
        if k not in FUSION_KINDS:
            raise UsageError(f"--skip-fusion {k}: known fusion kinds are {', '.join(FUSION_KINDS)}")
    return _Optimizer(model, output, opts).run()


def _check_numbers(opts: Options) -> None:
    """Numeric options: finite, in range (NaN compares false with everything, so it passes naive checks)."""
    if opts.threads is not None and (isinstance(opts.threads, bool) or not isinstance(opts.threads, int)
                                     or not 1 <= opts.threads <= 4096):
        raise UsageError(f"--threads {opts.threads}: give a whole number of threads, 1 or more")
    for flag, value, low in (("--search-budget", opts.search_budget, 0.0), ("--tune-budget", opts.tune_budget, 0.0),
                             ("--min-speedup", opts.min_speedup, 0.0)):
        if not math.isfinite(value) or value < low or (flag == "--search-budget" and value == 0):
            need = "more than 0" if flag == "--search-budget" else "0 or more"
            raise UsageError(f"{flag} {value}: give a finite number, {need}")


class _Optimizer:
    def __init__(self, source, output, opts: Options):
        self.source, self.output, self.opts = source, output, opts
        self.report: dict = {"onnxopt_version": __version__, "target": opts.target.to_dict(), "regions": [],
                             "rejected": [], "timings": {}}
        self.tmpdir = None
        self.bindings: dict[str, int] = {}  # values for symbolic dims in the checks (_choose_bindings)
        # Cross-compiling for a CPU with instructions this one lacks: the kernels cannot run here, so they are
        # accepted on the strength of their codegen tests, and the model is verified through its function bodies.
        self.cannot_run = missing_cpu_flags(opts.target.required_cpu_flags)
        self.costs = None  # the CostCache, opened on first use (_cost_cache)
        self.inline_flops = INLINE_FLOPS  # the emitted library's CT_INLINE_FLOPS (_inline_choice)
        self.sequence_libraries: dict[tuple, str] = {}  # (library, sequence op types) -> linked path (_plan_session)
        self.plan_models: dict[tuple, tuple] = {}  # (library, region ids) -> (model file, library, ops, regions)
        self.plan_base: SharedWeights | None = None  # the folded model light, its weights in one file (_plan_file)
        self.plan_sessions_made = 0  # sessions made from those files (_plan_session), for the report
        self.plan_files_written = 0
        self.tile_info: dict[int, dict] = {}  # id(region) -> its tile and tile search, for the report
        self.prebuilt: dict[str, tuple] = {}  # op type -> (object, desc) compiled by the tile search
        self.pair_predictions: dict[tuple, dict] = {}  # AFUSION pair -> the search's roofline prediction
        self.afusion_chosen: list = []  # the AFUSION plan's pairs (fusion/afusion/plan.py), as in report["afusion"]
        self.siblings_chosen: list = []  # the sibling groups fused (fusion/siblings.py), as in report["horizontal"]
        self.plan_bases: dict[str, str] = {}  # plan name -> the plan it adds fusions to (_plan_runoff)
        self.weights_flush: int | None = None  # bytes flushed before each run of a cold timing (_weights_flush)
        self._siblings_first: list = []  # the first search's sibling groups (before the probe's were added)
        self._siblings_probed = False
        self._chain_probe: list = []  # chains of three probed in a plan of their own (_afusion_plan)
        self._region_times: dict[tuple, tuple] = {}  # (op type, input shapes) -> timings of this run
        self._search_result = None  # the search's candidates (a CandidateResult), for the measured search
        self._kernel_costs: dict[str, float] = {}  # search signature -> seconds, from the cost cache
        self._afusion: dict | None = None  # the AFUSION plan's base plan, groups built and regions made
        self._afusion_base: list[Region] = []  # the plan the AFUSION groups are made from
        self._timed: dict[int, float] = {}  # id(region) -> its kernel's measured seconds (_check_regions)
        self._timed_by_key: dict[tuple, float] = {}  # (op type, input shapes) -> its measured seconds
        self.quantized: set[str] = set()  # nodes of quantized patterns, left to onnxruntime (graph/quantized.py)
        self.original_checks = True  # the input passes the ONNX checker, so the output must too (run)

    def say(self, msg: str):
        if self.opts.progress:
            self.opts.progress(msg)

    def run(self) -> Result:
        t_start = time.perf_counter()
        src_path = None if isinstance(self.source, onnx.ModelProto) else os.fspath(self.source)
        if self.output is not None:
            check_output_path(src_path, self.output)
        loaded = load_model(self.source, self.opts.input_shapes)
        if self.output is not None:
            # Everything this run reads (the model, its external data, the check inputs) against everything it may
            # write or replace: the model, its .data, its .so (an old one is deleted), the report.
            out = os.path.abspath(self.output)
            check_no_overwrite(loaded.files + list(self.opts.input_files),
                               [out, out + ".data", out + ".so", *self.opts.also_writes])
        original = loaded.model
        self.report["input"] = {"path": src_path, "size_bytes": loaded.size_bytes,
                                "external_data": loaded.used_external_data, "ir_version": original.ir_version,
                                "opsets": {o.domain or "ai.onnx": o.version for o in original.opset_import}}
        self.report["before"] = _op_counts(original)
        self._check_loadable(original, src_path)
        # The ONNX checker vouches for what we write only where it accepts what we were given: onnxruntime runs
        # models it rejects (nodes out of order, outputs without shapes, old IR versions).
        try:
            check_model(original)
            self.original_checks = True
        except Exception as e:  # noqa: BLE001
            self.original_checks = False
            self.report["input"]["checker"] = " ".join(str(e).split())[:300]
        check_given_inputs(original, self.opts.check_inputs)

        if self.opts.verify or self.opts.measure:
            self._choose_bindings(original)
        self.tmpdir = tempfile.mkdtemp(prefix="onnxopt-")
        try:
            return self._run(original, loaded, src_path, t_start)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self._close_cost_cache()

    def _check_loadable(self, model, path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            if path:
                ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            else:
                inference_session(model, so, ["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0][:300]
            raise InputError(f"onnxruntime cannot load this model ({msg}); onnxopt optimizes models that "
                             "onnxruntime runs (custom ops: register their library first)") from None

    def _run(self, original, loaded, src_path, t_start) -> Result:
        t = time.perf_counter()
        work = onnx.ModelProto()
        work.CopyFrom(original)
        try:
            folded = fold_constants(work)
        except Exception as e:  # noqa: BLE001 - folding is best effort; an unfoldable graph is still optimized
            folded, work = 0, onnx.ModelProto()
            work.CopyFrom(original)
            self.report["rejected"].append({"nodes": [], "reason": f"constant folding skipped: {e}"})
        self.report["folded_nodes"] = folded
        # Duplicate nodes (NASNet's repeated Relus of one tensor) become one: less work, and fewer readers to keep a
        # fused convolution's outputs under the glue's limit (graph/cse.py).
        self.report["merged_nodes"] = eliminate_common_subexpressions(work)
        # Exact rewrites that leave less for onnxruntime to run and more for the kernels to fuse
        # (graph/subsample_conv.py, graph/unary_through_concat.py, graph/classifier_conv.py); the Relus they copy
        # merge with existing ones.
        inferred = _infer(work)
        static = _static_shapes(inferred)
        _check_tensor_sizes(static)
        # A quantized model keeps the structure onnxruntime's int8 fusions match (graph/quantized.py): no rewrites,
        # and no region that touches it.
        self.quantized = quantized_nodes(work.graph)
        if self.quantized:
            rewrites = {"skipped": "the model is quantized"}
        else:
            rewrites = {"subsampling_into_convs": fold_subsampling_into_convs(work, static),
                        "unary_through_concats": push_unary_through_concats(work),
                        "classifiers_as_convs": classifiers_as_convs(work, static)}
        self.report["rewrites"] = rewrites
        if rewrites.get("unary_through_concats"):
            self.report["merged_nodes"] += eliminate_common_subexpressions(work)
        self.emit_base = work  # the folded graph as it is: what fused.onnx is built from
        work = _infer(work) if any(isinstance(v, int) and v for v in rewrites.values()) else inferred
        _complete_output_types(self.emit_base, work)
        self.report["timings"]["load_fold_infer_s"] = time.perf_counter() - t

        t = time.perf_counter()
        # Two plans: compute ops with their epilogues (plus elementwise regions elsewhere), and elementwise regions
        # only. Which one wins depends on the graph: onnxruntime keeps chains of its own convolutions in its
        # blocked layout, so replacing a conv can cost reorders around it. The whole-model timing decides.
        regions: list[Region] = []
        plans: list[tuple[str, list[Region]]] = []
        seen: dict[tuple, Region] = {}

        def dedupe(rs):  # the same nodes fused the same way in both plans: one region, checked once
            out = []
            for r in rs:
                a = r.compute.attrs if r.compute is not None else None
                layout = (a.get("in_blocked", 0), a.get("out_blocked", 0), a.get("channel_vectors", 0)) \
                    if a is not None else (r.pool.attrs.get("blocked", 0),) if r.pool is not None else \
                    (r.copy.lanes,) if r.copy is not None else (r.blocked_lanes,)
                key = (r.kind, tuple(n.output[0] for n in r.nodes), layout)
                out.append(seen.setdefault(key, r))
            return out

        self._dedupe = dedupe

        if "compute" not in self.opts.skip_fusion:
            mk = select_micro_kernel(self.opts.target)
            mi = mk.tile.mi
            # Dense convolutions only is a plan of its own: depthwise ones are memory-bound, and onnxruntime's
            # blocked kernels for them are hard to beat while our layout is NCHW (see docs/decisions.md).
            for name, grouped in (("compute", True), ("compute-dense", False)):
                claimed: set[int] = set()
                rejected = self.report["rejected"] if grouped else []
                plan = ComputeRule(work, mi, grouped=grouped, blocked=_channel_vector_kernel(mk)).find_regions(
                    claimed, rejected)
                if "pool" not in self.opts.skip_fusion:  # pools with their epilogues (fusion/pool.py)
                    plan += PoolRule(work).find_regions(claimed, rejected)
                plan += self._kind_regions(work, claimed, rejected)
                if "elementwise" not in self.opts.skip_fusion:
                    plan += ElementwiseRule(work).find_regions(rejected, exclude=claimed)
                plans.append((name, dedupe(plan)))
            blocked_plan = self._blocked_plan(work)
            if blocked_plan:
                plans.append(("compute-blocked", dedupe(blocked_plan)))
            if not {"afusion", "horizontal"} <= set(self.opts.skip_fusion) and mk.lanes >= 8:
                # AFUSION pairs and sibling groups within the blocked plan, or within the compute plan when no
                # tensor can be blocked (a depthwise convolution on the graph's input, say).
                base = blocked_plan or next(p for n, p in plans if n == "compute")
                # what each of these plans adds to: its first opponent in the runoff (_plan_runoff)
                base_name = "compute-blocked" if blocked_plan else "compute"
                self.plan_bases = {"afusion": base_name, "afusion-chains": base_name, "horizontal": base_name}
                afusion = self._afusion_plan(work, base)
                if afusion and "afusion" not in self.opts.skip_fusion:
                    plans.append(("afusion", dedupe(afusion)))
                if self._chain_probe:
                    plans.append(("afusion-chains", dedupe(self._chain_plan(base))))
                if self.siblings_chosen:  # horizontal fusion alone (what --no-afusion keeps)
                    plans.append(("horizontal", dedupe(self._horizontal_plan(base))))
        if "compute" in self.opts.skip_fusion and "pool" not in self.opts.skip_fusion:  # pools without compute
            claimed = set()
            plan = PoolRule(work).find_regions(claimed, self.report["rejected"])
            plan += self._kind_regions(work, claimed, [])
            if plan and "elementwise" not in self.opts.skip_fusion:
                plan += ElementwiseRule(work).find_regions([], exclude=claimed)
            if plan:
                plans.append(("pool", dedupe(plan)))
        if "elementwise" not in self.opts.skip_fusion:  # no compute fusion: the kinds' regions and elementwise ones
            rejected = [] if plans else self.report["rejected"]
            claimed = set()
            plan = self._kind_regions(work, claimed, rejected)
            plans.append(("elementwise", dedupe(plan + ElementwiseRule(work).find_regions(rejected, exclude=claimed))))
        # A plan with the same regions as an earlier one (compute-dense on a graph without grouped convolutions) would
        # only be built, checked and timed again.
        kept, keys = [], set()
        for name, plan in plans:
            key = frozenset(id(r) for r in plan)
            if key not in keys or name == self.opts.plan:
                kept.append((name, plan))
                keys.add(key)
        plans = kept
        if self.quantized:
            plans = [(name, self._without_quantized(plan)) for name, plan in plans]
        if self.opts.plan is not None:
            plans = [p for p in plans if p[0] == self.opts.plan]
        elif not self.opts.measure or self.cannot_run:
            plans = plans[:1]  # only timing chooses between plans: without it, build and check the first only
        self.plans = plans
        regions = list({id(r): r for _, plan in plans for r in plan}.values())
        for r in regions:
            if r.relayout is None:  # a relayout is emitted as its nodes: no function
                r.fallback_key = fallback_key(r, work)
            r.compute_op_type(self.opts.target.name + "|" + self.opts.target.cpu + "|" + self.opts.target.llvm_features
                              + f"|rank{len(r.shape)}")
        self.report["timings"]["search_s"] = time.perf_counter() - t
        self.say(f"{len(regions)} candidate regions")
        if self.opts.measure and self.opts.tile_search and not self.cannot_run:
            self._search_tiles(work, regions)

        t = time.perf_counter()
        built = self._build(regions)
        self.report["timings"]["codegen_s"] = time.perf_counter() - t

        t = time.perf_counter()
        accepted = self._check_regions(work, built) if built else []
        accepted = self._measured_afusion(accepted, [r for _, _, rs in built.values() for r in rs])
        accepted += passthroughs_kept(accepted, regions)
        kept = _consistent_layouts(accepted)
        kept_ids = {id(r) for r in kept}
        for r in accepted:
            if id(r) not in kept_ids:
                self._reject(r, "a neighbour in its blocked-layout chain was rejected")
                self.report["regions"] = [e for e in self.report["regions"] if e.get("nodes") != r.node_names
                                          or e.get("op_type") != r.op_type]
        accepted = kept
        self._afusion_savings()
        self._sibling_savings()
        self.report["timings"]["kernel_check_s"] = time.perf_counter() - t

        t = time.perf_counter()
        if accepted and self.opts.measure and not self.cannot_run:
            accepted = self._whole_model_decision(original, work, accepted, built, src_path)

        self.report["timings"]["model_check_s"] = time.perf_counter() - t

        return self._emit(original, work, accepted, built, loaded, src_path, t_start)

    def _blocked_plan(self, work) -> list[Region]:
        """Compute regions with the tensors between fused convolutions in the blocked layout (fusion/layout.py),
        running through the ops onnxruntime can compute on blocked tensors (fusion/blocked_passthrough.py); empty
        when no tensor can be blocked."""
        mk = select_micro_kernel(self.opts.target)
        self._blocked_rule = None
        if mk.lanes < 8:
            return []
        claimed: set[int] = set()
        rule = ComputeRule(work, mk.tile.mi, blocked=_channel_vector_kernel(mk))
        self._blocked_rule = rule
        plan = rule.find_regions(claimed, [])
        ew = rule.ew

        def const_of(name):
            t = ew.inits.get(name)
            return None if t is None else numpy_helper.to_array(t)

        passthrough, exits = {}, {}
        for i, node in enumerate(rule.index.nodes):
            if i in claimed or blocked_passthrough.admit(node, ew.shape_of, const_of, mk.lanes, ew.opset) is not None:
                continue
            for form in blocked_passthrough.rewrites(node, ew.shape_of, const_of, mk.lanes, ew.opset):
                if blocked_passthrough.check(node, form, ew.shape_of, const_of, mk.lanes, ew.opset, work.ir_version):
                    passthrough[i] = form
                    if node.op_type in blocked_passthrough.GLOBAL_POOLS:
                        exits[i] = blocked_passthrough.exit_form(node, form, ew.shape_of, mk.lanes, ew.opset)
                    break
        blocked = assign_blocked_layouts(plan, rule.index, ew.shape_of, mk.lanes, mk.tile.ni, ew.opset, passthrough,
                                         exits)
        if not blocked:
            return []
        if self.opts.winograd not in ("auto", "off") and winograd.check_opset(work) is None:
            # Forced: every convolution on the blocked kernel whose kernel offers this tile length ("auto" decides
            # in _search_tiles).
            m = int(self.opts.winograd)
            plan = [winograd.to_winograd(r, m, mk.lanes, mk.tile.ni)
                    if winograd.applies(r) is None and m in winograd.sizes(r.compute.attrs["kernel"]) else r
                    for r in plan]
        relayouts = [r for r in blocked if r.relayout is not None]
        claimed.update(rule.index.producer[r.outputs[0]] for r in relayouts)
        if "pool" not in self.opts.skip_fusion:
            # A pool inside a chain runs as our blocked pool kernel (pool_exec.c), its passthrough form the
            # fallback: onnxruntime's 3-D pool on the 5-D form is a slow generic loop. So does a global pool that
            # ends a chain (a classifier's): onnxruntime's ReduceMean and the reorder after it would end the
            # sequence before the classifier.
            pools = PoolRule(work)
            relayouts = [(r.kind == "relayout" and pools.blocked_region(r.nodes[0], r.relayout, mk.lanes))
                         or (r.kind == "relayout-exit" and pools.blocked_region(
                             r.nodes[0], r.relayout, mk.lanes, exit_channels=int(ew.shape_of(r.outputs[0])[1])))
                         or r for r in relayouts]
        plan += relayouts
        if "copy" not in self.opts.skip_fusion:
            # Concats and nearest Resizes in the chains as our copy kernel (fusion/blocked_copy.py); the plan keeps
            # their passthrough regions too, which stand in for a copy kernel that is rejected.
            plan += fuse_copies(relayouts, rule.index, ew.shape_of, mk.lanes)
        if "elementwise" not in self.opts.skip_fusion:
            # Relus and Adds the chains run through as our elementwise kernels on the blocked tensors
            # (fusion/blocked_elementwise.py); their passthrough regions stay in the plan as the fallback.
            plan += blocked_elementwise(relayouts, work, mk.lanes)
        if "pool" not in self.opts.skip_fusion:  # pools left out of the chains read and write NCHW
            plan += PoolRule(work).find_regions(claimed, [])
        if "copy" not in self.opts.skip_fusion and self.opts.sequences:
            # Concats left out of the chains (NCHW) as our copy kernel: no faster than onnxruntime's, but one of
            # onnxruntime's between two of our kernels would end a sequence (fusion/blocked_copy.py).
            concats = plain_concats(rule.index, ew.shape_of, ew.dtype_of, claimed)
            claimed.update(rule.index.producer[r.outputs[0]] for r in concats)
            plan += concats
            # And Slices, for the same reason (NASNet-A's crops after its factorized reductions).
            slices = plain_slices(rule.index, ew.shape_of, ew.dtype_of, const_of, claimed, ew.opset)
            claimed.update(rule.index.producer[r.outputs[0]] for r in slices)
            plan += slices
        plan += self._kind_regions(work, claimed, [])
        if "elementwise" not in self.opts.skip_fusion:
            plan += ElementwiseRule(work).find_regions([], exclude=claimed)
        return plan

    def _kind_regions(self, work, claimed: set[int], rejected: list) -> list[Region]:
        """The regions of the registered kinds (onnxopt/kinds/) among the nodes not claimed yet."""
        out = []
        for kind in KINDS:
            if kind.name not in self.opts.skip_fusion:
                out += kind.find(work, claimed, rejected)
        return out

    def _afusion_plan(self, work, blocked_plan: list[Region]) -> list[Region] | None:
        """The blocked plan with convolution groups fused into AFUSION kernels (onnxopt/fusion/afusion); None when
        no group can be.

        The search (_search_pairs) picks the groups. When kernels will be timed, every other legal group that does
        not overlap its choice is built and timed too (the *probe*), and the search runs again on the measured
        times once the kernels are checked (_measured_afusion): a group the roofline misjudged is then kept or
        dropped on what it measured."""
        mk = select_micro_kernel(self.opts.target)
        rule = self._blocked_rule or ComputeRule(work, mk.tile.mi, blocked=_channel_vector_kernel(mk))
        pairs, refused = afusion_pairs(blocked_plan, rule.index, rule.ew.shape_of, mk.lanes,
                                       self.opts.threads or os.cpu_count() or 1)
        if "afusion" in self.opts.skip_fusion:
            pairs = []
        self.report.setdefault("afusion", {})["refused"] = refused
        groups, sib_refused = ([], []) if "horizontal" in self.opts.skip_fusion else \
            sibling_groups(blocked_plan, mk.lanes, rule.ew.shape_of, rule.index.nodes)
        self.report["horizontal"] = {"refused": sib_refused, "groups": []}
        chosen = self._search_pairs(work, pairs, groups)
        self._set_afusion_chosen(chosen)
        self._afusion_base = blocked_plan  # the kernels whose times cost the search's convolutions
        probing = self.opts.measure and not self.cannot_run and self._search_result is not None \
            and os.environ.get("ONNXOPT_AFUSION_PAIRS") not in ("all", "chains")
        built = greedy_pairs(chosen + [p for p in pairs if p not in chosen]) if probing else chosen
        # Chains of three overlap the pairs they are made of, so the probe's plan cannot hold both: the chains the
        # search did not choose are probed in a plan of their own (afusion-chains), built, checked and timed like
        # the others, and the second search weighs them on what they measured.
        self._chain_probe = greedy_pairs([p for p in pairs if p.chain and p not in built]) if probing else []
        if probing and os.environ.get("ONNXOPT_SIBLINGS") != "all":
            # The sibling groups' probe: every legal group of two or three (a search candidate of its own) that the
            # search's choice does not touch is built and timed too, and judged again on what it measured.
            taken = {n for g in self.siblings_chosen for n in g.convs}
            self._siblings_first = list(self.siblings_chosen)
            self._set_siblings_chosen(self.siblings_chosen + [g for g in groups
                                                              if len(g.regions) <= 3 and not taken & set(g.convs)])
            self._siblings_probed = True
        self._afusion = {"base": blocked_plan, "pairs": built if probing else None, "made": {}, "sib_made": {},
                         "lanes": mk.lanes, "ni": mk.tile.ni, "opset": _opset(work)}
        if not built and not self.siblings_chosen:
            return None
        return self._compose(built)

    def _compose(self, pairs) -> list[Region]:
        """The AFUSION plan: the base plan with `pairs` fused, and the chosen sibling groups none of them holds."""
        a = self._afusion
        plan = apply_pairs(a["base"], pairs, a["lanes"], a["ni"], a["opset"], made=a["made"])
        in_pairs = {id(r) for p in pairs for r in [p.first, *p.seconds]}
        sibs = [g for g in self.siblings_chosen if not any(id(r) in in_pairs for r in g.regions)]
        return apply_siblings(plan, sibs, a["lanes"], a["ni"], a["opset"], made=a["sib_made"])

    def _chain_plan(self, base) -> list[Region]:
        """The base plan with the probed chains of three fused (each built and timed for the second search)."""
        a = self._afusion
        return apply_pairs(base, self._chain_probe, a["lanes"], a["ni"], a["opset"], made=a["made"])

    def _horizontal_plan(self, base) -> list[Region]:
        """The base plan with the chosen sibling groups fused (horizontal fusion only)."""
        a = self._afusion
        return apply_siblings(base, self.siblings_chosen, a["lanes"], a["ni"], a["opset"], made=a["sib_made"])

    def _choose_siblings(self, groups, wanted: list[frozenset]) -> list:
        """The sibling groups of the search's horizontal candidates (`wanted`: their convolutions), each within one
        legal group, none sharing a convolution with another. (The horizontal plan takes them all; the afusion plan
        leaves out those whose convolutions an AFUSION group holds, _compose.)"""
        taken: set[str] = set()
        chosen = []
        for want in wanted:
            for g in groups:
                regions = [r for r in g.regions if r.node_names[0] in want]
                if len(regions) == len(want) and not (want & taken):
                    chosen.append(Siblings(regions))
                    taken |= want
                    break
        return chosen

    def _set_afusion_chosen(self, chosen):
        self.afusion_chosen = chosen
        self.report["afusion"]["pairs"] = [dict({"nodes": p.node_names, "pattern": p.pattern,
                                                 "band_rows": p.band_rows},
                                                **self.pair_predictions.get(_pair_key(p), {})) for p in chosen]

    def _set_siblings_chosen(self, chosen):
        self.siblings_chosen = chosen
        self.report.setdefault("horizontal", {"refused": []})["groups"] = [
            {"nodes": g.node_names, "convs": g.convs} for g in chosen]

    def _target_ident(self) -> str:
        t = self.opts.target
        return f"{t.name}|{t.cpu}|{t.llvm_features}"

    def _run_search(self, cands, measured: dict, built=None):
        from onnxopt.fusion.search import measured_search

        return measured_search(cands, measured, budget_s=self.opts.search_budget, built=built)

    def _search_pairs(self, work, pairs, groups=()):
        """OptiFX's candidates (Algorithm 1) and backtracking search (Algorithm 2, onnxopt/fusion/search) over the
        whole graph, costed by the kernel times the cost cache holds from earlier runs and by the roofline for the
        rest; the AFUSION SISO, SIMO and MISO candidates of the plan it finds pick which legal groups are fused, its
        horizontal candidates which sibling convolutions run as one kernel (self.siblings_chosen).
        The candidate counts and the search's figures go in report["search"]. When the search fails, every legal
        group is taken in graph order (greedy_pairs)."""
        from onnxopt.fusion.search import generate_candidates
        from onnxopt.fusion.search.region_costs import search_signatures

        t = time.perf_counter()
        entry = self.report.setdefault("search", {})
        self._search_result = None
        self.siblings_chosen = []
        all_groups = list(groups)
        try:
            kinds = tuple(k for k in ("vertical", "horizontal", "afusion") if k not in self.opts.skip_fusion)
            machine = _machine() or "xeon-gold-6240"
            cands = generate_candidates(work, machine, prune=self.opts.prune, kinds=kinds)
            entry["candidates"] = cands.counts()
            cache = self._cost_cache()
            self._kernel_costs = cache.get_kernels(search_signatures(cands), self.opts.threads,
                                                   self._target_ident()) if cache else {}
            res, source = self._run_search(cands, self._kernel_costs)
            self._search_result = cands
            entry.update({"baseline_s": res.baseline_cost, "best_s": res.best_cost, "expansions": res.expansions,
                          "stopped_by_budget": res.stopped_by_budget, "seconds": time.perf_counter() - t,
                          "measured_kernels": len(source.used), "estimated_kernels": len(source.estimated),
                          "plan": _plan_entries(res.plan)})
            wanted = _afusion_groups(res.plan)
            # The roofline's prediction for each group (pruned or not: every legal group can be forced).
            known = {frozenset(c.rops): c for c in cands.enumerated if c.kind == "afusion" and c.pattern in FUSABLE}
            for p in pairs:
                c = known.get(_pair_rops(p))
                if c is not None:
                    self.pair_predictions[_pair_key(p)] = {"predicted": {
                        "separate_s": c.seconds_before, "fused_s": c.seconds_after,
                        "saving_s": c.seconds_before - c.seconds_after, "speedup": c.predicted_speedup}}
            chosen = [p for p in pairs if _pair_rops(p) in wanted]
            entry["afusion_pairs_chosen"] = len(chosen)
            forced = os.environ.get("ONNXOPT_AFUSION_PAIRS")
            if forced == "all":  # tests and benchmarks: every legal group (a chain only where no pair of it is)
                chosen = pairs
            elif forced == "chains":  # tests: the chains of three first
                chosen = [p for p in pairs if p.chain] + [p for p in pairs if not p.chain]
            chosen = greedy_pairs(chosen)
            if os.environ.get("ONNXOPT_SIBLINGS") == "all":  # tests and benchmarks: every legal sibling group
                sib_wanted = [frozenset(g.convs) for g in all_groups]
            else:
                sib_wanted = [frozenset(c.rops) for c in res.plan if c.kind == "horizontal"]
            self._set_siblings_chosen(self._choose_siblings(all_groups, sib_wanted))
            entry["sibling_groups_chosen"] = len(self.siblings_chosen)
            return chosen
        except Exception as e:  # noqa: BLE001 - the search only chooses among legal pairs: fall back to all
            entry["error"] = f"{type(e).__name__}: {e}"[:300]
            self._search_result = None
            self._set_siblings_chosen([])
            return greedy_pairs(pairs)
        finally:
            self.report["timings"]["fusion_search_s"] = time.perf_counter() - t

    def _measured_afusion(self, accepted: list[Region], checked: list[Region]) -> list[Region]:
        """The search again, on what the checked kernels measured (each conv kernel and each probed AFUSION group;
        the times are stored in the cost cache for later runs' searches in any case): the AFUSION plan keeps the
        groups it chooses among those built.
        Returns `accepted` without the probed groups it leaves out."""
        from onnxopt.fusion.search.region_costs import conv_signature, group_signature

        if self._search_result is None:
            return accepted
        a = self._afusion
        t = time.perf_counter()
        cands, entry = self._search_result, self.report["search"]
        cache = self._cost_cache()
        measured = dict(self._kernel_costs)
        by_nodes = {tuple(p.node_names): p for p in [*(a["pairs"] or []), *self._chain_probe]} if a else {}
        # The AFUSION groups are judged against the kernels of the plan they are made from (blocked, usually), not
        # against the same convolutions in another plan's layout.
        base = {id(r) for r in self._dedupe(self._afusion_base)} | {id(r) for r in (a["made"].values() if a else ())}
        base |= {id(r) for r in (a["sib_made"].values() if a else ())}
        sib_convs = {tuple(g.node_names): g.convs for g in self.siblings_chosen}
        fresh = 0
        for r in checked:  # right answers, timed; a kernel slower than onnxruntime still has its time
            seconds = self._timed.get(id(r))
            if not seconds or r.compute is None or id(r) not in base:
                continue
            pair = by_nodes.get(tuple(r.node_names)) if r.compute.op == "afusion" else None
            if pair is not None:
                sig = group_signature(cands, _pair_rops(pair))
            elif r.compute.op == "siblings" and tuple(r.node_names) in sib_convs:
                sig = group_signature(cands, sib_convs[tuple(r.node_names)], kind="horizontal")
            elif r.compute.op == "conv":
                sig = conv_signature(cands, r.node_names)
            else:
                continue
            if sig is None:
                continue
            measured[sig] = seconds
            fresh += 1
            if cache is not None:
                cache.put_kernel(sig, self.opts.threads, self._target_ident(), seconds, r.op_type)
        if not a or (a["pairs"] is None and not self._siblings_probed):  # nothing probed: the times are kept for
            return accepted                                                  # later runs' searches
        probed = (a["pairs"] if a["pairs"] is not None else self.afusion_chosen) + self._chain_probe
        groups = {_pair_rops(p) for p in probed} | {frozenset(g.convs) for g in self.siblings_chosen}
        try:  # among the groups built: one never built cannot be kept, so the plan must not count on it
            res, source = self._run_search(cands, measured, lambda c: c.kind == "vertical" or (
                c.kind in ("afusion", "horizontal") and frozenset(c.rops) in groups and c.key in measured))
        except Exception as e:  # noqa: BLE001 - keep the first search's choice
            entry["measured_search"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            return accepted
        wanted = _afusion_groups(res.plan)
        live = {id(r) for r in accepted}  # a group whose kernel failed its check is not chosen
        chosen = [p for p in probed if _pair_rops(p) in wanted and id(a["made"][tuple(p.node_names)]) in live]
        # A group slower than onnxruntime on its own nodes, timed alone (where onnxruntime also pays its layout
        # reorders), is slower in the graph too, whatever it saves over our separate kernels: ResNet-50's stem
        # (7x7 conv, Relu, 3x3 max pool) measured 0.66x there, 2.07 ms against 1.37 ms, and was kept.
        made = {id(p): a["made"][tuple(p.node_names)] for p in chosen}
        slow = {id(made[id(p)]): (p.node_names, ratio) for p in chosen
                if (ratio := (made[id(p)].measured or {}).get("speedup", 1.0)) < 1.0}
        chosen = [p for p in chosen if id(made[id(p)]) not in slow]
        sib_wanted = {frozenset(c.rops) for c in res.plan if c.kind == "horizontal"}
        sib_before = self._siblings_first if self._siblings_probed else self.siblings_chosen
        sibs = [g for g in self.siblings_chosen
                if frozenset(g.convs) in sib_wanted and id(a["sib_made"].get(tuple(g.node_names))) in live]
        entry["measured_search"] = {
            "kernels_timed": fresh, "measured_kernels": len(source.used), "estimated_kernels": len(source.estimated),
            "calibration": source.factor, "baseline_s": res.baseline_cost, "best_s": res.best_cost,
            "seconds": time.perf_counter() - t, "plan": _plan_entries(res.plan),
            "afusion_before": [p.node_names for p in self.afusion_chosen],
            "afusion_after": [p.node_names for p in chosen],
            "slower_than_onnxruntime": [{"nodes": nodes, "speedup": ratio} for nodes, ratio in slow.values()],
            "siblings_before": [g.convs for g in sib_before], "siblings_after": [g.convs for g in sibs]}
        self._set_afusion_chosen(chosen)
        self._set_siblings_chosen(sibs)
        kept_regions = {id(a["made"][tuple(p.node_names)]) for p in chosen}
        kept_regions |= {id(a["sib_made"][tuple(g.node_names)]) for g in sibs}
        left_out = {id(r) for r in [*a["made"].values(), *a["sib_made"].values()]} - kept_regions
        parts_of = {id(a["made"][tuple(p.node_names)]): [p.first, *p.seconds] for p in probed}
        parts_of |= {id(r): list(r.compute.parts) for r in a["sib_made"].values()}
        base_of = {tuple(r.node_names): r for r in self._dedupe(self._afusion_base)}
        for r in accepted:
            if id(r) in left_out:
                # What was timed: the fused kernel and those of its parts that are our kernels (a pool part runs in
                # onnxruntime, costed by the calibrated roofline).
                parts = [self._timed.get(id(base_of.get(tuple(q.node_names), q))) for q in parts_of.get(id(r), [])]
                timed = " + ".join(f"{t * 1e6:.0f}" for t in parts if t) or "-"
                kind = "horizontal" if r.compute.op == "siblings" else "AFUSION"
                if id(r) in slow:
                    self._reject(r, f"AFUSION: slower than onnxruntime on the same nodes ({slow[id(r)][1]:.2f}x)")
                    continue
                self._reject(r, f"{kind}: the search on measured kernel times keeps these convolutions apart (fused "
                                f"{self._timed.get(id(r), 0) * 1e6:.0f} us; parts timed {timed} us)")
        self.report["regions"] = [e for e in self.report["regions"]
                                  if not any(id(r) in left_out and e["nodes"] == r.node_names for r in accepted)]
        plan = self._dedupe(self._compose(chosen))
        horizontal = self._dedupe(self._horizontal_plan(a["base"]))
        self.plans = [(n, plan if n == "afusion" else horizontal if n == "horizontal" else p) for n, p in self.plans
                      if (n != "afusion" or chosen or self.siblings_chosen) and (n != "horizontal" or sibs)
                      and n != "afusion-chains"]  # the chosen chains are in the afusion plan now
        return [r for r in accepted if id(r) not in left_out]

    def _afusion_savings(self):
        """Each AFUSION group's measured saving (_group_saving)."""
        for p, pair in zip(self.afusion_chosen, (self.report.get("afusion") or {}).get("pairs", [])):
            pair["measured"] = self._group_saving([p.first, *p.seconds], pair["nodes"])

    def _sibling_savings(self):
        """Each fused sibling group's measured saving (_group_saving)."""
        for g, entry in zip(self.siblings_chosen, (self.report.get("horizontal") or {}).get("groups") or []):
            entry["measured"] = self._group_saving(g.regions, entry["nodes"])

    def _group_saving(self, members: list[Region], nodes: list[str]) -> dict | None:
        """A fused group's convolutions as our separate kernels (as the base plan checked them, their op types known
        now) against the fused kernel, and the fused kernel against onnxruntime on the same nodes; None when not
        measured (--no-measure, a --plan that builds no parts, a rejection)."""
        entries = {(e["op_type"], tuple(e["nodes"])): e for e in self.report["regions"]}
        parts = [entries.get((r.op_type, tuple(r.node_names))) for r in members]
        fused = next((e for e in self.report["regions"] if e["nodes"] == nodes), None)
        if not all(e and "measured_fused_s" in e for e in [*parts, fused]):
            return None
        separate = sum(e["measured_fused_s"] for e in parts)
        return {"separate_s": separate, "fused_s": fused["measured_fused_s"],
                "saving_s": separate - fused["measured_fused_s"], "speedup": separate / fused["measured_fused_s"],
                "onnxruntime_s": fused["measured_original_s"]}

    def _build(self, regions):
        """Compile each distinct kernel once, on all cores (codegen/parallel.py); a region whose kernel fails to
        compile is rejected."""
        from onnxopt.codegen.parallel import build_many

        built = {}  # op_type -> (obj, desc, [regions])
        todo: dict[str, list[Region]] = {}
        for r in regions:
            if r.relayout is not None:  # onnxruntime's own nodes: nothing to compile
                continue
            if r.op_type in self.prebuilt:
                built.setdefault(r.op_type, (*self.prebuilt[r.op_type], []))[2].append(r)
                continue
            todo.setdefault(r.op_type, []).append(r)

        def job(r):
            kind = kind_of(r)
            if kind is not None:
                return lambda: kind.build(r, self.opts.target)
            builder = build_pool if r.pool is not None else build_compute if r.compute is not None \
                else build_copy if r.copy is not None else build_elementwise
            return lambda: builder(r, self.opts.target)

        # The compute kernels' tile sets first, each distinct one once (codegen/compute/tile_sets.py): most
        # convolutions of a network share a few. The kernels then only describe themselves.
        prebuild(tile_sets_of([rs[0] for rs in todo.values()], self.opts.target), self.opts.target)
        results = build_many([job(rs[0]) for rs in todo.values()])
        for (op_type, rs), res in zip(todo.items(), results):
            if isinstance(res, Exception):  # reported, regions left unfused
                for r in rs:
                    self._reject(r, f"code generation failed: {res}")
                continue
            built[op_type] = (res[0], res[1], rs)
        return built

    def _cost_cache(self):
        """The measured-cost cache (onnxopt/cost_cache.py), opened on first use; None when off or unusable."""
        if self.costs is None and self.opts.cost_cache is not False:
            self.costs = open_cost_cache(self.opts.cost_cache)
            if self.costs.warning:
                self.say(self.costs.warning)
        return self.costs if self.costs is not None and self.costs.enabled else None

    def _close_cost_cache(self):
        if self.costs is not None:
            self.report["cost_cache"] = self.costs.summary()
            self.costs.close()
        else:
            self.report["cost_cache"] = {"path": None, "enabled": False, "hits": 0, "misses": 0}

    def _weights_flush(self, work) -> int:
        """Bytes to flush before each run of a cold timing (tune/winograd_search.weights_cold_flush), once."""
        if self.weights_flush is None:
            from onnxopt.hardware.measure import cache_levels
            from onnxopt.tune.winograd_search import weights_cold_flush

            self.weights_flush = weights_cold_flush(work, cache_levels()[-1].total_bytes)
        return self.weights_flush

    def _cached_times(self, r: Region, feeds, entry, measure, cold: bool = False):
        """The region's (original, fused) timings: from the cost cache when it holds them for this op type, these
        input shapes, threads, machine and versions; else `measure()`d and stored. Only the timing is reused: the
        kernel was checked against onnxruntime before this is called."""
        cache = self._cost_cache()
        shapes = [list(np.shape(v)) for v in feeds.values()]
        # The same kernel on the same shapes in another region of this run (a network's repeated cells: NASNet's,
        # Inception's modules, and the same convolution in several plans): its time is that one's.
        same = self._region_times.get((r.op_type, repr(shapes)))
        if same is not None:
            entry["timed_as"] = "the same kernel and shapes in another region"
            return same
        hit = cache.get_region(r.op_type, shapes, self.opts.threads, cold) if cache else None
        if hit is not None:
            entry["cost_cache"] = "hit"
            return {"median": hit["original_s"]}, {"median": hit["fused_s"]}
        t_orig, t_fused = measure()
        self._region_times[(r.op_type, repr(shapes))] = (t_orig, t_fused)
        if cache is not None:
            cache.put_region(r.op_type, shapes, self.opts.threads, t_orig["median"], t_fused["median"], cold)
            if cache.enabled:
                entry["cost_cache"] = "miss"
        return t_orig, t_fused

    def _tile_of(self, r: Region) -> list[int]:
        mk = select_micro_kernel(self.opts.target)
        c = r.compute
        if c.op in ("afusion", "siblings"):  # the parts' tiles
            return [self._tile_of(p) for p in c.parts]
        if is_depthwise(c) and (c.attrs.get("out_blocked") or c.attrs.get("channel_vectors")):
            # Its own tile: pixels of one channel vector (codegen/microkernel/depthwise.py), as build_compute picks.
            return [depthwise_mi_for(mk, c.attrs["kernel"][1]), 1, 1]
        t = c.tile if c.tile is not None else mk.tile
        return [t.mi, t.ni, t.mii]

    def _search_tiles(self, work, regions):
        """The register tile of each compute region, by a small measured search (onnxopt/tune/tile_search.py):
        the winner, when it is not the target's default tile, is applied to the region (weights repacked, new op
        type) before the kernels are built. Regions with the same op type and shapes are searched once."""
        from onnxopt.annotate.shapes import tensor_info

        from onnxopt.tune.tile_search import region_flops

        t = time.perf_counter()
        info = tensor_info(work)
        done: dict[tuple, object] = {}
        # Winograd choices first: they gain 1.5-3x where they win, a register tile a few percent. Then largest first,
        # so that a tuning budget spent leaves the default tile on the cheapest regions.
        wino = self.opts.winograd == "auto"
        order = sorted((r for r in regions if r.compute is not None and r.compute.op not in ("afusion", "siblings")),
                       key=lambda r: (not (wino and winograd.applies(r) is None),
                                      -region_flops(r, info, self._bindings())))
        split = {"build_s": 0.0, "measure_s": 0.0}
        # AFUSION band heights cost a compile and a short timing per op type: a third of the budget is kept for them.
        has_bands = any(r.compute is not None and r.compute.op == "afusion" for r in regions)
        tile_share = 2 / 3 if has_bands else 1
        # The Winograd choices come first, with all of tune_budget: on Inception-v3 its 49 candidate layers took
        # 11 s. The register tiles and band heights then share what is left, but at least a third of it (ours gain
        # a few percent; Winograd 1.5-3x where it wins).
        t_tiles, rest = None, self.opts.tune_budget
        for r in order:
            feeds_key = (r.op_type, tuple(tuple(d if isinstance(d, int) else self.bindings.get(d, d)
                                                for d in (info[x].shape if x in info else ()))
                                          for x in runtime_inputs(r, work)))
            if wino and winograd.applies(r) is None:
                spent = time.perf_counter() - t
                over = f"the Winograd budget ({self.opts.tune_budget:g} s) is spent" \
                    if spent > self.opts.tune_budget else None
                self._search_winograd(work, r, info, feeds_key, done, over, split)
                continue
            if t_tiles is None:
                t_tiles = time.perf_counter()
                rest = max(self.opts.tune_budget - (t_tiles - t), self.opts.tune_budget / 3)
            spent = time.perf_counter() - t_tiles
            over = f"the tuning budget ({self.opts.tune_budget:g} s) is spent" if spent > rest * tile_share else None
            res = self._once(r, feeds_key, done, split, "tile_search", lambda r=r, over=over: search_tile(
                r, work, self.opts.target, self.opts.threads, self._cost_cache(), info=info, bindings=self._bindings(),
                seed=self.opts.seed, cache_only=over))
            if res is None:
                continue
            if res.changed:
                try:
                    if res.vectors == "channels":
                        mk = select_micro_kernel(self.opts.target)
                        with_channel_vectors(r, mk.lanes, mk.tile.ni, _opset(work))
                    else:
                        apply_tile(r, res.tile)
                except Exception as e:  # noqa: BLE001
                    self.tile_info[id(r)] = {"tile": self._tile_of(r),
                                             "tile_search": dict(res.to_report(), skipped=f"cannot apply: {e}")}
                    continue
            self.tile_info[id(r)] = {"tile": self._tile_of(r), "tile_search": res.to_report()}
            if not res.skipped:
                self.say(f"tile {self._tile_of(r)} for {r.describe()}"
                         + (f" ({res.to_report().get('gain', 1.0):.2f}x the default)" if res.changed else ""))
        if t_tiles is None:  # no region for the tile search: the bands get what the Winograd choices left
            t_tiles = time.perf_counter()
            rest = max(self.opts.tune_budget - (t_tiles - t), self.opts.tune_budget / 3)
        self._search_bands(work, regions, info, t_tiles, rest, split)
        wins = [v["winograd"] for v in self.tile_info.values() if "winograd" in v]
        if wins:
            chosen = {}
            for kernel, ms in winograd.SIZES_BY_KERNEL.items():
                for m in ms:
                    n = sum(1 for w in wins if w.get("chosen") == m and tuple(w.get("kernel", ())) == kernel)
                    if n or kernel == (3, 3):
                        chosen[winograd.label(kernel, m)] = n
            self.report["winograd"] = {"searched": sum(1 for w in wins if not w.get("skipped")), "chosen": chosen,
                                       "weights": "cold" if self._weights_flush(work) else "warm",
                                       "direct": sum(1 for w in wins if not w.get("chosen"))}
        searches = [v["tile_search"] for v in self.tile_info.values() if "tile_search" in v]
        self.report["tile_search"] = {"searched": sum(1 for x in searches if not x.get("skipped")),
                                      "changed": sum(1 for x in searches if not x.get("skipped")
                                                     and (x["chosen"] != x["default"]
                                                          or x.get("vectors", "pixels") != "pixels")),
                                      "skipped": sum(1 for x in searches if x.get("skipped")),
                                      "over_budget": sum(1 for x in searches if "tuning budget" in x.get("skipped", "")),
                                      "budget_s": self.opts.tune_budget}
        self.report["timings"]["tile_search_s"] = time.perf_counter() - t
        self.report["timings"]["tile_search_build_s"] = split["build_s"]
        self.report["timings"]["tile_search_measure_s"] = split["measure_s"]

    def _once(self, r: Region, key, done: dict, split: dict, report_key: str, search):
        """`search()` once per key (regions with the same op type and shapes share the result): its build and
        measurement time go into `split`, the kernels it compiled into the prebuilt set. None when it failed, the
        reason kept in the region's report under `report_key`: a search is an optimization, the region keeps its
        kernel."""
        try:
            res = done.get(key) or search()
        except Exception as e:  # noqa: BLE001
            self.tile_info[id(r)] = {"tile": self._tile_of(r), report_key: {"skipped": f"{type(e).__name__}: {e}"[:300]}}
            return None
        if key not in done:
            split["build_s"] += res.build_s
            split["measure_s"] += res.measure_s
        done[key] = res
        self.prebuilt.update(res.built)
        return res

    def _search_winograd(self, work, r: Region, info, feeds_key, done: dict, over: str | None, split: dict):
        """Direct or Winograd for one blocked convolution (onnxopt/tune/winograd_search.py); the winner is
        applied to the region in place (the plans share it; AFUSION and sibling parts are copies)."""
        from onnxopt.tune.winograd_search import search_winograd

        res = self._once(r, ("winograd",) + feeds_key, done, split, "winograd", lambda: search_winograd(
            r, work, self.opts.target, self.opts.threads, self._cost_cache(), info=info, bindings=self._bindings(),
            seed=self.opts.seed, cache_only=over, flush_bytes=self._weights_flush(work)))
        if res is None:
            return
        if res.m:
            mk = select_micro_kernel(self.opts.target)
            winograd.apply_winograd(r, res.m, mk.lanes, mk.tile.ni)
            self.say(f"Winograd {winograd.label(r.compute.attrs['kernel'], res.m)} for {r.describe()}"
                     + (f" ({res.to_report()['gain']:.2f}x the direct kernel)" if "gain" in res.to_report() else ""))
        self.tile_info[id(r)] = {"tile": self._tile_of(r), "winograd": res.to_report()}

    def _search_bands(self, work, regions, info, t_start, budget, split):
        """The band height of each AFUSION region (onnxopt/tune/band_search.py), in what is left of `budget` seconds
        from t_start (shared with the register-tile search), largest first; the chosen variant is applied and its
        object code kept for _build."""
        from onnxopt.tune.band_search import apply_band, search_band
        from onnxopt.tune.tile_search import region_flops

        bands = sorted((r for r in regions if r.compute is not None and r.compute.op == "afusion"),
                       key=lambda r: -region_flops(r, info, self._bindings()))
        found, done = [], {}
        for r in bands:
            # One search per op type: regions that share it share the object code, whose symbols carry its name,
            # so they must keep sharing one height (and one op type).
            res = done.get(r.op_type)
            if res is None:
                if time.perf_counter() - t_start > budget:
                    found.append({"nodes": r.node_names, "skipped": "the tuning budget is spent"})
                    continue
                try:
                    res = search_band(r, work, self.opts.target, self.opts.threads, info=info,
                                      bindings=self._bindings(), seed=self.opts.seed)
                except Exception as e:  # noqa: BLE001 - the search is an optimization: keep the model's height
                    found.append({"nodes": r.node_names, "skipped": f"{type(e).__name__}: {e}"[:300]})
                    continue
                done[r.op_type] = res
                split["build_s"] += res.build_s
                split["measure_s"] += res.measure_s
            if res.rows != res.default:
                apply_band(r, res.rows)
                for pair in (self.report.get("afusion") or {}).get("pairs", []):
                    if pair["nodes"] == r.node_names:
                        pair["band_rows"], pair["band_rows_model"] = res.rows, res.default
            self.prebuilt.update(res.built)
            found.append(dict(res.to_report(), nodes=r.node_names))
        self.report["band_search"] = found

    def _reject(self, r: Region, reason: str):
        r.rejected = reason
        self.report["rejected"].append({"op_type": r.op_type, "nodes": r.node_names, "ops": r.describe(),
                                        "reason": reason})

    def _check_regions(self, work, built) -> list[Region]:
        """Run every kernel against its region in onnxruntime: right answers first, then speed."""
        from onnxopt.annotate.shapes import tensor_info

        info = tensor_info(work)
        if self.cannot_run:
            self.report["kernels_not_run"] = (f"this CPU lacks {', '.join(self.cannot_run)} that target "
                                              f"{self.opts.target.name} needs: kernels were compiled but not run here")
            accepted = [r for _, _, regions in built.values() for r in regions]
            for r in accepted:
                r.measured = {"op_type": r.op_type, "ops": r.describe(), "nodes": r.node_names, "inputs": r.inputs,
                              "outputs": r.outputs, "shape": r.shape, "checked": False}
                self.report["regions"].append(r.measured)
            return accepted
        lib = os.path.join(self.tmpdir, "candidates.so")
        link_library([b[1] for b in built.values()], [b[0] for b in built.values()], self.opts.target, lib)
        bindings = self._bindings()
        accepted = []
        machine = _machine()
        # The same kernel on the same shapes in another region (a network's repeated cells) gets that region's
        # verdict without two more sessions (NASNet's checks: 32 s -> 25.5 s): the code is the same, only the
        # weights differ, and the whole-model check still runs every region with its own.
        verdicts: dict[tuple, tuple] = {}  # key -> (rejection reason or None, accepted entry or None)
        for op_type, (_, desc, regions) in built.items():
            for r in regions:
                feeds = _region_feeds(r, info, bindings, self.opts.seed, work)
                key = (r.op_type, repr([np.shape(v) for v in feeds.values()]))
                if key in verdicts:
                    self._reuse_verdict(r, key, verdicts[key], accepted)
                    continue
                verdicts[key] = (None, None)  # filled in below; a crash leaves it unknown
                orig, fused = _region_models(r, work, info)
                # Blocked tensors go in and come out in the kernel's layout; the check compares NCHW values and
                # that the padding channels are exact zeros (the next blocked kernel relies on it).
                lanes = r.compute.attrs.get("block", 0) if r.compute is not None else \
                    r.pool.attrs.get("blocked", 0) if r.pool is not None else \
                    r.copy.lanes if r.copy is not None else r.blocked_lanes
                fused_feeds = {x: to_blocked(v, lanes) if x in blocked_inputs(r) else v for x, v in feeds.items()}
                try:
                    s_orig = make_session(orig, self.opts.threads)
                    s_fused = make_session(fused, self.opts.threads, library=lib, ops=custom_ops(fused))
                    want = s_orig.run(None, feeds)
                    got = s_fused.run(None, fused_feeds)
                    b_out = blocked_outputs(r)
                    for i, name in enumerate(r.outputs):
                        if name in b_out:
                            ch = want[i].shape[1]
                            back = to_blocked(from_blocked(got[i], ch), lanes)
                            if got[i].shape != back.shape or not np.array_equal(got[i], back):
                                raise RuntimeError(f"blocked output {name} is not zero in its padding channels")
                            got[i] = from_blocked(got[i], ch)
                except Exception as e:  # noqa: BLE001
                    self._reject(r, f"kernel check could not run: {str(e).splitlines()[0][:200]}")
                    verdicts[key] = (r.rejected, None)
                    continue
                tol = Tolerance(dict(KERNEL_RTOL), dict(KERNEL_ATOL), {})
                if r.compute is not None:
                    # A reduction over K terms in another order differs by about K * eps * sum |a * b|: where
                    # terms cancel, the relative error of a small result is large while the error itself is
                    # rounding. Judge it against the output's scale.
                    tol = kernel_tolerance(want, kernel_error_bound(r))
                diffs = compare(r.outputs, want, got, tol)
                bad = [d for d in diffs if not d.ok]
                if bad:
                    d = bad[0]
                    self._reject(r, f"kernel gives wrong results on {d.name} (max abs {d.max_abs:.3g}, "
                                    f"max rel {d.max_rel:.3g}) {d.detail}".strip())
                    verdicts[key] = (r.rejected, None)
                    continue
                bytes_moved = _bytes_moved(r, feeds, want)
                entry = {"op_type": r.op_type, "ops": r.describe(), "nodes": r.node_names, "inputs": r.inputs,
                         "outputs": r.outputs, "shape": r.shape, "bytes": bytes_moved,
                         "max_abs_err": max(d.max_abs for d in diffs)}
                if blocked_inputs(r) or blocked_outputs(r):
                    entry["layout"] = (("blocked" if r.inputs[0] in blocked_inputs(r) else "nchw") + "->"
                                       + ("blocked" if blocked_outputs(r) else "nchw"))
                flops = _region_flops(r, feeds, want)
                if flops:
                    entry["flops"] = flops
                if machine is not None:
                    level = machine.level_for(bytes_moved)
                    # Roofline: the slower of the arithmetic at peak and the bytes at the level's bandwidth.
                    entry["predicted_s"] = max(bytes_moved / level.bandwidth,
                                               flops / machine.peak_flops["float32"] if flops else 0.0)
                    entry["memory_level"] = level.name
                    entry["level_bandwidth"] = level.bandwidth
                if r.compute is not None:
                    entry.update(self.tile_info.get(id(r)) or {"tile": self._tile_of(r)})
                if self.opts.measure:
                    # A region of a blocked chain is judged with its chain in the whole-model timing; its own time
                    # is for the report (and AFUSION's measured savings): a shorter timing does. A copy kernel has
                    # its passthrough nodes to fall back on (fusion/blocked_copy.py); without sequences it is judged
                    # alone. With them it keeps its neighbours in one sequence, though alone it is hardly faster
                    # than onnxruntime's Concat: only the whole model shows that.
                    chained = ((blocked_inputs(r) or blocked_outputs(r)) and r.copy is None) or \
                        (r.copy is not None and self.opts.sequences)
                    # Blocks of 4 ms, not 10: a chain's kernel is timed three blocks a side, and NASNet-A's 200
                    # checks took 14 s with 10 ms blocks.
                    # A kernel judged alone stops timing once it is far from the bar either way (SETTLED_BEYOND):
                    # NASNet-A's NCHW kernels measured 0.1-0.2x, 0.1 s each.
                    bar = self.opts.min_speedup
                    quick = dict(min_time=0.012, max_blocks=6, min_blocks=3, block_s=0.004) if chained \
                        else dict(min_time=ALONE_CHECK_S, max_blocks=15, block_s=0.005,
                                  settled_outside=(bar / SETTLED_BEYOND, bar * SETTLED_BEYOND))
                    # Judged alone with large weights in a model whose weights do not fit in the caches: timed with
                    # them out of the caches, as in the model (ResNet-50's classifier, 8 MB: ours measured faster
                    # warm and ran 550 us in the model against onnxruntime's 325).
                    cold = not chained and self._weights_flush(work) > 0 and _weight_bytes(r, work) >= COLD_REGION_BYTES
                    if cold:
                        quick = {"min_time": 0.1, "min_blocks": 8, "max_blocks": 16,
                                 "flush_bytes": self._weights_flush(work)}
                        entry["weights"] = "cold"
                    t_orig, t_fused = self._cached_times(r, feeds, entry, lambda: time_interleaved(
                        [s_orig, s_fused], [feeds, fused_feeds], **quick), cold)
                    self._timed[id(r)] = t_fused["median"]  # for the measured search, even if rejected below
                    self._timed_by_key[key] = t_fused["median"]
                    entry["measured_original_s"] = t_orig["median"]
                    entry["measured_fused_s"] = t_fused["median"]
                    entry["speedup"] = t_orig["median"] / t_fused["median"]
                    entry["achieved_bandwidth"] = bytes_moved / t_fused["median"]
                    if machine is not None:
                        entry["bandwidth_fraction"] = entry["achieved_bandwidth"] / entry["level_bandwidth"]
                    if flops:
                        entry["achieved_flops"] = flops / t_fused["median"]
                        if machine is not None:
                            entry["peak_fraction"] = entry["achieved_flops"] / machine.peak_flops["float32"]
                    # A region of a blocked chain is judged with its chain, in the whole-model timing (`chained`).
                    if entry["speedup"] < self.opts.min_speedup and not chained:
                        self._reject(r, f"not faster than onnxruntime ({entry['speedup']:.2f}x, "
                                        f"needs {self.opts.min_speedup:.2f}x)")
                        verdicts[key] = (r.rejected, None)
                        continue
                r.measured = entry
                self.report["regions"].append(entry)
                accepted.append(r)
                verdicts[key] = (None, entry)
        return accepted

    def _reuse_verdict(self, r: Region, key: tuple, verdict: tuple, accepted: list) -> None:
        """_check_regions for a region whose kernel and shapes an earlier region had: the same outcome."""
        reason, first = verdict
        if key in self._timed_by_key:  # the measured AFUSION search reads every region's time, rejected ones too
            self._timed[id(r)] = self._timed_by_key[key]
        if reason is None and first is None:
            reason = "kernel check could not run (the same kernel and shapes in another region)"
        if reason is not None:
            self._reject(r, reason)
            return
        entry = dict(first, nodes=r.node_names, inputs=r.inputs, outputs=r.outputs, shape=r.shape,
                     checked_as="the same kernel and shapes in another region")
        if r.compute is not None:
            entry.update(self.tile_info.get(id(r)) or {"tile": self._tile_of(r)})
        r.measured = entry
        self.report["regions"].append(entry)
        accepted.append(r)

    def _whole_model_decision(self, original, work, accepted, built, src_path) -> list[Region]:
        """Kernels that win alone can still lose in the graph: onnxruntime's blocked-layout (NCHWc) pass keeps
        conv -> activation chains blocked, and a custom op between them costs a reorder on each side. So time the
        whole fused model against the original; drop, one kernel type at a time, those whose removal makes the
        model faster; and emit nothing if the result is still not faster than the original."""
        lib = os.path.join(self.tmpdir, "candidates.so")
        feeds = make_inputs(original, self._bindings(), self.opts.seed, self.opts.check_inputs)
        s_orig = make_session(original if src_path is None else src_path, self.opts.threads)

        session_lib: dict[int, str] = {}  # a plan's library other than candidates.so (_inline_choice), by id

        def session(regions):
            return self._plan_session(regions, session_lib.get(id(regions), lib), built)

        def compare(a, b, min_time=0.4, max_blocks=30):
            # min_time decides for most models; 4 blocks a side at least for slow ones (PicoDet's 6 plans at 185 ms
            # a run took 16 s with 6)
            ta, tb = time_interleaved([a, b], feeds, min_time=min_time, max_blocks=max_blocks, min_blocks=4)
            return ta["median"], tb["median"]

        # Pick the faster plan first (see _run), then refine it kernel type by kernel type.
        t_phase = time.perf_counter()  # where the whole-model decision's seconds go, for the report
        live = {id(r) for r in accepted}
        candidates = []
        for name, plan in self.plans:
            regs = _consistent_layouts([r for r in plan if id(r) in live])
            if regs:
                s_plan = session(regs)
                t_o, t_p = compare(s_orig, s_plan)
                candidates.append((t_p / t_o, name, regs, s_plan, t_o, t_p))
        candidates.sort(key=lambda c: c[0])

        inline_choices: dict[int, dict] = {}  # id of a plan's regions -> its _inline_choice entry

        def choose_library(regions):  # each plan on the library it would be emitted with
            if id(regions) not in inline_choices:
                # the fastest plan's time: the smallest model time known, so the largest bound on the gain
                entry, wide = self._inline_choice(regions, lib, built, compare, min(c[5] for c in candidates))
                inline_choices[id(regions)] = entry
                if wide:
                    session_lib[id(regions)] = wide[0]
            return inline_choices[id(regions)]

        def duel(a, b):
            """Each round in new sessions (one session of a model can be a few % off), each plan on its library:
            NASNet's compute-blocked plan gains 10-20% with small kernels inline, and without them it lost its
            duel to the elementwise plan (1.01x)."""
            choose_library(a[2])
            choose_library(b[2])
            gains = []
            for _ in range(RUNOFF_ROUNDS):
                t_a, t_b = compare(session(a[2]), session(b[2]), min_time=0.5, max_blocks=100)
                gains.append(t_b / t_a)
            return gains

        phases = {"plans_s": time.perf_counter() - t_phase}
        # Plans all short of the bar: no runoff to order them. The fastest goes to the drop trials, which may rescue
        # it, and to the final check, which times it longer; DETR's plans measured 0.82-0.98x, and their runoffs took
        # 11-13 s.
        behind = candidates and 1.0 / candidates[0][0] < self.opts.min_speedup * WHOLE_MODEL_MARGIN * RUNOFF_FLOOR
        runoff = None if behind else self._plan_runoff(candidates, duel)
        phases["runoff_s"] = time.perf_counter() - t_phase - sum(phases.values())
        _, plan_name, current, s_cur, t_orig, t_cur = candidates[0]
        entries = self.report["regions"]
        why = {}  # why each region left the plan, applied once the plan is final
        for r in accepted:
            why[id(r)] = f"the {plan_name} plan makes the model faster without this region"
        decisions = {"original_s": t_orig, "all_kernels_s": t_cur, "dropped": [], "plan": plan_name,
                     "plans": {c[1]: c[4] / c[5] for c in candidates}}
        if runoff:
            decisions["runoff"] = runoff
        # A region in a blocked chain cannot leave alone: its neighbours read or write its layout.
        chained = {r.op_type for r in current if blocked_inputs(r) or blocked_outputs(r)}
        # The kernels that won least alone are the likeliest to lose in the graph: tried first, within a budget (each
        # trial is a session of the whole model, a second or two on Inception-v3, which has 90 kernel types).
        alone = {}
        for r in current:
            alone[r.op_type] = min(alone.get(r.op_type, float("inf")), (r.measured or {}).get("speedup", 1.0))
        kinds = sorted({r.op_type for r in current} - chained,
                       key=lambda k: (alone.get(k, 1.0), sum(r.op_type == k for r in current)))
        feeds_path = os.path.join(self.tmpdir, "feeds.npz")

        def look_in_new_process(plan_regions, trial_regions):
            """The second look of a drop trial, in a new process (timing.time_pair_in_new_process)."""
            files = [self._plan_file(regs, session_lib.get(id(regs), lib), built)
                     for regs in (plan_regions, trial_regions)]
            try:
                if not os.path.exists(feeds_path):
                    np.savez(feeds_path, **feeds)
                return time_pair_in_new_process(files[0], files[1], feeds_path, self.opts.threads)
            except Exception as e:  # noqa: BLE001 - no new process here: new sessions in this one
                decisions.setdefault("second_look_errors", []).append(str(e)[:300])
                s_trial = session(trial_regions)
                return compare(session(plan_regions), s_trial)

        if self.opts.min_speedup > 0:  # 0 keeps every correct kernel: nothing is dropped for its timing
            current, s_cur = _drop_trials(current, s_cur, kinds, session, compare, decisions, why,
                                          look_in_new_process)
        phases["drop_trials_s"] = time.perf_counter() - t_phase - sum(phases.values())
        decisions["inline_flops"] = choose_library(current)  # chosen in the runoff, unless kernels were dropped
        phases["inline_choice_s"] = time.perf_counter() - t_phase - sum(phases.values())
        if id(current) in session_lib:  # the plan runs on that library from here on, the final check included
            s_cur = session(current)
        # The last word, timed longer, with a margin: two sessions of the same model differ by 1-3% run to run on a
        # shared machine, and a model that only measured faster by that much is not known to be faster. A plan
        # that fails it leaves the next plan that measured faster its turn (PLAN_FALLBACKS of them): the plans
        # were timed for 0.4 s each, and one burst of noise once made UNet's elementwise plan (two small kernels)
        # look 1.36x faster, pass over the 1.23x compute-blocked plan, fail here, and leave nothing emitted.
        others = [c for c in candidates[1:] if c[4] / c[5] >= self.opts.min_speedup * WHOLE_MODEL_MARGIN]
        # each with what its plan timing said, so that a final check that contradicts it is timed again
        attempts = [(plan_name, current, decisions["plans"][plan_name])]
        attempts += [(c[1], c[2], c[4] / c[5]) for c in others[:PLAN_FALLBACKS]]
        # a fallback that chose its library in the runoff is timed on it
        sessions = {plan_name: s_cur, **{c[1]: session(c[2]) if id(c[2]) in session_lib else c[3]
                                         for c in others[:PLAN_FALLBACKS]}}

        def final_time(name, fresh):
            pair = [s_orig, sessions[name]]
            if fresh:  # new sessions of the same two models
                pair = [make_session(original if src_path is None else src_path, self.opts.threads),
                        session({a[0]: a[1] for a in attempts}[name])]
            # 1.5 s decides for most models; six blocks a side at least for slow ones (Whisper's encoder: 450 ms)
            ta, tb = time_interleaved(pair, feeds, min_time=1.5, max_blocks=400, min_blocks=6)
            return ta["median"], tb["median"]

        passed, finals = self._final_check(attempts, final_time)
        phases["final_checks_s"] = time.perf_counter() - t_phase - sum(phases.values())
        if finals and finals[0]["plan"] == plan_name:
            decisions["final_candidate_s"] = finals[0]["fused_s"]  # what the plan measured, emitted or not
        if finals:  # the last one timed is the plan that passed, if one did
            t_orig, t_cur = finals[-1]["original_s"], finals[-1]["fused_s"]
        if passed is None:  # no plan passed: nothing is emitted
            if finals:
                for r in accepted:
                    why[id(r)] = f"the fused model is not faster than the original ({finals[0]['speedup']:.2f}x)"
            current = []
        else:
            name, current = attempts[passed][:2]
            if id(current) in session_lib:  # the emitted library runs the kernels the way it was timed
                self.inline_flops = decisions["inline_flops"]["kept"]
            if name != plan_name:
                decisions["plan"] = name
                for r in accepted:
                    why[id(r)] = f"the {name} plan makes the model faster without this region"
        if finals:
            decisions["final_checks"] = finals
        kept = {id(r) for r in current}
        for r in accepted:
            if id(r) not in kept:
                self._reject(r, why[id(r)])
        self.report["regions"] = [e for e in entries if any(e["op_type"] == r.op_type and e["nodes"] == r.node_names
                                                            for r in current)]
        decisions["final_original_s"], decisions["final_fused_s"] = t_orig, (t_cur if current else t_orig)
        decisions["seconds"] = phases
        decisions["plan_models"] = {"built": self.plan_files_written, "sessions": self.plan_sessions_made}
        self.report["whole_model"] = decisions
        return current

    def _plan_session(self, regions: list[Region], library: str, built):
        """A session of the model with these regions fused, on `library` (candidates.so, or its wide-inline twin),
        run the way it would be emitted: with its sequence ops (emit/sequence.py), on a library linked with them.
        Plans are timed with their sequences because the sections change which plan is faster (NASNet-A's
        compute-blocked plan ran 1.21x faster in sequences, MobileNetV2's 1.08x). A library is linked once per set
        of sequences, with the plan's kernels only (about 0.1 s on NASNet-A; 0.28 s with every kernel built).

        The model is built and written once per plan and library, and every later session of it (a runoff round, a
        retimed final check) is made from that file: building and serializing Inception-v3 took 0.4 s a session,
        and its whole-model decision made 24 of them (13.6 s of a 72 s run without tuning)."""
        path, library, ops = self._plan_file(regions, library, built)
        self.plan_sessions_made += 1
        return make_session(path, self.opts.threads, library=library, ops=ops)

    def _plan_file(self, regions: list[Region], library: str, built) -> tuple[str, str, set]:
        """The plan's model file, the library it runs on and the op types it registers (_plan_session)."""
        key = (library, tuple(id(r) for r in regions))
        if key not in self.plan_models:
            if self.plan_base is None:  # the folded model's weights, written once for every plan file
                self.plan_base = SharedWeights(self.emit_base, self.tmpdir)
            m = build_fused_model(self.plan_base.light, regions, None, None, {}, [], constants=self.emit_base)
            if self.opts.sequences:
                m, seqs = make_sequences(m, {op: b[1] for op, b in built.items()}, DOMAIN)
                if seqs:
                    library = self._sequence_library(regions, library, seqs, built)
            path = os.path.join(self.tmpdir, f"plan{self.plan_files_written}.onnx")
            self.plan_files_written += 1
            if is_large(m):
                save_with_external_data(m, path)
            else:
                with open(path, "wb") as f:
                    f.write(m.SerializeToString())
            # the regions are kept with their file, so that their ids stay theirs while it is in use
            self.plan_models[key] = (path, library, custom_ops(m), list(regions))
            evict_plan_files(self.plan_models, PLAN_FILES_BYTES)
        return self.plan_models[key][:3]

    def _sequence_library(self, regions: list[Region], library: str, seqs: list, built) -> str:
        """The library a plan with these sequence ops runs on: its kernels only, linked once per set of sequences
        (a quicker link than every kernel built)."""
        key = (library, tuple(sorted(q.op_type for q in seqs)))
        if key not in self.sequence_libraries:
            path = os.path.join(self.tmpdir, f"sequences{len(self.sequence_libraries)}.so")
            wide = os.path.basename(library) == "candidates-inline.so"
            used = [built[op] for op in dict.fromkeys(r.op_type for r in regions) if op in built]
            link_library([b[1] for b in used] + seqs, [b[0] for b in used], self.opts.target, path,
                         inline_flops=INLINE_FLOPS_WIDE if wide else INLINE_FLOPS)
            self.sequence_libraries[key] = path
        return self.sequence_libraries[key]

    def _inline_choice(self, regions: list[Region], lib: str, built, compare,
                       model_s: float | None = None) -> tuple[dict, tuple | None]:
        """Which compute kernels run on the calling thread (CT_INLINE_FLOPS, codegen/glue/compute_exec.c): the plan
        is timed head to head with a library whose kernels below INLINE_FLOPS_WIDE run there, and that library is
        kept only if it wins by INLINE_MARGIN. Small kernels (NASNet's 16-channel 1x1 convolutions, 1-4 MFLOP) ran
        faster on one thread than on two, because onnxruntime's pool threads sleep between ops and the input is in
        the calling core's cache; MobileNetV2's ran slower, and DenseNet-BC's emitted AFUSION plan measured 1.41x
        onnxruntime's speed with the wide library against 1.30x in one interleaved timing, 1.26x against 1.30x in
        the next (hence INLINE_MARGIN). `model_s`: the seconds of a run of the fused model, if known (the fastest
        plan timing), which bounds what the wide library can gain. Returns the report entry, and (that library's
        path, the plan's session on it) when it is kept, else None."""
        entry = {"tried": INLINE_FLOPS_WIDE, "kept": INLINE_FLOPS}
        # Kernels far above both thresholds run on the pool either way: then the two libraries are the same program
        # and timing them would only cost offline time (ResNet-50's smallest convolution is 103 MFLOP). The glue
        # counts a Winograd kernel's products, about a quarter of the report's direct FLOPs for F(4x4, 3x3).
        small = [r for r in regions if r.compute is not None
                 and (r.measured or {}).get("flops", 0.0) < INLINE_FLOPS_WIDE * INLINE_REACH]
        if not small:
            entry["skipped"] = "no compute kernel is small enough for the threshold to matter"
            return entry, None
        # The wide library changes how the small kernels run, nothing else: even if they took no time at all, the
        # plan could not gain more than model_s / (model_s - their time alone). Below INLINE_MARGIN the timing
        # cannot keep it (Inception-v3: 29 small kernels, 2.1 ms of a 56 ms model, a 1.04x bound; 11 s of its
        # 72 s run without tuning went to these timings).
        bound = inline_gain_bound(small, model_s)
        if bound < INLINE_MARGIN:
            entry["skipped"] = f"the small kernels take too little of the model: at most {bound:.3f}x to gain"
            return entry, None
        wide = os.path.join(self.tmpdir, "candidates-inline.so")
        if not os.path.exists(wide):  # every plan's kernels, linked once for all the plans that try it
            link_library([b[1] for b in built.values()], [b[0] for b in built.values()], self.opts.target, wide,
                         inline_flops=INLINE_FLOPS_WIDE)
        # Both sessions new: the plan's own session has run the earlier timings, and one session of a model can run
        # a few percent faster than another (Inception-v3's wide library once measured 1.10x against the old session
        # and 1.00x against a new one).
        s_plan = self._plan_session(regions, lib, built)
        s_wide = self._plan_session(regions, wide, built)
        t_plan, t_wide = compare(s_plan, s_wide, min_time=1.0, max_blocks=200)
        entry["gain"] = t_plan / t_wide
        if entry["gain"] < INLINE_MARGIN:
            return entry, None
        entry["kept"] = INLINE_FLOPS_WIDE
        return entry, (wide, s_wide)

    def _final_check(self, attempts: list, final_time) -> tuple[int | None, list[dict]]:
        """The last word on the plan, timed longer (`final_time(name, fresh)` -> (original s, fused s)), with a
        margin: `attempts` is [(plan name, regions, speedup its plan timing measured)], the chosen plan first, then
        the fallbacks. Returns the index of the first that is at least min_speedup * WHOLE_MODEL_MARGIN faster
        (None: none is) and what each one timed. A pass within the noise of that bar (by less than CONFIRM_BELOW)
        is not trusted alone: the plan is timed twice more in fresh sessions of both models (`fresh`) and the median
        of the three stands. One session of a model can run a few percent faster than another: a NASNet plan that
        passed at 1.03x measured 0.94-0.98x in the benchmark's sessions. A failure that contradicts the plan's own
        timing (CONTRADICTED_ABOVE) is timed again too, however far below the bar: MobileNetV2's plan measured
        1.17x, then 0.92x in one final check (both models ran 30% slower than before, a burst of load on the host),
        and nothing was emitted."""
        finals = []
        need = self.opts.min_speedup * WHOLE_MODEL_MARGIN
        for i, (name, regions, planned) in enumerate(attempts):
            if not regions:
                continue
            t_orig, t_plan = final_time(name, False)
            entry = {"plan": name, "speedup": t_orig / t_plan, "original_s": t_orig, "fused_s": t_plan}
            finals.append(entry)
            close_pass = need <= t_orig / t_plan < need * CONFIRM_BELOW
            contradicts = planned >= need * CONTRADICTED_ABOVE and t_orig / t_plan < need
            if close_pass or contradicts:
                timings = [(t_orig, t_plan)] + [final_time(name, True) for _ in range(2)]
                entry["retimed"] = [o / p for o, p in timings]
                t_orig, t_plan = sorted(timings, key=lambda t: t[0] / t[1])[1]
                entry.update(speedup=t_orig / t_plan, original_s=t_orig, fused_s=t_plan)
            if entry["speedup"] >= need:
                return i, finals
        return None, finals

    def _plan_runoff(self, candidates: list, duel) -> dict | None:
        """Each plan was timed against the original on its own, so plans within a few percent of each other are
        ordered by noise. The fastest meets up to RUNOFF_OPPONENTS plans in turn: the plan it is built on
        (self.plan_bases) first, however far behind, then the fastest of those that measured within
        PLAN_RUNOFF_WITHIN and fuse more or less than it in PLANS_BY_FUSION (AFUSION before horizontal before
        compute-blocked ...), except a plan built on it (it measured behind: what it adds did not pay). Each duel is
        head to head (`duel(a, b)` -> t_b / t_a per round, each round in its own sessions); the more fused of the two
        is kept only if the median of its rounds wins by PLAN_MARGIN, and the winner meets the next. So a less fused plan that measured first does not win on its one timing either:
        DenseNet-BC's compute plan measured 1.41x against compute-blocked's 1.35x and was emitted, and ran 1.14x
        against 1.32x. `candidates` (sorted, fastest first) is reordered in place: the winner first."""

        def rank(name):  # PLANS_BY_FUSION, not the order the plans were built in (compute-blocked before AFUSION)
            return PLANS_BY_FUSION.index(name) if name in PLANS_BY_FUSION else len(PLANS_BY_FUSION)

        def meets(a, b):  # fuse differently, and b does not only add fusions to a (AFUSION to compute-blocked)
            return rank(a[1]) != rank(b[1]) and not (rank(b[1]) < rank(a[1]) and self.plan_bases.get(b[1]) == a[1])

        best = candidates[0]
        opponents = [c for c in candidates[1:] if c[0] <= best[0] * PLAN_RUNOFF_WITHIN and meets(best, c)]
        # A plan built on another (AFUSION and horizontal on compute-blocked) meets that one first, however far
        # apart their plan timings were: their duel times exactly what the fusion adds.
        base = self.plan_bases.get(best[1])
        first = [c for c in candidates[1:] if c[1] == base]
        opponents = first + [c for c in opponents if c[1] != base]
        if not opponents:
            return None
        champion, duels = best, []
        for other in opponents[:RUNOFF_OPPONENTS]:
            if not meets(champion, other):
                continue  # the same rank, or only adds fusions to the champion and measured behind it
            gains = duel(champion, other)
            gain = statistics.median(gains)  # the champion's
            if rank(champion[1]) < rank(other[1]):  # the champion fuses more
                kept = champion if gain >= PLAN_MARGIN else other
            else:
                kept = other if 1.0 / gain >= PLAN_MARGIN else champion
            duels.append({"plans": [champion[1], other[1]], "gains": gains, "gain": gain, "kept": kept[1]})
            champion = kept
        candidates.remove(champion)
        candidates.insert(0, champion)
        return {"duels": duels, "kept": champion[1]}

    def _bindings(self) -> dict[str, int]:
        return self.bindings

    def _choose_bindings(self, original) -> None:
        """Values for symbolic dims in the checks: distinct ones > 1 first (so that dims that only happen to be
        equal cannot hide a broadcasting mistake), then all 2, then all 1; the first the model accepts."""
        symbols = []
        for vi in original.graph.input:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param and d.dim_param not in symbols:
                    symbols.append(d.dim_param)
        self.bindings = {}
        candidates = [{s: 2 + i for i, s in enumerate(symbols)}, {s: 2 for s in symbols}, {s: 1 for s in symbols}]
        src = self.report["input"]["path"]
        failure = None
        # Run as the checks run it (every onnxruntime optimization): a model that fails there is refused now, not
        # after the whole run, when the final check could not run it.
        for b in candidates if symbols else [{}]:
            try:
                feeds = make_inputs(original, b, self.opts.seed, self.opts.check_inputs)
                make_session(original if src is None else src, self.opts.threads).run(None, feeds)
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001 - the model constrains its dims; try the next set
                failure = failure or " ".join(str(e).split())[:200]
                continue
            self.bindings = b
            break
        else:
            given = "the given" if self.opts.check_inputs else "random"
            raise InputError(f"the model fails in onnxruntime on {given} inputs ({failure}); give inputs it runs on "
                             "with --check-input NAME:FILE.npy, fix symbolic dims with --input-shape, or skip the "
                             "checks with --no-verify --no-measure")
        self.report["check_bindings"] = self.bindings

    def _emit(self, original, work, accepted, built, loaded, src_path, t_start) -> Result:
        t = time.perf_counter()
        lib_path = sha = None
        out_dir = os.path.dirname(os.path.abspath(self.output)) if self.output else self.tmpdir
        lib_name = (os.path.basename(self.output) if self.output else "model.onnx") + ".so"
        if accepted:
            fused = build_fused_model(self.emit_base, accepted, lib_name, None, self.opts.target.to_dict(),
                                      self.opts.target.required_cpu_flags)
        else:  # nothing wins: the user gets their model back as it was, and the report says why
            fused = onnx.ModelProto()
            fused.CopyFrom(original)
            loaded.restore_given(fused)
            self.report["unchanged"] = self._why_unchanged()
        if accepted:
            used = []
            for op_type, (obj, desc, _) in built.items():
                if any(r.op_type == op_type for r in accepted):
                    used.append((obj, desc))
            descs = [d for _, d in used]
            if self.opts.sequences:
                fused, seqs = make_sequences(fused, {d.op_type: d for d in descs}, DOMAIN)
                descs += seqs
                self.report["sequences"] = [{"op_type": q.op_type, "steps": len(q.steps),
                                             "concat_inputs_in_place": sum(v is not None for v in q.slot_view)}
                                            for q in seqs]
            lib_path = os.path.join(out_dir, f".{lib_name}.{os.getpid()}.tmp")
            sha = link_library(descs, [o for o, _ in used], self.opts.target, lib_path,
                               inline_flops=self.inline_flops)
            set_library_sha256(fused, sha)
        try:
            if self.original_checks:
                check_model(fused)
        except Exception as e:  # noqa: BLE001
            self._cleanup([lib_path])
            raise OnnxoptError(f"internal error: the fused model fails the ONNX checker ({' '.join(str(e).split())}); "
                               "please report it") from None
        self.report["timings"]["emit_s"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            if self.opts.verify:
                # A model written unchanged is checked against itself as given (restore_given), not against the
                # shape-fixed copy, when there is no file to run.
                self._verify_model(original, fused, lib_path, src_path, reference=None if accepted else fused)
            else:
                self._check_result_loads(fused, lib_path)
        except BaseException:
            self._cleanup([lib_path])  # the library linked for the model that is not written
            raise
        self.report["timings"]["verify_s"] = time.perf_counter() - t

        self.report["after"] = _op_counts(fused)
        self.report["fused_regions"] = sum(r.relayout is None for r in accepted)
        relayouts = [r.node_names[0] for r in accepted if r.relayout is not None]
        if relayouts:  # onnxruntime nodes rewritten to run on blocked tensors
            self.report["blocked_passthrough"] = relayouts
        written = []
        if self.output:
            try:
                written = save_model(fused, self.output, external=loaded.used_external_data, commit=False)
                commit_files(written, self.output)
                final_lib = os.path.join(out_dir, lib_name)
                if lib_path:
                    os.replace(lib_path, final_lib)
                elif os.path.exists(final_lib):
                    os.remove(final_lib)  # a stale library from an earlier run would not match this model
            except BaseException:
                self._cleanup([lib_path] + written)
                raise
            self.report["output"] = {"path": os.path.abspath(self.output), "size_bytes": os.path.getsize(self.output),
                                     "library": final_lib if lib_path else None, "library_sha256": sha}
            lib_result = final_lib if lib_path else None
        else:
            self._cleanup([lib_path])
            lib_result = None
        self.report["timings"]["total_s"] = time.perf_counter() - t_start
        self.report["offline"] = offline_split(self.report["timings"])
        return Result(fused, self.report, self.output, lib_result)

    def _without_quantized(self, plan: list[Region]) -> list[Region]:
        """The plan less the regions that would take a node of a quantized pattern from onnxruntime."""
        out = []
        for r in plan:
            if any((n.output[0] if n.output else n.name) in self.quantized for n in r.nodes):
                if not r.rejected:
                    self._reject(r, "part of a quantized pattern that onnxruntime runs as an int8 kernel "
                                    "(QDQ node unit or integer MatMul rescaling)")
            else:
                out.append(r)
        return out

    def _why_unchanged(self) -> str:
        """One sentence for a model written unchanged: why no fused region was kept."""
        whole = self.report.get("whole_model") or {}
        finals = whole.get("final_checks") or []
        if finals:
            return (f"no fused plan was faster than onnxruntime on the whole model (the best measured "
                    f"{max(f['speedup'] for f in finals):.3f}x; a plan must be "
                    f"{self.opts.min_speedup * WHOLE_MODEL_MARGIN:.3f}x)")
        if self.report.get("regions") or self.report.get("rejected"):
            reasons = [r["reason"] for r in self.report.get("rejected", []) if r.get("nodes")]
            if reasons:
                common = max(set(reasons), key=reasons.count)
                return f"every candidate region was rejected; the most common reason: {common}"
        return "nothing in this model is a region onnxopt fuses (see the supported ops in the README)"

    def _cleanup(self, paths):
        for p in paths:
            if p and os.path.exists(p):
                os.remove(p)

    def _check_result_loads(self, fused, lib_path):
        """Even without verification, the written model must at least open in onnxruntime."""
        libraries = [None if self.cannot_run else lib_path]
        if self.opts.verify_fallback and libraries[0] is not None:
            libraries.append(None)
        for lib in libraries:
            try:
                make_session(fused, 1, library=lib)
            except Exception as e:  # noqa: BLE001
                self._cleanup([lib_path])
                without = "" if lib else " without its kernel library"
                raise VerificationError(f"the optimized model does not load in onnxruntime{without} "
                                        f"({str(e).splitlines()[0][:300]}); nothing was written. Please report it; "
                                        "--skip-fusion elementwise avoids it") from None

    def _verify_model(self, original, fused, lib_path, src_path, reference=None):
        feeds = make_inputs(original, self._bindings(), self.opts.seed, self.opts.check_inputs)
        names = [o.name for o in original.graph.output]
        try:
            # From the path when there is one: external data resolves next to it, and > 2 GB models need it.
            source = src_path if src_path is not None else original if reference is None else reference
            want = make_session(source, self.opts.threads).run(names, feeds)
        except Exception as e:  # noqa: BLE001
            self.report["verification"] = {"skipped": f"the original model does not run on random inputs: {e}"}
            raise InputError(f"cannot verify: the original model fails on random inputs "
                                    f"({str(e).splitlines()[0][:200]}); give real inputs with "
                                    "--check-input name:file.npy or fix symbolic dims with --input-shape") from None
        try:
            lib = None if self.cannot_run else lib_path
            got = make_session(fused, self.opts.threads, library=lib).run(names, feeds)
        except Exception as e:  # noqa: BLE001
            self._cleanup([lib_path])
            raise VerificationError(f"the optimized model fails to run: {str(e).splitlines()[0][:300]}") from None
        diffs = compare(names, want, got, self.opts.tolerance)
        self.report["verification"] = {"outputs": [d.__dict__ for d in diffs], "ok": all(d.ok for d in diffs),
                                       "library": lib is not None}
        self._fail_if_differs(diffs, lib_path, "verification failed: output {} differs",
                              "Loosen with --rtol/--atol if this is expected, or skip a fusion with --skip-fusion")
        if self.opts.verify_fallback:
            self._verify_fallback(fused, lib_path, names, feeds, want, diffs if lib is None else None)

    def _verify_fallback(self, fused, lib_path, names, feeds, want, diffs=None):
        """The model as a host without the library runs it (a plain onnxruntime, another CPU): the function bodies
        must load and give the original's answers, or nothing is written. `diffs`: already compared that way."""
        if diffs is None:
            try:
                got = make_session(fused, self.opts.threads).run(names, feeds)
            except Exception as e:  # noqa: BLE001
                self._cleanup([lib_path])
                raise VerificationError(f"the optimized model does not run without its kernel library "
                                        f"({str(e).splitlines()[0][:300]}); nothing was written. Please report it; "
                                        "--skip-fusion with the kind named there avoids it") from None
            diffs = compare(names, want, got, self.opts.tolerance)
        self.report["fallback_verification"] = {"outputs": [d.__dict__ for d in diffs],
                                                "ok": all(d.ok for d in diffs)}
        self._fail_if_differs(diffs, lib_path, "verification failed without the kernel library: output {} of the "
                              "function bodies differs", "Please report it")

    def _fail_if_differs(self, diffs, lib_path, what: str, advice: str) -> None:
        bad = [d for d in diffs if not d.ok]
        if bad:
            self._cleanup([lib_path])
            d = bad[0]
            raise VerificationError(f"{what.format(d.name)} (max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g}); "
                                    f"nothing was written. {advice}")


FUSABLE = ("SISO", "SIMO", "MISO")  # the AFUSION patterns that have kernels


def _afusion_groups(plan) -> set[frozenset]:
    """The convolutions of each AFUSION group in a search plan that has a kernel."""
    return {frozenset(c.rops) for c in plan if c.kind == "afusion" and c.pattern in FUSABLE}


def _plan_entries(plan) -> list[dict]:
    return [{"kind": c.kind, "pattern": c.pattern, "nodes": list(c.members), "predicted_speedup": c.predicted_speedup}
            for c in plan]


def _pair_key(pair) -> tuple:
    return tuple(pair.node_names)


def _pair_rops(pair) -> frozenset:
    """An AFUSION group's convolutions, as the search's candidates name them (their ROPs)."""
    return frozenset(r.node_names[0] for r in [pair.first, *pair.seconds])


def offline_split(timings: dict) -> dict:
    """The offline time in OptiFX's three parts (its Table 7): searching (finding regions and the fusion plan),
    code generation (the kernels, and the tile search's candidates) and measurement (checking and timing kernels,
    the whole-model decision, verification); the rest is loading and writing."""
    t = {k: float(v) for k, v in timings.items()}
    tuned = t.get("tile_search_s", 0.0)
    tune_build = t.get("tile_search_build_s", 0.0)
    out = {"search_s": t.get("search_s", 0.0),
           "codegen_s": t.get("codegen_s", 0.0) + tune_build,
           "measurement_s": (tuned - tune_build) + t.get("kernel_check_s", 0.0) + t.get("model_check_s", 0.0)
           + t.get("verify_s", 0.0),
           "total_s": t.get("total_s", 0.0)}
    out["other_s"] = max(0.0, out["total_s"] - out["search_s"] - out["codegen_s"] - out["measurement_s"])
    return out


def passthroughs_kept(accepted: list[Region], regions: list[Region]) -> list[Region]:
    """The passthrough regions of blocked chains that join the accepted kernels. They have no kernel to check and
    stay while both their ends do (_consistent_layouts), except those an accepted copy kernel replaces
    (fusion/blocked_copy.py) or an accepted elementwise kernel on blocked tensors (fusion/blocked_elementwise.py):
    they come back only when it was rejected."""
    copied = {id(f) for r in accepted for f in (r.copy.fallback if r.copy is not None else r.replaces)}
    return [r for r in regions if r.relayout is not None and id(r) not in copied]


def _consistent_layouts(regions: list[Region]) -> list[Region]:
    """Drop the regions of a plan whose blocked inputs or outputs lost their other end (a neighbour whose kernel
    was rejected): onnxruntime's ops cannot read or write the blocked layout."""
    regions = list(regions)
    while True:
        made = {o for r in regions for o in blocked_outputs(r)}
        read = {x for r in regions for x in blocked_inputs(r)}
        keep = [r for r in regions
                if blocked_inputs(r) <= made and all(o in read for o in blocked_outputs(r))]
        if len(keep) == len(regions):
            return keep
        regions = keep


def _machine():
    try:
        from onnxopt.hardware.measure import load_machine

        return load_machine(quick=True)
    except Exception:  # noqa: BLE001 - predictions are optional in the report
        return None


def evict_plan_files(plan_models: dict, budget: int) -> None:
    """Plan files hold the weights their regions carry (the folded model's are shared): past `budget` bytes the
    oldest entries of `plan_models` (key -> (path, ...), in the order made) leave it and their files are deleted (a
    plan asked for again is built again), so a large model's plans do not fill the disk. The newest stays, whatever
    its size."""
    sizes = {k: os.path.getsize(v[0]) for k, v in plan_models.items()}
    while sum(sizes.values()) > budget and len(sizes) > 1:
        oldest = next(iter(sizes))
        os.remove(plan_models.pop(oldest)[0])
        del sizes[oldest]


def custom_ops(model: onnx.ModelProto) -> set[str]:
    """The op types of our library that the model's graph runs (make_session registers only those)."""
    return {n.op_type for n in model.graph.node if n.domain == DOMAIN}


def inline_gain_bound(small: list[Region], model_s: float | None) -> float:
    """The most a library that runs these kernels on the calling thread can speed up a model whose run takes
    `model_s` (inf when unknown): as if they took no time at all, by the seconds each measured alone."""
    times = [(r.measured or {}).get("measured_fused_s") for r in small]
    if model_s is None or None in times:  # a kernel not timed alone: no bound
        return float("inf")
    small_s = sum(times)
    if small_s >= model_s:
        return float("inf")
    return model_s / (model_s - small_s)


def _between_ours(kind: str, regions: list) -> bool:
    """Whether a kernel of type `kind` reads a tensor another region of the plan writes and writes one another
    region reads: without it, onnxruntime's nodes would sit between two of our kernels and end a sequence."""
    written = {o: id(r) for r in regions for o in getattr(r, "outputs", [])}
    read: dict[str, set] = {}
    for r in regions:
        for x in getattr(r, "inputs", []):
            read.setdefault(x, set()).add(id(r))
    for r in regions:
        if r.op_type != kind:
            continue
        before = any(written.get(x, id(r)) != id(r) for x in getattr(r, "inputs", []))
        after = any(read.get(o, set()) - {id(r)} for o in getattr(r, "outputs", []))
        if before and after:
            return True
    return False


def _drop_trials(current: list, s_cur, kinds: list, session, compare, decisions: dict, why: dict,
                 second_look=None):
    """The refinement of _whole_model_decision: for each kernel type in `kinds` (the likeliest losers first), the
    model without it (`session(regions)` -> a session) is timed against the plan (`compare(a, b)` -> (s, s)); the
    type is dropped only when a second look agrees: `second_look(plan regions, trial regions)` -> (s, s) (the
    pipeline's times them in a new process), else new sessions of both in this one. Both looks must beat the
    plan by DROP_MARGIN, or SPLIT_DROP_MARGIN for a type between two of our kernels (_between_ours). Every timing goes to
    decisions["trials"], each drop to decisions["dropped"], and why the regions left to `why`; the types not
    reached within DROP_TRIALS_S to decisions["untried"]. Returns the plan's regions and session after the drops."""
    t_trials = time.perf_counter()
    for kind in kinds:
        if time.perf_counter() - t_trials > DROP_TRIALS_S:
            decisions["untried"] = kinds[kinds.index(kind):]
            break
        trial = [r for r in current if r.op_type != kind]
        margin = SPLIT_DROP_MARGIN if _between_ours(kind, current) else DROP_MARGIN
        s_trial = session(trial)
        t_cur, t_trial = compare(s_cur, s_trial)
        decisions.setdefault("trials", []).append({"op_type": kind, "gains": [t_cur / t_trial]})
        if margin != DROP_MARGIN:
            decisions["trials"][-1]["margin"] = margin
        if not t_trial * margin < t_cur:
            continue
        # A second look before dropping: one 0.4 s timing is easily 10% off on a shared machine, and a dropped
        # kernel type can end sequences all over the model. The pipeline's runs in a new process. DenseNet-BC's
        # plain Concats (one op type) were dropped on two looks in the fifth and sixth optimizations of benchmark
        # processes (1.21x and 1.30x against the plan's session; 1.25x, then 1.23x in new sessions of both), and
        # those builds ran 1.26-1.33x onnxruntime's speed against 1.50-1.65x with them; in new processes the same
        # trial measured 0.84-0.91x. The plan's regions go as a copy, so that it runs on the library the trial runs
        # on, not on one the runoff chose for the plan (_inline_choice, by list id).
        if second_look is not None:
            t_cur2, t_trial2 = second_look(list(current), trial)
        else:
            s_trial = session(trial)
            t_cur2, t_trial2 = compare(session(list(current)), s_trial)
        decisions["trials"][-1]["gains"].append(t_cur2 / t_trial2)
        if not t_trial2 * margin < t_cur2:
            continue
        gain = (t_cur + t_cur2) / (t_trial + t_trial2)
        for r in current:
            if r.op_type == kind:
                why[id(r)] = (f"the model is faster without this kernel ({gain:.2f}x): "
                              "it breaks a chain that onnxruntime keeps in its blocked layout")
        decisions["dropped"].append({"op_type": kind, "gain": gain})
        current, s_cur = trial, s_trial
    return current, s_cur
