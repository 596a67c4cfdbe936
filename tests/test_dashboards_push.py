"""`foreshock dashboards push` against a local server that checks requests as Grafana's API does.

No Grafana server can run here, so the fake below enforces the parts of the contract a push
relies on (Grafana HTTP API docs, /api/folders and /api/dashboards/db):

- every request carries ``Authorization: Bearer <token>``; a wrong or missing token is 401;
- ``GET /api/folders/<uid>`` is 404 for an unknown folder, ``POST /api/folders`` takes
  ``{title, uid}`` and is 409 when the uid or the title exists;
- ``POST /api/dashboards/db`` takes ``{dashboard, folderUid, overwrite, message?}`` with a JSON
  content type; the dashboard needs ``uid`` and ``title``, its ``id`` must be null or absent for a
  new uid; the folder must exist (400); when the stored version differs from the posted one and
  ``overwrite`` is false it answers 412 ``version-mismatch``; otherwise it stores the dashboard
  with version + 1 and answers ``{id, uid, url, status, version, slug}``; each save adds an entry
  ``{version, createdBy, message}`` to the dashboard's history;
- ``GET /api/dashboards/uid/<uid>`` answers ``{dashboard, meta}`` (404 for an unknown uid) and
  ``GET /api/dashboards/uid/<uid>/versions?limit=N`` the newest N history entries: a bare list as
  Grafana 9-11 answer it, or ``{continueToken, versions}`` as Grafana 12 does (``wrapped_versions``);
- over https when the fixture is ``tls_grafana`` (the test certificate of tests/data/redfish);
- on the IPv6 loopback when made with ``host="::1"``;
- with ``page`` set, something else answers at that URL (an SSO proxy's login page, Grafana's
  own HTML 404 page for a path outside /api): every request gets that HTML page and status.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

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
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # uid -> saves, oldest first
    wrapped_versions: bool = False
    page: tuple[int, str] | None = None  # (status, HTML) answered to every request instead

    def edit(self, uid: str, by: str = "admin") -> None:
        """Someone saves the dashboard in Grafana's UI (no version message)."""
        stored = self.dashboards[uid]
        stored["version"] += 1
        stored["dashboard"] = {**stored["dashboard"], "version": stored["version"]}
        self.history[uid].append({"version": stored["version"], "createdBy": by, "message": ""})


CERTS = Path(__file__).parent / "data" / "redfish"  # a throwaway self-signed CA certificate for 127.0.0.1


class _Ipv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@contextmanager
def fake_grafana(tls: bool = False, host: str = "127.0.0.1") -> Iterator[FakeGrafana]:
    server = (_Ipv6Server if ":" in host else ThreadingHTTPServer)((host, 0), BaseHTTPRequestHandler)
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(CERTS / "bmc-cert.pem", CERTS / "bmc-key.pem")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls else "http"
    authority = f"[{host}]" if ":" in host else host
    state = FakeGrafana(url=f"{scheme}://{authority}:{server.server_address[1]}")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _reply_page(self, status: int, html: str) -> None:
            data = html.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = None
            if raw and method == "GET":
                state.violations.append(f"GET {self.path} with a body (Grafana reads query parameters)")
            if raw:
                if not self.headers.get("Content-Type", "").startswith("application/json"):
                    state.violations.append(f"{method} {self.path}: body without JSON content type")
                    return self._reply(415, {"message": "unsupported content type"})
                body = json.loads(raw)
            with lock:
                state.requests.append((method, self.path, dict(self.headers), body))
                if state.page is not None:
                    return self._reply_page(*state.page)
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
                if any(f["title"] == body["title"] for f in state.folders.values()):
                    return self._reply(409, {"message": "a folder or dashboard in the general folder with the same "
                                                        "name already exists"})
                state.folders[uid] = {"id": len(state.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
                return self._reply(200, state.folders[uid])
            if method == "POST" and path == "/api/dashboards/db":
                return self._post_dashboard(body)
            if method == "GET" and path.startswith("/api/dashboards/uid/"):
                uid, _, rest = path[len("/api/dashboards/uid/"):].partition("/")
                stored = state.dashboards.get(uid)
                if stored is None:
                    return self._reply(404, {"message": "Dashboard not found", "status": "not-found"})
                if rest == "versions":
                    query = parse_qs(urlparse(self.path).query)
                    limit = int(query.get("limit", ["1000"])[0])
                    newest = [{"uid": uid, **entry} for entry in reversed(state.history[uid])][:limit]
                    return self._reply(200, {"continueToken": "", "versions": newest} if state.wrapped_versions
                                       else newest)
                if rest == "":
                    return self._reply(200, {"dashboard": stored["dashboard"],
                                             "meta": {"version": stored["version"], "folderUid": stored["folderUid"]}})
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
            same_title = [u for u, d in state.dashboards.items()
                          if u != uid and d["folderUid"] == folder and d["dashboard"].get("title") == title]
            if same_title and not body.get("overwrite", False):
                return self._reply(412, {"message": "A dashboard with the same name in the folder already exists",
                                         "status": "name-exists"})
            if stored is None and board.get("id") is not None:
                return self._reply(404, {"message": "Dashboard not found"})
            if stored is not None and not body.get("overwrite", False) and board.get("version") != stored["version"]:
                return self._reply(412, {"message": "The dashboard has been changed by someone else",
                                         "status": "version-mismatch"})
            version = (stored["version"] if stored else 0) + 1
            state.dashboards[uid] = {"dashboard": {**board, "version": version}, "folderUid": folder,
                                     "version": version}
            state.history.setdefault(uid, []).append(
                {"version": version, "createdBy": "sa-foreshock", "message": body.get("message", "")})
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
def grafana() -> Iterator[FakeGrafana]:
    with fake_grafana() as state:
        yield state


@pytest.fixture
def tls_grafana() -> Iterator[FakeGrafana]:
    with fake_grafana(tls=True) as state:
        yield state


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
    grafana.edit("foreshock-gpu")  # someone edits it in Grafana
    with pytest.raises(PushError, match="'foreshock-gpu'.*saved in Grafana by admin.*--overwrite"):
        push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)
    assert grafana.dashboards["foreshock-gpu"]["version"] == 2  # the edit survives
    pushed = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=True)
    assert {p.uid: p.version for p in pushed}["foreshock-gpu"] == 3


