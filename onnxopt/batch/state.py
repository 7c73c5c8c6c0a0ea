"""OUT_DIR/batch-state.json: what each model's last run ended as, so that a rerun picks up where one stopped.

A model is known by its absolute path, and its record counts only while the file's sha256 and the optimize options
are the same as then (an edited model, or other options, is optimized again). The file is rewritten after every model,
through a temporary file and os.replace, so an interrupted batch leaves the state of every model it finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from .worker import FINISHED

VERSION = 1
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: mkstemp's files are private (0600), ours get the usual mode


def file_sha256(path: str) -> str:
    from onnxopt.codegen.glue.library import sha256_file

    return sha256_file(path)


def options_key(optimize_args: list[str]) -> str:
    return hashlib.sha256(json.dumps(optimize_args).encode()).hexdigest()[:16]


class BatchState:
    def __init__(self, path: str):
        self.path = path
        self.models: dict[str, dict] = {}
        self.warning: str | None = None  # set when the file was there but could not be used (the driver prints it)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return  # the first run into this folder
        except (OSError, ValueError) as e:
            self._discard(f"{type(e).__name__}: {e}")
            return
        if isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("models"), dict):
            self.models = data["models"]
        else:
            self._discard(f"not a version-{VERSION} batch state")

    def _discard(self, why: str) -> None:
        """An unusable state file is kept aside (it may be the only record of a long batch), never dropped silently."""
        n = 1
        while os.path.lexists(f"{self.path}.corrupt-{n}"):
            n += 1
        aside = f"{self.path}.corrupt-{n}"
        try:
            os.replace(self.path, aside)
            kept = f"moved to {aside}"
        except OSError as e:
            kept = f"left as it is ({e.strerror or e})"
        self.warning = f"{self.path} is unreadable ({why[:200]}); {kept}, and every model is run again"

    def previous(self, source: str, sha256: str, options: str) -> dict | None:
        """The last record of this model if it is still valid for this file and these options."""
        entry = self.models.get(source)
        if not entry or entry.get("sha256") != sha256 or entry.get("options") != options:
            return None
        return entry.get("record")

    def is_finished(self, record: dict | None) -> bool:
        """Finished (optimized or unchanged) and its model still on disk."""
        return bool(record) and record.get("status") in FINISHED and bool(record.get("output")) \
            and os.path.isfile(record["output"])

    def put(self, source: str, sha256: str, options: str, record: dict) -> None:
        self.models[source] = {"sha256": sha256, "options": options, "record": record}
        self.save()

    def save(self) -> None:
        write_atomic(self.path, {"version": VERSION, "models": self.models})


def write_atomic(path: str, data) -> None:
    """`data` as JSON (a str as it is) to `path`, which is whole or untouched whatever happens."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            if isinstance(data, str):
                f.write(data)
            else:
                json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
