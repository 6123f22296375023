"""The code under test: what a probe measures besides its notebook, part of every execution's key.

By default it is the project's git working tree (tracked files and untracked ones git does not
ignore, as they are on disk, but not runs/, hypotheses/ or the probe notebooks, which have keys of
their own) and every installed distribution's name and version (with its commit for a VCS install,
or a hash of its source for an editable one outside the project). `[tool.perfkit] code = [...]`
names paths and installed distributions instead; a record's `probe.code` adds some. Outside git,
the files themselves are hashed.

The tree is computed with a temporary copy of git's index, so the user's index, HEAD and work tree
are never touched (git stores the blobs and trees it hashes as loose objects, which is what lets a
later run name the files that changed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.paths import Project, git, git_try

EXCLUDED = ("runs", "hypotheses")  # the project's own evidence and records: never the code under test
SHOWN_FILES = 3  # changed files named in a reason; the rest are counted
WEIGHTS = (".safetensors", ".gguf", ".pt", ".pth", ".ckpt", ".onnx", ".npz")  # model weights: always named


@dataclass(frozen=True)
class CodeState:
    """What the code under test is now: `digest` goes into every execution's key."""

    digest: str
    how: str  # in words: "the git working tree", "ownlib, src (files)"
    tree: str | None = None  # the git tree of the working tree, when in git
    parts: dict[str, str] = field(default_factory=dict)  # configured path -> git object id or file hash
    packages: dict[str, str] = field(default_factory=dict)  # distribution -> version (+ commit or source hash)

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "how": self.how,
            "tree": self.tree,
            "parts": self.parts,
            "packages": self.packages,
        }


def git_top(root: Path) -> Path | None:
    """The top of the git working tree holding `root`, or None outside one (or without git)."""
    done = git_try(root, "rev-parse", "--show-toplevel")
    return Path(done.stdout.strip()) if done is not None and done.returncode == 0 and done.stdout.strip() else None


def working_tree(project: Project, top: Path) -> str:
    """The git tree of the working tree as it is on disk, less the project's runs/, hypotheses/ and notebooks."""
    code_root = project.code_root
    prefix = code_root.resolve().relative_to(top.resolve()).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    named = [f"{prefix}{name}" for name in EXCLUDED if (code_root / name).exists()]
    said = git_try(top, "check-ignore", "--", *named) if named else None
    ignored = set(said.stdout.split()) if said is not None else set()
    skipped = [f":(exclude){n}" for n in named if n not in ignored] + [f":(exclude,glob){prefix}notebooks/**/*.ipynb"]
    index = Path(git(top, "rev-parse", "--git-path", "index").strip())
    index = index if index.is_absolute() else top / index
    with tempfile.TemporaryDirectory(prefix="perfkit-index-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if index.is_file():
            # its stat cache, and its time: git re-hashes an entry not older than the index ("racily clean")
            shutil.copy2(index, Path(tmp) / "index")
        git(top, "add", "--all", "--", ".", *skipped, env=env)
        tracked = [*named, f":(glob){prefix}notebooks/**/*.ipynb"]
        git(top, "rm", "--cached", "-r", "-q", "--ignore-unmatch", "--", *tracked, env=env)
        return git(top, "write-tree", env=env).strip()


def _files_hash(paths: list[Path]) -> str:
    """A hash of every file under `paths` (names and bytes), skipping caches and hidden folders."""
    digest = hashlib.sha256()
    for base in paths:
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            parts = path.relative_to(base.parent).parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts) or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(base.parent).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _default_files(root: Path) -> list[Path]:
    """Outside git: the project's own files, but its evidence, probe notebooks and virtual environments."""
    out = []
    for path in sorted(root.iterdir()):
        if path.name in EXCLUDED or path.name.startswith(".") or (path / "pyvenv.cfg").is_file():
            continue
        if path.name == "notebooks":
            out += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix != ".ipynb"]
            continue
        out.append(path)
    return out


SKIPPED_FOLDERS = {"__pycache__", "node_modules", "site-packages", "build", "dist", "runs"}


def _sources(folder: Path):
    """The .py files under `folder`, not in hidden folders, caches, builds or virtual environments."""
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            if entry.name.startswith(".") or entry.name in SKIPPED_FOLDERS or (entry / "pyvenv.cfg").exists():
                continue
            yield from _sources(entry)
        elif entry.suffix == ".py":
            yield entry


