"""Files the stages exchange: atomic writes, JSON, and the dataset split format.

Dataset split format (``dpgen-split/1``), written once by the data stage:

* ``<split>.npz``: ``images`` uint8 array ``[N, C, H, W]`` (C = 1 grey, 3 RGB) and
  ``labels`` int64 array ``[N]`` (class index; toy data stores float32 ``points [N, 2]``
  in ``images``' place, see :func:`save_points`).
* ``<split>.json`` (the manifest): format tag, split name, source, count, shape, classes,
  ``counts_per_class``, the seed, and ``sha256``: the hex digest of the array contents
  (dtype, shape and bytes of every array in name order; not of the zip file, whose
  timestamps vary), so a reader can check it loaded exactly what was written.

Every read (:func:`load_split`, :func:`load_points`) checks the arrays against the manifest;
a missing or unreadable manifest, a truncated file or a changed byte is a one-line
:class:`~pipeline.stage.PipelineError` naming the file, never a traceback or a silent load.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stage import DataNotFoundError, PipelineError

SPLIT_FORMAT = "dpgen-split/1"


class CorruptFileError(PipelineError, ValueError):
    """A file exists but is not what it claims: unreadable, truncated, or its contents differ
    from the sha256 its manifest records. Also a :class:`ValueError`, so callers that wrap
    value errors with the name of their input keep working."""


def _proc_umask() -> int | None:
    """The umask from ``/proc/self/status`` (Linux >= 4.7): read without changing it, so no race."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


@functools.lru_cache(maxsize=1)
def _swapped_umask() -> int:
    # POSIX can only read the umask by setting it: done once per process, because a file
    # another thread creates between the two calls would get mode 0666/0777.
    old = os.umask(0o022)
    os.umask(old)
    return old


def current_umask() -> int:
    """The process umask: fresh from ``/proc`` where it exists, else read once and cached."""
    mask = _proc_umask()
    return _swapped_umask() if mask is None else mask


def output_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: ``0o666 & ~umask``."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    A crash never leaves a half-written output that Snakemake would take as done. The
    output gets the mode a plain ``open(path, "w")`` would give (``0o666 & ~umask``), not
    ``mkstemp``'s private 0600, so collaborators and web servers on a shared cluster can read
    results exactly as the user's umask allows.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix or path.suffix)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # after the writer: some writers replace the file rather than truncate it
        os.chmod(tmp_path, output_mode())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | Path) -> Any:
    """Parse the JSON file at ``path``; one-line errors naming the file when absent or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"{path}: expected a JSON file here (was the stage that writes it run?)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptFileError(f"{path}: not valid JSON ({_one_line(exc)}); truncated or edited? "
                               "rerun the stage that writes it") from None


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Split:
    """A labelled image split: uint8 ``images [N, C, H, W]``, int64 ``labels [N]``."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"labels must have shape ({self.images.shape[0]},), got {self.labels.shape}")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, idx: np.ndarray) -> Split:
        return Split(self.images[idx], self.labels[idx])


def manifest_path(npz_path: str | Path) -> Path:
    return Path(npz_path).with_suffix(".json")


