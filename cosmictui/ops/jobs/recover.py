"""Recovering stuck jobs without ever losing one.

A job is deleted only after its every field and the exact command that recreates it are in a
file under the state directory. Delete & recreate needs a *known* create command: the
configured `[commands] create` template with every field it names known, or a command the
operator reviewed and edited. Otherwise recovery is delete only, and says plainly that the
operator recreates the job (web UI or CLI) from the saved file. A create that fails after its
delete is reported as such ("DELETED and NOT recreated"), with the command and the file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cosmictui.ops.config import CREATE_FIELDS, Settings
from cosmictui.ops.jobs.model import Job, StatusSets
from cosmictui.ops.progress import state_dir
from cosmictui.ops.runner import CommandResult, RunnerError
from cosmictui.ops.setup.steps import JobWatch, WatchVerdict

RunCommand = Callable[[str], Awaitable[CommandResult]]

#: Where the documented create fields are found among a list's columns (normalised names).
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("name", "job name", "title"),
    "tags": ("tags", "tag", "labels"),
    "location": ("location", "region", "zone", "datacenter", "site"),
    "gpu_model": ("gpu model", "gpu type", "gpu", "model"),
    "gpu_count": ("gpu count", "gpus", "num gpus", "gpu num", "gpu qty"),
    "image": ("image", "base os image", "os image", "base image", "os"),
    "disk_gb": ("disk gb", "disk", "disk size", "disk size gb", "storage gb"),
}
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_ .-]+)\}")


def _key(name: str) -> str:
    return re.sub(r"[\s_\-.]+", " ", name.strip().lower())


def field_value(job: Job, name: str) -> str | None:
    """`name` (a documented create field or any column) of `job`, if the list showed it."""
    if _key(name) == "id":
        return job.id
    fields = {_key(k): v for k, v in job.fields.items()}
    for alias in (_key(name), *FIELD_ALIASES.get(name.strip().lower().replace(" ", "_"), ())):
        value = fields.get(_key(alias))
        if value is not None and value.strip() and value.strip() not in ("-", "<none>"):
            return value.strip()
    return None


@dataclass(frozen=True)
class CreateDraft:
    """The create command for a job: complete (`known`) or with `{field}` left for the operator."""

    command: str
    missing: tuple[str, ...]
    source: Literal["config", "draft"]

    @property
    def known(self) -> bool:
        return self.source == "config" and not self.missing


def draft_create(job: Job, settings: Settings) -> CreateDraft:
    """Fill the configured template with the job's fields; without a template, a draft to edit.

    The draft's flags are a guess (the real `create` flags are not documented where we can see
    them), so a draft is never run without the operator reviewing it.
    """
    template = settings.create_command.strip()
    source: Literal["config", "draft"] = "config"
    if not template:
        source = "draft"
        prog = (shlex.split(settings.list_command) or ["cosmicac"])[0]
        template = f"{prog} jobs create " + " ".join(f"--{f.replace('_', '-')} {{{f}}}" for f in CREATE_FIELDS)
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        value = field_value(job, name)
        if value is None:
            missing.append(name)
            return m.group(0)
        return shlex.quote(value)

    return CreateDraft(_PLACEHOLDER.sub(sub, template).strip(), tuple(missing), source)


def unfilled(command: str) -> list[str]:
    """The `{field}` placeholders still in a command the operator edited."""
    return _PLACEHOLDER.findall(command)


def delete_command(job: Job, settings: Settings) -> str:
    return _PLACEHOLDER.sub(
        lambda m: shlex.quote(job.id) if _key(m.group(1)) == "id" else shlex.quote(field_value(job, m.group(1)) or ""),
        settings.delete_command,
    ).strip()


@dataclass(frozen=True)
class RecoveryPlan:
    """What recovering one job runs: the delete, and the create when it is known."""

    job: Job
    delete: str
    create: str | None
    #: "config": the configured template, complete; "operator": reviewed and edited in the dialog.
    create_source: Literal["config", "operator"] | None


def plan_recovery(job: Job, settings: Settings, reviewed_create: str | None = None) -> RecoveryPlan:
    """Delete & recreate when the create command is known, else delete only (create None)."""
    if reviewed_create is not None and reviewed_create.strip() and not unfilled(reviewed_create):
        return RecoveryPlan(job, delete_command(job, settings), reviewed_create.strip(), "operator")
    draft = draft_create(job, settings)
    if draft.known:
        return RecoveryPlan(job, delete_command(job, settings), draft.command, "config")
    return RecoveryPlan(job, delete_command(job, settings), None, None)


def recovery_dir(deployment: str) -> Path:
    """One folder for every deployment (a short path to show); each file names its deployment."""
    return state_dir() / "recovered"


def records_of(deployment: str) -> list[Path]:
    """The saved records of `deployment`'s jobs (each file names its deployment)."""
    found: list[Path] = []
    for path in sorted(recovery_dir(deployment).glob("*.json")):
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("deployment") == deployment:
            found.append(path)
    return found


