"""Meta-tests: the repository speaks of the project only.

Every tracked text file is checked for (1) references to Markdown files that do not exist in the
repository, (2) issue-tracker wording ("issue 3", "issue #12": numbers of a tracker the repo does
not contain) and (3) absolute paths of a particular machine (home, root or work folders, /tmp).
Each checker also has a must-fail test on planted text. Runs in well under a second.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sh", ".rst", ""}
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "out", "__pycache__", ".pytest_cache",
             ".hypothesis"}
# Markdown files of OTHER repositories that the docs cite by their path there.
EXTERNAL_MARKDOWN = {
    "contributed/advanced_FAQs.md": "aws-neuron/nki-samples (docs/nki-compatibility-review.md, FAQ)",
}

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
_MD_REF = re.compile(r"(?<![\w/.-])((?:\.{1,2}/|[\w-]+/)*[\w.-]+\.md)\b")
_ISSUE = re.compile(r"\bissues?\s*#?\s*\d+", re.I)
_MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|home|root|Users|tmp)/[\w.-]")


def tracked_text_files() -> list[Path]:
    """The repository's text files: ``git ls-files`` when this is a git checkout, else a walk."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True, timeout=30).stdout.decode().split("\0")
        files = [ROOT / n for n in names if n]
    except (OSError, subprocess.SubprocessError):
        files = [Path(d) / f for d, dirs, fs in os.walk(ROOT)
                 for f in fs if not (set(Path(d).relative_to(ROOT).parts) & SKIP_DIRS)]
    return sorted(p for p in files if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and not p.name.endswith(".egg-info"))


def dangling_markdown_refs(path: Path, text: str, root: Path = ROOT) -> list[str]:
    """``*.md`` paths named in ``text`` that exist neither beside ``path`` nor under ``root``; a
    bare name (``layouts.md``) also resolves when exactly one Markdown file in ``root`` has it."""
    bad = []
    for ref in _MD_REF.findall(_URL.sub(" ", text)):
        if ref in EXTERNAL_MARKDOWN or _in_repo(path.parent / ref, root) or _in_repo(root / ref, root):
            continue
        if "/" not in ref and len(_markdown_by_name(root).get(ref, ())) == 1:
            continue
        bad.append(ref)
    return bad


def _in_repo(candidate: Path, root: Path) -> bool:
    """An existing file inside ``root`` (``../`` may not leave the repository)."""
    resolved = candidate.resolve()
    return resolved.is_file() and resolved.is_relative_to(root.resolve())


def _markdown_by_name(root: Path) -> dict[str, list[Path]]:
    if root not in _MD_NAMES:
        found: dict[str, list[Path]] = {}
        for p in root.rglob("*.md"):
            if not set(p.relative_to(root).parts) & SKIP_DIRS:
                found.setdefault(p.name, []).append(p)
        _MD_NAMES[root] = found
    return _MD_NAMES[root]


_MD_NAMES: dict[Path, dict[str, list[Path]]] = {}


def issue_refs(text: str) -> list[str]:
    return _ISSUE.findall(text)


def machine_paths(text: str) -> list[str]:
    return _MACHINE_PATH.findall(_URL.sub(" ", text))


def _offenders(check) -> list[str]:
    found = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue                      # this file names the patterns it looks for
        text = path.read_text(errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            hits = check(path, line)
            if hits:
                found.append(f"{path.relative_to(ROOT)}:{i}: {hits}")
    return found


def test_the_checks_see_the_repository():
    names = {p.relative_to(ROOT).as_posix() for p in tracked_text_files()}
    assert {"README.md", "docs/layouts.md", "host/attention.py", "pyproject.toml"} <= names


def test_no_references_to_missing_markdown_files():
    bad = _offenders(dangling_markdown_refs)
    assert not bad, "Markdown files referenced but not in the repo:\n" + "\n".join(bad)


def test_no_issue_tracker_wording():
    bad = _offenders(lambda path, line: issue_refs(line))
    assert not bad, "issue-number references (say what is meant instead):\n" + "\n".join(bad)


def test_no_machine_paths():
    bad = _offenders(lambda path, line: machine_paths(line))
    assert not bad, "absolute machine paths (use repo-relative paths):\n" + "\n".join(bad)


def test_external_markdown_citations_are_not_in_the_repo():
    for ref in EXTERNAL_MARKDOWN:
        assert not (ROOT / ref).exists(), f"{ref} is in the repo now; drop it from EXTERNAL_MARKDOWN"


# ------------------------------------------------------------------ the checkers can fail
def test_markdown_checker_flags_missing_files_only(tmp_path):
    for d in ("docs", "host", "a", "b"):
        (tmp_path / d).mkdir()
    for f in ("docs/there.md", "a/twice.md", "b/twice.md"):
        (tmp_path / f).write_text("x")
    doc = tmp_path / "docs" / "a.md"
    (tmp_path.parent / "outside.md").write_text("x")
    text = ("see there.md, docs/there.md, ../docs/there.md and INTERFACES.md §3, "
            "notes/gone.md, https://example.org/remote/README.md, ../../outside.md")
    assert dangling_markdown_refs(doc, text, root=tmp_path) == [
        "INTERFACES.md", "notes/gone.md", "../../outside.md"]
    # from another folder: a bare name resolves only when it is unambiguous
    src = tmp_path / "host" / "x.py"
    assert dangling_markdown_refs(src, "layouts in there.md; twice.md", root=tmp_path) == ["twice.md"]
    assert dangling_markdown_refs(doc, "nothing here", root=tmp_path) == []


@pytest.mark.parametrize("text, hits", [
    ("Default batch (issue 3): 256 sequences", 1), ("as in Issue #12 and issues 4", 2),
    ("a hardware known issue", 0), ("vLLM PR #13245", 0), ("issue order", 0)])
def test_issue_checker(text, hits):
    assert len(issue_refs(text)) == hits


@pytest.mark.parametrize("text, hits", [
    ("quoted in " + "/wo" + "rk/shared/docs/x.md", 1), ("script /tmp/someone/x.py", 1),
    ("cd /home/me/repo && /root/.cache", 2), ("nki_sim/README.md and docs/work/x", 0),
    ("https://example.org/home/page", 0), ("~/work/x", 0)])
def test_machine_path_checker(text, hits):
    assert len(machine_paths(text)) == hits
