"""Push the generated dashboards to a Grafana server through its HTTP API (grafana-client).

The token is passed in by the caller (the CLI reads it from ``FORESHOCK_GRAFANA_TOKEN`` or a
file) and is never logged nor put in an error message: grafana-client sends it as
``Authorization: Bearer <token>``. Dashboards go into one folder, created if missing, with
``POST /api/dashboards/db`` and ``{dashboard, folderUid, overwrite, message}``.

Without ``overwrite`` a dashboard is replaced only when the last change Grafana holds is a
push of foreshock's (its version message is :data:`PUSH_MESSAGE`): the generated JSON always
carries version 1, so posting it as is would pass Grafana's version check only until the
second push, and an edit made in Grafana would be told from a previous push by nothing.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse, urlunparse

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaTimeoutError, GrafanaUnauthorizedError
from niquests.exceptions import InvalidJSONError, RequestException, SSLError

log = logging.getLogger("foreshock.dashboards")

PUSH_MESSAGE = "foreshock dashboards push"
"""The version message of every push: how a push without overwrite recognises its own versions."""


class PushError(RuntimeError):
    """Grafana refused the push; the message says why and never contains the token. ``status`` is
    Grafana's HTTP status (0 when it did not answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    version: int
    url: str


def _shown(url: str) -> str:
    """``url`` as a message may show it: whatever precedes its last ``@`` after the scheme cut, for
    that is where credentials go, and a URL that does not parse (no scheme: ``admin:pw@grafana``)
    still carries them there."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "…@" + rest.rsplit("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def _normalise_url(url: str) -> str:
    # grafana-client appends "api" to the URL path as is: "/grafana" must become "/grafana/"
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"not an http(s) URL: {_shown(url)!r}")
    if "@" in parts.netloc:
        raise PushError("put the credentials in FORESHOCK_GRAFANA_TOKEN or --token-file, not in the URL")
    try:
        parts.port  # parsed on access: a port out of range or not a number raises
    except ValueError as exc:
        raise PushError(f"bad port in {_shown(url)!r}: {exc}") from None
    path = parts.path if parts.path.endswith("/") or not parts.path else parts.path + "/"
    return urlunparse(parts._replace(path=path))


def _api_url(url: str) -> str:
    """The base of Grafana's HTTP API under ``url`` (normalised), as grafana-client builds it, but
    from the URL's own host: grafana-client builds it from the host *name*, which loses an IPv6
    literal's brackets (``http://::1:3000/api``: no request could be made)."""
    parts = urlparse(url)
    return urlunparse(parts._replace(path=(parts.path or "/") + "api", params="", query="", fragment=""))


def _not_the_api(url: str, answered: str, page: object) -> str:
    """What a message says of an answer that is not Grafana's API (an SSO login page after a
    redirect, a proxy's page, another app's at that path): an HTML page by its title, other text
    by its start on one line (the whole page, thousands of characters, buried the message)."""
    if page is not None and not isinstance(page, str):  # JSON, but not the object Grafana answers
        return f"{url} answered {answered}with JSON that is not Grafana's API (another app at that path?): check --url"
    text = page or ""
    title = re.search(r"<title[^>]*>([^<]*)</title", text, re.IGNORECASE)
    flat = " ".join((title.group(1) if title else text).split())
    shown = repr(flat if len(flat) <= 120 else flat[:120] + "…")
    which = f" titled {shown}" if title else f": {shown}" if flat else ""
    return f"{url} answered {answered}with a non-JSON page{which} (a login page or a proxy?): check --url"


_PRECONDITION = {  # Grafana's 412 answers to POST /api/dashboards/db, by their "status"
    "version-mismatch": "the dashboard was changed in Grafana since (412 version-mismatch); "
                        "push with --overwrite to replace it",
    "name-exists": "another dashboard in the folder has the same title (412 name-exists); "
                   "rename or delete it in Grafana",
    "plugin-dashboard": "a plugin's dashboard has this uid (412 plugin-dashboard)",
}


def _explain(exc: GrafanaException, what: str, url: str) -> PushError:
    status = int(getattr(exc, "status_code", 0) or 0)
    if isinstance(exc, GrafanaUnauthorizedError):
        return PushError(f"{what}: Grafana rejected the token (401 Unauthorized)", status)
    if isinstance(exc, GrafanaTimeoutError):
        return PushError(f"{what}: Grafana did not answer in time (--timeout)")
    response = getattr(exc, "response", None)
    if status and not isinstance(response, dict):  # a page from something else than Grafana's API
        return PushError(f"{what}: {_not_the_api(url, f'{status} ', response)}", status)
    message = response.get("message", "") if isinstance(response, dict) else ""
    if status == 403:
        return PushError(f"{what}: the token lacks permission (403): {message}", status)
    if status == 412:
        reason = response.get("status", "") if isinstance(response, dict) else ""
        return PushError(f"{what}: " + _PRECONDITION.get(reason, f"Grafana refused it (412 {reason}): {message}"),
                         status)
    return PushError(f"{what}: Grafana answered {status or 'nothing'}: {message or exc.message}", status)


def _transport(exc: RequestException, what: str, url: str) -> PushError:
    """A request that got no HTTP answer (refused, DNS, TLS): the cause, without a traceback."""
    text = str(exc)
    if isinstance(exc, SSLError):
        found = re.search(r"certificate verify failed: ([^(']+)", text)
        reason = found.group(1).strip() if found else text
        return PushError(f"{what}: TLS certificate of {url} not trusted ({reason}); pass --ca-file with the "
                         "CA certificate that signed it")
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return PushError(f"{what}: cannot reach Grafana at {url}: {found.group(1) if found else text}")


