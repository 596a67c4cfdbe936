"""``foreshock dashboards``: generate the Grafana dashboards and Prometheus rules, push dashboards."""

from __future__ import annotations

import math
import os
import stat
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

TOKEN_ENV = "FORESHOCK_GRAFANA_TOKEN"


@click.group("dashboards")
def command() -> None:
    """Grafana dashboards and Prometheus rules, generated as code (foreshock.dashboards)."""


@command.command("generate")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Repository root: writes dashboards/generated/*.json and deploy/prometheus/rules/ under it "
                   "(default: the current directory if it is a foreshock checkout, else the checkout foreshock "
                   "is installed from in editable mode).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if regenerating would change, add or delete a file.")
def generate(root: Path | None, check: bool) -> None:
    """Regenerate the dashboard JSON and the Prometheus rule file from one config (and delete any
    dashboard JSON in dashboards/generated/ it no longer makes)."""
    from foreshock.dashboards.generate import leftovers, render, stale, write

    console = Console(stderr=True)
    root = _generated_root(root, console)
    if check:
        outdated = stale(root)
        left = set(leftovers(root))
        missing = [rel for rel in outdated if not (root / rel).exists()]
        for rel in outdated:
            what = "missing" if rel in missing else "no longer generated" if rel in left else "out of date"
            console.print(f"[red]{what}:[/] {rel}")
        if outdated:
            console.print(f"under {root.resolve()}: {len(missing)} missing, "
                          f"{len(outdated) - len(missing) - len(left)} out of date, {len(left)} no longer generated; "
                          "run `foreshock dashboards generate` and commit the result")
            sys.exit(1)
        console.print(f"{len(render())} generated files under {root.resolve()} are up to date")
        return
    changed = write(root)
    deleted = [rel for rel in changed if not (root / rel).exists()]
    for rel in changed:
        console.print(f"{'deleted' if rel in deleted else 'wrote'} {rel}")
    console.print(f"{len(changed) - len(deleted)} of {len(render())} generated files under {root.resolve()} changed"
                  + (f"; deleted {len(deleted)} no longer generated" if deleted else ""))


def _is_checkout(root: Path) -> bool:
    """Whether ``root`` is a foreshock checkout: the generator's own source beside the folder of
    Prometheus files (a folder merely holding ``dashboards/`` and ``deploy/prometheus/``, the layout
    of many an ops repository, was written into: review h28)."""
    return (root / "dashboards" / "generate.py").is_file() and (root / "deploy" / "prometheus").is_dir()


def _installed_checkout() -> Path | None:
    """The checkout foreshock runs from (an editable install links its modules there), or None
    (installed from a wheel: its package folder is no checkout)."""
    from foreshock.dashboards import generate

    root = Path(generate.__file__).resolve().parents[1]
    return root if _is_checkout(root) else None


def _generated_root(root: Path | None, console: Console) -> Path:
    """``--root`` as given; else the current directory when it is a foreshock checkout, else the
    checkout foreshock is installed from. Run from anywhere else, ``generate`` wrote a second copy
    of the files into that folder and ``--check`` called every file out of date: refused."""
    if root is not None:
        return root
    here = Path(".")
    if _is_checkout(here):
        return here
    installed = _installed_checkout()
    if installed is None:
        raise click.UsageError(f"{here.resolve()} is not a foreshock checkout (no dashboards/generate.py and "
                               "deploy/prometheus/ folder) and foreshock is not installed from one: run it from the repository root "
                               "or give --root DIR")
    console.print(f"[dim]{here.resolve()} is not a foreshock checkout: using the one foreshock is installed from, "
                  f"{installed}[/dim]")
    return installed


def _read_token(token_file: Path | None) -> str:
    if token_file is not None:
        mode = token_file.stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            click.echo(f"warning: {token_file} is readable by other users (chmod 600 it)", err=True)
        token = token_file.read_text(encoding="utf-8").strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise click.UsageError(f"no Grafana token: set {TOKEN_ENV} or pass --token-file "
                               "(the token is never accepted on the command line)")
    return token


def _finite_seconds(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """``--timeout`` as given, unless NaN or infinite: ``FloatRange`` lets NaN through (no
    comparison with it holds), and the HTTP client refused it with a traceback."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value


@command.command("push")
@click.option("--url", required=True, help="Grafana base URL, e.g. http://grafana:3000")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=f"File holding a Grafana service-account token (default: ${TOKEN_ENV}).")
@click.option("--folder-uid", default=None, help="Folder UID (default from the dashboards config).")
@click.option("--overwrite/--no-overwrite", default=True, show_default=True,
              help="Replace dashboards edited in Grafana since foreshock's last push; --no-overwrite "
                   "fails on such a dashboard (and replaces only what foreshock pushed).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              callback=_finite_seconds, help="HTTP timeout in seconds.")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CA certificate(s) (PEM) to trust for an https Grafana (default: the system's).")
def push(url: str, token_file: Path | None, folder_uid: str | None, overwrite: bool, timeout: float,
         ca_file: Path | None) -> None:
    """Push the generated dashboards to Grafana (token from $FORESHOCK_GRAFANA_TOKEN or --token-file)."""
    from foreshock.dashboards.config import DEFAULT_CONFIG
    from foreshock.dashboards.generate import load_dashboards
    from foreshock.dashboards.push import PushError, push_dashboards

    token = _read_token(token_file)
    boards = load_dashboards()
    try:
        pushed = push_dashboards(url, token, boards, folder_uid or DEFAULT_CONFIG.folder_uid,
                                 DEFAULT_CONFIG.folder_title, overwrite=overwrite, timeout=timeout, ca_file=ca_file)
    except PushError as exc:
        raise click.ClickException(str(exc)) from None
    table = Table(title=f"pushed to {url}")
    for col in ("uid", "title", "version", "url"):
        table.add_column(col)
    for p in pushed:
        table.add_row(p.uid, p.title, str(p.version), p.url)
    Console(stderr=True).print(table)