def save_record(plan: RecoveryPlan, settings: Settings, draft: CreateDraft | None = None) -> Path:
    """Write the job's every field and the recreate command to a new file; its path.

    Written (and fsynced) before anything is deleted: this file is what it takes to undo.
    """
    job = plan.job
    d = recovery_dir(settings.deployment)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", job.id)[:80] or "job"
    path = d / f"{stamp}-{safe}.json"
    n = 1
    while path.exists():
        n += 1
        path = d / f"{stamp}-{safe}-{n}.json"
    record: dict[str, Any] = {
        "deployment": settings.deployment,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job": {
            "id": job.id,
            "status": job.status,
            "created": job.created.isoformat() if job.created else None,
            "fields": dict(job.fields),
        },
        "create_fields": {f: field_value(job, f) for f in CREATE_FIELDS},
        "delete_command": plan.delete,
        "recreate_command": plan.create,
        "recreate_source": plan.create_source,
        "note": (
            "Recreate this job with recreate_command."
            if plan.create
            else "No known create command: recreate this job yourself (web UI or `cosmicac jobs create`) with "
            "these fields. create_fields that are null were not shown by the jobs list."
        ),
    }
    if draft is not None and plan.create is None:
        record["draft_create_command"] = draft.command
    data = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    # only the operator reads it: a job's fields may name private images, hosts or tokens
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return path


Outcome = Literal["recreated", "deleted-only", "delete-failed", "create-failed"]


@dataclass(frozen=True)
class RecoveryResult:
    job_id: str
    outcome: Outcome
    message: str
    record: Path
    command: str | None = None
    output: str = ""
    #: what to do about a failure: the hint for the failed command, or how to recreate a lost job
    fix: str = ""
    #: the job the create made, which replaces this one (None: not recreated, or not told apart)
    new_job_id: str | None = None

    @property
    def lost(self) -> bool:
        """Deleted and not recreated although a recreate was meant: the banner case."""
        return self.outcome == "create-failed"


def lost_message(job_id: str, command: str | None, record: Path) -> str:
    how = command or "(see the file)"
    return f"Job {job_id} was DELETED and NOT recreated. Recreate it with: {how} — every field is in {record}"


