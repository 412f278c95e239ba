"""``groundcover cluster plan | prefetch | check-offline | run``: one groundcover command as a
cluster job (docs/clusters.md). The job itself is ``serving/cluster`` (``plan``: what runs
where; ``job``: Ray over a Slurm allocation; ``fetch``: models on an offline node); here the
command line, and what only the command line knows: the inner command, parsed by this same CLI
and its request built (``frameworks.INSPECTED``) before anything starts, so a flag the job adds
is added only where that command takes it -- or the plan is refused in one line naming the
command and the flag -- and what the command will read (datasets by name, its defaults
included; its roles' models and adapters; NLI checkpoints; gpt-oss's tokenizer files) listed
for ``prefetch`` and ``check-offline``.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from typer import _click as click
from typer.core import TyperGroup, TyperOption

from ..runtime.terminal import labelled, terminal

EXIT_REFUSED = 2  # the plan refused: nothing started
PANEL = "The job"
console = terminal(stderr=True)

cluster_app = typer.Typer(
    help="One groundcover command as a cluster job: plan it, fetch what it reads, check an "
    "offline node, run it (docs/clusters.md).",
    no_args_is_help=True,
)

# the flags the job adds to the command, and when
RAY_FLAG_SOURCES = {  # what the job sets each to, and how to change it
    "--ray-address": "the head of the Ray it starts on the job's nodes",
    "--drivers": "one per node times --drivers-per-node: set that option of the job instead",
}
RAY_FLAGS = tuple(RAY_FLAG_SOURCES)
JUDGE_FLAGS = ("--endpoint", "--model", "--api-key-env", "--model-revision")
NLI_FLAG = "--nli-app"
STAND_IN_ENDPOINT = "http://127.0.0.1:9/v1"  # the judge's URL in a check: a port nothing serves


class Refused(Exception):
    """A job that cannot run as asked: the one line saying why."""


# ---- the options every subcommand takes ---------------------------------------------------------


def _option(help: str, *decls: str, **more: Any) -> Any:
    return typer.Option(*decls, help=help, rich_help_panel=PANEL, **more)


JOB_OPTIONS: list[tuple[str, Any, Any]] = [
    ("judge", str | None, _option("serve this model once for every driver (Ray Serve LLM)")),
    ("replicas", str, _option("with --judge: N replicas, or auto (as many as fit)")),
    (
        "gpus_per_replica",
        int | None,
        _option("with --judge: GPUs per replica (default: the fewest that hold it)"),
    ),
    (
        "max_model_len",
        int | None,
        _option("with --judge: its context length (default: the preset's, else its config's)"),
    ),
    (
        "judge_engine_arg",
        list[str] | None,
        _option("with --judge: a vLLM engine flag, one token each", metavar="FLAG"),
    ),
    (
        "lora",
        list[str] | None,
        _option("with --judge: NAME=PATH, an adapter on every replica", metavar="NAME=PATH"),
    ),
    ("judge_start_timeout", float, _option("seconds the judge's start may take")),
    ("judge_revision", str | None, _option("the judge's weights' revision, when not found here")),
    ("nli", str | None, _option("an NLI cross-encoder to deploy as a Ray Serve app")),
    ("nli_app", str, _option("the NLI app's name")),
    ("nli_replicas", str, _option("N (one per node), or auto")),
    ("nli_start_timeout", float, _option("seconds the NLI app's deploy may take")),
    (
        "nli_gpu_fraction",
        float | None,
        _option("the NLI app's share of a judge's GPU (default: a GPU of its own)"),
    ),
    ("drivers_per_node", int, _option("drivers of the command on each node")),
    (
        "dataset",
        list[str] | None,
        _option("prefetch / check-offline: a catalogued dataset the command does not name"),
    ),
    (
        "allocation",
        str | None,
        _option("NODE:GPUS,... or NxGPUS: the nodes to plan for (default: this Slurm job's)"),
    ),
    (
        "gpu_memory",
        float | None,
        _option("each GPU's memory in GiB, nvidia-smi's MiB / 1024 (default: read in the job)"),
    ),
    ("max_requeues", int, _option("requeues at the time limit's warning before FAILED")),
    (
        "no_requeue",
        bool,
        _option("at the time limit's warning, stop without requeueing", "--no-requeue"),
    ),
    ("dashboard", bool, _option("Ray's dashboard on the head", "--dashboard")),
    ("ray", str | None, _option("the ray command (default: beside this Python)")),
    ("groundcover", str | None, _option("the groundcover command (default: beside this Python)")),
    ("serve", str | None, _option("Ray Serve's command (default: beside this Python)")),
]
DEFAULTS: dict[str, Any] = {
    "replicas": "auto",
    "judge_start_timeout": 3600.0,
    "nli_app": "groundcover-nli",
    "nli_replicas": "auto",
    "nli_start_timeout": 1800.0,
    "drivers_per_node": 1,
    "max_requeues": 3,
    "no_requeue": False,
    "dashboard": False,
}
COMMAND = Annotated[
    list[str] | None,
    typer.Argument(help="-- then the groundcover command (groundcover eval ...)"),
]


def job_command(
    extra: list[inspect.Parameter],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The job's options (declared once, above) as keyword parameters of ``function``."""

    def decorate(function: Callable[..., None]) -> Callable[..., None]:
        own = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=DEFAULTS.get(name),
                annotation=Annotated[kind, info],
            )
            for name, kind, info in JOB_OPTIONS
        ]
        command = inspect.Parameter(
            "command", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=COMMAND
        )
        params = [*extra, *own, command]
        function.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        function.__annotations__ = {p.name: p.annotation for p in params}
        return function

    return decorate


