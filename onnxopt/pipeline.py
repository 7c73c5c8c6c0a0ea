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
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx

from onnxopt import __version__
from onnxopt.codegen.glue.library import INLINE_FLOPS
from onnxopt.backends import backend_of, parse_target
from onnxopt.kinds import all_kinds
from onnxopt.codegen.target import Target
from onnxopt.emit.model import fallback_key
from onnxopt.errors import InputError, UsageError
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.elementwise import ElementwiseRule, _opset
from onnxopt.fusion.layout import blocked_conv_refusal
from onnxopt.fusion.pool import PoolRule
from onnxopt.fusion.region import Region
from onnxopt.annotate.shapes import tensor_info
from onnxopt.graph.classifier_conv import classifiers_as_convs
from onnxopt.graph.conv1d import conv1d_as_conv2d
from onnxopt.graph.infer import check_tensor_sizes as _check_tensor_sizes
from onnxopt.graph.infer import complete_output_types as _complete_output_types
from onnxopt.graph.infer import infer as _infer
from onnxopt.graph.infer import static_shapes as _static_shapes
from onnxopt.graph.cse import eliminate_common_subexpressions
from onnxopt.graph.fold import fold_constants
from onnxopt.graph.large import SharedWeights, check_model, inference_session
from onnxopt.graph.quantized import (dedicate_unit_dequantizers, integer_product_units, is_quantized,
                                     qdq_conv_units, qdq_matmul_units, qdq_pool_units,
                                     quantized_nodes)
from onnxopt.graph.quantized_concats import int8_concats, requantize_before_concats
from onnxopt.graph.quantized_pools import int8_max_pools, quantize_before_max_pools
from onnxopt.graph.quantized_softmax import softmax_before_transposes
from onnxopt.graph.quantized_weights import fold_quantized_weights
from onnxopt.graph.publish import check_destination, probe_writable
from onnxopt.graph.load import check_no_overwrite, check_output_path, load_model, parse_input_shapes
from onnxopt.graph.subsample_conv import fold_subsampling_into_convs
from onnxopt.graph.transpose_chains import merge_transpose_chains
from onnxopt.graph.unary_through_concat import push_unary_through_concats
from onnxopt.fusion import winograd
from onnxopt.verify import Tolerance, check_given_inputs, load_check_inputs, make_inputs
from onnxopt.driver.policy import (PLANS, FUSION_KINDS, passthroughs_kept, _consistent_layouts, _op_counts,
                                   _channel_vector_kernel, _packed_panel)
from onnxopt.driver.decision import DecisionStage
from onnxopt.kinds.attention import amx as attention_amx
from onnxopt.driver.precision import (B_DTYPE, DEFAULT_ACCURACY_BUDGET, FP16_BUDGET, bf16_k_step, choose_auto,
                                      conv_refusal, fp16_k_step, kernel_path, lower_regions, parse_budget,
                                      parse_precision)
from onnxopt.driver.result import Result
from onnxopt.driver.kernels import KernelStage
from onnxopt.driver.outputs import OutputStage
from onnxopt.driver.plans import PlanStage



WINOGRAD_MODES = ("auto", "off") + tuple(str(m) for m in winograd.SIZES)


@dataclass
class Options:
    input_shapes: dict = field(default_factory=dict)
    # --measure-shape: input shapes for the checks and timings only; their symbolic dims stay symbolic in the output
    measure_shapes: dict = field(default_factory=dict)
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
    # A target of another architecture (--target aarch64-dotprod on x86-64): check the written model with its
    # library in onnxruntime under emulation where it is set up (hardware/emulator.py).
    emulate: bool = True
    input_files: tuple = ()  # files read besides the model (--check-input): never written over
    also_writes: tuple = ()  # files the caller writes besides the outputs, never read nor written over
    report_file: str | None = None  # the report's JSON, published with the outputs (driver/outputs.py)
    # The constant-B GEMMs' weights in bf16 or fp16, or bf16 where the model stays within `accuracy_budget` ("auto");
    # fp32 lowers nothing (driver/precision.py)
    precision: str = "fp32"
    accuracy_budget: float = DEFAULT_ACCURACY_BUDGET


