"""pip's settings as uv's: what setup.sh hands ``uv pip install``, to install from where pip would.

uv reads none of pip's configuration. This prints, one per line, the flags for pip's package
sources (``--index-url``, ``--extra-index-url``, ``--find-links``, ``--constraint``) and the
variables for its certificate and timeout (``SSL_CERT_FILE=``, ``UV_HTTP_TIMEOUT=``), read with
``pip config list``: every config file and ``PIP_*`` variable pip itself would read, listed from
the weakest source up, so a later value of a name wins as it does in pip.

    python scripts/uv_flags.py     # run with the virtualenv's Python (its pip is asked)
"""

from __future__ import annotations

import subprocess
import sys

SOURCES = ("index-url", "extra-index-url", "find-links", "constraint")
VARIABLES = {"cert": "SSL_CERT_FILE", "default-timeout": "UV_HTTP_TIMEOUT"}
SECTIONS = ("global", "install", ":env:")  # what `pip install` reads


def pip_settings() -> dict[str, str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in SECTIONS:
            settings[name] = value.strip().strip("'\"")
    return settings


def uv_flags(settings: dict[str, str]) -> list[str]:
    flags = [f"--{name}={value}" for name in SOURCES for value in settings.get(name, "").split()]
    variables = [f"{var}={settings[name]}" for name, var in VARIABLES.items() if name in settings]
    return flags + variables


if __name__ == "__main__":
    print("\n".join(uv_flags(pip_settings())))
