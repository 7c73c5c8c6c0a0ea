"""The measured-cost cache: what timing a region's kernel against onnxruntime found, kept on disk and reused.

Checking a kernel is cheap; timing it is not (about a tenth of a second per region, more for the tile search). A
model converted twice, or fifty models that share their layers, need each measurement once. The cache is an SQLite
file (stdlib sqlite3, WAL journal, a busy timeout) that several processes can share, e.g. a batch conversion.

Location: `optimize(cost_cache=PATH)` / `--cost-cache PATH`, else `$ONNXOPT_CACHE_DIR/costs.sqlite`, else
`$XDG_CACHE_HOME/onnxopt/costs.sqlite`, else `~/.cache/onnxopt/costs.sqlite`. `cost_cache=False` /
`--no-cost-cache` turns it off.

The fusion search (OptiFX Algorithm 2) reads kernel costs from here too: `kernel_cost` holds our kernel's seconds
for a sub-graph signature of the search (a conv with its epilogue, an AFUSION group), so a plan is costed by what
its kernels measured, in this run or an earlier one, and by the roofline only where nothing was measured. That
table was added without a schema change (CREATE TABLE IF NOT EXISTS): an older onnxopt ignores it. So was
`tuning_claim`: the problem an `onnxopt tune` is searching, so that another process (a batch's other model, a Ray
task) waits for its records instead of searching the same problem at the same time.

A row is keyed by the sha256 of everything the time depends on: the region's op type (which hashes its
computation and the target's name, CPU and features; the register tile too), the runtime input shapes that were
timed, the thread count (and the CPUs this process may use), onnxruntime's version, onnxopt's version with a digest
of its sources (onnxopt/ and codegen/: the glue's task split or an IR emitter change makes another kernel under the
same op type) and the CPU model, so a cache copied to another machine or kept across an upgrade, or a checkout
moved to another commit, never answers for what it did not measure.
The readable parts are stored as columns too, for inspection with any SQLite client.

Only timings are reused: every kernel is still checked against onnxruntime on every run. A file that cannot be
opened, is not a database, has another schema version or stays locked past the timeout never stops an
optimization: the cache turns itself off, and the report (and one Python warning) says why.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import socket
import sqlite3
import time
import warnings

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS region_cost (
    key TEXT PRIMARY KEY,
    op_type TEXT NOT NULL,
    shapes TEXT NOT NULL,          -- JSON: the runtime input shapes timed, in the fused op's input order
    threads INTEGER NOT NULL,      -- intra-op threads asked for (0: onnxruntime's default)
    cpus INTEGER NOT NULL,         -- CPUs this process could use
    ort_version TEXT NOT NULL,
    onnxopt_version TEXT NOT NULL,
    cpu TEXT NOT NULL,
    original_s REAL NOT NULL,      -- onnxruntime running the region's original ops, median seconds per run
    fused_s REAL NOT NULL,         -- the fused kernel, median seconds per run (same interleaved run)
    speedup REAL NOT NULL,
    measured_at REAL NOT NULL      -- unix time
);
CREATE TABLE IF NOT EXISTS tile_choice (
    key TEXT PRIMARY KEY,
    op_type TEXT NOT NULL,         -- the region's op type with the target's default tile
    shapes TEXT NOT NULL,
    threads INTEGER NOT NULL,
    cpus INTEGER NOT NULL,
    ort_version TEXT NOT NULL,
    onnxopt_version TEXT NOT NULL,
    cpu TEXT NOT NULL,
    tile TEXT NOT NULL,            -- JSON [mi, ni, mii, lanes]: the tile chosen
    candidates TEXT NOT NULL,      -- JSON [{"tile": [...], "seconds": s or null, "error": ...}]
    measured_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kernel_cost (
    key TEXT PRIMARY KEY,
    signature TEXT NOT NULL,       -- the fusion search's sub-graph signature (search/candidates.py, Candidate.key)
    threads INTEGER NOT NULL,
    cpus INTEGER NOT NULL,
    ort_version TEXT NOT NULL,
    onnxopt_version TEXT NOT NULL,
    cpu TEXT NOT NULL,
    target TEXT NOT NULL,          -- the code generation target (name, CPU, features): the kernel timed
    seconds REAL NOT NULL,         -- our kernel for that sub-graph, median seconds per run
    op_type TEXT NOT NULL,         -- the region's op type that was timed, for inspection
    measured_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tuning_claim (
    key TEXT PRIMARY KEY,          -- the problem (as tuning_record's, without the point)
    owner TEXT NOT NULL,           -- "host:pid" of the process searching it
    claimed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tuning_record (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,            -- the kernel's schedule space (onnxopt/tune/heron: "packed_matmul")
    shape TEXT NOT NULL,           -- JSON: the problem's sizes (a matmul's [items, M, K, N])
    target TEXT NOT NULL,          -- the code generation target (name, CPU, features)
    dtype TEXT NOT NULL,
    threads INTEGER NOT NULL,
    cpus INTEGER NOT NULL,
    ort_version TEXT NOT NULL,
    onnxopt_version TEXT NOT NULL,
    cpu TEXT NOT NULL,
    point TEXT NOT NULL,           -- JSON: the point measured, as the kernel takes it
    seconds REAL,                  -- per call; NULL: it failed its check or did not build
    source TEXT NOT NULL,          -- "default" (the optimizer's few measurements) or "tune" (onnxopt tune)
    measured_at REAL NOT NULL
);
"""