@pytest.mark.parametrize("wrapped_versions", [False, True], ids=["grafana-11", "grafana-12"])
def test_pushes_without_overwrite_replace_what_foreshock_pushed(grafana: FakeGrafana, boards: dict[str, dict[str, Any]],
                                                                 wrapped_versions: bool) -> None:
    # the generated JSON always says version 1: posted as is, the third push was refused (412)
    # although nobody had touched the dashboards in Grafana
    grafana.wrapped_versions = wrapped_versions
    for push in range(1, 4):
        pushed = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)
        assert {p.version for p in pushed} == {push}
    assert grafana.violations == []
    grafana.edit("foreshock-fleet", by="alice")
    with pytest.raises(PushError, match="'foreshock-fleet'.*version 4 was saved in Grafana by alice"):
        push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)


def test_a_title_taken_by_another_dashboard_is_not_called_an_edit(grafana: FakeGrafana,
                                                                  boards: dict[str, dict[str, Any]]) -> None:
    grafana.folders["foreshock"] = {"id": 1, "uid": "foreshock", "title": "foreshock", "version": 1}
    grafana.dashboards["hand-made"] = {"dashboard": {"uid": "hand-made", "title": "foreshock / GPU detail"},
                                       "folderUid": "foreshock", "version": 1}
    with pytest.raises(PushError, match="same title.*name-exists") as info:
        push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", overwrite=False)
    assert "changed in Grafana" not in str(info.value)


def test_a_folder_title_taken_under_another_uid_says_what_to_do(grafana: FakeGrafana,
                                                                 boards: dict[str, dict[str, Any]]) -> None:
    grafana.folders["ops1"] = {"id": 1, "uid": "ops1", "title": "foreshock", "version": 1}  # made by hand
    with pytest.raises(PushError, match="409.*titled 'foreshock' exists with another uid.*--folder-uid"):
        push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock")
    pushed = push_dashboards(grafana.url, TOKEN, boards, "ops1", "foreshock")
    assert len(pushed) == 5 and {d["folderUid"] for d in grafana.dashboards.values()} == {"ops1"}