def optimize(model: str | os.PathLike | onnx.ModelProto | bytes, output: str | os.PathLike | None = None, *,
             input_shape: str | Sequence[str] | None = None,
             measure_shape: str | Sequence[str] | None = None,
             target: str | None = None,
             rtol: float | str | Sequence[str] | None = None,
             atol: float | str | Sequence[str] | None = None,
             scale_tol: float | str | Sequence[str] | None = None,
             check_input: str | Sequence[str] | None = None,
             skip_fusion: str | Sequence[str] | None = None,
             threads: int | None = None,
             verify: bool = True,
             measure: bool = True,
             min_speedup: float = 1.0,
             seed: int = 0,
             plan: str | None = None,
             cost_cache: str | os.PathLike | bool | None = None,
             tile_search: bool = True,
             search_budget: float = 60.0,
             tune_budget: float = 12.0,
             prune: bool = True,
             sequences: bool = True,
             winograd: str | int = "auto",
             precision: str = "fp32",
             accuracy_budget: float | str | None = None,
             verify_fallback: bool = True,
             emulate: bool = True,
             also_writes: Sequence[str | os.PathLike] | None = None,
             report_file: str | os.PathLike | None = None,
             progress: Callable[[str], object] | None = None,
             _cli: bool = False,
             **unknown) -> Result:
    """Optimize a model: a path, an onnx.ModelProto, or the bytes of a serialized one.

    With `output`, writes the model there and its kernel library as `<output>.so`; `Result.output` and
    `Result.library` name them. Without it nothing is written: `Result.model` is the fused model, `Result.library`
    is None and the model's metadata names no library file (one would name a file that does not exist);
    `Result.library_data` holds the library's bytes, and `Result.save(path)` writes the model and `<path>.so`.

    Every option is keyword-only and mirrors the CLI flag of the same name; a bad value raises UsageError naming it
    (`_cli=True`, the CLI's own: messages name its flags instead of the keywords).

    Options:
        input_shape: "NAME:D0,D1,..." or a list of them: fix an input's symbolic dims.
        measure_shape: "NAME:D0,D1,..." or a list: check and time at this shape, its dims left symbolic in the output.
        target: the CPU to compile for: "native" (None), "x86-64-v3", "x86-64-v4", "aarch64", "aarch64-dotprod",
            or "cpu=NAME,+feature,..." (an x86-64 or aarch64 CPU).
        rtol: relative tolerance of the whole-model check: a number, "DTYPE:X", or a list of them (float32 1e-3).
        atol: absolute tolerance, as rtol (float32 1e-4).
        scale_tol: tolerance as a fraction of the output's largest magnitude, as rtol (float32 1e-5; 0: none).
        check_input: "NAME:FILE.npy" or a list of them: check on these inputs instead of random data.
        skip_fusion: a fusion kind, "kind1,kind2", or a list of kinds not to fuse (driver/policy.py FUSION_KINDS).
        threads: intra-op threads for checking and timing, 1 or more (None: all cores).
        verify: check the whole written model against the original (kernels are always checked).
        measure: time kernels and plans against onnxruntime; False emits every correct kernel.
        min_speedup: emit a kernel only if at least this much faster than onnxruntime on its region (0: keep all).
        seed: the seed of the random check inputs, a whole number 0 or more.
        plan: build only this whole-graph plan (driver/policy.py PLANS) instead of timing them all.
        cost_cache: the measured-cost cache: a path, None or True (the default location), False (no cache).
        tile_search: time a few register tiles per compute region (with measure).
        search_budget: seconds for the backtracking search over fusion plans, more than 0.
        tune_budget: seconds for the Winograd, register-tile and band searches, 0 or more.
        prune: prune fusion candidates the roofline predicts no gain for.
        sequences: merge runs of fused ops into sequence ops that run in one parallel section.
        winograd: Winograd tiles: "auto" (timed), "off", or a tile length m (2, 4, 6) on every convolution that has it.
        precision: "fp32" (the default: nothing lowered), "bf16" or "fp16" (the fused GEMMs' constant weights in that
            type, float32 sums, checked against the float32 original at the bf16 tolerance), or "auto" (bf16 per
            GEMM while the model stays within accuracy_budget); driver/precision.py.
        accuracy_budget: with precision="auto", the largest error allowed on any output, as a fraction of that
            output's largest magnitude (default 0.01).
        verify_fallback: also run the written model without its library (its function bodies) and compare.
        emulate: for a foreign target, check the written model with its library under qemu where set up.
        also_writes: files the caller writes besides the outputs: never read as inputs, never overwritten.
        report_file: write the report as JSON here too, with the outputs (only with `output`).
        progress: a callable given one status line (str) at a time.
    """
    import inspect
    import numbers
    import re

    import numpy as np

    from onnxopt.errors import OnnxoptError

    def named(key, value) -> str:  # the option as the caller wrote it: the CLI's flag, or the Python keyword
        return f"--{key.replace('_', '-')} {value}" if _cli else f"{key}={value!r}"

    def number(key, value, kind=float, what="a number"):
        # bool is an int to Python, and a str was accepted by float() before: keep numeric strings working
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise UsageError(f"{named(key, value)}: give {what}")
        try:
            x = float(value)
        except ValueError:
            raise UsageError(f"{named(key, value)}: give {what}") from None
        if kind is int:
            if not x.is_integer():
                raise UsageError(f"{named(key, value)}: give {what}")
            return int(value) if isinstance(value, numbers.Integral) else int(x)  # exact past 2**53
        return x

    def switch(key, value) -> bool:
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
            return bool(value)
        raise UsageError(f"{named(key, value)}: give True or False")

    def texts(key, value) -> list[str] | None:
        # a lone string is one value: iterating it would take each character for one
        if value is None:
            return None
        if isinstance(value, (str, os.PathLike)):
            return [os.fspath(value)]
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in value):
            return [os.fspath(v) for v in value]
        raise UsageError(f"{named(key, value)}: give a string or a list of strings")

    def tolerance(key, value):
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return value
        return texts(key, value)

    def keywords(message: str) -> str:
        params = inspect.signature(optimize).parameters

        def swap(m):
            key = m.group(1).replace("-", "_")
            if key in params and key[0] != "_":
                return key
            if key.startswith("no_") and key[3:] in params:
                return f"{key[3:]}=False"
            return m.group(0)
        message = re.sub(r"(?<![\w-])-o(?= )", "output", message)
        return re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", swap, message)

    try:
        if unknown:
            known = [k for k, p in inspect.signature(optimize).parameters.items()
                     if p.kind == p.KEYWORD_ONLY and k[0] != "_"]
            raise UsageError(f"unknown option(s) {', '.join(unknown)} for onnxopt.optimize; its options are "
                             f"{', '.join(known)}")
        if isinstance(model, (bytes, bytearray, memoryview)):
            data = bytes(model)  # a serialized ModelProto, as onnxruntime.InferenceSession takes bytes
            try:
                model = onnx.load_from_string(data)
            except Exception:  # noqa: BLE001 - protobuf raises several types
                raise InputError(f"model: {len(data):,} bytes that are not a serialized ONNX model; give a path, "
                                 "an onnx.ModelProto or its SerializeToString()") from None
        elif not isinstance(model, (str, os.PathLike, onnx.ModelProto)):
            raise UsageError(f"model of type {type(model).__name__}: give a path (str), an onnx.ModelProto or the "
                             "bytes of a serialized one")
        if output is not None and not isinstance(output, (str, os.PathLike)):
            raise UsageError(f"output={output!r}: give a path (str) or None")
        if target is not None and not isinstance(target, str):
            raise UsageError(f"{named('target', target)}: give a string such as 'native' or 'x86-64-v3'")
        if threads is not None:
            threads = number("threads", threads, int, "a whole number of threads, 1 or more")
        if plan is not None and plan not in PLANS:
            raise UsageError(f"{named('plan', plan)}: known plans are {', '.join(PLANS)}")
        if report_file is not None and (output is None or not isinstance(report_file, (str, os.PathLike))):
            raise UsageError(f"report_file={report_file!r}: give a path (str), and an output to write it with")
        if progress is not None and not callable(progress):
            raise UsageError(f"progress={progress!r}: give a callable that takes one line (str), or None")
        if cost_cache is True:
            cost_cache = None  # the default location
        elif cost_cache is not None and cost_cache is not False and not isinstance(cost_cache, (str, os.PathLike)):
            raise UsageError(f"{named('cost_cache', cost_cache)}: give a path, True (the default location) or False")
        kinds = []
        for k in texts("skip_fusion", skip_fusion) or ():
            kinds += [s.strip() for s in k.split(",") if s.strip()]
        for k in kinds:
            if k not in FUSION_KINDS:
                raise UsageError(f"{named('skip_fusion', k)}: known fusion kinds are {', '.join(FUSION_KINDS)}")
        check_input = texts("check_input", check_input)
        parsed_target = parse_target(target)
        backend = backend_of(parsed_target)
        if backend.name == "cuda":
            raise UsageError(f"--target {target}: {backend.unsupported()}")
        # The kinds the target's backend has no lowering for stay onnxruntime's nodes (onnxopt/backends).
        kinds += [k for k in backend.families_not_lowered(all_kinds()) if k not in kinds]
        opts = Options(
            input_shapes=parse_input_shapes(texts("input_shape", input_shape)),
            measure_shapes=parse_input_shapes(texts("measure_shape", measure_shape), "--measure-shape"),
            target=parsed_target,
            tolerance=Tolerance.parse(tolerance("rtol", rtol), tolerance("atol", atol),
                                      tolerance("scale_tol", scale_tol)),
            check_inputs=load_check_inputs(check_input),
            input_files=tuple(os.path.abspath(x.partition(":")[2]) for x in check_input or ()),
            also_writes=tuple(os.path.abspath(x) for x in (texts("also_writes", also_writes) or [])
                              + ([os.fspath(report_file)] if report_file is not None else [])),
            report_file=os.fspath(report_file) if report_file is not None else None,
            skip_fusion=tuple(kinds),
            threads=threads,
            verify=switch("verify", verify),
            measure=switch("measure", measure),
            min_speedup=number("min_speedup", min_speedup),
            seed=number("seed", seed, int, "a whole number, 0 or more"),
            progress=progress,
            plan=plan,
            cost_cache=cost_cache,
            tile_search=switch("tile_search", tile_search),
            search_budget=number("search_budget", search_budget, what="a number of seconds"),
            tune_budget=number("tune_budget", tune_budget, what="a number of seconds"),
            prune=switch("prune", prune),
            sequences=switch("sequences", sequences),
            winograd=str(winograd),
            verify_fallback=switch("verify_fallback", verify_fallback),
            emulate=switch("emulate", emulate),
        )
        _check_numbers(opts, named)
        opts.precision = parse_precision(precision, named)
        if accuracy_budget is not None:
            if opts.precision != "auto":
                raise UsageError(f"{named('accuracy_budget', accuracy_budget)}: the budget is for --precision auto "
                                 f"(precision is {opts.precision})")
            opts.accuracy_budget = parse_budget(accuracy_budget, named)
        if opts.winograd not in WINOGRAD_MODES:
            raise UsageError(f"{named('winograd', winograd)}: one of {', '.join(WINOGRAD_MODES)}")
        result = _Optimizer(model, output, opts).run()
    except OnnxoptError as e:
        if not _cli:  # messages from deeper down name the CLI's flags: say the Python keywords instead
            e.args = (keywords(str(e)),) + e.args[1:]
        raise
    return result  # without `output`, its model names no library file (driver/outputs.py) and carries its bytes