PASSING = {"allow_interspersed_args": False}


@dataclass
class Asked:
    """The job's options as given."""

    given: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["given"][name]
        except KeyError:
            raise AttributeError(name) from None

    def plan_ask(self) -> Any:
        from ...serving.cluster.plan import JudgeAsk, PlanAsk

        stand_in = stand_ins()
        judge = None
        if self.judge:
            replicas = self.replicas
            if stand_in and self.judge in stand_in.models and stand_in.replicas:
                replicas = stand_in.replicas if replicas == "auto" else replicas
            judge = JudgeAsk(
                model=stand_in.model(self.judge) if stand_in else self.judge,
                replicas=replicas,
                gpus_per_replica=self.gpus_per_replica,
                max_model_len=self.max_model_len,
                loras=dict(parse_lora(text) for text in self.lora or []),
                start_timeout=self.judge_start_timeout,
                engine_args=list(self.judge_engine_arg or []),
                revision=self.judge_revision,
            )
        elif self.lora:
            raise Refused("--lora is for the judge's replicas: give --judge")
        base = os.environ.get("GC_RAY_PORT_BASE")
        return PlanAsk(
            judge=judge,
            drivers_per_node=self.drivers_per_node,
            nli=stand_in.model(self.nli) if stand_in and self.nli else self.nli,
            nli_app=self.nli_app,
            nli_replicas=self.nli_replicas,
            nli_start_timeout=self.nli_start_timeout,
            nli_gpu_fraction=self.nli_gpu_fraction,
            max_requeues=self.max_requeues,
            requeue=not self.no_requeue and os.environ.get("GC_REQUEUE", "1") != "0",
            dashboard=self.dashboard,
            port_base=int(base) if base else None,
            gpu_memory_gib=self.gpu_memory,
        )


def stand_ins() -> Any:
    """The test's stand-ins (``serving/cluster/standin.py``): read here alone, from this
    process's environment, and each said on the log."""
    from ...serving.cluster.standin import ENV, StandInError, from_environment

    try:
        found = from_environment()
    except StandInError as exc:
        raise Refused(str(exc)) from None
    for name, folder in (found.models if found else {}).items():
        say(f"{ENV}: {name} is the local folder {folder} here (a test's stand-in)")
    return found


def stand_in_limit(words: list[str]) -> list[str]:
    """``--limit N`` where a test's stand-in asks for the command's first N items: only for a
    command that takes it and gives none of its own, said on the log."""
    from ...serving.cluster.standin import ENV, from_environment

    found = from_environment()  # read and checked by the plan's ask already
    if found is None or found.limit is None:
        return []
    command, path, rest = resolve_leaf(groundcover_args(words))
    where = " ".join(path[1:])
    if "--limit" not in option_names(command):
        raise Refused(f'{ENV}: "limit": `{where}` takes no --limit')
    if any(word == "--limit" or word.startswith("--limit=") for word in rest):
        return []
    say(f"{ENV}: the command's first {found.limit} item(s) here, --limit {found.limit}")
    return ["--limit", str(found.limit)]


