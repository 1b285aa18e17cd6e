"""Step 3: put the relay key into the deployment's `.env`, showing the diff before writing."""

from __future__ import annotations

from pathlib import PurePosixPath

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from cosmictui.ops.runner import RunnerError
from cosmictui.ops.setup.envapply import apply_plan
from cosmictui.ops.setup.envfile import EnvFileError, EnvPlan, decode_text, plan_relays
from cosmictui.ops.setup.steps import sentences
from cosmictui.screens.step import Step, runner_problem
from cosmictui.widgets.diff_view import DiffView
from cosmictui.widgets.path_input import elide_path


class ModeToggle(Static):
    """Merge or replace, spelled out (a checked box and a word, not a colour)."""

    class Toggled(Message):
        pass

    def on_mount(self) -> None:
        self.show("merge")

    def show(self, mode: str) -> None:
        merge, replace = ("x", " ") if mode == "merge" else (" ", "x")
        self.update(f"Other relays: [{merge}] merge  [{replace}] replace   (t switches)")

    def on_click(self) -> None:
        self.post_message(self.Toggled())


class EnvDiff(DiffView):
    """The .env's diff, titled with the file's path. A path wider than the top border gives way in
    the middle (its start and file name stay), so at 60 columns the title still names the file."""

    path = ""

    def show_path(self, path: str) -> None:
        self.path = path
        self._title()

    def on_resize(self) -> None:
        self._title()  # also when the box first shows: hidden, it has no width

    def _title(self) -> None:
        room = self.outer_size.width - 6  # the corners, and a rule and a blank each side of the title
        # Content, not a str: a path is plain text, never markup
        self.border_title = Content(elide_path(self.path, room) if room > 0 else self.path)


