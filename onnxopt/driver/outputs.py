"""The outputs: check inputs, the emitted model and library, the whole-model verification with and without the
library, and why a model was left unchanged.

A stage of the driver (onnxopt/pipeline.py, _Optimizer): its methods read and write the run's state there."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter

import numpy as np
import onnx

from onnxopt.emit.model import DOMAIN, build_fused_model, set_library_name, set_library_sha256
from onnxopt.emit.sequence import make_sequences
from onnxopt.errors import InputError, OnnxoptError, VerificationError
from onnxopt.fusion.region import Region
from onnxopt.graph.large import check_model
from onnxopt.graph.quantized import steps_region_refusal
from onnxopt.graph.bindings import candidates, needs_input_message, user_bindings
from onnxopt.graph.load import measure_bindings, write_model
from onnxopt.graph.publish import LIBRARY_SUFFIX, Staging, create_new
from onnxopt.timing import make_session, session_options, time_interleaved
from onnxopt.verify import Tolerance, compare, make_inputs
from onnxopt.driver.policy import (WHOLE_MODEL_MARGIN, _op_counts, offline_split, runs_quantized_units,
                                   takes_int8_units)
from onnxopt.driver.result import Result
from onnxopt.driver.openvino_reference import OPENVINO_FACTOR, openvino_bf16_outputs, openvino_relative
from onnxopt.driver.precision import (is_lowered, kernel_path, lowered_dtype, low_precision_tolerance, precision_cost,
                                      worst_error)

WRITTEN_TIME_S = 0.5  # seconds timing the written model against the original (report["written_timing"])


class OutputStage:

    def _bindings(self) -> dict[str, int]:
        return self.bindings

    def _choose_bindings(self, original) -> None:
        """Values for symbolic dims in the checks and timings: the first of graph/bindings.py's candidates the
        model runs at (what it implies, then typical sizes: images 224/320/640, batch 1, sequences 128, then the
        old small distinct values, all 2, all 1), each with the user's values (--measure-shape, the shapes of
        --check-input arrays) on top. A model that runs at none needs input shapes or data: InputError."""
        given = measure_bindings(original, self.opts.measure_shapes) if self.opts.measure_shapes else {}
        given = user_bindings(original, given, self.opts.check_inputs)
        tried: list[tuple[str, dict]] = []
        self.bindings = {}
        src = self.report["input"]["path"]
        failure = session = chosen = None

        def reject(label, b, e):
            nonlocal failure
            tried.append((label, b))
            failure = failure or " ".join(str(e).split())[:200]

        # Run as the checks run it (every onnxruntime optimization): a model that fails there is refused now, not
        # after the whole run, when the final check could not run it. One session serves every candidate.
        for label, b in candidates(original, given):
            try:
                feeds = make_inputs(original, b, self.opts.seed, self.opts.check_inputs)
            except InputError as e:  # too large at these values
                reject(label, b, e)
                continue
            try:
                if session is None:
                    session = self._session(original if src is None else src)
            except Exception as e:  # noqa: BLE001 - it cannot even make a session: no shape helps
                reject(label, b, e)
                break
            try:
                session.run(None, feeds)
            except Exception as e:  # noqa: BLE001 - the model constrains its dims or values; try the next set
                reject(label, b, e)
                continue
            chosen = b
            break
        if chosen is None:
            raise InputError(needs_input_message(original, failure, [label for label, _ in tried],
                                                 self.opts.check_inputs, bool(self.opts.measure_shapes)))
        self.bindings = chosen
        self.report["check_bindings"] = self.bindings
        if tried:
            self.report["check_bindings_rejected"] = [{"candidate": label, "bindings": b} for label, b in tried]

    def _emit(self, original, work, accepted, built, loaded, src_path, t_start) -> Result:
        """Write the outputs into a private folder beside their destination under their final names, check them
        there as a user loads them (onnxopt.runtime, from disk), then publish them together (graph/publish.py),
        the report with them. Without an output path they are staged in the run's temporary folder, and the
        library comes back as bytes in the Result."""
        t = time.perf_counter()
        with Staging(self.output or os.path.join(self.tmpdir, "model.onnx")) as staging:
            result, suffixes, remove = self._emit_staged(staging, original, accepted, built, loaded, src_path, t)
            self.report["timings"]["total_s"] = time.perf_counter() - t_start
            self.report["offline"] = offline_split(self.report["timings"])
            self._close_cost_cache()  # its summary goes in the published report
            if self.output:
                self._publish(staging, suffixes, remove)
        return result

    def _publish(self, staging: Staging, suffixes: list[str], remove: list[str]) -> None:
        """The report first (nothing of the model is out yet), then the model's files; a failure of either
        leaves every destination as it was."""
        report_file = self.opts.report_file
        report = Staging(report_file) if report_file else None
        try:
            if report:
                with create_new(report.path()) as f:
                    f.write((json.dumps(self.report, indent=1, default=str) + "\n").encode())
                report.publish([""])
            staging.publish(suffixes, remove)
        except BaseException:
            if report:
                report.rollback()
            raise
        finally:
            if report:
                report.discard()

    def _emit_staged(self, staging: Staging, original, accepted, built, loaded, src_path, t) -> Result:
        lib_path = sha = None
        lib_name = os.path.basename(staging.destination) + LIBRARY_SUFFIX
        precision = self._written_precision(accepted)
        if accepted:
            fused = build_fused_model(self.emit_base, accepted, lib_name, None, self.opts.target.to_dict(),
                                      self.opts.target.required_cpu_flags, precision=precision)
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
            lib_path = staging.path(LIBRARY_SUFFIX)
            sha = self.backend.link(descs, [o for o, _ in used], self.opts.target, lib_path,
                               inline_flops=self.inline_flops)
            set_library_sha256(fused, sha)
        try:
            if self.original_checks:
                check_model(fused)
        except Exception as e:  # noqa: BLE001
            raise OnnxoptError(f"internal error: the fused model fails the ONNX checker ({' '.join(str(e).split())}); "
                               "please report it") from None
        # The model as the user gets it: written, then read back from disk by every check below.
        suffixes = write_model(fused, staging.path(), external=loaded.used_external_data)
        written = staging.path()
        self.report["timings"]["emit_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if self.opts.verify:
            # A model written unchanged is checked against itself as given (restore_given), not against the
            # shape-fixed copy, when there is no file to run.
            self._verify_model(original, fused, written, lib_path, src_path, reference=None if accepted else fused)
        else:
            self._check_result_loads(fused, written, lib_path)
        self.report["timings"]["verify_s"] = time.perf_counter() - t

        self.report["after"] = _op_counts(fused)
        self.report["fused_regions"] = sum(r.relayout is None for r in accepted)
        relayouts = [r.node_names[0] for r in accepted if r.relayout is not None]
        if relayouts:  # onnxruntime nodes rewritten to run on blocked tensors
            self.report["blocked_passthrough"] = relayouts
        if not self.output:
            # Nothing is left on disk: the model comes back without a library name (it would name a file that
            # does not exist), and the library as bytes; Result.save writes both, the name set to match.
            library_data = None
            if lib_path:
                with open(lib_path, "rb") as f:
                    library_data = f.read()
                set_library_name(fused, None)
            return Result(fused, self.report, None, None, library_data), [], []
        if lib_path:
            suffixes = [LIBRARY_SUFFIX] + suffixes  # the library before the model that names it
        self.report["output"] = {"path": staging.destination, "size_bytes": os.path.getsize(written),
                                 "library": staging.destination + LIBRARY_SUFFIX if lib_path else None,
                                 "library_sha256": sha}
        # A stale library of an earlier run would not match this model: it goes (and comes back on failure).
        return (Result(fused, self.report, self.output, staging.destination + LIBRARY_SUFFIX if lib_path else None),
                suffixes, [] if lib_path else [LIBRARY_SUFFIX])

    def _written_precision(self, accepted) -> dict | None:
        """What the written model's weights were lowered to (its metadata, driver/precision.py), None when float32
        was asked for; with lowered kernels, the whole-model checks take the low-precision tolerance."""
        if self.opts.precision == "fp32":
            return None
        lowered = [r for r in accepted if is_lowered(r)]
        b_dtypes = {lowered_dtype(r) for r in lowered}
        record = {"precision": {"bfloat16": "bf16", "float16": "fp16"}[b_dtypes.pop()] if lowered else "fp32",
                  "requested": self.opts.precision,
                  "kernels": kernel_path(self.opts.precision, self.opts.target) if lowered else "fp32",
                  "lowered_regions": len(lowered),
                  "float32_compute_regions": sum(r.compute is not None and not is_lowered(r) for r in accepted)}
        entry = self.report.setdefault("precision", {})
        # the regions kept float32 that were written (the candidates were every plan's)
        written = {tuple(r.node_names) for r in accepted}
        entry["float32_regions"] = [e for e in entry.get("float32_regions", []) if tuple(e["nodes"]) in written]
        entry.update({"written": record, "lowered": [r.node_names for r in lowered]})
        if lowered:
            budget = self.opts.accuracy_budget if self.opts.precision == "auto" else None
            self.opts.tolerance = low_precision_tolerance(self.opts.tolerance, budget)
        return record

    def _without_quantized(self, plan: list[Region]) -> list[Region]:
        """The plan less the regions that would take a node of a quantized pattern from onnxruntime; an int8 GEMM
        region (onnxopt/kinds/qmatmul, qconv) may take an integer product with its rescaling, or a QDQ convolution unit
        with its requantization, which it runs whole, and the quantized elementwise tail after it that its tables
        run as onnxruntime's nodes do (kinds/qconv/lookup.py)."""
        out = []
        beside_int8_units = self.quantized - self.int8_units
        for r in plan:
            guarded = beside_int8_units - set(r.params.runs_as_onnxruntime()) if takes_int8_units(r) \
                else self.quantized
            if any((n.output[0] if n.output else n.name) in guarded for n in r.nodes):
                steps = r.params.family == "elementwise" and runs_quantized_units(r)
                why = steps_region_refusal(self.quantized_graph, self.quantized, self.float_tensors, r.nodes,
                                           r.inputs, r.outputs) if steps else "not the whole unit"
                if why is None:  # a QDQ elementwise unit taken whole, its steps computed as the spec's
                    out.append(r)
                elif not r.rejected:
                    self._reject(r, "part of a quantized pattern that onnxruntime runs as an int8 kernel "
                                    f"(QDQ node unit or integer MatMul rescaling): {why}")
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

    def _written_session(self, written: str, lib_path: str | None, threads=None):
        """A session on the written model as a user makes it: from its file, through onnxopt.runtime, which finds
        the library by the model's own metadata. With `lib_path` (a library this host can run), the loader must
        have picked it up: a written model whose library is present but not used is a failed run."""
        from onnxopt import runtime

        so = session_options(threads or self.opts.threads)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", runtime.LibraryNotUsedWarning)
            sess = runtime.InferenceSession(written, so,
                                           providers=[self.backend.execution_provider(self.opts.target)])
        if lib_path is not None and runtime.registered_library(sess) is None:
            why = "; ".join(str(w.message) for w in caught) or "no reason given"
            raise VerificationError(f"the written model's kernel library is not picked up by onnxopt.runtime ({why}); "
                                    "nothing was written. Please report it")
        return sess

    def _run_counting(self, sess, written: str, names, feeds):
        """Run the written model once and check that each fused node ran its kernel: per op type, the library
        counted as many Compute calls as the graph has nodes of that type (matching outputs alone would not show
        that the function bodies ran instead)."""
        from onnxopt import runtime
        from onnxopt.runtime.kernel_calls import kernel_calls

        lib = runtime.registered_library(sess, loadable=True)
        before = kernel_calls(lib) if lib else {}
        got = sess.run(names, feeds)
        if lib:
            after = kernel_calls(lib)
            graph = onnx.load(written, load_external_data=False).graph
            want = Counter(n.op_type for n in graph.node if n.domain == DOMAIN)
            ran = {op: after.get(op, 0) - before.get(op, 0) for op in want}
            wrong = {op: (ran[op], n) for op, n in want.items() if ran[op] != n}
            self.report.setdefault("verification", {})["kernel_calls"] = sum(ran.values())
            from onnxopt.runtime.matrix_engine import amx_status

            amx = amx_status(lib)
            if amx["state"] != "no AMX kernels":  # which tiles the int8 kernels ran here, and why not AMX
                self.report["verification"]["amx"] = amx
            if wrong:
                op, (have, need) = next(iter(wrong.items()))
                raise VerificationError(f"the written model ran {have} of its {need} {op} kernels through its library "
                                        f"({len(wrong)} op types short); nothing was written. Please report it")
        return got

    def _time_written(self, reference_session, written_session, feeds) -> None:
        """The written files, loaded as a user loads them, timed against the original (interleaved, WRITTEN_TIME_S):
        what the user gets, in the report (`report["written_timing"]`). The plans were judged on plan files with the
        library registered directly; this ties that judgement to the files written. It informs, it does not decide
        (a short timing is noisier than the decision's)."""
        t_orig, t_written = time_interleaved([reference_session, written_session], feeds,
                                             min_time=WRITTEN_TIME_S, min_blocks=4)
        self.report["written_timing"] = {"original_s": t_orig["median"], "written_s": t_written["median"],
                                         "speedup": t_orig["median"] / t_written["median"],
                                         "loaded_by": "onnxopt.runtime"}

    def _check_result_loads(self, fused, written, lib_path):
        """Even without verification, the written model must at least open in onnxruntime, as a user opens it (with
        its library unless this host cannot run it) and as a host without the library does."""
        import onnxruntime as ort

        lib = None if self.cannot_run else lib_path
        try:
            self._written_session(written, lib, threads=1)
            if self.opts.verify_fallback and lib is not None:
                ort.InferenceSession(written, session_options(1),
                                     providers=[self.backend.execution_provider(self.opts.target)])
        except VerificationError:
            raise
        except Exception as e:  # noqa: BLE001
            raise VerificationError(f"the optimized model does not load in onnxruntime "
                                    f"({str(e).splitlines()[0][:300]}); nothing was written. Please report it; "
                                    "--skip-fusion elementwise avoids it") from None

    def _verify_model(self, original, fused, written, lib_path, src_path, reference=None):
        feeds = make_inputs(original, self._bindings(), self.opts.seed, self.opts.check_inputs)
        names = [o.name for o in original.graph.output]
        try:
            # From the path when there is one: external data resolves next to it, and > 2 GB models need it.
            source = src_path if src_path is not None else original if reference is None else reference
            reference_session = self._session(source)
            want = reference_session.run(names, feeds)
        except Exception as e:  # noqa: BLE001
            self.report["verification"] = {"skipped": f"the original model does not run on random inputs: {e}"}
            raise InputError(f"cannot verify: the original model fails on random inputs "
                                    f"({str(e).splitlines()[0][:200]}); give real inputs with "
                                    "--check-input name:file.npy or fix symbolic dims with --input-shape") from None
        quantized = any(n.op_type in ("DynamicQuantizeLinear", "QuantizeLinear") for n in original.graph.node)
        emulated, base = self._emulator(), None
        lib = None if self.cannot_run else lib_path
        self.report["verification"] = {}
        try:
            if emulated:
                # The emulated onnxruntime is the reference too: its own float kernels move a dynamically quantized
                # model's steps as much as ours may.
                lib = lib_path
                emulated_runs = self._emulated_runs(source, written, lib_path, names, feeds, emulated, quantized)
            else:
                written_session = self._written_session(written, lib)
                got = self._run_counting(written_session, written, names, feeds)
                if lib is not None and self.opts.measure:
                    self._time_written(reference_session, written_session, feeds)
        except VerificationError:
            raise
        except Exception as e:  # noqa: BLE001
            where = f" under {emulated}" if emulated else ""
            raise VerificationError(f"the optimized model fails to run{where}: "
                                    f"{str(e).strip().splitlines()[-1][:300]}") from None
        host_want, tol, spread = want, self.opts.tolerance, None
        if emulated:
            want, got, base = emulated_runs
        if quantized:
            tol, spread = self._int8_tolerance(source, names, feeds, want, base)
        diffs = compare(names, want, got, tol)
        if self.report.get("precision", {}).get("written", {}).get("lowered_regions"):
            self._precision_cost(names, want, got)
            if self.opts.precision == "bf16" and not emulated:
                self._openvino_bar(source, names, feeds, want, diffs)
        self.report["verification"].update({"outputs": [d.__dict__ for d in diffs], "ok": all(d.ok for d in diffs),
                                            "library": lib is not None})
        if emulated:
            self.report["verification"]["emulated"] = emulated
        if spread is not None:
            self.report["verification"]["onnxruntime_spread"] = spread
        if lib is None and lib_path is not None:  # this host cannot run the kernels: the function bodies ran
            what = "verification failed without the kernel library (this CPU cannot run its kernels): output {} of " \
                   "the function bodies differs"
        else:
            what = "verification failed: output {} differs"
        self._fail_if_differs(diffs, what,
                              "Loosen with --rtol/--atol if this is expected, or skip a fusion with --skip-fusion")
        if self.opts.verify_fallback:
            if emulated:  # the function bodies run here, against this host's onnxruntime
                tol = self._int8_tolerance(source, names, feeds, host_want)[0] if quantized else self.opts.tolerance
            self._verify_fallback(written, names, feeds, host_want, diffs if lib is None else None, tol)

    def _emulator(self) -> str | None:
        """For a target of another architecture: how its library is run here (qemu and the emulated CPU, the
        emulated onnxruntime's version), or None where no emulator is set up (hardware/emulator.py)."""
        from onnxopt.hardware import emulator

        target = self.opts.target
        if not target.foreign or not self.opts.emulate:
            return None
        why = emulator.unavailable(target.arch)
        if why:
            self.report["emulation"] = f"not run: {why}"
            return None
        return emulator.describe(target)

    def _emulated_runs(self, source, fused, lib_path, names, feeds, how: str, quantized: bool) -> tuple:
        """(the original's outputs, the written model's with its library, the original's without graph
        optimizations where `quantized`, else None), all from onnxruntime under emulation, in one emulated process."""
        from onnxopt.hardware import emulator

        def on_disk(model, name):
            if isinstance(model, str):
                return model
            path = os.path.join(self.tmpdir, name)
            onnx.save(model, path, save_as_external_data=model.ByteSize() > (1 << 30), location=name + ".data")
            return path

        original, written = on_disk(source, "emulated_original.onnx"), on_disk(fused, "emulated.onnx")
        threads = self.opts.threads or 2
        jobs = [{"model": original, "inputs": feeds, "threads": threads},
                {"model": written, "library": lib_path, "inputs": feeds, "threads": threads}]
        if quantized:
            jobs.append({"model": original, "inputs": feeds, "threads": threads, "optimization": "none"})
        self.say(f"running the {self.opts.target.arch} library under {how}")
        runs = emulator.run_sessions(jobs, cpu=emulator.qemu_cpu(self.opts.target))
        outputs = []
        for model, run in zip([original, written, original], runs):
            graph_outputs = [o.name for o in onnx.load(model, load_external_data=False).graph.output]
            outputs.append([dict(zip(graph_outputs, run))[n] for n in names])
        return outputs[0], outputs[1], outputs[2] if quantized else None

    def _int8_tolerance(self, source, names, feeds, want, base=None):
        """(the tolerance, onnxruntime's own spread per output) for a quantized model, whose result onnxruntime
        itself changes with its graph optimizations:
        - dynamic: each DynamicQuantizeLinear rounds its input to steps, so an ulp anywhere before one moves a value
          a whole step and the output far more than float rounding (MiniLM-L6 int8: 0.0136, 9% of the output's
          scale, between onnxruntime's optimization levels);
        - static QDQ: onnxruntime fuses each unit into an int8 kernel (QLinearConv) whose AVX2 form saturates
          16-bit pair sums, off by up to 8 steps at 1% of a layer's outputs from the spec's result, which it gives
          without the fusion. The int8 kernels give the spec's (tests/kinds/test_qconv.py).
        - static QOperator: the same QLinearConv (and QLinearMatMul, QGemm), against the model with each one run as the
          spec defines it, in float (graph/quantized.py qlinear_as_float); onnxruntime's quantizer keeps full 7-bit weights there,
          and the saturation moved a small CNN's outputs by up to 92 steps on AVX2.
        The check allows twice that spread on top of the usual tolerance: ours may differ from onnxruntime by as
        much as onnxruntime differs from itself, on either side."""
        if base is None:  # `base`: already run (under emulation)
            base = make_session(_as_specified(source), self.opts.threads, optimization="none",
                                provider=self.backend.execution_provider(self.opts.target)).run(names, feeds)
        spread = {n: _finite_spread(a, b) for n, a, b in zip(names, want, base) if np.asarray(a).dtype.kind == "f"}
        tol = Tolerance(dict(self.opts.tolerance.rtol), dict(self.opts.tolerance.atol), dict(self.opts.tolerance.stol))
        widest = 2.0 * max(spread.values(), default=0.0)
        for dt in list(tol.atol) or ["float32"]:
            tol.atol[dt] = tol.atol.get(dt, 1e-4) + widest
        return tol, spread

    def _verify_fallback(self, written, names, feeds, want, diffs=None, tol=None):
        """The written model as a host without the library runs it (a plain onnxruntime, another CPU): the function
        bodies must load and give the original's answers (within `tol`, the check's tolerance), or nothing is
        written. `diffs`: already compared that way."""
        import onnxruntime as ort

        if diffs is None:
            try:
                sess = ort.InferenceSession(written, session_options(self.opts.threads),
                                            providers=[self.backend.execution_provider(self.opts.target)])
                got = sess.run(names, feeds)
            except Exception as e:  # noqa: BLE001
                raise VerificationError(f"the optimized model does not run without its kernel library "
                                        f"({str(e).splitlines()[0][:300]}); nothing was written. Please report it; "
                                        "--skip-fusion with the kind named there avoids it") from None
            diffs = compare(names, want, got, tol or self.opts.tolerance)
            if self._openvino_cost is not None:  # the function bodies are held to the same bar as the kernels
                openvino_relative(diffs, precision_cost(names, want, got), self._openvino_cost)
        self.report["fallback_verification"] = {"outputs": [d.__dict__ for d in diffs],
                                                "ok": all(d.ok for d in diffs)}
        self._fail_if_differs(diffs, "verification failed without the kernel library: output {} of the "
                              "function bodies differs", "Please report it")

    def _precision_cost(self, names, want, got) -> None:
        """What the lowered weights cost on the check inputs (driver/precision.py); `auto` must have kept the
        model within its budget, or nothing is written."""
        entry = self.report["precision"]
        entry["cost"] = precision_cost(names, want, got)
        if self.opts.precision == "auto":
            err = worst_error(entry["cost"])
            entry["within_budget"] = err <= self.opts.accuracy_budget
            if not entry["within_budget"]:
                raise VerificationError(f"--precision auto: the written model's max relative error {err:.3g} is "
                                        f"past --accuracy-budget {self.opts.accuracy_budget:g} (its simulation "
                                        f"gave {entry['auto']['simulated_max_rel_error']:.3g}); nothing was "
                                        "written. Give a smaller budget, or --precision fp32")

    _openvino_cost: list | None = None  # OpenVINO's bf16 error per output, once measured (_openvino_bar)

    def _openvino_bar(self, source, names, feeds, want, diffs) -> None:
        """`--precision bf16`'s whole-model bar: OpenVINO's own bf16 error on the same inputs where OpenVINO reads
        the model (driver/openvino_reference.py), else the fixed bf16 tolerance; the report says which and why."""
        entry = self.report["precision"]
        path = source
        if not isinstance(source, str):
            path = os.path.join(self.tmpdir, "openvino_original.onnx")
            onnx.save(source, path, save_as_external_data=source.ByteSize() > (1 << 30),
                      location="openvino_original.onnx.data")
        outs, info = openvino_bf16_outputs(path, names, feeds, os.path.join(self.tmpdir, "openvino"),
                                           self.opts.threads)
        if outs is None:
            entry["reference"] = {"bar": "the fixed bf16 tolerance: 2% of the value plus 1% of the output's "
                                         "largest magnitude", **info}
            return
        self._openvino_cost = precision_cost(names, want, outs)
        bars = openvino_relative(diffs, entry["cost"], self._openvino_cost)
        entry["reference"] = {"bar": f"{OPENVINO_FACTOR}x OpenVINO's bf16 error on the same inputs", **info,
                              "outputs": bars}

    def _fail_if_differs(self, diffs, what: str, advice: str) -> None:
        bad = [d for d in diffs if not d.ok]
        if bad:
            d = bad[0]
            if self.opts.precision == "bf16":  # the model amplifies bfloat16's rounding past its tolerance
                bar = self.report.get("precision", {}).get("reference", {}).get("bar", "the bf16 tolerance")
                advice = (f"With --precision bf16 the outputs moved past {bar}: --precision auto "
                          "--accuracy-budget X keeps the costly regions float32, --precision fp32 all of them")
                if d.detail:
                    advice = f"{d.detail}. {advice}"
            raise VerificationError(f"{what.format(d.name)} (max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g}); "
                                    f"nothing was written. {advice}")


def _finite_spread(a, b) -> float:
    """The largest difference between two runs where both are finite (an output that overflowed in either run is
    compared for its infs and NaNs by `compare`, not widened into an infinite tolerance here)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[both] - b[both]), initial=0.0))


def _as_specified(source):
    """`source` (a path or a model) with its QLinearConv, QLinearMatMul and QGemm nodes as the spec defines them (a
    model), or as it is."""
    from onnxopt.graph.quantized import QLINEAR_PRODUCTS, qlinear_as_float

    model = onnx.load(source, load_external_data=False) if isinstance(source, str) else source
    if not any(n.op_type in QLINEAR_PRODUCTS for n in model.graph.node):
        return source
    if isinstance(source, str):
        model = onnx.load(source)
    return qlinear_as_float(model)
