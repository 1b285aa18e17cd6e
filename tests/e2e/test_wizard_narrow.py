"""At 60×20: step 4's commands are whole (never broken mid-word), and the footer says "b Back"
wherever it fits beside the step's keys (the nav bar's ◀ Back button says it where it does not)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets._footer import FooterKey

from cosmictui.ops.config import Settings
from cosmictui.screens.step_apply import CommandRow
from tests.e2e._wizard_support import KEY, make_app, resume_at, step, wait_until

APPLY = "task apply-wrk-server-k8s-nvidia-common-config"


def _footer(app: object, width: int) -> dict[str, str]:
    keys = app.screen.query(FooterKey)  # type: ignore[attr-defined]
    return {k.key: k.description for k in keys if 0 < k.region.right <= width and k.region.width}


@pytest.mark.parametrize("size", [(60, 20), (80, 24)])
async def test_step_4_commands_are_whole_and_the_footer_says_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    d = tmp_path / "deploy"
    d.mkdir()
    resume_at(str(d), "apply", relay_key=KEY)
    app = make_app(Settings(deployment=str(d), relay_storage=str(tmp_path / "store")), save=False)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.screen.index == 3, "step 4")
        apply = step(app, "apply")
        rows = list(apply.query(CommandRow))

        def whole() -> bool:
            for row in rows:
                text = row.query_one(".command-text")
                longest = max(len(w) for w in row.cmd.split())
                if text.content_region.width < longest:
                    return False
            return True

        await wait_until(pilot, whole, f"every command's longest word fits its line at {size}")
        assert rows[0].cmd == APPLY
        await wait_until(pilot, lambda: _footer(app, size[0]).get("b") == "Back", f"b Back in the footer at {size}")
        footer = _footer(app, size[0])
        assert footer.get("r") == "Run" and footer.get("n") == "Next" and footer.get("q") == "Quit", footer