class CostCacheWarning(UserWarning):
    """The cost cache could not be used; the optimization goes on without it."""


def default_path() -> str:
    d = os.environ.get("ONNXOPT_CACHE_DIR")
    if not d:
        xdg = os.environ.get("XDG_CACHE_HOME")
        d = os.path.join(xdg, "onnxopt") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "onnxopt")
    return os.path.join(d, "costs.sqlite")


def cpu_model() -> str:
    """The CPU's model string ("AMD EPYC 9454 48-Core Processor"), or what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "cpu model", "Hardware"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """12 hex digits of sha256 over the Python and C sources of the onnxopt and codegen packages (what generates and
    runs a kernel; tests and docs are not part of it)."""
    import onnxopt
    from onnxopt import codegen

    roots = [os.path.dirname(os.path.abspath(p.__file__)) for p in (onnxopt, codegen)]
    # Installed from a wheel, codegen/ lies inside onnxopt/; in a checkout (editable install) beside it.
    return tree_digest([r for r in roots if not any(r.startswith(o + os.sep) for o in roots)])


def tree_digest(roots) -> str:
    """sha256 (12 hex digits) of the .py, .c and .h files under each root, by path relative to the root's parent."""
    h = hashlib.sha256()
    for root in roots:
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith((".py", ".c", ".h")):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, os.path.dirname(root)).encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read() + b"\0")
    return h.hexdigest()[:12]


def _ort_version() -> str:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except Exception:  # noqa: BLE001
        return "unknown"