async def recover(run: RunCommand, plan: RecoveryPlan, record: Path) -> RecoveryResult:
    """Delete the job, then (when known) create it again; the record must already be saved."""
    from cosmictui.ops.jobs.listing import runner_problem
    from cosmictui.ops.wording import command_failure_hint

    jid = plan.job.id
    try:
        result = await run(plan.delete)
    except RunnerError as e:
        return RecoveryResult(
            jid, "delete-failed", runner_problem(e, f"delete job {jid}") + " Nothing deleted.", record, plan.delete
        )
    if not result.ok:
        hint = command_failure_hint(plan.delete, result.exit_code, result.output)
        return RecoveryResult(
            jid,
            "delete-failed",
            f"{plan.delete} exited {result.exit_code}; job {jid} not deleted. {hint}",
            record,
            plan.delete,
            result.output,
            hint,
        )
    if plan.create is None:
        return RecoveryResult(
            jid,
            "deleted-only",
            f"Job {jid} deleted. Recreate it yourself (web UI or CLI) with the fields saved in {record}.",
            record,
        )
    try:
        result = await run(plan.create)
    except RunnerError as e:
        return RecoveryResult(
            jid,
            "create-failed",
            lost_message(jid, plan.create, record) + " " + runner_problem(e, "recreate it"),
            record,
            plan.create,
            fix=f"recreate it with: {plan.create} (every field is in {record})",
        )
    if not result.ok:
        hint = command_failure_hint(plan.create, result.exit_code, result.output)
        return RecoveryResult(
            jid,
            "create-failed",
            f"{lost_message(jid, plan.create, record)} ({plan.create} exited {result.exit_code}. {hint})",
            record,
            plan.create,
            result.output,
            f"{hint} Then recreate it with: {plan.create} (every field is in {record})",
        )
    return RecoveryResult(jid, "recreated", f"Job {jid} deleted and created again.", record, plan.create, result.output)


def new_job_made(old: Job, create_output: str, appeared: Sequence[Job]) -> str | None:
    """Which of the jobs that `appeared` in the list since the create is the one it made (None: not told).

    One new job: that one. Several (someone else created jobs meanwhile): the one whose id the
    create printed, else the only one with the old job's name. Never a guess among equals.
    """
    if len(appeared) == 1:
        return appeared[0].id
    printed = [j for j in appeared if re.search(rf"(?<![\w-]){re.escape(j.id)}(?![\w-])", create_output)]
    if len(printed) == 1:
        return printed[0].id
    name = field_value(old, "name")
    same = [j for j in appeared if name is not None and field_value(j, "name") == name]
    return same[0].id if len(same) == 1 else None


def note_new_job(record: Path, new_job_id: str | None, why: str = "") -> None:
    """Add the job that replaced the saved one to its record (`new_job_id`, or why it is not known)."""
    try:
        data = json.loads(record.read_text("utf-8"))
        data["new_job_id"] = new_job_id
        if new_job_id is None:
            data["new_job_id_unknown"] = why
        tmp = record.with_name(record.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record)
    except (OSError, ValueError):
        pass  # the record still holds every field and the recreate command; the result says the new id


async def _find_new_job(
    run: RunCommand, settings: Settings, old: Job, create_output: str, known: set[str]
) -> tuple[str | None, str]:
    """The new job's id from the jobs list after the create (a few lists while it has not shown up
    yet), or None and why; every id listed joins `known`."""
    from cosmictui.ops.jobs.listing import list_jobs

    why = "no new job in the jobs list yet"
    for attempt in range(3):
        if attempt:
            await asyncio.sleep(settings.poll_interval)
        listing = await list_jobs(run, settings, datetime.now(UTC))
        if not listing.ok:
            return None, f"the jobs list failed: {listing.error}"
        appeared = [j for j in listing.jobs if j.id not in known]
        known.update(j.id for j in listing.jobs)
        if appeared:
            new_id = new_job_made(old, create_output, appeared)
            if new_id is not None:
                return new_id, ""
            return None, f"{len(appeared)} new jobs appeared ({', '.join(j.id for j in appeared)})"
    return None, why


@dataclass(frozen=True)
class RecordSaved:
    """A job's record is on disk (mode 0600); its delete runs next."""

    job_id: str
    record: Path
    delete: str


@dataclass(frozen=True)
class JobRecovered:
    """One job done: recreated, or deleted only (the operator recreates it from the record)."""

    result: RecoveryResult


@dataclass(frozen=True)
class RecoveryStopped:
    """Recovery stopped at this job; the jobs after it were not touched.

    `result` is None when its record could not be saved (then nothing of it was deleted);
    otherwise its delete failed (nothing deleted) or its create failed after the delete
    (`result.lost`: the record is what it takes to recreate it).
    """

    job_id: str
    message: str
    fix: str
    result: RecoveryResult | None = None

    @property
    def lost(self) -> bool:
        return self.result is not None and self.result.lost


