"""Push the generated dashboards to a Grafana server through its HTTP API (grafana-client).

The token is passed in by the caller (the CLI reads it from ``FORESHOCK_GRAFANA_TOKEN`` or a
file) and is never logged nor put in an error message: grafana-client sends it as
``Authorization: Bearer <token>``. Dashboards go into one folder, created if missing, with
``POST /api/dashboards/db`` and ``{dashboard, folderUid, overwrite}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse, urlunparse

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError

log = logging.getLogger("foreshock.dashboards")


class PushError(RuntimeError):
    """Grafana refused the push; the message says why and never contains the token."""


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    version: int
    url: str


def _normalise_url(url: str) -> str:
    # grafana-client appends "api" to the URL path as is: "/grafana" must become "/grafana/"
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"not an http(s) URL: {url!r}")
    if parts.username or parts.password:
        raise PushError("put the credentials in FORESHOCK_GRAFANA_TOKEN or --token-file, not in the URL")
    path = parts.path if parts.path.endswith("/") or not parts.path else parts.path + "/"
    return urlunparse(parts._replace(path=path))


def _explain(exc: GrafanaException, what: str) -> PushError:
    if isinstance(exc, GrafanaUnauthorizedError):
        return PushError(f"{what}: Grafana rejected the token (401 Unauthorized)")
    status = getattr(exc, "status_code", 0)
    response = getattr(exc, "response", None)
    message = response.get("message", "") if isinstance(response, dict) else ""
    if status == 403:
        return PushError(f"{what}: the token lacks permission (403): {message}")
    if status == 412:
        return PushError(f"{what}: the dashboard changed in Grafana since it was generated (412 {message}); "
                         "push with --overwrite to replace it")
    return PushError(f"{what}: Grafana answered {status or 'nothing'}: {message or exc.message}")


def _client(url: str, token: str, timeout: float) -> GrafanaApi:
    if not token or not token.strip():
        raise PushError("empty Grafana token")
    api: GrafanaApi = GrafanaApi.from_url(_normalise_url(url), credential=token.strip(), timeout=timeout)
    return api


def ensure_folder(api: GrafanaApi, uid: str, title: str) -> str:
    """The folder's UID, creating the folder when Grafana has none with that UID."""
    try:
        api.folder.get_folder(uid)
        return uid
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise _explain(exc, f"looking up folder {uid!r}") from None
    except GrafanaException as exc:
        raise _explain(exc, f"looking up folder {uid!r}") from None
    try:
        created = api.folder.create_folder(title, uid=uid)
    except GrafanaException as exc:
        raise _explain(exc, f"creating folder {uid!r}") from None
    log.info("created Grafana folder %s (%s)", title, uid)
    return str(created.get("uid", uid))


def push_dashboards(url: str, token: str, boards: dict[str, dict[str, Any]], folder_uid: str,
                    folder_title: str, overwrite: bool = True, timeout: float = 10.0) -> list[Pushed]:
    """Create or update every dashboard in ``boards`` (keyed by UID) inside one folder."""
    api = _client(url, token, timeout)
    folder = ensure_folder(api, folder_uid, folder_title)
    pushed = []
    for uid, board in boards.items():
        # id null: Grafana matches on uid; "version" lets it detect edits made since generation
        payload = {"dashboard": {**board, "id": None}, "folderUid": folder, "overwrite": overwrite,
                   "message": "foreshock dashboards push"}
        try:
            result = api.dashboard.update_dashboard(payload)
        except GrafanaException as exc:
            raise _explain(exc, f"pushing dashboard {uid!r}") from None
        pushed.append(Pushed(uid=str(result.get("uid", uid)), title=str(board.get("title", uid)),
                             version=int(result.get("version", 0)), url=str(result.get("url", ""))))
        log.info("pushed dashboard %s (version %s)", uid, result.get("version"))
    return pushed
