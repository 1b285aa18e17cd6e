"""Ticks derived from what is true now (cosmictui.ops.session), not from what the progress file says."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmictui.ops.config import Settings
from cosmictui.ops.metrics.probe import PROBE_CHECK
from cosmictui.ops.session import (
    STEP_IDS,
    SessionFacts,
    WizardContext,
    derive_ticks,
    derive_unproven,
    probe_verdict,
    why_not,
)
from cosmictui.ops.setup.checks import CheckResult

KEY = "k" * 52
ALL = frozenset(STEP_IDS)


def facts(**kw: object) -> SessionFacts:
    base: dict[str, object] = {
        "completed": ALL,
        "relay_key": KEY,
        "relay_running": True,
        "env_relays": (KEY,),
        "restarted_at": 200.0,
        "env_written_at": 100.0,
        "verified": (KEY, 200.0),
    }
    base.update(kw)
    return SessionFacts(**base)  # type: ignore[arg-type]


def test_everything_true_ticks_everything() -> None:
    assert derive_ticks(facts()) == ALL


def test_a_new_restart_withdraws_the_verification_at_once() -> None:
    assert derive_ticks(facts(restarted_at=300.0)) == ALL - {"verify", "recover"}
    assert "no new job was proven" in (why_not("verify", facts(restarted_at=300.0)) or "")


def test_a_verification_of_another_relay_is_none_of_this_one() -> None:
    assert derive_ticks(facts(verified=("o" * 52, 200.0))) == ALL - {"verify", "recover"}
    assert derive_ticks(facts(verified=None)) == ALL - {"verify", "recover"}


def test_an_unfinished_restart_is_no_apply() -> None:
    assert derive_ticks(facts(restart_finished=False)) == {"prereqs", "relay", "env"}


def test_a_stopped_relay_takes_back_2_and_all_after_it() -> None:
    assert derive_ticks(facts(relay_running=False)) == {"prereqs"}


def test_an_env_without_the_key_takes_back_3_to_6() -> None:
    assert derive_ticks(facts(env_relays=("other",))) == {"prereqs", "relay"}


def test_an_unread_env_keeps_the_history() -> None:
    assert derive_ticks(facts(env_relays=None)) == ALL


def test_an_env_written_after_the_restart_takes_back_4_to_6() -> None:
    f = facts(env_written_at=300.0)
    assert derive_ticks(f) == {"prereqs", "relay", "env"}
    assert why_not("apply", f) == "the .env changed after the last restart"


def test_a_later_step_never_stands_on_an_unticked_one() -> None:
    # "· 4 under ✔ 5": apply not done, so verify and recover are not either
    assert derive_ticks(facts(completed=ALL - {"apply"})) == {"prereqs", "relay", "env"}


def test_a_restart_of_the_same_relay_with_the_same_key_keeps_them() -> None:
    before = derive_ticks(facts())
    assert derive_ticks(facts(relay_running=True)) == before


def test_an_unproven_relay_is_ticked_for_the_later_steps_but_shown_unproven() -> None:
    f = facts(relay_unproven="failed at key found on the DHT")
    assert derive_ticks(f) == ALL
    assert derive_unproven(f) == {"relay"}
    assert derive_unproven(facts()) == frozenset()
    # a relay that is not ticked at all is not "unproven": it is not done
    assert derive_unproven(facts(relay_unproven="x", relay_running=False)) == frozenset()


LOCAL_OK = CheckResult(PROBE_CHECK, "ok", "two peers echoed")
LOCAL_FAIL = CheckResult(PROBE_CHECK, "fail", "failed at key found on the DHT: no DHT bootstrap node answered")
HOST = "Relay carries a connection from ops@jobs-host (probe)"


def test_the_probe_from_the_deployment_host_decides_when_it_ran() -> None:
    assert probe_verdict(LOCAL_FAIL, CheckResult(HOST, "ok", "two peers there echoed")) is None
    assert probe_verdict(LOCAL_OK, CheckResult(HOST, "fail", "failed at holepunch: timed out")) == (
        "from ops@jobs-host failed at holepunch: timed out"
    )


def test_without_a_probe_result_from_the_host_the_local_probe_decides() -> None:
    could_not_run = CheckResult(HOST, "warn", "could not run the probe there: permission denied")
    assert probe_verdict(LOCAL_FAIL, could_not_run) == LOCAL_FAIL.detail
    assert probe_verdict(LOCAL_FAIL, None) == LOCAL_FAIL.detail
    assert probe_verdict(LOCAL_OK, could_not_run) is None
    assert probe_verdict(None, None) is None


def test_the_unproven_mark_is_kept_in_the_progress_file_for_that_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "deploy").mkdir()
    settings = Settings(deployment=str(tmp_path / "deploy"))
    ctx = WizardContext(settings, relay_check=lambda storage, key: None)
    ctx.relay_key = KEY
    ctx.relay_unproven = "from jobs-host failed at holepunch: timed out"
    ctx.set_done("prereqs", True)
    ctx.set_done("relay", True)
    ctx.save_progress(2)

    rerun = WizardContext(settings, relay_check=lambda storage, key: None)
    assert rerun.relay_unproven == "from jobs-host failed at holepunch: timed out"
    assert "relay" in rerun.ticks() and rerun.unproven() == {"relay"}
    rerun.relay_key = "o" * 52  # another relay: not disproven by the old one's probe
    assert rerun.relay_unproven is None and rerun.unproven() == frozenset()
    rerun.relay_key = KEY
    rerun.relay_unproven = None  # a probe passed: saved at once
    assert WizardContext(settings, relay_check=lambda storage, key: None).unproven() == frozenset()


def test_a_restart_begun_is_recorded_at_once_so_a_quit_halfway_knows_when(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quitting while the restart ran left the earlier restart's time on step 5 ('restarted at
    09:29:39' when it was 09:35:12): the time is saved as the restart begins, and it is not a
    finished restart until it exited 0."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "deploy").mkdir()
    settings = Settings(deployment=str(tmp_path / "deploy"))
    clock = [1000.0]
    ctx = WizardContext(settings, relay_check=lambda storage, key: None, clock=lambda: clock[0])
    ctx.relay_key = KEY
    ctx.restart_began((KEY,))
    ctx.restart_ended()
    clock[0] = 2000.0
    ctx.restart_began((KEY,))  # ... and the wizard quits while it runs
    rerun = WizardContext(settings, relay_check=lambda storage, key: None)
    assert rerun.restarted_at == 2000.0 and not rerun.facts().restart_finished
    assert "did not finish" in (why_not("apply", facts(restart_finished=False)) or "")


def test_jobs_made_after_an_earlier_restart_that_applied_the_key_have_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "deploy").mkdir()
    clock = [1000.0]
    ctx = WizardContext(Settings(deployment=str(tmp_path / "deploy")), save=False, clock=lambda: clock[0])
    ctx.relay_key = KEY
    for at, keys in ((1000.0, ("o" * 52,)), (2000.0, (KEY,)), (3000.0, (KEY, "o" * 52))):
        clock[0] = at
        ctx.restart_began(keys)
        ctx.restart_ended()
    assert ctx.key_since() == 2000.0 and ctx.restarted_at == 3000.0  # not "no key" for a job made at 2500
    clock[0] = 4000.0
    ctx.restart_began(("o" * 52,))  # the .env dropped it: from now on new jobs do not get it
    ctx.restart_ended()
    assert ctx.key_since() == 4000.0