def test_unreachable_grafana_is_a_message_not_a_traceback(boards: dict[str, dict[str, Any]]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(PushError, match=f"cannot reach Grafana at {url}.*refused"):
        push_dashboards(url, TOKEN, boards, "foreshock", "foreshock", timeout=5)
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", url, "--timeout", "5"],
                                env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 1 and "cannot reach Grafana" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_https_grafana_with_a_private_ca(tls_grafana: FakeGrafana, boards: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(PushError, match="TLS certificate .* not trusted .*--ca-file") as info:
        push_dashboards(tls_grafana.url, TOKEN, boards, "foreshock", "foreshock", timeout=5)
    assert TOKEN not in str(info.value)
    pushed = push_dashboards(tls_grafana.url, TOKEN, boards, "foreshock", "foreshock", timeout=5,
                             ca_file=CERTS / "bmc-cert.pem")
    assert {p.uid for p in pushed} == EXPECTED_UIDS
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", tls_grafana.url, "--ca-file",
                                      str(CERTS / "bmc-cert.pem")], env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    assert tls_grafana.violations == []


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


@pytest.mark.parametrize("extra", ["\n# service account foreshock-push", "\x00", " second-token", "\u00e9"])
def test_a_token_with_a_second_line_or_a_control_character_is_refused_unshown(
        grafana: FakeGrafana, tmp_path: Path, extra: str) -> None:
    """A token file holding the token and a comment line: the HTTP client refused the header and
    its message, the whole header value included, reached stderr as "cannot reach Grafana"."""
    secret = "glsa_SECRETTOKEN123"
    token_file = tmp_path / "token"
    token_file.write_text(secret + extra + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", grafana.url, "--token-file", str(token_file)],
                                env={"FORESHOCK_GRAFANA_TOKEN": ""})
    assert result.exit_code == 1
    assert "token holds" in result.output and "cannot reach" not in result.output
    assert secret not in result.output and grafana.requests == []


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


# a page of the size of Grafana's own or an SSO proxy's: its body is what buried the message
LOGIN_PAGE = ("<!DOCTYPE html><html><head><title>Sign in - Example SSO</title></head><body>"
              + "<div>" * 500 + "Sign in with your company account" + "</div>" * 500 + "</body></html>")


@pytest.mark.parametrize("status", [200, 404], ids=["login-page-200", "html-404"])
def test_a_page_that_is_not_grafanas_api_is_a_short_message(grafana: FakeGrafana, boards: dict[str, dict[str, Any]],
                                                             status: int) -> None:
    # 200: an SSO proxy's login page after a redirect, or another app at that path (the push failed
    # with an AttributeError on the page's text); 404: Grafana's HTML page for a path outside /api
    # (a wrong sub-path in --url), read as "no such folder", then the whole page in the error
    grafana.page = (status, LOGIN_PAGE)
    with pytest.raises(PushError, match="non-JSON page titled 'Sign in - Example SSO'.*check --url") as info:
        push_dashboards(grafana.url + "/wrong", TOKEN, boards, "foreshock", "foreshock")
    assert len(str(info.value)) < 300 and "<div>" not in str(info.value)
    assert [r[0] for r in grafana.requests] == ["GET"]  # nothing posted on the strength of a page
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", grafana.url], env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "non-JSON page titled 'Sign in - Example SSO'" in result.output and len(result.output) < 400


def test_credentials_in_a_url_without_scheme_are_never_echoed() -> None:
    url = "admin:S3cretPassw0rd@grafana:3000"
    with pytest.raises(PushError, match="not an http\\(s\\) URL") as info:
        push_dashboards(url, TOKEN, {}, "foreshock", "foreshock")
    assert "S3cret" not in str(info.value) and "grafana:3000" in str(info.value)
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", url], env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 1 and "S3cret" not in result.output


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_push_to_an_ipv6_literal(boards: dict[str, dict[str, Any]]) -> None:
    # grafana-client built its URL from the host name, without the brackets: http://::1:PORT/api,
    # which no request could be made to
    with fake_grafana(host="::1") as grafana:
        assert grafana.url.startswith("http://[::1]:")
        pushed = push_dashboards(grafana.url, TOKEN, boards, "foreshock", "foreshock", timeout=5)
        assert {p.uid for p in pushed} == EXPECTED_UIDS
        assert grafana.violations == []


@pytest.mark.parametrize("url", ["http://grafana:99999", "http://grafana:30OO"])
def test_a_bad_port_is_a_message_not_a_traceback(url: str) -> None:
    with pytest.raises(PushError, match="bad port in"):
        push_dashboards(url, TOKEN, {}, "foreshock", "foreshock")
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", url], env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "bad port in" in result.output


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_a_finite_number_of_seconds_above_zero(grafana: FakeGrafana, timeout: str) -> None:
    result = CliRunner().invoke(cli, ["dashboards", "push", "--url", grafana.url, "--timeout", timeout],
                                env={"FORESHOCK_GRAFANA_TOKEN": TOKEN})
    assert result.exit_code == 2 and "--timeout" in result.output, (result.output, result.exception)
    assert grafana.requests == []
    with pytest.raises(PushError, match="timeout"):
        push_dashboards(grafana.url, TOKEN, {}, "foreshock", "foreshock", timeout=float(timeout))
