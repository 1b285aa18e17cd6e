"""Ticks derived from what is true now (cosmictui.ops.session), not from what the progress file says."""

from __future__ import annotations

from cosmictui.ops.session import STEP_IDS, SessionFacts, derive_ticks, why_not

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
    }
    base.update(kw)
    return SessionFacts(**base)  # type: ignore[arg-type]


def test_everything_true_ticks_everything() -> None:
    assert derive_ticks(facts()) == ALL


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
