"""Fill the model claim: the head pod's ``fetch-model`` init container (chart value ``model.source``
``hf://org/name[@revision]`` or ``pvc://claim/dir``).

    python fetch_model.py SOURCE DEST

``hf://org/name@revision`` downloads the repository from the Hugging Face Hub (``HF_TOKEN`` from a
Secret for gated models); ``pvc://claim/dir`` copies the directory ``dir`` of another claim, which the
chart mounts read-only at ``/model-source`` (``BATON_MODEL_SOURCE_ROOT``). DEST is the model directory
on the claim Baton loads from (``model.pvc.mountPath``/``model.path``).

The copy is made next to DEST and renamed into place, and DEST gets a marker naming its source: a
pod restart finds the marker and skips the download, a changed source replaces the model, and a
copy cut off half-way is never taken for a model. Shipped by the Helm chart in the ConfigMap next to
config.yaml; only the standard library (and huggingface_hub, for hf://) is used.
"""

from __future__ import annotations

import enum
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = ".baton-fetched"
SOURCE_ROOT = Path(os.environ.get("BATON_MODEL_SOURCE_ROOT", "/model-source"))


class Kind(enum.Enum):
    HF = "hf"
    PVC = "pvc"


@dataclass(frozen=True)
class Source:
    kind: Kind
    location: str  # hf: "org/name"; pvc: the directory on the source claim ("" = its root)
    revision: str | None = None
    claim: str | None = None

    def describe(self) -> str:
        if self.kind is Kind.HF:
            return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")
        return f"pvc://{self.claim}/{self.location}".rstrip("/")


def parse_source(text: str) -> Source:
    """``hf://org/name[@revision]`` or ``pvc://claim[/dir]``; ValueError naming what is wrong."""
    if text.startswith("hf://"):
        rest = text[len("hf://") :]
        repo, _, revision = rest.partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{text!r}: a Hugging Face source is hf://org/name or hf://org/name@revision")
        if "@" in rest and not revision:
            raise ValueError(f"{text!r}: an empty revision after '@'")
        return Source(Kind.HF, repo, revision or None)
    if text.startswith("pvc://"):
        claim, _, directory = text[len("pvc://") :].partition("/")
        if not claim:
            raise ValueError(f"{text!r}: a claim source is pvc://claim or pvc://claim/dir")
        directory = directory.strip("/")
        if ".." in Path(directory).parts:
            raise ValueError(f"{text!r}: the directory may not leave the claim ('..')")
        return Source(Kind.PVC, directory, claim=claim)
    raise ValueError(f"{text!r}: model.source to fetch is hf://org/name[@revision] or pvc://claim/dir")


def hf_download(repo: str, revision: str | None, target: Path, token: str | None) -> None:
    """The Hugging Face Hub boundary: the repository's files into ``target``."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SystemExit("fetch-model: huggingface_hub is not installed in the image") from None
    snapshot_download(repo_id=repo, revision=revision, local_dir=str(target), token=token)


def copy_tree(src: Path, target: Path) -> None:
    if not src.is_dir():
        raise SystemExit(f"fetch-model: {src} is not a directory on the source claim")
    shutil.copytree(src, target, symlinks=False)


def fetch(source: Source, dest: Path, token: str | None = None, log=print) -> bool:
    """Make ``dest`` hold ``source``'s model. Returns False when it already did (nothing fetched)."""
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == source.describe():
        log(f"fetch-model: {dest} already holds {source.describe()}")
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".{dest.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # a copy an earlier attempt did not finish
    log(f"fetch-model: {source.describe()} -> {dest}")
    if source.kind is Kind.HF:
        partial.mkdir()
        hf_download(source.location, source.revision, partial, token)
    else:
        copy_tree(SOURCE_ROOT / source.location, partial)
    cache = partial / ".cache"  # huggingface_hub's download bookkeeping, not the model
    if cache.is_dir():
        shutil.rmtree(cache)
    (partial / MARKER).write_text(source.describe() + "\n")
    if dest.exists():
        old = dest.parent / f".{dest.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
        partial.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(dest)
    log(f"fetch-model: {dest} ready")
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: fetch_model.py hf://org/name[@revision]|pvc://claim/dir DEST", file=sys.stderr)
        return 2
    try:
        source = parse_source(argv[1])
    except ValueError as e:
        print(f"fetch-model: {e}", file=sys.stderr)
        return 2
    fetch(source, Path(argv[2]), token=os.environ.get("HF_TOKEN") or None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
