"""Public kernel sources of the evidence suite, fetched at run time into a cache OUTSIDE the repo.

Nothing fetched here is ever stored in the repository: the table (``measurements.json``) names
each kernel by (GitHub repository, commit, path) and this module brings that one file into
``cache_dir()`` (env ``NKI_PA_EVIDENCE_CACHE``, default ``~/.cache/nki-pa-evidence``):

1. a file already in the cache is used as is (keyed by repository, commit and path);
2. else, if a local git mirror of the repository is given (``--mirror DIR``: a folder holding
   ``<owner>+<name>/repo`` or ``<owner>+<name>`` git directories, or ``<owner>/<name>``
   checkouts), the file is read with ``git show <commit>:<path>``;
3. else it is downloaded from ``raw.githubusercontent.com`` at the pinned commit.

When none of these works (offline, repository gone) :class:`SourceUnavailable` is raised and the
runner skips the case with the message.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


class SourceUnavailable(RuntimeError):
    """A public kernel source could not be fetched (offline, or not found)."""


def cache_dir() -> Path:
    """Folder of the fetched sources and of the saved traces (created on first use)."""
    root = os.environ.get("NKI_PA_EVIDENCE_CACHE") or Path.home() / ".cache" / "nki-pa-evidence"
    return Path(root)


def _cache_path(repo: str, commit: str, path: str) -> Path:
    key = hashlib.sha1(f"{repo}@{commit}:{path}".encode()).hexdigest()[:12]
    return cache_dir() / "src" / repo.replace("/", "+") / f"{key}-{Path(path).name}"


def _git_dirs(mirror: Path, repo: str):
    owner_name = repo.replace("/", "+")
    for cand in (mirror / owner_name / "repo", mirror / owner_name, mirror / repo):
        if cand.is_dir():
            yield cand


def _from_mirror(mirror: Path, repo: str, commit: str, path: str) -> bytes | None:
    for git_dir in _git_dirs(mirror, repo):
        try:
            return subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"],
                                  check=True, capture_output=True, timeout=60).stdout
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
            continue
    return None


def _download(repo: str, commit: str, path: str, timeout: float) -> bytes:
    url = RAW_URL.format(repo=repo, commit=commit, path=path)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:      # noqa: S310 (fixed host)
            return resp.read()
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise SourceUnavailable(f"cannot fetch {repo}@{commit[:12]}:{path} ({e}); run online "
                                f"or pass --mirror with a local clone") from None


def fetch(repo: str, commit: str, path: str, *, mirror: Path | None = None,
          timeout: float = 20.0) -> Path:
    """Local path of ``repo``'s ``path`` at ``commit`` (cached outside the repository)."""
    if not (repo and commit and path):
        raise ValueError(f"repo, commit and path must all be given; got {repo!r}, {commit!r}, "
                         f"{path!r}")
    dest = _cache_path(repo, commit, path)
    if dest.is_file():
        return dest
    data = _from_mirror(Path(mirror), repo, commit, path) if mirror is not None else None
    if data is None:
        data = _download(repo, commit, path, timeout)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest
