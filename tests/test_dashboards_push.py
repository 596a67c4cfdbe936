"""`foreshock dashboards push` against a local server that checks requests as Grafana's API does.

No Grafana server can run here, so the fake below enforces the parts of the contract a push
relies on (Grafana HTTP API docs, /api/folders and /api/dashboards/db):

- every request carries ``Authorization: Bearer <token>``; a wrong or missing token is 401;
- ``GET /api/folders/<uid>`` is 404 for an unknown folder, ``POST /api/folders`` takes
  ``{title, uid}`` and is 409 when the uid exists;
- ``POST /api/dashboards/db`` takes ``{dashboard, folderUid, overwrite, message?}`` with a JSON
  content type; the dashboard needs ``uid`` and ``title``, its ``id`` must be null or absent for a
  new uid; the folder must exist (400); when the stored version differs from the posted one and
  ``overwrite`` is false it answers 412 ``version-mismatch``; otherwise it stores the dashboard
  with version + 1 and answers ``{id, uid, url, status, version, slug}``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.dashboards.generate import load_dashboards
from foreshock.dashboards.push import PushError, push_dashboards

TOKEN = "glsa_test_0123456789abcdef"
EXPECTED_UIDS = {"foreshock-fleet", "foreshock-gpu", "foreshock-fabric", "foreshock-incidents", "foreshock-pipeline"}


@dataclass
class FakeGrafana:
    url: str
    token: str = TOKEN
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> {dashboard, folderUid, version}
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    state = FakeGrafana(url=f"http://127.0.0.1:{server.server_address[1]}")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = None
            if raw:
                if not self.headers.get("Content-Type", "").startswith("application/json"):
                    state.violations.append(f"{method} {self.path}: body without JSON content type")
                    return self._reply(415, {"message": "unsupported content type"})
                body = json.loads(raw)
            with lock:
                state.requests.append((method, self.path, dict(self.headers), body))
                if self.headers.get("Authorization") != f"Bearer {state.token}":
                    return self._reply(401, {"message": "Invalid API key"})
                return self._route(method, body)

        def _route(self, method: str, body: Any) -> None:
            path = self.path.split("?")[0]
            if method == "GET" and path.startswith("/api/folders/"):
                uid = path.rsplit("/", 1)[1]
                if uid not in state.folders:
                    return self._reply(404, {"message": "folder not found", "status": "not-found"})
                return self._reply(200, state.folders[uid])
            if method == "POST" and path == "/api/folders":
                if not isinstance(body, dict) or not body.get("title"):
                    return self._reply(400, {"message": "folder title cannot be empty"})
                uid = body.get("uid") or f"auto{len(state.folders)}"
                if uid in state.folders:
                    return self._reply(409, {"message": "a folder with the same uid already exists"})
                state.folders[uid] = {"id": len(state.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
                return self._reply(200, state.folders[uid])
            if method == "POST" and path == "/api/dashboards/db":
                return self._post_dashboard(body)
            state.violations.append(f"unexpected {method} {path}")
            return self._reply(404, {"message": "Not found"})

        def _post_dashboard(self, body: Any) -> None:
            if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
                return self._reply(400, {"message": "bad request data"})
            unknown = set(body) - {"dashboard", "folderUid", "folderId", "overwrite", "message"}
            if unknown:
                state.violations.append(f"unknown payload keys {sorted(unknown)}")
            board = body["dashboard"]
            uid, title = board.get("uid"), board.get("title")
            if not uid or not title:
                return self._reply(400, {"message": "Dashboard title cannot be empty"})
            folder = body.get("folderUid", "")
            if folder and folder not in state.folders:
                return self._reply(400, {"message": "folder not found"})
            stored = state.dashboards.get(uid)
            if stored is None and board.get("id") is not None:
                return self._reply(404, {"message": "Dashboard not found"})
            if stored is not None and not body.get("overwrite", False) and board.get("version") != stored["version"]:
                return self._reply(412, {"message": "The dashboard has been changed by someone else",
                                         "status": "version-mismatch"})
            version = (stored["version"] if stored else 0) + 1
            state.dashboards[uid] = {"dashboard": board, "folderUid": folder, "version": version}
            slug = title.lower().replace(" ", "-").replace("/", "")
            return self._reply(200, {"id": len(state.dashboards), "uid": uid, "url": f"/d/{uid}/{slug}",
                                     "status": "success", "version": version, "slug": slug})

        def do_GET(self) -> None:  # noqa: N802
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._handle("PUT")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def boards() -> dict[str, dict[str, Any]]:
    return load_dashboards()


def test_push_creates_folder_then_every_dashboard(grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    pushed = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock")
    assert {p.uid for p in pushed} == EXPECTED_UIDS
    assert grafana.folders["foreshock"]["title"] == "foreshock"
    assert set(grafana.dashboards) == EXPECTED_UIDS
    for uid, stored in grafana.dashboards.items():
        assert stored["folderUid"] == "foreshock"
        assert stored["dashboard"]["panels"] == boards[uid]["panels"]
        assert stored["dashboard"]["id"] is None
    posts = [r for r in grafana.requests if r[1] == "/api/dashboards/db"]
    assert len(posts) == 5 and all(r[3]["overwrite"] is True for r in posts)
    assert all(r[2].get("Authorization") == f"Bearer {TOKEN}" for r in grafana.requests)
    assert grafana.violations == []


def test_push_reuses_an_existing_folder_and_overwrites(grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock")
    again = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock")
    assert {p.version for p in again} == {2}
    assert [r for r in grafana.requests if r[0] == "POST" and r[1] == "/api/folders"].__len__() == 1
    assert grafana.violations == []


def test_version_conflict_without_overwrite_is_reported(grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)  # new: version 1
    grafana.dashboards["foreshock-gpu"]["version"] += 1  # someone edits it in Grafana
    with pytest.raises(PushError, match="412.*--overwrite"):
        push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)
    pushed = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=True)
    assert {p.uid: p.version for p in pushed}["foreshock-gpu"] == 3


def test_wrong_token_is_401_and_the_token_is_never_shown(grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    wrong = "glsa_wrong_token_do_not_print"
    with pytest.raises(PushError) as info:
        push_dashboards(grafana.url, wrong, boards, "foreshock", "foreshock")
    assert "401" in str(info.value)
    assert wrong not in str(info.value)
    assert grafana.dashboards == {}


def test_cli_reads_the_token_from_env_and_never_prints_it(grafana: FakeGrafana, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    runner = CliRunner()
    result = runner.invoke(cli, ["-vv", "dashboards", "push", "--url", grafana.url],
                           env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    assert set(grafana.dashboards) == EXPECTED_UIDS
    assert TOKEN not in result.output
    assert TOKEN not in caplog.text


def test_cli_token_file_and_wrong_token(grafana: FakeGrafana, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    token_file = tmp_path / "token"
    token_file.write_text("glsa_wrong_token_in_file\n")
    token_file.chmod(0o600)
    runner = CliRunner()
    result = runner.invoke(cli, ["-vv", "dashboards", "push", "--url", grafana.url, "--token-file", str(token_file)],
                           env={"FORESHOCK_GRAFANA_TOKEN": ""})
    assert result.exit_code == 1
    assert "401" in result.output
    assert "glsa_wrong_token_in_file" not in result.output + caplog.text
    token_file.write_text(TOKEN + "\n")
    result = runner.invoke(cli, ["dashboards", "push", "--url", grafana.url + "/", "--token-file", str(token_file),
                                 "--no-overwrite"], env={"FORESHOCK_GRAFANA_TOKEN": ""})
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output


def test_cli_refuses_without_a_token_and_has_no_token_option(grafana: FakeGrafana) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["dashboards", "push", "--url", grafana.url], env={"FORESHOCK_GRAFANA_TOKEN": ""})
    assert result.exit_code == 2 and "FORESHOCK_GRAFANA_TOKEN" in result.output
    result = runner.invoke(cli, ["dashboards", "push", "--url", grafana.url, "--token", TOKEN])
    assert result.exit_code == 2 and "No such option" in result.output
    assert grafana.requests == []


def test_credentials_in_the_url_are_refused(grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    url = grafana.url.replace("http://", "http://admin:secret@")
    with pytest.raises(PushError, match="FORESHOCK_GRAFANA_TOKEN") as info:
        push_dashboards(url, TOKEN, boards, "foreshock", "foreshock")
    assert "secret" not in str(info.value)
