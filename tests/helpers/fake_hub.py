"""A local imitation of the Hugging Face hub over HTTP on 127.0.0.1: the endpoints the real
`huggingface_hub` client calls to fetch a repo (point HF_ENDPOINT at `FakeHub.url`).

- GET /api/models/{repo}/revision/{rev}: the commit and the file list (404 with X-Error-Code
  RevisionNotFound for an unknown revision, as the hub answers);
- HEAD and GET /{repo}/resolve/{rev}/{path}: X-Repo-Commit, ETag, Content-Length, and a Range
  request answered 206 from its offset, so a cut download resumes;
- 401 "Invalid credentials in Authorization header" to a bearer token other than `token`.

Faults a test switches on: `cut_once` (the first GET of a file sends half its body, then closes
the connection), `served` (bytes to serve for a file instead of its own, e.g. tampered ones) and
`declared_sizes` (sizes the file list claims). Every request is kept in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Seen:
    """One request the imitation answered."""

    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """`repo_id` at one commit (`COMMIT`, also reachable as `main`), its files read from
    `files` (path in the repo -> bytes)."""

    def __init__(self, repo_id: str, files: dict[str, bytes], token: str | None = None) -> None:
        self.repo_id = repo_id
        self.files = files
        self.token = token
        self.cut_once: set[str] = set()
        self.served: dict[str, bytes] = {}
        self.declared_sizes: dict[str, int] = {}
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """The hub goes away: its port refuses connections from now on."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(10)
        self._server.server_close()

    def downloads(self) -> list[str]:
        """The repo paths fetched with GET, in order."""
        return [unquote(s.path.split("/resolve/", 1)[1].split("/", 1)[1]) for s in self.gets()]

    def gets(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.requests if s.method == "GET" and "/resolve/" in s.path]

    def content(self, path: str) -> bytes:
        return self.served.get(path, self.files[path])

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    info = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/?]+)$")
    resolve = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = urlsplit(self.path).path
            hub.record(
                Seen(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                )
            )
            if hub.token is not None and self.headers.get("Authorization") not in (
                None,
                f"Bearer {hub.token}",
            ):
                return self._error(401, None, "Invalid credentials in Authorization header")
            if m := info.match(path):
                return self._info(m["repo"], unquote(m["rev"]))
            if m := resolve.match(path):
                return self._file(m["repo"], unquote(m["rev"]), unquote(m["path"]), body)
            return self._error(404, None, "Not found")

        def _known(self, repo: str, rev: str) -> bool:
            if repo != hub.repo_id:
                self._error(404, "RepoNotFound", "Repository not found")
                return False
            if rev not in (COMMIT, "main"):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return False
            return True

        def _info(self, repo: str, rev: str) -> None:
            if not self._known(repo, rev):
                return
            siblings = [
                {"rfilename": name, "size": hub.declared_sizes.get(name, len(data))}
                for name, data in sorted(hub.files.items())
            ]
            payload = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _file(self, repo: str, rev: str, name: str, body: bool) -> None:
            if not self._known(repo, rev):
                return
            if name not in hub.files:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            data = hub.content(name)
            start = 0
            if m := re.match(r"bytes=(\d+)-$", self.headers.get("Range") or ""):
                start = int(m[1])
            part = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(part)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            if name in hub.cut_once:
                hub.cut_once.discard(name)
                self.wfile.write(part[: len(part) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(part)

        def _error(self, status: int, code: str | None, message: str) -> None:
            payload = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def repo_files(model_dir: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """A repo holding the model folder's files (its `asset/` tree) and `extra` ones."""
    files = {
        str(p.relative_to(model_dir)): p.read_bytes()
        for p in (model_dir / "asset").rglob("*")
        if p.is_file()
    }
    return {**files, **(extra or {})}


def sha256_map(files: dict[str, bytes]) -> dict[str, str]:
    """The map in ChatTTS's format (sha256_asset_gpt_config_json) of the repo's asset files."""
    return {
        "sha256_" + name.replace("/", "_").replace(".", "_"): hashlib.sha256(data).hexdigest()
        for name, data in files.items()
        if name.startswith("asset/")
    }
