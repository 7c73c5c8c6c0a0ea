"""The whole-model decision: each plan timed against the original, the runoff, drop trials, the inline library
choice and the final check (the policy's rules are pure functions in policy.py).

A stage of the driver (onnxopt/pipeline.py, _Optimizer): its methods read and write the run's state there."""

from __future__ import annotations

import os
import time

import numpy as np

from onnxopt.codegen.glue.library import INLINE_FLOPS, INLINE_FLOPS_WIDE
from onnxopt.emit.model import DOMAIN, build_fused_model
from onnxopt.emit.sequence import make_sequences
from onnxopt.fusion.layout import blocked_inputs, blocked_outputs
from onnxopt.fusion.region import Region
from onnxopt.graph.large import SharedWeights, is_large, save_with_external_data
from onnxopt.timing import time_interleaved, time_pair_in_new_process
from onnxopt.verify import make_inputs
from onnxopt.driver.policy import (WHOLE_MODEL_MARGIN, RUNOFF_FLOOR, RUNOFF_ROUNDS, PLAN_FALLBACKS, INLINE_MARGIN,
                                   PLAN_FILES_BYTES, INLINE_REACH, _consistent_layouts, evict_plan_files, custom_ops,
                                   inline_gain_bound, _drop_trials, final_check, plan_runoff)


class DecisionStage:

    def _whole_model_decision(self, original, work, accepted, built, src_path) -> list[Region]:
        """Kernels that win alone can still lose in the graph: onnxruntime's blocked-layout (NCHWc) pass keeps
        conv -> activation chains blocked, and a custom op between them costs a reorder on each side. So time the
        whole fused model against the original; drop, one kernel type at a time, those whose removal makes the
        model faster; and emit nothing if the result is still not faster than the original."""
        lib = os.path.join(self.tmpdir, "candidates.so")
        feeds = make_inputs(original, self._bindings(), self.opts.seed, self.opts.check_inputs)
        s_orig = self._session(original if src_path is None else src_path)

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
                return time_pair_in_new_process(files[0], files[1], feeds_path, self.opts.threads,
                                                provider=self.backend.execution_provider(self.opts.target))
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
                pair = [self._session(original if src_path is None else src_path),
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
        return self._session(path, library=library, ops=ops)

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
            self.backend.link([b[1] for b in used] + seqs, [b[0] for b in used], self.opts.target, path,
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
            self.backend.link([b[1] for b in built.values()], [b[0] for b in built.values()], self.opts.target, wide,
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
        return final_check(attempts, final_time, self.opts.min_speedup)

    def _plan_runoff(self, candidates: list, duel) -> dict | None:
        return plan_runoff(candidates, duel, self.plan_bases)
