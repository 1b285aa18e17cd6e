"""The wizard's session state lives in `cosmictui.ops.session` (no Textual there); re-exported here."""

from cosmictui.ops.session import STEP_IDS, LoggedRunner, WizardContext, relay_problem

__all__ = ["STEP_IDS", "LoggedRunner", "WizardContext", "relay_problem"]