def _check_numbers(opts: Options, named=None) -> None:
    """Numeric options: finite, in range (NaN compares false with everything, so it passes naive checks).
    `named(key, value)`: how a message names the option (default: the CLI's flag)."""
    named = named or (lambda key, value: f"--{key.replace('_', '-')} {value}")
    if opts.threads is not None and (isinstance(opts.threads, bool) or not isinstance(opts.threads, int)
                                     or not 1 <= opts.threads <= 4096):
        raise UsageError(f"{named('threads', opts.threads)}: give a whole number of threads, 1 or more")
    if opts.seed < 0:
        raise UsageError(f"{named('seed', opts.seed)}: give a whole number, 0 or more")
    for key, value, low in (("search_budget", opts.search_budget, 0.0), ("tune_budget", opts.tune_budget, 0.0),
                            ("min_speedup", opts.min_speedup, 0.0)):
        if not math.isfinite(value) or value < low or (key == "search_budget" and value == 0):
            need = "more than 0" if key == "search_budget" else "0 or more"
            raise UsageError(f"{named(key, value)}: give a finite number, {need}")


class _Optimizer(PlanStage, KernelStage, DecisionStage, OutputStage):
    def __init__(self, source, output, opts: Options):
        self.source, self.output, self.opts = source, output, opts
        self.report: dict = {"onnxopt_version": __version__, "target": opts.target.to_dict(), "regions": [],
                             "rejected": [], "timings": {}}
        self.tmpdir = None
        self.bindings: dict[str, int] = {}  # values for symbolic dims in the checks (_choose_bindings)
        # Cross-compiling for a CPU with instructions this one lacks: the kernels cannot run here, so they are
        # accepted on the strength of their codegen tests, and the model is verified through its function bodies.
        self.backend = backend_of(opts.target)  # what lowers, compiles and links for the target (onnxopt/backends)
        self.cannot_run = self.backend.cannot_run(opts.target)
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
        self.quantized_graph: onnx.GraphProto | None = None  # the graph `quantized` names nodes of
        self.quantizes_statically = False
        self.float_tensors: set[str] = set()  # its float32 tensors, where it is quantized
        self.int8_units: set[str] = set()  # integer products and their rescaling: the int8 GEMM kind's to take
        self.original_checks = True  # the input passes the ONNX checker, so the output must too (run)
        self.emit_base: onnx.ModelProto | None = None  # the folded, rewritten graph fused.onnx is built from (_run)
        self.plans: list[tuple[str, list[Region]]] = []  # the candidate plans, by name (_run)
        self._dedupe = None  # (_run) regions -> the same regions found by an earlier plan, so each is checked once
        self._blocked_rule = None  # the compute rule of the blocked plan, for the AFUSION plan (_blocked_plan)

    def say(self, msg: str):
        if self.opts.progress:
            self.opts.progress(msg)

    def _session(self, model, library=None, ops=None, threads=None):
        """An onnxruntime session on the target's execution provider, with the run's threads."""
        return self.backend.session(model, self.opts.target, threads or self.opts.threads, library=library, ops=ops)

    def run(self) -> Result:
        t_start = time.perf_counter()
        src_path = None if isinstance(self.source, onnx.ModelProto) else os.fspath(self.source)
        if self.output is not None:
            check_output_path(src_path, self.output)
        if self.opts.report_file is not None:
            report = os.path.abspath(self.opts.report_file)
            check_destination(report, "report_file")
            probe_writable(os.path.dirname(report), f"report_file {self.opts.report_file}")
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

    def _lower_precision(self, work, regions) -> None:
        """Store the constant-B GEMMs' weights in the requested precision (driver/precision.py), in place; with
        "auto" only those that keep the model within the accuracy budget, by simulation on the check inputs."""
        opts = self.opts
        entry = {"requested": opts.precision, "kernels": kernel_path(opts.precision, opts.target)}
        self.say(f"precision {opts.precision}: {entry['kernels']}")
        opset = _opset(work)
        candidates = regions
        refused: list[dict] = []
        if opts.precision in ("auto", "fp16"):
            # auto: bf16 within the user's budget; fp16: within its fixed tolerance's share of each output's scale
            # (a model that amplifies float16's rounding, as PP-OCRv4 rec's 6625-class softmax does, keeps its
            # costliest regions float32 instead of failing the whole-model check)
            f16 = opts.precision == "fp16"
            budget = FP16_BUDGET if f16 else opts.accuracy_budget
            entry["accuracy_budget"] = budget
            entry["budget_metric"] = "max over outputs of max |lowered - float32| / max |float32|"
            # only regions the lowering takes, each GEMM once (the plans share their regions' nodes)
            lowerable = {}
            convs = conv_refusal(opts.precision, opts.target) is None
            attention = attention_amx.choose(opts.target, "f16" if f16 else "bf16")[0] is not None
            for r in regions:
                if (r.compute is None and attention and r.params.family == "attention") or (
                        r.compute is None and not f16 and r.params.family == "recurrent") or (
                        r.compute is not None and ((r.compute.op == "matmul" and r.compute.attrs.packed_b)
                                                   or (convs and (r.compute.op == "conv" if f16
                                                                  else blocked_conv_refusal(r) is None)))):
                    lowerable.setdefault(r.nodes[0].output[0], []).append(r)
            feeds = make_inputs(work, self._bindings(), opts.seed, opts.check_inputs)
            # the kernels that round A: vdpbf16ps and AMX (bf16); AMX-FP16 (fp16; float16 storage does not)
            round_a = fp16_k_step(opts.target) > 1 if f16 else \
                opts.target.has("avx512bf16") or bf16_k_step(opts.target) > 2
            chosen, refused, entry["auto"] = choose_auto(
                work, [rs[0] for rs in lowerable.values()], budget, round_a,
                lambda m, outputs: self._session(m).run(outputs, feeds), B_DTYPE[opts.precision])
            chosen_heads = {r.nodes[0].output[0] for r in chosen}
            candidates = [r for r in regions if r.nodes[0].output[0] in chosen_heads
                          or r.nodes[0].output[0] not in lowerable]
        lowered, kept = lower_regions(candidates, opts.precision, opset, opts.target)
        seen = set()
        entry["float32_regions"] = [e for e in refused + kept
                                    if not (tuple(e["nodes"]) in seen or seen.add(tuple(e["nodes"])))]
        entry["lowered_candidates"] = len(lowered)
        self.report["precision"] = entry

    def _check_loadable(self, model, path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:  # what onnxruntime's CPU provider cannot load, no provider of ours runs
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
        # (graph/subsample_conv.py, graph/unary_through_concat.py, graph/classifier_conv.py,
        # graph/transpose_chains.py); the Relus they copy
        # merge with existing ones.
        inferred = _infer(work)
        static = _static_shapes(inferred)
        _check_tensor_sizes(static)
        # A quantized model keeps the structure onnxruntime's int8 fusions match (graph/quantized.py): no rewrites
        # but one that makes each QDQ convolution unit whole and one that puts MaxPools on the int8 tensors, as
        # onnxruntime does when it loads the model (graph/quantized_pools.py), and no region that touches a unit but
        # the int8 kinds'. Weights the quantizer quantizes at run time (a Paddle export's Constant nodes) are folded
        # to their integers first, as onnxruntime computes them (graph/quantized_weights.py).
        if is_quantized(work):
            rewrites = {"skipped": "the model is quantized",
                        "quantized_weights_folded": fold_quantized_weights(work),
                        "dequantizers_per_unit": dedicate_unit_dequantizers(work)}
            on_int8 = quantize_before_max_pools(work)
            rewrites.update(max_pools_on_int8=on_int8["MaxPool"], resizes_on_int8=on_int8["Resize"],
                            transposes_on_int8=on_int8["Transpose"], concats_on_int8=requantize_before_concats(work),
                            softmaxes_before_transposes=softmax_before_transposes(work))
        else:
            rewrites = {"subsampling_into_convs": fold_subsampling_into_convs(work, static),
                        "unary_through_concats": push_unary_through_concats(work),
                        "classifiers_as_convs": classifiers_as_convs(work, static),
                        "conv1d_as_conv2d": conv1d_as_conv2d(work, static),
                        "transpose_chains_merged": merge_transpose_chains(work, static)}
        self.report["rewrites"] = rewrites
        self.quantized = quantized_nodes(work.graph)
        self.quantized_graph = work.graph
        # Quantized statically (QDQ or QOperator): activations are quantized at fixed scales, so its units are small
        # and many. A dynamically quantized model's are few and large (MiniLM's MatMulIntegers).
        self.quantizes_statically = any(n.op_type == "QuantizeLinear" for n in work.graph.node)
        self.int8_units = integer_product_units(work.graph) | qdq_conv_units(work.graph) | \
            qdq_matmul_units(work.graph) | qdq_pool_units(work.graph)
        if rewrites.get("unary_through_concats"):
            self.report["merged_nodes"] += eliminate_common_subexpressions(work)
        self.emit_base = work  # the folded graph as it is: what fused.onnx is built from
        work = _infer(work) if any(isinstance(v, int) and v for v in rewrites.values()) else inferred
        if self.quantized:  # which tensors are float: what a region of quantization steps may read and write
            types = {n: t.dtype for n, t in tensor_info(work).items()}
            self.float_tensors = {n for n, t in types.items() if t == "float32"}
            self.int8_units |= int8_max_pools(work.graph, types) | int8_concats(work.graph, types)
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
                layout = (a.in_blocked, a.out_blocked, a.channel_vectors) \
                    if a is not None else (r.params.tensor_lanes(),)
                key = (r.label, tuple(n.output[0] for n in r.nodes), layout)
                out.append(seen.setdefault(key, r))
            return out

        self._dedupe = dedupe

        if "compute" not in self.opts.skip_fusion:
            mk = self.backend.layout(self.opts.target)
            mi = mk.tile.mi
            # Dense convolutions only is a plan of its own: depthwise ones are memory-bound, and onnxruntime's
            # blocked kernels for them are hard to beat while our layout is NCHW (see docs/decisions.md).
            for name, grouped in (("compute", True), ("compute-dense", False)):
                claimed: set[int] = set()
                rejected = self.report["rejected"] if grouped else []
                plan = self._kind_regions(work, claimed, rejected, first=True)
                plan += ComputeRule(work, mi, grouped=grouped, blocked=_channel_vector_kernel(mk),
                                  panel=_packed_panel(mk)).find_regions(
                    claimed, rejected)
                if "pool" not in self.opts.skip_fusion:  # pools with their epilogues (fusion/pool.py)
                    plan += PoolRule(work).find_regions(claimed, rejected)
                plan += self._int8_concats(work, claimed)
                plan += self._kind_regions(work, claimed, rejected, first=False)
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
            plan = self._kind_regions(work, claimed, [], first=True)
            plan += PoolRule(work).find_regions(claimed, self.report["rejected"])
            plan += self._kind_regions(work, claimed, [], first=False)
            if plan and "elementwise" not in self.opts.skip_fusion:
                plan += ElementwiseRule(work).find_regions([], exclude=claimed)
            if plan:
                plans.append(("pool", dedupe(plan)))
        if "elementwise" not in self.opts.skip_fusion:  # no compute fusion: the kinds' regions and elementwise ones
            rejected = [] if plans else self.report["rejected"]
            claimed = set()
            plan = self._kind_regions(work, claimed, rejected)
            if self.quantized and "pool" not in self.opts.skip_fusion:  # a quantized model's int8 MaxPools
                plan += PoolRule(work).find_regions(claimed, rejected, int8_only=True)
            plan += self._int8_concats(work, claimed)
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
        if self.opts.winograd not in ("auto", "off") and winograd.check_opset(work) is None:
            self._forced_nchw_winograd(work, regions, int(self.opts.winograd))
        if self.opts.precision != "fp32":  # before the op types: a lowered kernel is another op
            self._lower_precision(work, regions)
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
