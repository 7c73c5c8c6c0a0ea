"""The row kernel's schedule space: the width of its vectors (kinds/schedule.py lanes_knob)."""

from ..schedule import ScheduleSpace, lanes_knob, params_apply


def space(region, target):
    if target.backend != "llvm":
        return ScheduleSpace("layernorm", note=f"the {target.backend} backend's compiler picks the vectors")
    return ScheduleSpace("layernorm", (lanes_knob(target),), params_apply({"lanes": target.float32_lanes}))