def save_split(path: str | Path, split: Split, *, name: str, source: str, seed: int,
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``split`` to ``path`` (.npz) and its manifest beside it; return the manifest."""
    arrays = {"images": split.images, "labels": split.labels.astype(np.int64)}
    classes, counts = np.unique(arrays["labels"], return_counts=True)
    manifest = {
        "format": SPLIT_FORMAT,
        "split": name,
        "source": source,
        "n": len(split),
        "shape": list(split.images.shape[1:]),
        "dtype": "uint8",
        "classes": [int(c) for c in classes],
        "counts_per_class": {str(int(c)): int(k) for c, k in zip(classes, counts)},
        "seed": seed,
        "sha256": arrays_sha256(arrays),
        **(dict(extra) if extra else {}),
    }
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)
    write_json(manifest_path(path), manifest)
    return manifest


def rebuild_command(path: str | Path) -> str:
    """The command that rewrites the file at ``path``, for an error about a file that exists but is broken.

    ``--force``: a corrupt or edited file is newer than its inputs, so a plain ``snakemake <path>``
    would find it up to date and do nothing. ``--force`` reruns only the job that writes ``path``
    (for a data split: ``prepare_data``, which writes every split again, deterministically).
    """
    return f"snakemake --cores 1 --force {path} (with the run's --configfile, if any)"


def read_manifest(npz_path: str | Path) -> dict[str, Any]:
    """The manifest of the split or point file at ``npz_path``, checked for the fields a reader needs.

    A missing manifest is an error, not a reason to skip the check: without it nothing
    says the arrays are the ones the data stage wrote.
    """
    npz_path = Path(npz_path)
    mpath = manifest_path(npz_path)
    if not mpath.is_file():
        raise CorruptFileError(f"{npz_path}: manifest {mpath} missing, so its contents cannot be verified; "
                               f"rebuild it: {rebuild_command(npz_path)}")
    try:
        manifest = read_json(mpath)
    except CorruptFileError as exc:
        raise CorruptFileError(f"{npz_path}: manifest unreadable: {exc}; rebuild it: {rebuild_command(npz_path)}") from None
    if not isinstance(manifest, dict):
        raise CorruptFileError(f"{mpath}: expected a JSON object (the manifest of {npz_path}), "
                               f"got {type(manifest).__name__}")
    if manifest.get("format") != SPLIT_FORMAT:
        raise CorruptFileError(f"{mpath}: expected format {SPLIT_FORMAT!r}, got {manifest.get('format')!r}")
    sha = manifest.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64):
        raise CorruptFileError(f"{mpath}: expected a 64-hex 'sha256' of the arrays in {npz_path}, got {sha!r}")
    return manifest


def load_verified_arrays(path: str | Path, names: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays of the .npz at ``path`` and its manifest, after checking them against each other.

    Every failure (file or manifest missing, truncated zip, bad CRC, absent array, sha256
    mismatch) is one :class:`~pipeline.stage.PipelineError` line naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"{path}: dataset split not found (run the data stage: snakemake {path})")
    manifest = read_manifest(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as exc:
        raise CorruptFileError(f"{path}: not a readable .npz ({_one_line(exc)}); truncated or edited? "
                               f"rebuild it: {rebuild_command(path)}") from None
    missing = [n for n in names if n not in arrays]
    if missing:
        found = ", ".join(sorted(arrays)) or "none"
        raise CorruptFileError(f"{path}: expected arrays {', '.join(names)}, found {found}; "
                               f"rebuild it: {rebuild_command(path)}")
    if arrays_sha256(arrays) != manifest["sha256"]:
        raise CorruptFileError(f"{path}: contents do not match the sha256 in {manifest_path(path)}; "
                               f"the file was changed after it was written; rebuild it: {rebuild_command(path)}")
    return arrays, manifest


def load_split(path: str | Path) -> Split:
    """Read a split written by :func:`save_split`, verified against its manifest's sha256.

    There is deliberately no way to skip the check: every stage that reads a split relies
    on it being the data the ledger and the manifests describe.
    """
    arrays, _ = load_verified_arrays(path, ("images", "labels"))
    try:
        return Split(arrays["images"], arrays["labels"])
    except ValueError as exc:
        raise CorruptFileError(f"{path}: not an image split ({exc})") from None


def load_points(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read toy points written by :func:`save_points` (``points [N, 2]``, ``labels [N]``), verified."""
    arrays, _ = load_verified_arrays(path, ("points", "labels"))
    return arrays["points"], arrays["labels"]


def save_points(path: str | Path, points: np.ndarray, labels: np.ndarray, *, name: str, source: str,
                seed: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Toy 2-D data: float32 ``points [N, 2]`` and int64 ``labels`` (mixture component)."""
    arrays = {"points": points.astype(np.float32), "labels": labels.astype(np.int64)}
    classes, counts = np.unique(arrays["labels"], return_counts=True)
    manifest = {
        "format": SPLIT_FORMAT, "split": name, "source": source, "n": int(points.shape[0]),
        "shape": list(points.shape[1:]), "dtype": "float32", "classes": [int(c) for c in classes],
        "counts_per_class": {str(int(c)): int(k) for c, k in zip(classes, counts)},
        "seed": seed, "sha256": arrays_sha256(arrays), **(dict(extra) if extra else {}),
    }
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)
    write_json(manifest_path(path), manifest)
    return manifest


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
