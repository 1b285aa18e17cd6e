"""End to end: the demo sandbox walked from the first check to "the new job left Creating".

Nothing here is simulated by the test: the sandbox's `task` and `cosmicac` decide job states
themselves, and a job leaves Creating only when its agent reached the sandbox worker through the
real Python relay the wizard started (both peers punching off; `cosmictui/ops/demo/worker.py`).
"""

from __future__ import annotations

from cosmictui.app import WizardApp
from cosmictui.ops.demo.sandbox import Sandbox, sandbox_state
from cosmictui.ops.session import WizardContext
from cosmictui.screens.confirm import ConfirmScreen
from tests.e2e._wizard_support import status, step, wait_status, wait_until


async def _confirm(pilot, app: WizardApp) -> None:  # type: ignore[no-untyped-def]
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "a confirmation")
    await pilot.press("y")
    await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the confirmation to close")


async def test_wizard_demo_end_to_end_new_job_leaves_creating(sandbox: Sandbox) -> None:
    # Poll the jobs list faster than the demo's 2 s: the test waits on states, not on time.
    app = WizardApp(WizardContext(sandbox.settings.with_overrides(poll_interval=0.5), demo=sandbox))
    async with app.run_test(size=(80, 24)) as pilot:
        # 1. Prerequisites: nothing fails (warnings: demo storage under /tmp, relay not running yet).
        await wait_status(pilot, app, "prereqs", ("ok", "warn"), timeout=30)
        await pilot.press("n")
        assert app.screen.index == 1

        # 2. Relay: start it detached; it must answer a PING from the deployment host.
        await pilot.press("s")
        text = await wait_status(pilot, app, "relay", ("ok", "error"), timeout=60)
        assert "Started the relay" in text, text
        key = app.screen.ctx.relay_key
        assert key and key in str(step(app, "relay").query_one("#relay-key").render())
        # In the demo the relay does not outlive the wizard: the step says so.
        assert "stopped, with the sandbox, when the wizard exits" in str(
            step(app, "relay").query_one("#relay-intro").render()
        )
        assert "Log:     blind-relay.log in the storage dir" in str(
            step(app, "relay").query_one("#relay-state").render()
        )
        reach = [r.text for r in step(app, "relay").query("CheckRow")]
        assert any(r.startswith("✔ ok Relay answers from") for r in reach), reach
        await pilot.press("c")
        assert app.clipboard == key
        await pilot.press("n")

        # 3. .env: merge the key in and write it.
        await wait_status(pilot, app, "env", ("info",))
        await pilot.press("w")
        await wait_status(pilot, app, "env", ("ok",))
        assert f'["{key}"]' in sandbox.env_path.read_text()
        await pilot.press("n")

        # 4. Apply and restart, output streamed.
        await pilot.press("r")
        await wait_status(pilot, app, "apply", ("ok",), timeout=30)
        await pilot.press("n")

        # 5. Verify: old jobs are marked; a new job gets the key and leaves Creating.
        text = await wait_status(pilot, app, "verify", ("info",), timeout=30)
        assert "create one now" in text
        await pilot.press("j")
        await _confirm(pilot, app)
        text = await wait_status(pilot, app, "verify", ("ok", "error"), timeout=60)
        assert "left Creating" in text and "keeps updating" in text, text
        # The relay's record holds the new job's own pairing: when it opened, what it carried.
        verify = step(app, "verify")
        await wait_until(pilot, lambda: verify.verdict is not None and verify.verdict.proven, "the proof")
        assert "the relay works" in status(app, "verify")  # said once, in the status line
        v = verify.verdict
        assert v is not None and v.attribution is not None and v.attribution.pairing is not None
        assert (v.attribution.pairing.bytes or 0) > 0, v.attribution
        shown = str(verify.query_one("#verify-evidence").render())
        assert "Pairing #" in shown and "relayed" in shown and "after the window opened" in shown, shown
        new_jobs = [j for j in sandbox_state(sandbox)["jobs"] if j["relays"]]
        assert [j["relays"] for j in new_jobs] == [[key]] and new_jobs[0]["status"] == "Running"
        await pilot.press("n")

        # 6. Recover: the stuck old job is deleted and recreated; the new one leaves Creating too.
        await wait_status(pilot, app, "recover", ("info",), timeout=30)
        await pilot.press("space")
        await pilot.press("d")
        await _confirm(pilot, app)
        text = await wait_status(pilot, app, "recover", ("ok", "error"), timeout=60)
        assert "left Creating" in text, text
        await pilot.press("n")
        # Finish says how to keep the relay running after a reboot: the unit blind-relay prints.
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the finish dialog")
        assert app.screen.title_text == "Finished: the relay is set up"
        assert any("--systemd-unit --storage" in c for c in app.screen.commands), app.screen.commands
        assert "systemctl daemon-reload && systemctl enable --now blind-relay" in app.screen.commands
        await pilot.press("escape")
        assert status(app, "recover")
    jobs = sandbox_state(sandbox)["jobs"]
    assert "job-7f3a21" not in [j["id"] for j in jobs]  # the stuck job was deleted …
    # … and made again with its fields, once: "j" in step 5 made the small test job, not a copy.
    like_it = [j for j in jobs if j["name"] == "llama-3-70b-serve"]
    assert len(like_it) == 1 and all(j["relays"] == [key] and j["status"] == "Running" for j in like_it)
    assert [(j["tags"], j["location"], j["gpu_model"], j["gpu_count"], j["image"], j["disk_gb"]) for j in like_it] == [
        ("llm,serve", "eu-1", "A100", "4", "ubuntu-22.04", "200")
    ]
    test_job = [j for j in jobs if j["name"] == "relay-check"]
    assert len(test_job) == 1 and (test_job[0]["gpu_model"], test_job[0]["gpu_count"]) == ("L4", "1")
