"""Setting a relay up: prerequisite checks, the wizard's step decisions, and the `.env` editor."""
