"""A path too long for its field keeps its start and its last directory around `…`."""

from __future__ import annotations

from cosmictui.widgets.path_input import elide_path


def test_a_path_that_fits_is_shown_as_it_is() -> None:
    assert elide_path("/var/lib/blind-relay", 36) == "/var/lib/blind-relay"


def test_a_long_path_keeps_its_start_and_its_last_directory() -> None:
    shown = elide_path("/tmp/cosmictui-demo-bo_9uhyz/relay-storage", 36)
    assert shown == "/tmp/cosmictui-demo-b…/relay-storage" and len(shown) == 36


def test_a_last_directory_longer_than_half_the_field_keeps_as_much_of_its_end_as_fits() -> None:
    path = "/srv/" + "x" * 40 + "-relay-storage"
    shown = elide_path(path, 30)
    assert len(shown) == 30 and shown.startswith("/srv") and shown.endswith("-relay-storage")


def test_a_tiny_field_still_shows_the_end() -> None:
    assert elide_path("/var/lib/blind-relay", 6) == "…relay"
