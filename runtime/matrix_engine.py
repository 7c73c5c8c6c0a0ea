"""Whether a loaded kernel library runs its AMX tiles, and if not why (codegen/glue/matrix_engine.c): the CPU flags
do not prove it, since Linux grants the tile state per process, when asked."""

from __future__ import annotations

import _ctypes
import ctypes
import errno
import os

_STATES = {0: ("no AMX kernels", "the library has no AMX tiles, or no session has registered it yet"),
           1: ("granted", "the AMX tiles run"),
           2: ("emulated", "the library was built with emulated tiles (ONNXOPT_EMULATE_TILES=1, for tests): they run "
                           "as plain code"),
           -1000: ("no AMX on this CPU", "its dot-product tiles run instead"),
           -1001: ("turned off (ONNXOPT_AMX=0)", "its dot-product tiles run instead")}
_WHY = {errno.EINVAL: "the kernel is older than Linux 5.16 or does not know AMX",
        errno.ENOSPC: "a signal stack in this process is too small for the tile state (sigaltstack, as Python's "
                      "faulthandler sets one up, must be at least AT_MINSIGSTKSZ)",
        errno.EPERM: "the process is not allowed the tile state",
        errno.EOPNOTSUPP: "the kernel does not support AMX here"}


UNITS = {1: "AMX-INT8", 2: "AMX-BF16", 4: "AMX-FP16"}  # matrix_engine.c's AMX_INT8, AMX_BF16, AMX_FP16


def amx_status(library: str) -> dict:
    """{"state": ..., "why": ..., "units": {unit: "runs" or why not}} for the library at `library` in this process
    (give `registered_library(session, loadable=True)`). "units" names the AMX units the library's tiles use: a CPU
    can grant the tile state and still lack one of them (AMX-FP16 on a Sapphire Rapids), whose kernels then run their
    dot-product tiles."""
    lib = ctypes.CDLL(library)
    try:
        status = getattr(lib, "onnxopt_amx_status", None)
        if status is None:
            return {"state": "no AMX kernels", "why": "the library was written before AMX support", "units": {}}
        status.restype = ctypes.c_int
        code = int(status())
        units_fn = getattr(lib, "onnxopt_amx_units", None)  # libraries written before it name no units
        units = int(units_fn()) if units_fn is not None else None
    finally:
        _ctypes.dlclose(lib._handle)
    if code in _STATES:
        state, why = _STATES[code]
    else:
        err = -code
        state = f"refused by the OS ({errno.errorcode.get(err, err)})"
        why = f"{_WHY.get(err, os.strerror(err))}; its dot-product tiles run instead"
    if units is None:
        return {"state": state, "why": why, "units": {}}
    used, cpu = units & 0xFF, units >> 8
    running = code in (1, 2)
    named = {name: ("runs" if cpu & bit else "not on this CPU: its kernels run their dot-product tiles")
             if running else why for bit, name in UNITS.items() if used & bit}
    missing = [name for name, said in named.items() if said != "runs"]
    if running and missing:  # granted, but the CPU lacks some of the units the tiles use
        have = [name for name, said in named.items() if said == "runs"]
        state = f"no {' or '.join(missing)} on this CPU" + (f" ({', '.join(have)} {state})" if have else "")
        why = (f"the {', '.join(have)} tiles run; " if have else "") + \
            f"the kernels on {' and '.join(missing)} run their dot-product tiles instead"
    return {"state": state, "why": why, "units": named}