class EnvStep(Step):
    STEP_ID = "env"
    TITLE = "Configure .env"
    STEP_BINDINGS = (
        Binding("w", "step('write')", "Write"),
        Binding("t", "step('toggle_mode')", "Mode"),
        Binding("e", "step('reload')", "Re-read"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.plan: EnvPlan | None = None
        self.mode = "merge"
        self.written = False
        self.written_key: str | None = None

    def compose_step(self) -> ComposeResult:
        yield Static("3. Configure .env", classes="step-title")
        yield Static("", id="env-intro", classes="step-intro")
        yield ModeToggle(id="env-mode", markup=False)
        yield Static("", id="env-summary", markup=False)
        yield EnvDiff(id="env-diff")

    def on_enter(self) -> None:
        var = self.ctx.settings.env_var
        self.query_one("#env-intro", Static).update(
            f"Sets [b]{var}[/b]. Every other line stays byte for byte; a timestamped backup is made first."
        )
        if self.written and self.written_key != self.ctx.relay_key:
            self.written = False  # the relay (and its key) changed in step 2 since
            self.mark_done(False)
        if not self.written:
            self.load()

    # -- reading and planning ---------------------------------------------------------------------

    def on_mode_toggle_toggled(self, event: ModeToggle.Toggled) -> None:
        event.stop()
        self.action_toggle_mode()

    def action_toggle_mode(self) -> None:
        if self.busy:
            return
        self.mode = "replace" if self.mode == "merge" else "merge"
        self.query_one(ModeToggle).show(self.mode)
        self.written = False
        self.mark_done(False)
        self.load()

    def action_reload(self) -> None:
        self.written = False
        self.mark_done(False)
        self.load()

    def _clear(self) -> None:
        self.plan = None
        self.query_one("#env-summary", Static).update("")
        self.query_one(DiffView).clear()

    async def _read(self) -> tuple[str, str]:
        runner = await self.ctx.deployment()
        path = runner.resolve(self.ctx.settings.env_path)
        data = await runner.read_file(path)
        return path, decode_text(data)

    @work(exclusive=True, group="env", exit_on_error=False)
    async def load(self) -> None:
        key = self.ctx.relay_key
        if not key:
            self._clear()
            self.status.set("No relay key yet: go back to step 2 and start or attach the relay.", "error")
            return
        self.busy = True
        self.status.set("Reading .env …", "busy")
        try:
            path, text = await self._read()
            plan = plan_relays(text, key, self.mode, var=self.ctx.settings.env_var, path=path)  # type: ignore[arg-type]
        except RunnerError as e:
            self._clear()
            self.status.set(runner_problem(e, "read the .env"), "error")
            return
        except EnvFileError as e:
            self._clear()
            self.status.set(_env_problem(e), "error")
            return
        finally:
            self.busy = False
        self.plan = plan
        self.ctx.env_relays = tuple(plan.old_keys)  # evidence for the ticks: what the .env lists now
        self.query_one("#env-summary", Static).update(
            f"Relays: {len(plan.old_keys)} now → {len(plan.new_keys)} after ({self.mode}). The change:"
        )
        diff = self.query_one(EnvDiff)
        diff.show_path(path)
        diff.show_diff(plan.diff)
        if not plan.changed:
            self.written = True
            self.written_key = key
            self.mark_done()
            self.status.set("The .env already has this relay key; nothing to write. Press n.", "ok")
        else:
            self.status.set(f"Review the diff ({self.mode}), then press w to write.", "info")

    # -- writing ----------------------------------------------------------------------------------

    def action_write(self) -> None:
        if self.plan is None or self.busy:
            self.status.set("Nothing to write yet: the .env could not be read (see above).", "error")
            return
        if not self.plan.changed:
            self.status.set("The .env already has this relay key; nothing to write.", "ok")
            return
        self.write()

    @work(exclusive=True, group="env", exit_on_error=False)
    async def write(self) -> None:
        plan = self.plan
        assert plan is not None
        self.busy = True
        self.status.set("Writing .env …", "busy")
        try:
            runner = await self.ctx.deployment()
            path = runner.resolve(self.ctx.settings.env_path)
            try:
                applied = await apply_plan(runner, path, plan, self.ctx.settings.env_var, self.ctx.relay_key or "")
            except EnvFileError as e:
                if "changed since" not in e.problem:
                    raise
                # Someone changed the file since we showed the diff: show the new diff instead.
                self.busy = False
                self.load()
                self.notify("The .env changed since the diff was shown; review the new diff.", severity="warning")
                return
        except RunnerError as e:
            self.status.set(runner_problem(e, "write the .env") + " The file was not changed.", "error")
            return
        except EnvFileError as e:
            self.status.set(_env_problem(e), "error")
            return
        finally:
            self.busy = False
        backup, keys = applied.backup, applied.keys
        self.ctx.env_backup = backup
        self.ctx.note(f"wrote {path}" + (f" (backup: {backup})" if backup else ""))
        if problem := applied.problem():  # the read-back: what is on disk must be what we showed
            self.status.set(problem, "error")
            return
        self.written = True
        self.written_key = self.ctx.relay_key
        self.ctx.env_writes += 1
        self.ctx.env_written(tuple(keys))
        self.invalidate_later("The .env changed")
        self.query_one("#env-summary", Static).update(
            # the backup sits next to the .env: its name alone, so no path wraps mid-word
            f"Wrote:  {path}\nBackup: {PurePosixPath(backup).name if backup else '(none)'} (same directory)\n"
            f"Relays: {len(keys)} ({self.mode})"
        )
        self.query_one(DiffView).show_diff(plan.written_diff())  # what was written, not what would be
        self.mark_done()
        self.status.set("Wrote the .env. Press n to apply it and restart the worker.", "ok")

    def validate_step(self) -> str | None:
        if not self.ctx.relay_key:
            return "No relay key: finish step 2 first."
        if not self.written and not self.done:
            # (a tick from an earlier run stands while the .env lists the key: ops.session.derive_ticks)
            return "The .env does not have the relay key yet: review the diff and press w to write it."
        return None


def _env_problem(e: EnvFileError) -> str:
    where = f"{e.path} line {e.line}" if e.line is not None else e.path
    return sentences(f"Cannot edit {where}: {e.problem}", f"Fix: {e.fix}" if e.fix else None, "Nothing was changed")
