"""``chaosctl``: the command-line client of the local chaosd.

Commands are defined in :mod:`chaosctl.read`, :mod:`chaosctl.actions`, :mod:`chaosctl.demo.run` and
:mod:`chaosctl.testbed.cli`; this module assembles them and owns the error boundary: every
failure ends as one line on stderr and an exit code (0 ok, 1 failed, 2 usage, 3 unreachable).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated

import typer

try:  # typer >= 0.2x vendors its own copy of click as typer._click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import exceptions as click_exc  # type: ignore[no-redef]

from chaos_bench.cli import bench_app
from chaosctl import actions, read
from chaosctl.client import DEFAULT_SOCKET, DEFAULT_TIMEOUT_S, SOCKET_ENV, ControlFailure
from chaosctl.clusterinit import cluster_app
from chaosctl.common import CliState
from chaosctl.demo import run as demo
from chaosctl.testbed.cli import testbed_app

EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="chaosctl",
    help="Drive and watch a Chaos cluster through the local chaosd.",
    no_args_is_help=True,
    add_completion=False,
    # User errors are printed as one line by main(); never a rich traceback.
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        try:
            version = metadata.version("chaos-edge")
        except metadata.PackageNotFoundError:
            version = "unknown"
        print(f"chaosctl {version}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    socket: Annotated[Path, typer.Option(
        "--socket", "-s", envvar=SOCKET_ENV, metavar="PATH", help="The daemon's control socket.",
    )] = Path(DEFAULT_SOCKET),
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, metavar="SECONDS", help="How long to wait for the daemon's answer.",
    )] = DEFAULT_TIMEOUT_S,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.",
    )] = False,
) -> None:
    """Drive and watch a Chaos cluster through the local chaosd."""
    ctx.obj = CliState(socket=socket, timeout=timeout)


app.command()(read.status)
app.command()(read.nodes)
app.command()(read.links)
app.command()(read.events)
app.command(context_settings={"allow_interspersed_args": False})(actions.join)
app.command()(actions.leave)
app.add_typer(actions.link_app)
app.add_typer(actions.policy_app)
app.command()(actions.probe)
app.command()(demo.demo)
app.add_typer(testbed_app)
app.add_typer(bench_app)
app.add_typer(cluster_app)


def _usage_line(exc: click_exc.UsageError) -> str:
    path = exc.ctx.command_path if exc.ctx is not None else "chaosctl"
    return f"{path}: {exc.format_message()} (see '{path} --help')"


def run(argv: list[str] | None = None) -> int:
    """Run chaosctl with ``argv`` and return the exit code instead of exiting."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="chaosctl", standalone_mode=False)
    except ControlFailure as exc:
        print(f"chaosctl: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except click_exc.NoArgsIsHelpError as exc:
        exc.show()  # a bare group (`chaosctl link`): its help, as click does
        return 2
    except click_exc.UsageError as exc:
        print(_usage_line(exc), file=sys.stderr, flush=True)
        return 2
    except click_exc.ClickException as exc:
        print(f"chaosctl: {exc.format_message()}", file=sys.stderr, flush=True)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("chaosctl: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `chaosctl events | head` closes our stdout early; that is not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    # In non-standalone mode click returns the code of typer.Exit, or the command's value.
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
