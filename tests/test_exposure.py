"""Exposure: servers bind loopback unless told; another address needs an API key, which the
client sends; our code never unpickles, never evaluates model output, never runs a shell."""

from __future__ import annotations

import ast
import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.serving.client import EvalClient
from groundcover.serving.launch.server import ServerSpec, ServerStartError, VLLMServer, is_loopback
from tests.conftest import TEST_SERVER_ENV, require_engine

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["serving", "retrieval", "index_build", "pipelines", "scripts"]


def test_loopback_is_the_default_and_anything_else_needs_a_key(tmp_path):
    assert ServerSpec(model="embedded").host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    for host in ("0.0.0.0", "10.1.2.3"):
        with pytest.raises(ServerStartError, match="give it an API key"):
            VLLMServer(ServerSpec(model="embedded", host=host, port=1), tmp_path / "l").start()
    assert not (tmp_path / "l").exists()  # refused before anything started
    result = CliRunner().invoke(
        app, ["serve", "embedded", "--host", "0.0.0.0", "--run-dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "give it an API key" in result.output
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "embedded",
            "--host",
            "0.0.0.0",
            "--api-key-env",
            "GC_TEST_UNSET_KEY",
            "--run-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "GC_TEST_UNSET_KEY: the variable is not set" in result.output


def test_replicas_off_loopback_need_a_key():
    from groundcover.serving.cluster.serve_app import RayReplicas

    with pytest.raises(ServerStartError, match="give it an API key"):
        RayReplicas(ServerSpec(model="embedded", host="0.0.0.0"), 2)


@pytest.mark.engine
def test_a_server_off_loopback_refuses_requests_without_the_key(tiny_model, tmp_path):
    require_engine()
    key = "test-key-7f3a"
    spec = ServerSpec(model=str(tiny_model), host="0.0.0.0", env=TEST_SERVER_ENV, api_key=key)
    # own server: bound off loopback with an API key (the shared one is loopback, keyless)
    server = VLLMServer(spec, tmp_path / "serve.log")
    assert key not in " ".join(server.command())  # not on a command line others can read
    # The port chosen for it is taken (bound, not listening: the check before launching sees
    # it free) before vLLM binds, as an outgoing connection can take it: launched elsewhere.
    taken = server.port
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", taken))
        server.start()
    assert server.port != taken and server.port_moves == 1
    assert "Address already in use" in (tmp_path / "serve.log").read_text()
    with server:
        body = {
            "model": server.served_name,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }
        url = f"{server.base_url}/chat/completions"
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.post(url, json=body, headers=wrong, timeout=60).status_code == 401

        async def ask() -> str:
            async with EvalClient(
                server.base_url, server.served_name, api_key=key, max_retries=0
            ) as client:
                result = await client.chat(body["messages"], stage="probe", max_tokens=4)
                return result.text

        assert isinstance(asyncio.run(ask()), str)  # the client sends the key: answered


# The one place code is compiled and run on purpose: a framework file the user named
# (--framework, groundcover eval FILE.py) or trusted (groundcover trust), from the bytes that were
# hashed (tests/test_sent_runs.py proves nothing a run holds reaches it). (file, function)
CODE_THE_USER_TRUSTS = {("pipelines/runtime/contract/plugins.py", "load_source")}


def trusted_loader_nodes(path: Path, tree: ast.AST) -> set[int]:
    """The ids of every node inside a function of ``CODE_THE_USER_TRUSTS`` in ``path``."""
    resolved = path.resolve()
    relative = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else ""
    names = {name for file, name in CODE_THE_USER_TRUSTS if file == relative}
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name in names
        for inner in ast.walk(node)
    }


def unsafe_calls(path: Path) -> list[str]:
    """Calls that load pickles, evaluate text or run a shell (but in ``CODE_THE_USER_TRUSTS``)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    allowed = trusted_loader_nodes(path, tree)
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"} & set(names):
                found.append(f"{path}:{node.lineno}: imports a pickle module")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
        keywords = {k.arg: k.value for k in node.keywords}
        if isinstance(func, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
            found.append(f"{path}:{node.lineno}: {name}()")
        loader = keywords.get("Loader")
        safe_loader = getattr(loader, "attr", getattr(loader, "id", "")).endswith("SafeLoader")
        if owner == "yaml" and name in ("unsafe_load", "full_load", "unsafe_load_all"):
            found.append(f"{path}:{node.lineno}: yaml.{name} (use safe_load)")
        if owner == "yaml" and name in ("load", "load_all") and not safe_loader:
            found.append(f"{path}:{node.lineno}: yaml.{name} without a SafeLoader")
        if owner == "torch" and name == "load":
            safe = keywords.get("weights_only")
            if not (isinstance(safe, ast.Constant) and safe.value is True):
                found.append(f"{path}:{node.lineno}: torch.load without weights_only=True")
        for flag in ("allow_pickle", "shell", "trust_remote_code"):
            value = keywords.get(flag)
            if isinstance(value, ast.Constant) and value.value is True:
                found.append(f"{path}:{node.lineno}: {flag}=True")
    return found


def test_no_pickle_loading_no_eval_of_model_output_no_shell():
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert len(files) > 50
    assert [hit for path in files for hit in unsafe_calls(path)] == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport yaml, torch, numpy as np, subprocess\n"
        "eval(x)\nyaml.load(s)\ntorch.load(f)\nnp.load(f, allow_pickle=True)\n"
        "subprocess.run(c, shell=True)\ntorch.load(f, weights_only=True)\n"
        "yaml.load_all(s, Loader=yaml.Loader)\nyaml.load_all(s, Loader=yaml.CSafeLoader)\n"
    )
    assert len(unsafe_calls(bad)) == 7


def test_the_trusted_loader_is_the_only_exception_and_it_exists():
    """The exception names a function that is there, and only its own calls are let through: the
    same compile() and exec() anywhere else in that file are found."""
    for file, name in CODE_THE_USER_TRUSTS:
        tree = ast.parse((ROOT / file).read_text())
        assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    plugins = ROOT / "pipelines/runtime/contract/plugins.py"
    source = plugins.read_text()
    assert "compile(" in source and "exec(" in source
    planted = source + "\n\ndef elsewhere(code):\n    exec(compile(code, 'x', 'exec'))\n"
    tree = ast.parse(planted)
    allowed = trusted_loader_nodes(plugins, tree)
    hits = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("exec", "compile")
        and id(node) not in allowed
    ]
    assert len(hits) == 2 and min(hits) > source.count("\n")
