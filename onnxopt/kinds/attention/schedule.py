"""The attention kernel's schedule space: the fewest tasks a call is split into (exec.c splits a (batch, head)'s
query rows into more tasks until there are this many), the kind's default first. Its block order (b, m, l, k, n)
and its column block are fixed (the search issue's to open)."""

from ..schedule import Knob, ScheduleSpace, params_apply
from .lower import MIN_TASKS


def space(region, target):
    tasks = Knob("min_tasks", tuple(dict.fromkeys((MIN_TASKS, 1, 2, 4, 16, 32))),
                 "the fewest tasks a call is split into: fewer query rows a task rather than fewer tasks")
    return ScheduleSpace("attention", (tasks,), params_apply({"min_tasks": MIN_TASKS}),
                         note="its block order and column block are fixed")
