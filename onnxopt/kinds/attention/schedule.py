"""The attention kernel's schedule space: the fewest tasks a call is split into (exec.c splits a (batch, head)'s
query rows into more tasks until there are this many) and, on 16-lane targets, the micro-kernel's vectors a row;
the kind's default first; and the floats a block of keys may take (the data-movement model's by default, whole rows,
or half, one or two shares of a core's L2). Its block order (b, m, l, k, n) is fixed."""

from ..schedule import Knob, ScheduleSpace, params_apply
from . import plan
from .lower import MIN_TASKS, NR, NR_WIDE


def space(region, target):
    tasks = Knob("min_tasks", tuple(dict.fromkeys((MIN_TASKS, 1, 2, 4, 16, 32))),
                 "the fewest tasks a call is split into: fewer query rows a task rather than fewer tasks")
    knobs, defaults = [tasks], {"min_tasks": MIN_TASKS}
    if target.float32_lanes >= 16:
        knobs.append(Knob("vectors", (NR, NR_WIDE), "the micro-kernel's vectors a row (its column block)"))
        defaults["vectors"] = NR
    share = int(plan.KEY_SHARE * plan.core_cache_bytes(2)) // 4  # the model's capacity where blocks pay
    knobs.append(Knob("key_floats", (0, -1, share // 2, share, 2 * share),
                      "floats a block of keys may take: 0 the data-movement model's (capacity.py), -1 whole rows"))
    defaults["key_floats"] = 0
    return ScheduleSpace("attention", tuple(knobs), params_apply(defaults),
                         note="its block order (b, m, l, k, n) is fixed; the model sizes its l tile")
