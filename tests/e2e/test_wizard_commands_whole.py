"""Commands the operator confirms are shown whole at any width, and scroll from the keyboard; the
command log folds a long command to one short line while its copy and saved log keep it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from cosmictui.ops.progress import CommandJournal
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.widgets.command_log import CommandLog

APP_CSS = str(Path(__file__).resolve().parents[2] / "cosmictui" / "app.tcss")
# The shape of step 6's "Recreate with" and a long test job: cut at `--type` at 80 columns before.
LONG = (
    "cosmicac jobs create --name inference-llama-70b-eu --gpu h100x8 --type inference "
    "--image registry.example.com/cosmicac/inference-server:2026.11.3 --region eu-west-1 --replicas 2"
)
COMMANDS = [LONG, "cosmicac jobs delete job-001", *(f"{LONG} --index {i}" for i in range(6))]


class _Host(App[None]):
    CSS_PATH = APP_CSS


@pytest.mark.parametrize("size", [(80, 24), (60, 20), (160, 40)])
async def test_confirmed_commands_wrap_whole_and_scroll(size: tuple[int, int]) -> None:
    app = _Host()
    async with app.run_test(size=size) as pilot:
        screen = ConfirmScreen("Create a test job", "Run on the deployment host:", commands=COMMANDS, yes="Create")
        await app.push_screen(screen)
        await pilot.pause()
        assert screen.shown_commands() == COMMANDS  # whole, each its own
        texts = list(screen.query(".confirm-command-text"))
        for text, cmd in zip(texts, COMMANDS, strict=True):
            assert text.region.right <= size[0]
            # wrapped onto as many lines as it needs, never cut at the edge
            assert text.size.height * text.size.width >= len(cmd)
        scroll = screen.query_one("#confirm-scroll")
        buttons = screen.query_one("#confirm-buttons")
        assert buttons.region.bottom <= size[1] and buttons.region.height == 1
        await pilot.press("end")
        await pilot.pause()
        last = texts[-1]
        assert scroll.content_region.contains_region(last.region), (last.region, scroll.content_region)
        await pilot.press("home")
        await pilot.pause()
        assert scroll.scroll_y == 0
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is not screen


class _LogHost(App[None]):
    def __init__(self, journal: CommandJournal) -> None:
        super().__init__()
        self.journal = journal

    def compose(self) -> ComposeResult:
        yield CommandLog(id="log")


async def test_command_log_folds_a_long_command_and_keeps_it_whole_in_copy_and_file(tmp_path: Path) -> None:
    # the shape of the reachability PING the checks run on the deployment host
    program = "import os,socket,sys;" + "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);" * 12
    ping = f"python3 -c 'exec(\"{program}\")' 127.0.0.1 49737 3"
    journal = CommandJournal(tmp_path / "log.txt")
    app = _LogHost(journal)
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.query_one(CommandLog)
        log.journal = journal
        entry = log.begin(ping, "local:/srv/cosmicac")
        log.end(entry, 0)
        await pilot.pause()
        shown = log.query_one("#command-log-text").plain_lines  # type: ignore[attr-defined]
        assert shown[0].startswith("$ python3 -c '…") and "chars…' 127.0.0.1 49737" in shown[0]
        assert len(shown[0]) < 80
        assert ping in log.transcript()  # y copies it whole
    journal.close()
    assert ping in (tmp_path / "log.txt").read_text()