def _editable_source(url: str, root: Path) -> str | None:
    """A hash of an editable install's source (names, sizes, times), unless it lies in the project itself."""
    if not url.startswith("file://"):
        return None
    path = Path(url[len("file://") :])
    if not path.is_dir() or path.resolve().is_relative_to(root.resolve()) or root.resolve().is_relative_to(path):
        return None  # the project's own code: the tree covers it
    digest = hashlib.sha256()
    for file in _sources(path):
        stat = file.stat()
        digest.update(f"{file.relative_to(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:12]


def distribution_version(dist: metadata.Distribution, root: Path) -> str:
    """'2.2.0', '1.0 @ 3f2a...' (a VCS install's commit), '0.3 editable 9ab1...' (its source).

    perfkit's own source is in every key already (plan.source_tree_hash): its version alone here.
    """
    version = dist.version
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if isinstance(direct, dict):
        commit = (direct.get("vcs_info") or {}).get("commit_id")
        if commit:
            return f"{version} @ {commit}"
        if (direct.get("dir_info") or {}).get("editable") and dist.metadata["Name"] != "perfkit":
            source = _editable_source(str(direct.get("url", "")), root)
            return f"{version} editable {source}" if source else f"{version} editable"
    return version


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed(root: Path, names: list[str] | None = None) -> dict[str, str]:
    """Installed distributions (all, or those named) -> their version words."""
    wanted = None if names is None else {_normal(n) for n in names}
    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or (wanted is not None and _normal(name) not in wanted):
            continue
        out[name] = distribution_version(dist, root)
    return dict(sorted(out.items()))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def state(project: Project, names: tuple[str, ...] | None = None) -> CodeState:
    """The code under test now: the default (None), or the paths and distributions `names` lists."""
    root = project.code_root
    top = git_top(root)
    tree = working_tree(project, top) if top is not None else None
    if names is None:
        packages = installed(root)
        if tree is not None:
            return CodeState(_digest(tree, packages), "the git working tree and installed packages", tree, {}, packages)
        files = _files_hash(_default_files(root))
        return CodeState(_digest(files, packages), "the project's files and installed packages", None, {}, packages)
    paths = [n for n in names if (root / n).exists()]
    wanted = [n for n in names if n not in paths]
    packages = installed(root, wanted)
    found = {_normal(k) for k in packages}
    missing = [n for n in wanted if _normal(n) not in found]
    if missing:
        raise UserError(f"code: {', '.join(missing)} is neither a path in the project nor an installed distribution")
    if tree is not None:
        prefix = root.resolve().relative_to(top.resolve()).as_posix()
        parts = {p: git(top, "rev-parse", f"{tree}:{p if prefix == '.' else prefix + '/' + p}").strip() for p in paths}
    else:
        parts = {p: _files_hash([root / p]) for p in paths}
    return CodeState(_digest(parts, packages), ", ".join(names), tree, parts, packages)


def _tree_changes(project: Project, old: str, new: str, paths: list[str]) -> list[str] | None:
    """The files that differ between two trees (None when git no longer has one of them)."""
    top = git_top(project.root)
    if top is None:
        return None
    try:
        names = git(top, "diff-tree", "-r", "--name-only", "--no-renames", old, new, "--", *paths).split()
    except UserError:
        return None
    return names


def changes(project: Project, before: dict[str, Any], now: CodeState) -> list[str]:
    """What differs between a stored state (`CodeState.to_json`) and now, in words, for a reason line."""
    if before.get("digest") == now.digest:
        return []
    said: list[str] = []
    files = None
    if before.get("tree") and now.tree and before.get("tree") != now.tree:
        files = _tree_changes(project, before["tree"], now.tree, sorted(now.parts))
    weights = [f for f in files or () if f.endswith(WEIGHTS)]
    if weights:  # new weights change what a model does, whatever else changed: said first, each named
        said.append(f"the weights changed: {', '.join(weights)}")
    files = [f for f in files if f not in weights] if files else files
    if files:
        shown = ", ".join(files[:SHOWN_FILES]) + (
            f" and {len(files) - SHOWN_FILES} more" if len(files) > SHOWN_FILES else ""
        )
        said.append(f"{shown} changed")
    elif not weights and (before.get("parts") != now.parts or (files is None and before.get("tree") != now.tree)):
        said.append(f"the code under test changed ({now.how})")
    old, new = before.get("packages") or {}, now.packages
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            said.append(f"{name} {old.get(name, 'not installed')} -> {new.get(name, 'not installed')}")
    return said or [f"the code under test changed ({now.how})"]


def resolver(project: Project, configured: tuple[str, ...] | None):
    """The code under test for a record's `probe.code`, each distinct one computed once per run."""
    states: dict[tuple[str, ...] | None, CodeState] = {}

    def code_for(extra: tuple[str, ...]) -> CodeState:
        # the default already holds every file of the tree and every package: a record's extra adds nothing
        names = None if configured is None else tuple(dict.fromkeys(configured + extra))
        if names not in states:
            states[names] = state(project, names)
        return states[names]

    return code_for


def files(project: Project, names: tuple[str, ...] | None) -> list[Path]:
    """The project's files a cluster worker needs to import the code under test (paths under its code root).

    In git: the tracked and untracked-but-not-ignored files (all, or those under the configured paths),
    never runs/ or hypotheses/; outside git, the same walk as the hash. notebooks/ is always shipped.
    """
    root = project.code_root
    if git_top(root) is not None:
        listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".").split("\0")
        found = [root / name for name in listed if name and (root / name).is_file()]
    else:
        found = []
        for path in _default_files(root):
            found += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    chosen = [p for p in found if p.relative_to(root).parts[0] not in EXCLUDED]
    if names is not None:
        wanted = [root / n for n in names if (root / n).exists()] + [project.notebooks_dir]
        chosen = [p for p in chosen if any(p == w or p.is_relative_to(w) for w in wanted)]
    chosen = [p for p in chosen if p.relative_to(root).parts[0] != "notebooks"]  # the project's own, below
    notebooks = [p for p in project.notebooks_dir.rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts]
    return sorted(set(chosen) | set(notebooks))


def shipped_name(project: Project, path: Path) -> str:
    """Where a file `files` lists goes in what a cluster worker unpacks: notebooks/... or its place in the code."""
    if path.is_relative_to(project.notebooks_dir):
        return "notebooks/" + path.relative_to(project.notebooks_dir).as_posix()
    return path.relative_to(project.code_root).as_posix()
