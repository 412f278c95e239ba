"""Debian's headless Chromium driven over the DevTools protocol (aiohttp's websocket client): open
a page served on loopback, wait until its script has drawn some text, read the text, take a
screenshot. For pages that fetch their data after loading (inspect_ai's viewer), where
``--dump-dom`` with a virtual time budget returns before the data arrives."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1400,900",
)


class Page:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse):
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        key = next(self.ids)
        await self.socket.send_json({"id": key, "method": method, "params": params})
        while True:
            message = await self.socket.receive_json(timeout=60)
            if message.get("id") == key:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def text(self) -> str:
        found = await self.call(
            "Runtime.evaluate", expression="document.body ? document.body.innerText : ''"
        )
        return found.get("result", {}).get("value", "")

    async def evaluate(self, expression: str) -> Any:
        found = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True)
        return found.get("result", {}).get("value")

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def wait_for(self, wanted: list[str], timeout: float = 60) -> str:
        """The page's text once every string of ``wanted`` is in it (or at ``timeout``)."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if all(w in text for w in wanted):
                break
            await asyncio.sleep(0.2)
        return text

    async def key(self, key: str) -> None:
        """One key pressed and released, as a person types it (DOM keydown with ``key``)."""
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, text=key)

    async def screenshot(self, path: Path) -> None:
        await asyncio.sleep(0.3)  # let the last paint land
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def browser(timeout: float = 60):
    """A fresh headless Chromium (its own empty profile), one page of it, then gone."""
    assert BROWSER is not None
    profile = tempfile.mkdtemp(prefix="gc-chromium-")
    process = subprocess.Popen(
        [BROWSER, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = _devtools_address(process, timeout)
        async with aiohttp.ClientSession() as session:
            port = address.split(":")[2].split("/")[0]
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            target = next(t for t in targets if t.get("type") == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                yield page
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def _open(url: str, wanted: list[str], screenshot: Path | None, timeout: float) -> str:
    async with browser(timeout) as page:
        await page.navigate(url)
        text = await page.wait_for(wanted, timeout)
        if screenshot is not None:
            await page.screenshot(screenshot)
        return text


def _devtools_address(process: subprocess.Popen, timeout: float) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            return found.group(1)
        if not line and process.poll() is not None:
            break
    raise RuntimeError("chromium did not open its DevTools port")


def page_text(
    url: str, wanted: list[str], screenshot: Path | None = None, timeout: float = 60
) -> str:
    """The page's visible text once every string of ``wanted`` is in it (or at ``timeout``)."""
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()
        raise RuntimeError("page_text: call it outside an event loop")
    return asyncio.run(_open(url, wanted, screenshot, timeout))
