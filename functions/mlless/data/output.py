"""Where prepared files go: a local directory or any fsspec URL (memory://, s3://, ...)."""
from __future__ import annotations

import posixpath

import fsspec
from fsspec import AbstractFileSystem

from mlless.data.npz import sha256


class OutputDir:
    """Write whole files under a root and remember their sha256 for the manifest."""

    def __init__(self, url: str) -> None:
        self.url = url
        fs, root = fsspec.core.url_to_fs(url)
        self.fs: AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or root
        self.checksums: dict[str, str] = {}
        self._made: set[str] = set()

    def path(self, relpath: str) -> str:
        return posixpath.join(self.root, relpath)

    def _makedirs(self, relpath: str) -> None:
        parent = posixpath.dirname(self.path(relpath))
        if parent not in self._made:
            self.fs.makedirs(parent, exist_ok=True)
            self._made.add(parent)

    def put(self, relpath: str, data: bytes, checksum: bool = True) -> str:
        """Write `data` to `relpath`; returns (and records) its sha256."""
        self._makedirs(relpath)
        self.fs.pipe_file(self.path(relpath), data)
        digest = sha256(data)
        if checksum:
            self.checksums[relpath] = digest
        return digest

    def clear_stale(self) -> None:
        """Remove a previous preparation's manifest and batches so none of them survive."""
        for rel in ("manifest.json", "validation.npz", "ids.npz"):
            if self.fs.exists(self.path(rel)):
                self.fs.rm(self.path(rel))
        for folder in ("train", "users"):
            if self.fs.exists(self.path(folder)):
                self.fs.rm(self.path(folder), recursive=True)
