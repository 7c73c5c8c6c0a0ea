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


def amx_status(library: str) -> dict[str, str]:
    """{"state": ..., "why": ...} for the library at `library` in this process (give
    `registered_library(session, loadable=True)`)."""
    lib = ctypes.CDLL(library)
    try:
        status = getattr(lib, "onnxopt_amx_status", None)
        if status is None:
            return {"state": "no AMX kernels", "why": "the library was written before AMX support"}
        status.restype = ctypes.c_int
        code = int(status())
    finally:
        _ctypes.dlclose(lib._handle)
    if code in _STATES:
        state, why = _STATES[code]
        return {"state": state, "why": why}
    err = -code
    return {"state": f"refused by the OS ({errno.errorcode.get(err, err)})",
            "why": f"{_WHY.get(err, os.strerror(err))}; its dot-product tiles run instead"}
