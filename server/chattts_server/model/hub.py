"""`--model REPO[@REVISION]`: ChatTTS weights from the Hugging Face hub, as upstream's
`Chat.load(source="huggingface")` gets them, but at a revision pinned here (an update on the hub
changes nothing a release serves until someone reviews it and moves the pin).

The files the server loads (`verify.OFFICIAL_FILES`, nothing else) go into the standard Hugging
Face cache through `huggingface_hub`: HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN and
HF_HUB_OFFLINE mean what they mean there, and an interrupted download resumes from its
`.incomplete` file. Every file is checked against the sha256 map before it is served; one that
does not match is removed from the cache. A complete snapshot at a commit is read with no
network at all. Each failure is one `HubError` line saying what to do.
"""

from __future__ import annotations

import errno
import logging
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import huggingface_hub
import requests
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
)

from ..config_model import ModelConfig
from .errors import ModelLoadError
from .verify import OFFICIAL_FILES, check_file, config_sha256_map

log = logging.getLogger(__name__)

PINNED_REVISIONS: dict[str, str] = {
    # 2Noise/ChatTTS's main branch since its safetensors files (the ones ChatTTS 0.2.5's
    # res/sha256_map.json lists); moving it is a reviewed change.
    "2Noise/ChatTTS": "1a3c04a8b0651689bd9242fbb55b1f4b5a9aef84",
}
_PROGRESS_EVERY_S = 10.0
_MB = 1_000_000


class HubError(ModelLoadError):
    """`--model` cannot be served; the message is one line that says why and what to do.
    `environmental`: the cause is this machine's network or disk (offline, hub unreachable,
    disk full), where `--dev-model-fallback` serves the dev model instead."""

    def __init__(self, message: str, environmental: bool = False) -> None:
        super().__init__(message)
        self.environmental = environmental


@dataclass(frozen=True)
class HubModel:
    """A repo on the hub at one revision (a commit, or a branch or tag the hub resolves)."""

    repo_id: str
    revision: str

    @classmethod
    def parse(cls, spec: str) -> HubModel:
        """`REPO[@REVISION]`; without a revision, the one pinned here for that repo."""
        repo_id, _, revision = spec.partition("@")
        revision = revision or PINNED_REVISIONS.get(repo_id, "")
        if not revision:
            raise HubError(
                f"--model {spec}: this release pins no revision of {repo_id}; "
                f"name one: --model {repo_id}@REVISION"
            )
        return cls(repo_id, revision)

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}"

    @property
    def storage(self) -> Path:
        """This repo's folder in the Hugging Face cache (blobs/, refs/, snapshots/)."""
        return Path(hf_constants.HF_HUB_CACHE) / repo_folder_name(
            repo_id=self.repo_id, repo_type="model"
        )


def fetch(
    model: HubModel,
    sha256_map: Mapping[str, str],
    timeout_s: float,
    allow_unverified: bool = False,
) -> Path:
    """The snapshot folder of `model` in the cache, complete and checked; downloaded (or its
    missing files) first where the cache lacks it. Raises HubError."""
    try:
        return _fetch(model, sha256_map, timeout_s, allow_unverified)
    except OSError as exc:  # the cache's own folders: making them, writing a ref
        raise cache_error(exc) from None


def _fetch(
    model: HubModel, sha256_map: Mapping[str, str], timeout_s: float, allow_unverified: bool
) -> Path:
    cached = _cached_snapshot(model)
    offline = hf_constants.HF_HUB_OFFLINE
    if cached is not None and (REGEX_COMMIT_HASH.match(model.revision) or offline):
        log.info("--model %s: in the Hugging Face cache at %s", model, cached)
        return _checked(model, cached, sha256_map, allow_unverified)
    if offline:
        raise HubError(
            f"HF_HUB_OFFLINE=1 and {model} is not complete in the Hugging Face cache "
            f"({hf_constants.HF_HUB_CACHE}): unset HF_HUB_OFFLINE to download it, or fill that "
            "cache where the hub can be reached (chattts-server --model ... --download-only)",
            environmental=True,
        )
    try:
        info = _model_info(model, timeout_s)
    except HubError as exc:
        if cached is None or not exc.environmental:
            raise
        log.warning("%s; serving %s as the cache has it (%s)", exc, model, cached)
        return _checked(model, cached, sha256_map, allow_unverified)
    assert info.sha is not None
    snapshot = _download(model, info, timeout_s)
    return _checked(model, snapshot, sha256_map, allow_unverified)


