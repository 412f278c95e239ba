"""`groundcover view`: the runs' page served on 127.0.0.1, with a labelling page per run
(``reports.pages``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import FrameworkFiles, TrustFiles, clean_errors
from .serve import api_key_from, authorised

console = terminal(stderr=True)


@clean_errors
def view(
    run_dir: Annotated[list[Path], typer.Argument(help="run directories (or a study's root)")],
    port: Annotated[
        int | None,
        typer.Option(help="default 8765, or a free port when that is taken; 0 picks a free port"),
    ] = None,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    api_key_env: Annotated[
        str | None, typer.Option(help="variable holding the key (needed off loopback)")
    ] = None,
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """Serve the HTML report of the runs at http://127.0.0.1:PORT/ until Ctrl-C (rebuilt
    when a run changes on disk, so a running evaluation shows its progress; its items are
    filtered, searched and paged by the server), with a labelling page per run (/label?run=K:
    people's labels and overrides, written only from the page itself). Another --host needs a
    key, as `serve` does: a browser gives it as the password of the login it is asked for (any
    user name), a client as a Bearer token."""
    from ..runtime.contract.plugins import trust_files

    trust_files(framework_file, trust)
    from ...serving.launch.server import is_loopback
    from ..reports.pages.report_html import render
    from ..reports.pages.viewer import Viewer, serve

    key = api_key_from(api_key_env)
    if key is None and not is_loopback(host):
        raise UserError(
            f"--host {host} shows the runs beyond this machine: give it a key "
            "(--api-key-env NAME, the key in that variable)"
        )
    from ..runtime.store.run_dir import run_directories

    run_dir = run_directories(run_dir)  # a study's root stands for its runs
    render(run_dir, served=True)  # bad run directories stop here, with one line
    allowed = None if key is None else (lambda header: authorised(header, key))
    serve(Viewer(run_dir), host, port, allowed, console.print)
