"""The backend protocol: what the driver asks of a backend (onnxopt/backends/__init__.py says which is which), and
the parts the host backends share (the C glue's link, host feeds, CPU sessions, the CPU check)."""

from __future__ import annotations

from onnxopt.codegen.target import Target


class Backend:
    """The protocol (and the parts every host backend shares: the C glue's link, host feeds, CPU sessions)."""

    name: str = ""
    # The --target forms it takes, for messages
    target_help: str = ""

    def owns(self, spec: str) -> bool:
        raise NotImplementedError

    def parse_target(self, spec: str) -> Target:
        raise NotImplementedError

    def layout(self, target: Target):
        """The micro-kernel the fusion rules plan blocked layouts, lanes and register tiles for
        (codegen/microkernel/registry.py: the target's row of the ISA table), or None where it plans none."""
        from onnxopt.codegen.microkernel.registry import select

        return select(target)

    def lower(self, kind, region, target: Target) -> tuple:
        """(object code, the glue's description, source text) of the region's kernel, by the kind's lowering for
        this backend (onnxopt/kinds: Kind.lowering)."""
        build = kind.lowering(self.name)
        if build is None:
            raise NotImplementedError(f"the {self.name} backend has no lowering for the {kind.name} kind")
        built = tuple(build(region, target))
        return built + (None,) * (3 - len(built))  # the built-in compute kind gives no source text

    def families_not_lowered(self, kinds) -> tuple[str, ...]:
        """The kinds among `kinds` (their --skip-fusion names) it has no lowering for: the driver leaves them to
        onnxruntime."""
        missing = {k.name for k in kinds if k.lowering(self.name) is None}
        if "compute" in missing:  # AFUSION and sibling groups are compute kernels
            missing |= {"afusion", "horizontal"}
        return tuple(sorted(missing))

    def compile(self, source: str, target: Target, **options) -> bytes:
        raise NotImplementedError

    def link(self, descs: list, objects: list, target: Target, output: str, **options) -> str:
        """Link the kernels with the C glue into the library at `output`; returns its sha256."""
        from onnxopt.codegen.glue.library import link_library

        return link_library(descs, objects, target, output, **options)

    def execution_provider(self, target: Target) -> str:
        return target.execution_provider

    def session(self, model, target: Target, threads: int | None = None, library: str | None = None, **options):
        """An onnxruntime session on its execution provider (onnxopt/timing.py), the library registered: how the
        driver feeds, checks and times its kernels (host arrays for the CPU backends)."""
        from onnxopt.timing import make_session

        return make_session(model, threads, library=library, provider=self.execution_provider(target), **options)

    def cannot_run(self, target: Target) -> list[str]:
        """What this machine lacks to run the target's kernels ([] when it can run them)."""
        from onnxopt.codegen.target import missing_cpu_flags

        if target.foreign:
            return [f"the {target.arch} instruction set"]
        return missing_cpu_flags(target.required_cpu_flags)