def _cached_snapshot(model: HubModel) -> Path | None:
    """The cache's snapshot folder for the revision when it holds every official file."""
    paths = [
        huggingface_hub.try_to_load_from_cache(model.repo_id, relpath, revision=model.revision)
        for relpath in OFFICIAL_FILES
    ]
    if not all(isinstance(path, str) for path in paths):
        return None
    first = Path(str(paths[0]))
    return first.parents[len(Path(OFFICIAL_FILES[0]).parts) - 1]


def _model_info(model: HubModel, timeout_s: float) -> huggingface_hub.ModelInfo:
    """The revision's commit and file list, from the hub (one HTTP call)."""
    endpoint = hf_constants.ENDPOINT
    try:
        return huggingface_hub.HfApi().model_info(
            model.repo_id, revision=model.revision, timeout=timeout_s, files_metadata=True
        )
    except RevisionNotFoundError:
        raise HubError(f"{model.repo_id} has no revision {model.revision} on {endpoint}") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise HubError(
            f"{endpoint} has no repo {model.repo_id} that this token may read: check the name, "
            "or set HF_TOKEN to a token with access"
        ) from None
    except HfHubHTTPError as exc:
        raise _http_error(exc, endpoint) from None
    except requests.RequestException as exc:
        raise HubError(
            f"the hub at {endpoint} cannot be reached ({_reason(exc)}); "
            "check the network or set HF_ENDPOINT",
            environmental=True,
        ) from None


def _download(model: HubModel, info: huggingface_hub.ModelInfo, timeout_s: float) -> Path:
    """Every official file not yet in the cache, one after the other; the snapshot folder."""
    assert info.sha is not None
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    missing = [relpath for relpath in OFFICIAL_FILES if relpath not in sizes]
    if missing:
        raise HubError(
            f"{model} has no {', '.join(missing)}: not ChatTTS weights in the official layout"
        )
    snapshot = model.storage / "snapshots" / info.sha
    wanted = [relpath for relpath in OFFICIAL_FILES if not (snapshot / relpath).is_file()]
    _check_space(model, sum(sizes[relpath] for relpath in wanted))
    if info.sha != model.revision:
        _write_ref(model, info.sha)
    total = sum(sizes[relpath] for relpath in wanted)
    with _progress(model, total):
        for number, relpath in enumerate(wanted, 1):
            log.info(
                "--model %s: fetching %s (%.1f MB, %d of %d)",
                model,
                relpath,
                sizes[relpath] / _MB,
                number,
                len(wanted),
            )
            _download_file(model, info.sha, relpath, timeout_s)
    return snapshot


def _download_file(model: HubModel, commit: str, relpath: str, timeout_s: float) -> None:
    try:
        huggingface_hub.hf_hub_download(
            model.repo_id, relpath, revision=commit, etag_timeout=timeout_s
        )
    except OSError as exc:  # requests' and huggingface_hub's errors are OSErrors too
        raise _download_error(exc, relpath) from None


def _download_error(exc: OSError, relpath: str) -> HubError:
    endpoint = hf_constants.ENDPOINT
    # huggingface_hub reports a HEAD call that failed as LocalEntryNotFoundError from the cause.
    cause = exc.__cause__ if isinstance(exc, LocalEntryNotFoundError) else exc
    if isinstance(cause, HfHubHTTPError) and cause.response is not None:
        return _http_error(cause, endpoint)
    if isinstance(cause, requests.RequestException):
        return HubError(
            f"fetching {relpath} from {endpoint} failed ({_reason(cause)}); run again: the "
            "download resumes where it stopped",
            environmental=True,
        )
    if exc.errno is not None:
        return cache_error(exc)
    return HubError(f"fetching {relpath} from {endpoint} failed: {_reason(exc)}")


def cache_error(exc: OSError) -> HubError:
    """The cache folder itself failed (read-only, not ours, full)."""
    if exc.errno == errno.ENOSPC:
        return HubError(
            f"no space left on the device of the Hugging Face cache ({hf_constants.HF_HUB_CACHE})"
            ": free some, or point HF_HOME elsewhere; the next run resumes",
            environmental=True,
        )
    return HubError(
        f"the Hugging Face cache ({hf_constants.HF_HUB_CACHE}) cannot be written: "
        f"{exc.strerror or exc}; point HF_HOME (or HF_HUB_CACHE) at a folder of yours"
    )


def _http_error(exc: HfHubHTTPError, endpoint: str) -> HubError:
    status = exc.response.status_code if exc.response is not None else None
    if status in (401, 403):
        return HubError(
            f"{endpoint} refused the token ({status}): HF_TOKEN is wrong or has no access; "
            "fix it, or unset it for a public repo"
        )
    if status == 404:
        return HubError(f"{endpoint} answered 404 Not Found for {exc.response.url}")
    return HubError(f"the hub at {endpoint} answered {status}; try again later", environmental=True)