RecoveryEvent = RecordSaved | JobRecovered | RecoveryStopped


async def recover_jobs(
    run: RunCommand, plans: Sequence[RecoveryPlan], settings: Settings, listed: Iterable[str] | None = None
) -> AsyncIterator[RecoveryEvent]:
    """Recover `plans` in order, as progress events: the one recover loop (wizard step 6, `jobs recover`).

    Per job: save its record (every field and the recreate command) first; without it on disk
    nothing is deleted. Then delete and, when known, create. The first failure stops the loop
    (`RecoveryStopped`), so one broken command cannot delete job after job.

    `listed`: the job ids the list showed before; with it, after each create the list is read
    again and the job that appeared is named as the one that replaces the old (`new_job_id`, in
    the result and the record).
    """
    known = set(listed) if listed is not None else None
    for plan in plans:
        jid = plan.job.id
        try:
            record = save_record(plan, settings, draft_create(plan.job, settings))
        except OSError as e:
            where = recovery_dir(settings.deployment)
            yield RecoveryStopped(
                jid,
                f"Could not save job {jid}'s record in {where}: {e.strerror or e}. Job {jid} not deleted.",
                f"make {where} writable (or set XDG_STATE_HOME to a writable directory), then recover again",
            )
            return
        yield RecordSaved(jid, record, plan.delete)
        result = await recover(run, plan, record)
        if result.outcome in ("delete-failed", "create-failed"):
            yield RecoveryStopped(jid, result.message, result.fix, result)
            return
        if result.outcome == "recreated" and known is not None:
            new_id, why = await _find_new_job(run, settings, plan.job, result.output, known)
            note_new_job(record, new_id, why)
            message = (
                f"Job {jid} deleted and created again: new job {new_id} replaces it."
                if new_id is not None
                else f"Job {jid} deleted and created again; which new job replaces it is not known ({why})."
            )
            result = replace(result, new_job_id=new_id, message=message)
        yield JobRecovered(result)


@dataclass(frozen=True)
class RecreatedVerdict:
    """Where every recreated job stands: "confirmed" when each left Creating and keeps updating,
    "failed" when each is settled and one failed, else "waiting". `message` names each job."""

    state: Literal["waiting", "confirmed", "failed"]
    message: str
    verdicts: tuple[WatchVerdict, ...]


class RecreatedWatch:
    """Watches each job a recovery recreated until it left Creating (or failed), one `JobWatch`
    per job, so a recovery of several names and judges every one, not the first to get there.

    A new job told apart (`new_job_id`) is watched by its id alone. The ones not told apart are
    stood for by the other jobs that appeared since (not listed before, not a known new one).
    """

    def __init__(
        self,
        since: datetime | None,
        listed_before: Iterable[str],
        replaced: Sequence[tuple[str, str | None]],
        statuses: StatusSets | None = None,
    ) -> None:
        self.known = [(old, new) for old, new in replaced if new is not None]
        self.unknown = [old for old, new in replaced if new is None]
        self.watches = {new: JobWatch(since, set(), statuses) for _old, new in self.known}
        self.others = JobWatch(since, set(listed_before) | set(self.watches), statuses) if self.unknown else None
        self.seen: set[str] = set()

    def observe(self, jobs: Sequence[Job]) -> RecreatedVerdict:
        verdicts: list[WatchVerdict] = []
        for old, new in self.known:
            mine = [j for j in jobs if j.id == new]
            v = self.watches[new].observe(mine)
            if not mine and new not in self.seen:
                v = WatchVerdict("waiting", None, f"Job {new} (for {old}) is not in the jobs list yet …")
            self.seen.update(j.id for j in mine)
            verdicts.append(v)
        if self.others is not None:
            v = self.others.observe(list(jobs))
            whose = ", ".join(self.unknown)
            if v.job is None and v.state == "waiting":
                text = f"The job recreated for {whose} (its new ID was not told apart) is not in the list yet …"
            else:
                text = f"For {whose} (new ID not told apart): {v.message}"
            verdicts.append(replace(v, message=text))
        states = [v.state for v in verdicts]
        settled = all(st in ("confirmed", "failed") for st in states)
        state: Literal["waiting", "confirmed", "failed"] = (
            "waiting" if not settled else "confirmed" if all(st == "confirmed" for st in states) else "failed"
        )
        return RecreatedVerdict(state, " ".join(v.message for v in verdicts), tuple(verdicts))