# what a Grafana service-account token or API key is made of (glsa_..., base64): printable ASCII
_TOKEN_CHARACTERS = re.compile(r"[!-~]+")


class _Grafana:
    """grafana-client calls whose every failure becomes a :class:`PushError`."""

    def __init__(self, url: str, token: str, timeout: float, ca_file: Path | None) -> None:
        if not token or not token.strip():
            raise PushError("empty Grafana token")
        if not _TOKEN_CHARACTERS.fullmatch(token.strip()):
            # a second line (a comment, another secret) or a control character: the HTTP client
            # refuses the header with its whole value in the message, which then reached stderr
            raise PushError("the Grafana token holds a space, a line break or a character outside printable "
                            "ASCII: give the token alone (its value is not shown here)")
        self._token = token.strip()
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise PushError(f"the timeout must be a number of seconds above 0, not {timeout!r}")
        self.url = _normalise_url(url)
        self.api: GrafanaApi = GrafanaApi.from_url(self.url, credential=self._token, timeout=timeout)
        self.api.client.url = _api_url(self.url)
        if ca_file is not None:
            self.api.client.verify = str(ca_file)

    def call(self, what: str, fn: Callable[..., Any], *args: Any,
             answer: type | tuple[type, ...] = dict, **kw: Any) -> Any:
        """``fn(*args, **kw)``'s answer, which must be an ``answer`` (Grafana's API answers a JSON
        object): grafana-client hands back an HTML page (an SSO login page after a redirect, a
        proxy's or another app's page at that path) as a string, which the push then failed on."""
        try:
            result = fn(*args, **kw)
        except GrafanaException as exc:
            raise _explain(exc, what, self.url) from None
        except InvalidJSONError:  # a body that is no JSON, not labelled as text
            raise PushError(f"{what}: {_not_the_api(self.url, '', None)}") from None
        except RequestException as exc:
            error = _transport(exc, what, self.url)
            # the client's own text can quote the request (its headers); never the token
            raise PushError(str(error).replace(self._token, "<token>"), error.status) from None
        if not isinstance(result, answer):
            raise PushError(f"{what}: {_not_the_api(self.url, '', result)}")
        return result

    def find(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``'s answer, or None when Grafana answers 404."""
        return self.call(what, _none_if_missing, fn, *args, answer=(dict, type(None)))


def _none_if_missing(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except GrafanaClientError as exc:
        # Grafana's API says "not found" in JSON; a 404 page (a wrong path before /api) is no answer
        if exc.status_code == 404 and isinstance(exc.response, dict):
            return None
        raise


def ensure_folder(grafana: _Grafana, uid: str, title: str) -> str:
    """The folder's UID, creating the folder when Grafana has none with that UID."""
    if grafana.find(f"looking up folder {uid!r}", grafana.api.folder.get_folder, uid) is not None:
        return uid
    try:
        created = grafana.call(f"creating folder {uid!r}", grafana.api.folder.create_folder, title, uid=uid)
    except PushError as exc:
        if exc.status == 409:  # Grafana keeps folder titles unique: one made by hand or by provisioning
            raise PushError(f"{exc}; a folder titled {title!r} exists with another uid: push into it with "
                            "--folder-uid (its uid is in the folder's URL, /dashboards/f/<uid>/)", 409) from None
        raise
    log.info("created Grafana folder %s (%s)", title, uid)
    return str(created.get("uid", uid))


def _unedited_version(grafana: _Grafana, uid: str, what: str) -> int | None:
    """For a push without overwrite: the version Grafana holds of ``uid`` when foreshock's own push
    made it (None for a new dashboard); a :class:`PushError` when someone saved it since."""
    current = grafana.find(what, grafana.api.dashboard.get_dashboard, uid)
    if current is None:
        return None
    version = int(current.get("dashboard", {}).get("version") or current.get("meta", {}).get("version") or 0)
    answer = grafana.call(what, grafana.api.client.GET, f"/dashboards/uid/{uid}/versions", params={"limit": 1},
                          answer=(dict, list))
    entries = answer.get("versions", []) if isinstance(answer, dict) else answer  # Grafana 12 wraps the list
    latest = entries[0] if entries else {}
    if latest.get("message") != PUSH_MESSAGE:
        by = latest.get("createdBy") or "someone"
        raise PushError(f"{what}: version {version} was saved in Grafana by {by}, not by a foreshock push; "
                        "push with --overwrite to replace it")
    return version


def push_dashboards(url: str, token: str, boards: dict[str, dict[str, Any]], folder_uid: str,
                    folder_title: str, overwrite: bool = True, timeout: float = 10.0,
                    ca_file: Path | None = None) -> list[Pushed]:
    """Create or update every dashboard in ``boards`` (keyed by UID) inside one folder.

    ``ca_file``: the CA certificate(s) to trust for an https Grafana (default: the system's)."""
    grafana = _Grafana(url, token, timeout, ca_file)
    folder = ensure_folder(grafana, folder_uid, folder_title)
    pushed = []
    for uid, board in boards.items():
        what = f"pushing dashboard {uid!r}"
        # id null: Grafana matches on uid; "version" lets it detect edits made since the last push
        dashboard = {**board, "id": None}
        if not overwrite:
            version = _unedited_version(grafana, uid, what)
            if version is not None:
                dashboard["version"] = version
        payload = {"dashboard": dashboard, "folderUid": folder, "overwrite": overwrite, "message": PUSH_MESSAGE}
        result = grafana.call(what, grafana.api.dashboard.update_dashboard, payload)
        pushed.append(Pushed(uid=str(result.get("uid", uid)), title=str(board.get("title", uid)),
                             version=int(result.get("version", 0)), url=str(result.get("url", ""))))
        log.info("pushed dashboard %s (version %s)", uid, result.get("version"))
    return pushed