def parse_lora(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise Refused(f"--lora {text!r}: want NAME=PATH")
    return name, path


# ---- the inner command, checked by this CLI -----------------------------------------------------


@dataclass
class Checked:
    """The inner command as this CLI reads it: its words, its path (``eval fanoutqa``), the
    launcher's flags it takes, and -- for a framework's command -- its study and request."""

    words: list[str]
    path: str
    accepts: frozenset[str]
    study: Any = None
    request: Any = None
    datasets: list[str] = field(default_factory=list)


def groundcover_args(words: list[str]) -> list[str]:
    """The arguments after ``groundcover`` (``groundcover``, ``PATH/groundcover``, ``python -m
    groundcover``): the command must be one of ours, which this CLI can check."""
    if words and Path(words[0]).name == "groundcover":
        return words[1:]
    if len(words) >= 3 and words[1] == "-m" and words[2].split(".")[0] == "groundcover":
        return words[3:]
    shown = shlex.join(words[:3]) if words else "nothing"
    raise Refused(
        f"the command after -- must be a groundcover command (groundcover eval ..., python -m "
        f"groundcover ...), not {shown}: it is checked before the job starts anything"
    )


def resolve_leaf(args: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """(the click command, its path, its own arguments) of ``groundcover ARGS``."""
    from .main import app

    command: click.Command = typer.main.get_command(app)
    path = ["groundcover"]
    rest = list(args)
    ctx = click.Context(command, info_name="groundcover")
    while isinstance(command, TyperGroup):
        if not rest or rest[0].startswith("-"):
            raise Refused(f"`{' '.join(path)}` names no command: give one (see --help)")
        try:
            name, found, rest = command.resolve_command(ctx, rest)
        except click.exceptions.UsageError as exc:
            raise Refused(f"`{' '.join(path)}`: {exc.format_message()}") from None
        assert name is not None and found is not None
        path.append(name)
        command = found
        ctx = click.Context(command, info_name=name, parent=ctx)
    return command, path, rest


def option_names(command: click.Command) -> frozenset[str]:
    return frozenset(
        opt for param in command.params if isinstance(param, TyperOption) for opt in param.opts
    )


def required_flags(ask: Any) -> list[tuple[str, str]]:
    """(flag, why) the command must take for the job as asked."""
    needed = []
    if ask.nli:
        needed.append(
            (
                NLI_FLAG,
                "it hands the command the NLI app of --nli: drop --nli, or run a command that "
                "scores NLI on Ray (eval icat; eval comprehensiveness --method nli "
                "--nli-backend cross-encoder --nli-model M)",
            )
        )
    if ask.judge:
        why = "it hands the command the judge of --judge: drop --judge, or run a command that "
        why += "asks a model"
        needed += [(flag, why) for flag in JUDGE_FLAGS]
        if ask.judge.loras:
            needed.append(("--adapter-prefix", "it names the adapters of --lora: drop --lora"))
    return needed


def check_command(
    words: list[str], plan_ask: Any, judge_served: str | None, drivers: int = 1
) -> Checked:
    """The inner command parsed by this CLI with every flag the job adds (where it takes
    them, ``--drivers`` with the plan's count), its options validated and its request built:
    nothing started, nothing fetched."""
    from ..datasets.names import LISTED
    from .frameworks import INSPECTED

    command, path, rest = resolve_leaf(groundcover_args(words))
    where = " ".join(path[1:])
    accepts = option_names(command)
    if given_flag(rest, "--help"):
        raise Refused(f"`{where}` is given --help: the job would print its help and end")
    for flag, why in required_flags(plan_ask):
        if flag not in accepts:
            raise Refused(f"`{where}` takes no {flag}, which the job adds: {why}")
        if given_flag(rest, flag):
            raise Refused(
                f"`{where}` is given {flag}, which the job adds (its own would win): drop it "
                f"from the command, or {job_option_of(flag)}"
            )
    for flag, source in RAY_FLAG_SOURCES.items():  # else the job's value replaced it unsaid
        if flag in accepts and given_flag(rest, flag):
            raise Refused(
                f"`{where}` is given {flag}, which the job sets ({source}): drop it from the "
                "command"
            )
    added = placeholder_flags(plan_ask, accepts, judge_served, drivers)
    inspected: list[tuple[Any, Any]] = []
    datasets: list[str] = []
    said = io.StringIO()  # the command's own error line, said again as the job's
    token_in, token_listed = INSPECTED.set(inspected), LISTED.set(datasets)
    try:
        ctx = command.make_context(where, [*rest, *added])
        if not hasattr(command, "declaration"):  # not a framework's: parsed, not invoked
            return Checked(words, where, accepts)
        with ctx, contextlib.redirect_stderr(said):
            command.invoke(ctx)
    except click.exceptions.UsageError as exc:
        raise Refused(f"`{where}`: {exc.format_message()}") from None
    except typer.Exit as exc:
        if exc.exit_code:
            lines = said.getvalue().strip().splitlines() or ["refused (no reason given)"]
            shown = [flag for flag in added if flag.startswith("--")]
            given = f" with the flags the job adds ({' '.join(shown)})" if shown else ""
            raise Refused(f"`{where}`{given}: {lines[-1].removeprefix('error: ')}") from None
    finally:
        INSPECTED.reset(token_in)
        LISTED.reset(token_listed)
    study, request = inspected[0] if inspected else (None, None)
    check_nli_model(where, plan_ask, request)
    check_config_keeps_clear(where, rest, added)
    check_roles_ask_the_judge(where, plan_ask, study, request)
    check_the_jobs_drivers(where, study, request)
    return Checked(words, where, accepts, study, request, list(dict.fromkeys(datasets)))


def check_nli_model(where: str, plan_ask: Any, request: Any) -> None:
    """The command's cross-encoder is the NLI app's: the run refuses an app that serves another
    checkpoint (it would record one model and score with another), but only once it starts,
    after the judge has loaded."""
    scorer = getattr(getattr(request, "options", None), "cross_encoder", None)
    found = scorer() if plan_ask.nli and callable(scorer) else None
    if found and found[0] != plan_ask.nli:
        raise Refused(
            f"`{where}`: --nli-model {found[0]} is not the NLI app's checkpoint (--nli "
            f"{plan_ask.nli}): the run would refuse the app after the judge loaded; give both "
            "the same checkpoint"
        )


def check_config_keeps_clear(where: str, rest: list[str], added: list[str]) -> None:
    """The command's config sets none of what the job's flags set: a flag wins over the file,
    so a value there would be replaced without a word (the words alone were checked)."""
    from ..runtime.contract.config import SHARED_OPTIONS
    from ..runtime.contract.readers import read_text

    source = flag_value(rest, "--config")
    if source is None:
        return
    data = yaml.safe_load(read_text(Path(source)))  # the CLI's reader; parsed by the check
    if not isinstance(data, dict):
        return
    fields = {f"--{o.name.replace('_', '-')}": o.field for o in SHARED_OPTIONS if o.field}
    for flag in (word for word in added if word.startswith("--")):
        name = flag[2:].replace("-", "_")
        dotted = fields.get(flag)
        if dotted is not None:
            found = dotted if has_path(data, dotted.split(".")) else None
        else:  # a framework's option: its section's field
            found = next(
                (f"{k}.{name}" for k, v in data.items() if isinstance(v, dict) and name in v),
                None,
            )
        if found:
            raise Refused(
                f"`{where}`'s config {source} sets {found}, which the job sets with {flag} "
                "(its flag would replace it): remove it from the config"
            )


def has_path(data: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def flag_value(words: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag V`` or ``--flag=V``), or None."""
    value = None
    for n, word in enumerate(words):
        if word == flag and n + 1 < len(words):
            value = words[n + 1]
        elif word.startswith(f"{flag}="):
            value = word.split("=", 1)[1]
    return value


def check_roles_ask_the_judge(where: str, ask: Any, study: Any, request: Any) -> None:
    """With ``--judge``, every role of the command asks the job's judge: a role with an
    endpoint of its own would be sent the job's key (``--api-key-env``) and leave the judge's
    GPUs unused."""
    if not ask.judge or study is None or request is None:
        return
    for role in study.roles:
        endpoint = request.role(role).endpoint
        if endpoint and endpoint != STAND_IN_ENDPOINT:
            raise Refused(
                f"`{where}` sends role {role} to {endpoint} of its own: the job would send it "
                "the key of the judge it serves (--api-key-env) while that judge went unused; "
                "drop the role's URL, or drop --judge"
            )


def check_the_jobs_drivers(where: str, study: Any, request: Any) -> None:
    """What the run refuses of its drivers, with the job's number of them (the run would say
    it only in the job, after the judge loaded)."""
    if study is None or request is None:
        return
    from ..runtime.contract.errors import UserError
    from ..runtime.execution.drivers import check_drivers

    try:
        check_drivers(request, [{role: request.role(role) for role in study.roles}])
    except UserError as exc:
        raise Refused(f"`{where}`: {exc}") from None


def given_flag(words: list[str], flag: str) -> bool:
    return any(word == flag or word.startswith(f"{flag}=") for word in words)


def job_option_of(flag: str) -> str:
    """What to drop from the job instead of ``flag`` from the command."""
    return "drop --nli" if flag == NLI_FLAG else "drop --judge (and its --lora)"


def placeholder_flags(
    ask: Any, accepts: frozenset[str], served: str | None, drivers: int = 1
) -> list[str]:
    """The flags the job will add, with values that stand for the job's (its head's URL and
    the judge's revision are known only in the job; the drivers are the plan's count, as a
    command's checks of its drivers see them in the job)."""
    flags: list[str] = []
    if "--ray-address" in accepts:
        flags += ["--ray-address", "127.0.0.1:6379"]
    if "--drivers" in accepts:
        flags += ["--drivers", str(drivers)]
    if ask.nli:
        flags += [NLI_FLAG, ask.nli_app]
    if ask.judge:
        # a port nothing serves: a dry run notes the endpoint down and goes on
        flags += ["--endpoint", STAND_IN_ENDPOINT, "--model", served or ask.judge.model]
        flags += ["--api-key-env", "GROUNDCOVER_SERVE_API_KEY", "--model-revision", "planned"]
        if ask.judge.loras:
            flags += ["--adapter-prefix", f"{served}:"]
    return flags


# ---- what the command reads ---------------------------------------------------------------------


def needs_of(checked: Checked, ask: Any, extra_datasets: list[str]) -> list[Any]:
    """Everything the job reads, each once: the judge, the NLI app and the adapters it serves;
    the command's roles' models and adapters that it would start itself; the models, files and
    catalogued datasets (by name, defaults included) of its options."""
    from ...serving.cluster.fetch import Needed, model_needs

    found: list[Needed] = []
    if ask.judge:
        found += model_needs("judge", ask.judge.model, ask.judge.revision)
        for name, path in ask.judge.loras.items():
            found += model_needs(f"adapter {name}", path)
    if ask.nli:
        found += model_needs("NLI checkpoint", ask.nli)
    if checked.request is not None:
        found += request_needs(checked)
    for name in [*checked.datasets, *extra_datasets]:
        found.append(Needed("dataset", f"dataset {name}", name))
    unique: dict[tuple[str, str], Needed] = {}
    for need in found:
        unique.setdefault((need.kind, need.what), need)
    return list(unique.values())


def request_needs(checked: Checked) -> list[Any]:
    from ...serving.cluster.fetch import Needed, model_needs
    from ..runtime.store.provenance import content_fields

    found: list[Needed] = []
    request, study = checked.request, checked.study
    for role in study.roles:
        evaluator = request.role(role)
        if evaluator.endpoint is None:  # the command would start this model itself
            model = evaluator.model
            base = model if Path(model).expanduser().exists() else model.split(":")[0]
            found += model_needs(f"role {role}", base, evaluator.revision)
            for name, path in (evaluator.adapters or {}).items():
                found += model_needs(f"role {role} adapter {name}", path)
    named = set(checked.datasets)
    for name, marker, value in content_fields(request.options):
        text = str(value)
        if marker.kind == "model":
            resolved = marker.resolve(text) if marker.resolve else None
            found += model_needs(f"option {name}", resolved or text)
        elif text not in named and not any(text.startswith(d) for d in named):
            found.append(Needed("file", f"option {name}", text))
    return found


def inputs_json(needs: list[Any]) -> dict[str, list[dict[str, str]]]:
    """``cluster plan --json``'s ``inputs``: by kind."""
    groups = {"datasets": ("dataset",), "models": ("hub", "directory"), "tokenizers": ("tiktoken",)}
    out: dict[str, list[dict[str, str]]] = {name: [] for name in [*groups, "files"]}
    for need in needs:
        group = next((g for g, kinds in groups.items() if need.kind in kinds), "files")
        out[group].append(need.as_json())
    return out


def fetch_need(need: Any) -> tuple[bool, str]:
    if need.kind != "dataset":
        from ...serving.cluster.fetch import fetch

        return fetch(need)
    from ..datasets.fetch import get

    return True, f"{need.label}: {get(need.what, quiet=True).path}"


def check_need(need: Any) -> str | None:
    if need.kind != "dataset":
        from ...serving.cluster.fetch import check

        return check(need)
    from ..datasets.catalog import parse_spec
    from ..datasets.fetch import cached

    if cached(parse_spec(need.what)[0]) is None:
        return f"{need.label}: not cached under $GROUNDCOVER_HOME/data"
    return None


# ---- the subcommands ----------------------------------------------------------------------------


def say(text: str) -> None:
    print(f"cluster: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def one_line(what: str) -> Iterator[None]:
    """A refusal (ours, or a plan's, or a bad input's) as one ``error:`` line and exit 2."""
    from ...serving.cluster.job import ClusterError
    from ...serving.cluster.plan import PlanError
    from ...serving.cluster.sizing import SizingError
    from .options import expected_errors

    refusals: tuple[type[Exception], ...] = (Refused, PlanError, SizingError)
    try:
        yield
    except ClusterError as exc:  # a cluster this job cannot use
        console.print(
            labelled("error:", "red", f"cluster {what}: {exc}"), highlight=False, soft_wrap=True
        )
        raise typer.Exit(1) from None
    except refusals + expected_errors()[0] as exc:
        if str(exc):
            console.print(
                labelled("error:", "red", f"cluster {what}: {exc}"), highlight=False, soft_wrap=True
            )
        raise typer.Exit(EXIT_REFUSED) from None


@dataclass
class Prepared:
    ask: Any
    checked: Checked
    needs: list[Any]
    words: list[str]


def prepare(given: dict[str, Any], grid: bool = False, nodes: int | None = None) -> Prepared:
    """The job's options and its command, checked: the plan's ask, the command as this CLI
    reads it (with the drivers of ``nodes`` nodes, where known), what it reads."""
    from ...serving.cluster.plan import served_name

    asked = Asked(given)
    ask = asked.plan_ask()
    words = list(given.get("command") or [])
    if not words:
        raise Refused("give the groundcover command after --")
    if grid and os.environ.get("GC_GRID"):
        words += grid_line(Path(os.environ["GC_GRID"]), os.environ.get("SLURM_ARRAY_TASK_ID"))
    served = served_name(ask.judge.model) if ask.judge else None
    words += stand_in_limit(words)
    checked = check_command(words, ask, served, (nodes or 1) * ask.drivers_per_node)
    from ..datasets.catalog import lookup, parse_spec

    extra = list(given.get("dataset") or [])
    for name in extra:  # a name not in the catalogue, refused here rather than mid-check
        lookup(parse_spec(name)[0])
    needs = needs_of(checked, ask, extra)
    return Prepared(ask, checked, needs, words)


def grid_line(path: Path, task: str | None) -> list[str]:
    """The array task's line of a grid file (blank lines and # comments skipped)."""
    if task is None:
        raise Refused("GC_GRID is set but this is no array job (sbatch --array)")
    lines = [
        line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    k = int(task)
    if not 0 <= k < len(lines):
        raise Refused(f"{path} has {len(lines)} runs; array task {k} has none")
    return shlex.split(lines[k])


def allocation_of(
    allocation: str | None, in_job: bool = False
) -> tuple[str, dict[str, int], int, Any]:
    """(job, each node's GPUs, restarts, the Slurm allocation or None) for ``--allocation`` or
    this job (``in_job``: this node's, Slurm's or not)."""
    from ...serving.cluster.plan import Allocation, parse_allocation

    env = dict(os.environ)
    if allocation and not in_job:
        restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
        return env.get("SLURM_JOB_ID") or "0", parse_allocation(allocation), restarts, None
    if env.get("SLURM_JOB_ID") or in_job:
        alloc = Allocation.from_slurm(env)
        return alloc.job, alloc.node_gpus, alloc.restarts, alloc
    raise Refused("outside a Slurm job, give --allocation NODE:GPUS,... (or NxGPUS)")


def known_nodes(given: dict[str, Any]) -> int | None:
    """The allocation's number of nodes where one is given or this is a Slurm job."""
    try:
        return len(allocation_of(given.get("allocation"))[1])
    except Refused:
        return None


def make_plan(prepared: Prepared, allocation: str | None, in_job: bool = False) -> tuple[Any, Any]:
    from ...serving.cluster.plan import plan_for

    job, node_gpus, restarts, alloc = allocation_of(allocation, in_job)
    memory, per_node = None, None
    if in_job and prepared.ask.gpu_memory_gib is None and any(node_gpus.values()):
        memory, per_node = gpu_memory_in_job(alloc, prepared.ask.port_base)
    plan = plan_for(prepared.ask, job, node_gpus, restarts, memory, per_node)
    plan.inputs = inputs_json(prepared.needs)
    plan.command = prepared.words
    return plan, alloc


def gpu_memory_in_job(
    alloc: Any, port_base: int | None
) -> tuple[tuple[float, str] | None, dict[str, float] | None]:
    """The GPUs' memory as each node reads it (its ``job ports`` task), the smallest sizing the
    judge; on the head only where the nodes cannot be asked (no srun)."""
    from ...serving.cluster.job import node_reports
    from ...serving.cluster.plan import first_block_start, gpu_memory_here, smallest_gpu_memory

    first = first_block_start(alloc.job, port_base)
    reports = node_reports(alloc, first, first)
    found = smallest_gpu_memory(reports.gpu_mib, alloc.node_gpus) if reports else None
    if found is None:
        return gpu_memory_here(), None
    gib, where, per_node = found
    return (gib, where), per_node


@cluster_app.command("plan", context_settings=PASSING)
@job_command(
    [
        inspect.Parameter(
            "json_out",
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[bool, typer.Option("--json", help="the plan as one JSON object")],
        )
    ]
)
def plan(**given: Any) -> None:
    """What the job will do, started nothing: each node's GPUs, the judge's parallelism (from
    its config and the GPUs' memory) and replicas, the NLI app, idle GPUs and why, the drivers,
    the ports, and what the command reads. The command is parsed and checked by this CLI with
    every flag the job adds; a job that cannot run is refused in one line."""
    json_out = given.pop("json_out")
    with one_line("plan"):
        prepared = prepare(given, nodes=known_nodes(given))
        found, _ = make_plan(prepared, given.get("allocation"))
        found.command_dry_run = dry_run_here(prepared)
    if json_out:
        print(json.dumps(found.as_json(), indent=1))
        return
    for line in found.lines():
        print(line)
    for line in input_lines(prepared):
        print(line)
    print(f"plan: the command's dry run: {found.command_dry_run}")


def dry_run_here(prepared: Prepared) -> str:
    """The command's own dry run, here, where everything it reads is here (after prefetch):
    its items loaded and checked, its runs listed, what each would ask (on stderr); a
    command that cannot run is refused now. Where something is missing the job runs it first,
    once the offline check has passed."""
    from ..runtime.execution.execute import execute

    checked = prepared.checked
    if checked.study is None:
        return "none (the command has no --dry-run; its flags were checked)"
    if any(check_need(need) for need in prepared.needs):
        return "in the job, first (what it reads is not all here: groundcover cluster prefetch)"
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds the plan alone
        execute(checked.study, checked.request, no_cache=True, quiet=True, dry_run=True)
    return "passed (its estimate above, on stderr)"


def input_lines(prepared: Prepared) -> list[str]:
    out = [f"plan: the command: `{prepared.checked.path}`, its flags and options checked"]
    for need in prepared.needs:
        out.append(f"plan: reads {need.label}: {need.what}")
    return out


@cluster_app.command("prefetch", context_settings=PASSING)
@job_command([])
def prefetch(**given: Any) -> None:
    """Fetch what the job reads (on a login node, with the job's own arguments): the judge's
    weights and tokenizer, gpt-oss's tiktoken files, the NLI checkpoint, adapters and models
    the command would start, into HF_HOME; each catalogued dataset the command reads (its
    defaults included), into GROUNDCOVER_HOME/data. Paths are checked, never copied."""
    with one_line("prefetch"):
        prepared = prepare(given, nodes=known_nodes(given))
    failed = 0
    for need in prepared.needs:
        try:
            done, line = fetch_need(need)
        except Exception as exc:  # one thing not fetched: said, and the rest go on
            done, line = False, f"{need.label}: {need.what}: {' '.join(str(exc).split())[:300]}"
        failed += not done
        say(f"{'fetched' if done else 'failed'}: {line}")
    if failed:
        say(f"{failed} thing(s) the job needs not fetched (above)")
        raise typer.Exit(1)


def missing(needs: list[Any]) -> int:
    count = 0
    for need in needs:
        why = check_need(need)
        if why:
            count += 1
            say(f"missing: {why}")
        else:
            say(f"present: {need.label}: {need.what}")
    return count


@cluster_app.command("check-offline", context_settings=PASSING)
@job_command([])
def check_offline(**given: Any) -> None:
    """Say what the job reads that this node does not have (run it on a compute node with
    HF_HUB_OFFLINE=1): one line per thing missing, exit 1 if any. The job runs the same check
    first whenever HF_HUB_OFFLINE=1."""
    with one_line("check-offline"):
        prepared = prepare(given, nodes=known_nodes(given))
    count = missing(prepared.needs)
    if count:
        say(f"{count} thing(s) the job needs missing (above): groundcover cluster prefetch")
        raise typer.Exit(1)


@cluster_app.command("run", context_settings=PASSING)
@job_command([])
def run(**given: Any) -> None:
    """Run the command on this Slurm allocation (the batch script calls this on the first
    node): the command checked, the plan, the offline check, a Ray cluster over the nodes, the
    judge and the NLI app served, the command's dry run and then the command, and everything
    stopped however the job ends (docs/clusters.md, "What the job does")."""
    from ...serving.cluster.fetch import tiktoken_folder
    from ...serving.cluster.job import Job, ray_nodes, run_on_ray
    from ...serving.cluster.job import run as run_job
    from ...serving.cluster.plan import Allocation

    # a KubeRay RayJob's entrypoint runs inside its Ray cluster (RAY_ADDRESS set), not in Slurm
    on_ray = not os.environ.get("SLURM_JOB_ID") and bool(os.environ.get("RAY_ADDRESS"))
    with one_line("run"):
        nodes = ray_nodes() if on_ray else allocation_of(None, in_job=True)[1]
        prepared = prepare(given, grid=True, nodes=len(nodes))
        if on_ray:
            found, alloc = plan_on_ray(prepared, nodes)
        else:
            found, alloc = make_plan(prepared, None, in_job=True)
    for line in found.lines():
        say(line)
    for line in input_lines(prepared):
        say(line)
    if os.environ.get("HF_HUB_OFFLINE") == "1" and missing(prepared.needs):
        say("error: this node lacks what the job needs (above): groundcover cluster prefetch")
        raise typer.Exit(1)
    bindir = Path(sys.executable).parent
    job = Job(
        plan=found,
        allocation=alloc if alloc is not None else Allocation(found.job, [], {}),
        command=prepared.words,
        accepts=prepared.checked.accepts,
        ray=given.get("ray") or str(bindir / "ray"),
        groundcover=given.get("groundcover") or str(bindir / "groundcover"),
        serve=given.get("serve") or str(bindir / "serve"),
        judge_revision=given.get("judge_revision"),
        port_base=prepared.ask.port_base,
        pin_nli=not on_ray,
        own_placement=own_driver_placement(prepared.checked),
    )
    raise typer.Exit((run_on_ray if on_ray else run_job)(job, tiktoken_folder()))


def own_driver_placement(checked: Checked) -> bool:
    """Whether the command places its drivers itself: ``--driver-resources`` among its words,
    or ``run.driver_resources`` in its config (checked without the job's, which would win)."""
    if given_flag(checked.words, "--driver-resources"):
        return True
    run = getattr(checked.request, "run", None)
    return getattr(run, "driver_resources", None) is not None


def plan_on_ray(prepared: Prepared, nodes: dict[str, int]) -> tuple[Any, Any]:
    """The plan over the nodes of the Ray cluster this runs in (a KubeRay RayJob's)."""
    from ...serving.cluster.plan import Allocation, plan_for

    if not nodes:
        raise Refused("the Ray cluster has no node that offers a CPU: nothing can run")
    job = os.environ.get("RAY_JOB_SUBMISSION_ID") or os.environ.get("RAY_JOB_ID") or "0"
    found = plan_for(prepared.ask, job, nodes)
    found.inputs = inputs_json(prepared.needs)
    found.command = prepared.words
    return found, Allocation(job, list(nodes), nodes, requeue_id=job)
