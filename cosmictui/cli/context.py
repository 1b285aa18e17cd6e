"""What most commands need before they work: settings from config and flags, and the deployment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosmictui.cli.output import FAILED, USAGE, UsageError

#: How to name the deployment, for every error about a missing one.
DEPLOYMENT_FIX = (
    '--deployment DIR (or ssh://user@host[:port]/path) of the deployment, or deployment = "DIR" in the config'
)


def settings_from(args: argparse.Namespace, **overrides: Any) -> Any:
    """Settings from --config, --deployment and `overrides`; a bad config or deployment is a usage error."""
    from cosmictui.ops.config import ConfigError, load_settings

    if getattr(args, "deployment", None) is not None:
        overrides["deployment"] = args.deployment
    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except ConfigError as e:
        raise UsageError(str(e), "fix the config file named above, or pass another with --config PATH") from None
    from cosmictui.ops.runner import RunnerError, parse_deployment

    try:
        parse_deployment(settings.deployment)
    except RunnerError as e:  # ftp://x, ssh:// without a host or with a bad port: configuration
        raise UsageError(
            f"--deployment: {e.what}", e.fix or "--deployment DIR or --deployment ssh://user@host[:port]/path"
        ) from None
    return settings


def require_deployment(args: argparse.Namespace, settings: Any, would: str) -> None:
    """Refuse to guess the deployment: unnamed (no --deployment, none in the config), a command
    run "on the deployment" would run in whatever directory the command was typed in."""
    if getattr(args, "deployment", None) is None and settings.deployment == ".":
        raise UsageError(
            f"no deployment given, so this would {would} in {Path.cwd()} (the current directory); nothing ran",
            DEPLOYMENT_FIX,
        )


async def open_runner(settings: Any) -> Any:
    """The deployment's runner (local directory or SSH), with the config's SSH settings."""
    from cosmictui.ops.runner import open_deployment

    return await open_deployment(
        settings.deployment,
        env=settings.command_env,
        known_hosts=settings.ssh_known_hosts,
        client_keys=list(settings.ssh_identity) or None,
        connect_timeout=settings.ssh_connect_timeout,
    )


def runner_exit(e: Exception) -> int:
    """A deployment or file that does not exist is the operator's configuration (2); a host that
    does not answer, refuses us or fails a command is a failure (1)."""
    return USAGE if getattr(e, "kind", "") in ("missing-file", "missing-directory", "not-a-file") else FAILED


def session_from(args: argparse.Namespace, settings: Any) -> Any:
    """The session the wizard keeps for this deployment (its progress: relay, restarts, what was
    proven), with --storage, --relay-key and --metrics applied: what apply, verify and setup read and record."""
    from cosmictui.cli.output import KEY_FIX
    from cosmictui.ops import relayproc
    from cosmictui.ops.session import WizardContext
    from cosmictui.ops.setup.envfile import normalize_key

    ctx = WizardContext(settings)
    if getattr(args, "storage", None):
        ctx.relay_storage = args.storage
        rt = relayproc.attach(args.storage)
        if rt is not None:
            ctx.relay_key, ctx.relay_external = rt.key, False
    if getattr(args, "relay_key", None):
        try:
            ctx.relay_key = normalize_key(args.relay_key)
        except ValueError as e:
            raise UsageError(f"--relay-key: {e}", f"--relay-key KEY with {KEY_FIX}") from None
    if ctx.relay_key is None:
        rt = relayproc.attach(ctx.relay_storage)
        if rt is not None:
            ctx.relay_key = rt.key
    if getattr(args, "metrics", None):
        url = args.metrics if "://" in args.metrics else f"http://{args.metrics}"
        ctx.relay_metrics_url = lambda: url  # type: ignore[method-assign]
    return ctx