class RecoveryRefused(Exception):
    """Recovery that would lose a job, or guess: refused before anything is saved or deleted.

    `kind` is "unknown-job" (an id the list does not show: a failure) or "usage" (the operator
    must give a create command or say delete only).
    """

    def __init__(self, kind: Literal["unknown-job", "usage"], what: str, fix: str = "") -> None:
        super().__init__(what)
        self.kind = kind
        self.what = what
        self.fix = fix


def operator_create(job: Job, settings: Settings, command: str) -> CreateDraft:
    """The operator's create command for `job`: its `{field}`s filled from the list, never guessed."""
    draft = draft_create(job, settings.with_overrides(create_command=command))
    return CreateDraft(draft.command, draft.missing, "config")


def plan_jobs(
    jobs: list[Job],
    ids: list[str],
    settings: Settings,
    create_command: str | None = None,
    delete_only: bool = False,
) -> list[RecoveryPlan]:
    """Plans for the named jobs of a listing, in the given order, or RecoveryRefused.

    Every id must be in the list; each job is recreated by `create_command` (the operator's,
    `{field}`s filled per job) or the configured template, and a job with neither is deleted
    only when the operator said so (`delete_only`).
    """
    by_id = {j.id: j for j in jobs}
    wanted = list(dict.fromkeys(ids))
    unknown = [i for i in wanted if i not in by_id]
    if unknown:
        shown = ", ".join(sorted(by_id)[:10]) or "none"
        raise RecoveryRefused(
            "unknown-job",
            f"no job {', '.join(unknown)} in the jobs list ({settings.list_command}); nothing deleted",
            f"use an id the list shows (it shows: {shown})",
        )
    plans: list[RecoveryPlan] = []
    for jid in wanted:
        job = by_id[jid]
        if create_command is not None and create_command.strip():
            draft = operator_create(job, settings, create_command)
            if draft.missing:
                gaps = " ".join("{" + m + "}" for m in draft.missing)
                raise RecoveryRefused(
                    "usage",
                    f"--create-command still has {gaps} unfilled for job {jid} (the jobs list does not show "
                    "them); nothing deleted",
                    "write those values into the command yourself (check `cosmicac jobs create --help`)",
                )
            plans.append(plan_recovery(job, settings, draft.command))
        else:
            plans.append(plan_recovery(job, settings))
    if len(plans) > 1 and create_command and not _PLACEHOLDER.search(create_command):
        raise RecoveryRefused(
            "usage",
            "--create-command has no {field}: it would create the same job for every id; nothing deleted",
            "recover one job per command, or name its fields ({name}, {gpu_model}, any column)",
        )
    unknown_create = [p.job.id for p in plans if p.create is None]
    if unknown_create and not delete_only:
        draft = draft_create(by_id[unknown_create[0]], settings)
        gaps = f" ({', '.join(draft.missing)} not in the list)" if draft.missing and draft.source == "config" else ""
        raise RecoveryRefused(
            "usage",
            f"no known create command for job {', '.join(unknown_create)}{gaps}; nothing deleted",
            "give --create-command CMD (your reviewed `cosmicac jobs create ...`, {field}s allowed), set "
            "[commands] create in the config, or pass --delete-only and recreate the job yourself from the "
            f"saved file (draft: {draft.command})",
        )
    return plans