class CostCache:
    """Measured seconds per (region, shapes, threads, machine, versions), in an SQLite file."""

    def __init__(self, path=None, timeout: float = BUSY_TIMEOUT_S):
        from onnxopt import __version__

        path = os.fspath(path) if path else default_path()
        if os.path.isdir(path):
            path = os.path.join(path, "costs.sqlite")
        self.path = os.path.abspath(path)
        self.timeout = timeout
        self.hits = self.misses = 0
        self.tile_hits = self.tile_misses = 0
        self.kernel_hits = self.kernel_misses = 0
        self.warning: str | None = None
        self._conn: sqlite3.Connection | None = None
        self._ident = {"ort_version": _ort_version(), "onnxopt_version": f"{__version__}+{source_digest()}",
                       "cpu": cpu_model(),
                       "cpus": usable_cpus()}
        try:
            self._open()
        except (sqlite3.Error, OSError, ValueError) as e:
            self._disable(f"cannot open {self.path} ({type(e).__name__}: {e})")

    # ---- state ----
    @property
    def enabled(self) -> bool:
        return self._conn is not None

    def _open(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            # Some of what opening takes SQLite does not wait for with its busy handler (switching a new file to WAL,
            # a WAL recovery another process runs): processes opening the file at once retry until the timeout.
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    version = self._schema(conn)
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            if version != SCHEMA_VERSION:
                raise ValueError(f"schema version {version}, this onnxopt reads version {SCHEMA_VERSION}; "
                                 "point --cost-cache elsewhere or delete the file")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    @staticmethod
    def _schema(conn) -> int:
        """The file in WAL mode with our tables (made if missing); returns its schema version."""
        conn.execute("PRAGMA journal_mode = WAL").fetchone()  # reads the header: a file that is not a database fails
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            rows = conn.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                version = SCHEMA_VERSION
            else:
                version = rows[0][0]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return version

    def _disable(self, why: str):
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None
        if self.warning is None:  # warn once
            self.warning = f"cost cache off: {why}; kernels are timed without it"
            warnings.warn(self.warning, CostCacheWarning, stacklevel=3)

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def summary(self) -> dict:
        out = {"path": self.path, "enabled": self.enabled, "hits": self.hits, "misses": self.misses,
               "tile_hits": self.tile_hits, "tile_misses": self.tile_misses,
               "kernel_hits": self.kernel_hits, "kernel_misses": self.kernel_misses}
        if self.warning:
            out["warning"] = self.warning
        return out

    # ---- keys ----
    def _key(self, kind: str, op_type: str, shapes, threads, extra=None) -> tuple[str, dict]:
        cols = {"op_type": op_type, "shapes": json.dumps([[int(d) for d in s] for s in shapes]),
                "threads": int(threads or 0), **self._ident}
        doc = dict(cols, kind=kind, extra=extra)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), cols

    def key(self, op_type: str, shapes, threads, cold: bool = False) -> str:
        """The key of a region's timing (exposed for tests and inspection); `cold`: timed with its weights out of
        the caches (timing.time_interleaved's flush), kept apart from the warm timing."""
        return self._key("region", op_type, shapes, threads, extra="weights cold" if cold else None)[0]

    def _query(self, sql, args=()):
        if self._conn is None:
            return None
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            self._disable(f"{self.path}: {type(e).__name__}: {e}")
            return None

    # ---- region timings ----
    def get_region(self, op_type: str, shapes, threads, cold: bool = False) -> dict | None:
        """The stored timing of this region on these shapes, or None (counted as a hit or a miss)."""
        if self._conn is None:
            return None
        rows = self._query("SELECT original_s, fused_s, speedup, measured_at FROM region_cost WHERE key = ?",
                           (self.key(op_type, shapes, threads, cold),))
        if rows and all(isinstance(v, float) and v > 0 and v == v and v != float("inf") for v in rows[0][:2]):
            self.hits += 1
            return dict(zip(("original_s", "fused_s", "speedup", "measured_at"), rows[0]))
        if self._conn is not None:
            self.misses += 1
        return None

    def put_region(self, op_type: str, shapes, threads, original_s: float, fused_s: float,
                   cold: bool = False) -> None:
        key, cols = self._key("region", op_type, shapes, threads, extra="weights cold" if cold else None)
        self._query("INSERT OR REPLACE INTO region_cost (key, op_type, shapes, threads, cpus, ort_version, "
                    "onnxopt_version, cpu, original_s, fused_s, speedup, measured_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, cols["op_type"], cols["shapes"], cols["threads"], cols["cpus"], cols["ort_version"],
                     cols["onnxopt_version"], cols["cpu"], float(original_s), float(fused_s),
                     float(original_s) / float(fused_s), time.time()))

    # ---- tile searches ----
    def get_tile(self, op_type: str, shapes, threads, space) -> dict | None:
        """The stored tile search of this region over this candidate space (a list of tiles as lists)."""
        if self._conn is None:
            return None
        key, _ = self._key("tile", op_type, shapes, threads, extra=space)
        rows = self._query("SELECT tile, candidates, measured_at FROM tile_choice WHERE key = ?", (key,))
        if rows:
            try:
                out = {"tile": json.loads(rows[0][0]), "candidates": json.loads(rows[0][1]),
                       "measured_at": rows[0][2]}
            except (TypeError, ValueError):
                out = None
            if out is not None and out["tile"] in space:
                self.tile_hits += 1
                return out
        if self._conn is not None:
            self.tile_misses += 1
        return None

    def put_tile(self, op_type: str, shapes, threads, space, tile, candidates) -> None:
        key, cols = self._key("tile", op_type, shapes, threads, extra=space)
        self._query("INSERT OR REPLACE INTO tile_choice (key, op_type, shapes, threads, cpus, ort_version, "
                    "onnxopt_version, cpu, tile, candidates, measured_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, cols["op_type"], cols["shapes"], cols["threads"], cols["cpus"], cols["ort_version"],
                     cols["onnxopt_version"], cols["cpu"], json.dumps(list(tile)), json.dumps(candidates),
                     time.time()))

    # ---- tuning records (onnxopt/tune/heron) ----
    def put_records(self, kind: str, shape, target: str, dtype: str, threads, records, source: str) -> None:
        """Measured points of one problem: `records` is [(point as JSON-able, seconds or None)]."""
        for point, seconds in records:
            key, cols = self._key("record", kind, [list(shape)], threads,
                                  extra=[target, dtype, json.dumps(point, sort_keys=True)])
            self._query("INSERT OR REPLACE INTO tuning_record (key, kind, shape, target, dtype, threads, cpus, "
                        "ort_version, onnxopt_version, cpu, point, seconds, source, measured_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (key, kind, json.dumps([int(d) for d in shape]), target, dtype, cols["threads"],
                         cols["cpus"], cols["ort_version"], cols["onnxopt_version"], cols["cpu"],
                         json.dumps(point, sort_keys=True), None if seconds is None else float(seconds), source,
                         time.time()))

    def get_records(self, kind: str, shape, target: str, dtype: str, threads,
                    source: str | None = None) -> list[tuple[object, float | None]]:
        """Every stored measurement of this problem on this machine and these versions (only those of `source`,
        "tune" or "default", where given): [(point, seconds)]."""
        if self._conn is None:
            return []
        _, cols = self._key("record", kind, [list(shape)], threads)
        rows = self._query("SELECT point, seconds FROM tuning_record WHERE kind = ? AND shape = ? AND target = ? "
                           "AND dtype = ? AND threads = ? AND cpus = ? AND ort_version = ? AND onnxopt_version = ? "
                           "AND cpu = ? AND source LIKE ? ORDER BY key",
                           (kind, json.dumps([int(d) for d in shape]), target, dtype, cols["threads"],
                            cols["cpus"], cols["ort_version"], cols["onnxopt_version"], cols["cpu"],
                            source or "%")) or []
        out = []
        for point, seconds in rows:
            try:
                out.append((json.loads(point), seconds))
            except (TypeError, ValueError):
                continue
        return out

    # ---- claims: one process at a time searches a problem ----
    def _claim_key(self, kind: str, shape, target: str, dtype: str, threads) -> str:
        return self._key("claim", kind, [list(shape)], threads, extra=[target, dtype])[0]

    def claim(self, kind: str, shape, target: str, dtype: str, threads, stale_s: float = 3600.0) -> str | None:
        """Claims this problem for this process's search: None when it is ours now (or without a cache), else the
        owner ("host:pid") of a live claim. A claim older than `stale_s`, or of a process of this host that is
        gone, is taken over."""
        if self._conn is None:
            return None
        key, me, now = self._claim_key(kind, shape, target, dtype, threads), _owner(), time.time()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._conn.execute("SELECT owner, claimed_at FROM tuning_claim WHERE key = ?",
                                         (key,)).fetchone()
                if row and row[0] != me and now - row[1] < stale_s and _alive(row[0]):
                    return row[0]
                self._conn.execute("INSERT OR REPLACE INTO tuning_claim (key, owner, claimed_at) VALUES (?, ?, ?)",
                                   (key, me, now))
                return None
            finally:
                self._conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._disable(f"{self.path}: {type(e).__name__}: {e}")
            return None

    def release(self, kind: str, shape, target: str, dtype: str, threads) -> None:
        """Drops this process's claim of the problem (its records are in, or its search failed)."""
        self._query("DELETE FROM tuning_claim WHERE key = ? AND owner = ?",
                    (self._claim_key(kind, shape, target, dtype, threads), _owner()))

    # ---- kernel costs for the fusion search ----
    def get_kernels(self, signatures, threads, target: str) -> dict[str, float]:
        """The stored seconds of each signature measured for these threads and this target ({} without a cache);
        signatures not stored are left out (and counted as misses)."""
        if self._conn is None:
            return {}
        out: dict[str, float] = {}
        for sig in dict.fromkeys(signatures):
            key, _ = self._key("kernel", sig, [], threads, extra=target)
            rows = self._query("SELECT seconds FROM kernel_cost WHERE key = ?", (key,))
            if rows is None:
                return out
            v = rows[0][0] if rows else None
            if isinstance(v, float) and 0 < v < float("inf"):
                out[sig] = v
                self.kernel_hits += 1
            else:
                self.kernel_misses += 1
        return out

    def put_kernel(self, signature: str, threads, target: str, seconds: float, op_type: str) -> None:
        key, cols = self._key("kernel", signature, [], threads, extra=target)
        self._query("INSERT OR REPLACE INTO kernel_cost (key, signature, threads, cpus, ort_version, onnxopt_version, "
                    "cpu, target, seconds, op_type, measured_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, signature, cols["threads"], cols["cpus"], cols["ort_version"], cols["onnxopt_version"],
                     cols["cpu"], target, float(seconds), op_type, time.time()))


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(owner: str) -> bool:
    """Whether a claim's process may still run: on this host, whether the pid exists; elsewhere, assumed."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def open_cost_cache(option) -> CostCache | None:
    """`optimize(cost_cache=...)`: False -> no cache; None -> the default location; a path -> that file."""
    if option is False:
        return None
    return CostCache(None if option in (None, True) else option)