def _reason(exc: BaseException) -> str:
    """The innermost cause's words, without the stack of wrappers requests adds."""
    while exc.__context__ is not None and exc.__cause__ is None:
        exc = exc.__context__
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]


def _check_space(model: HubModel, needed_bytes: int) -> None:
    model.storage.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(model.storage).free
    if free < needed_bytes:
        raise HubError(
            f"no space left for {model}: it needs {needed_bytes / 1e9:.2f} GB in the Hugging "
            f"Face cache ({hf_constants.HF_HUB_CACHE}), {free / 1e9:.2f} GB is free; free some, "
            "or point HF_HOME elsewhere",
            environmental=True,
        )


def _write_ref(model: HubModel, commit: str) -> None:
    """refs/<branch> -> commit, as snapshot_download writes it, so the cache answers the branch
    when the hub cannot."""
    ref = model.storage / "refs" / model.revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)


def _checked(
    model: HubModel, snapshot: Path, sha256_map: Mapping[str, str], allow_unverified: bool
) -> Path:
    """`snapshot` once every file matches the map. A file that does not is removed from the
    cache (its link and its blob), so the next run fetches it again instead of serving it."""
    problems = [(relpath, check_file(snapshot, relpath, sha256_map)) for relpath in OFFICIAL_FILES]
    bad = [(relpath, problem) for relpath, problem in problems if problem is not None]
    if not bad:
        return snapshot
    listing = "; ".join(problem for _, problem in bad)
    if allow_unverified:
        log.warning("--model %s: loading UNVERIFIED files: %s", model, listing)
        return snapshot
    try:
        for relpath, _ in bad:
            _remove_from_cache(snapshot / relpath)
    except OSError as exc:  # a read-only cache: a volume filled elsewhere
        raise HubError(
            f"{model}: {listing} against the sha256 map; refused, and not removed from the "
            f"read-only cache ({exc.strerror}): fill it again"
        ) from None
    raise HubError(
        f"{model}: {listing} against the sha256 map; refused and removed from the cache "
        "(a next run fetches it again; --allow-unverified loads such files)"
    )


def _remove_from_cache(path: Path) -> None:
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


@contextmanager
def _progress(model: HubModel, total_bytes: int) -> Iterator[None]:
    """huggingface_hub's progress bars on a terminal; elsewhere a log line every few seconds
    with the bytes in the cache so far (its `.incomplete` files included)."""
    if sys.stderr.isatty():
        yield
        return
    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    stop = threading.Event()
    blobs = model.storage / "blobs"
    start = _blob_sizes(blobs)

    def report() -> None:
        while not stop.wait(_PROGRESS_EVERY_S):
            done = sum(size - start.get(name, 0) for name, size in _blob_sizes(blobs).items())
            log.info("--model %s: %.0f of %.0f MB", model, done / _MB, total_bytes / _MB)

    thread = threading.Thread(target=report, name="hub-progress", daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if not was_disabled:
            enable_progress_bars()
    log.info(
        "--model %s: fetched %.0f MB in %.0f s",
        model,
        total_bytes / _MB,
        time.monotonic() - started,
    )


def _blob_sizes(blobs: Path) -> dict[str, int]:
    """Bytes per file in the cache's blobs/ (a `.incomplete` one renamed meanwhile is skipped)."""
    sizes = {}
    for path in blobs.glob("*"):
        try:
            sizes[path.name] = path.stat().st_size
        except OSError:
            continue
    return sizes


def resolved(config: ModelConfig) -> ModelConfig:
    """`config` with `--model` fetched and checked: its snapshot folder as `model_dir`. With
    --dev-model-fallback and a cause in this machine's network or disk, no model instead (the
    dev model), saying why in one line. Raises HubError (a ModelLoadError)."""
    assert config.model is not None
    model = HubModel.parse(config.model)
    sha256_map = config_sha256_map(config)
    try:
        snapshot = fetch(model, sha256_map, config.hub_timeout_s, config.allow_unverified)
    except HubError as exc:
        if not (config.dev_model_fallback and exc.environmental):
            raise
        log.warning(
            "--model %s: %s; serving the RANDOM-WEIGHT dev model instead", model.repo_id, exc
        )
        return replace(config, model=None, dev_model_fallback=False)
    return replace(config, model=None, model_dir=snapshot, model_dir_checked=True)
