"""A path that does not fit its field wraps whole, broken after a `/` where one is near the end."""

from __future__ import annotations

from cosmictui.widgets.path_input import wrap_path


def test_a_path_that_fits_is_one_line() -> None:
    assert wrap_path("/var/lib/blind-relay", 36) == ["/var/lib/blind-relay"]


def test_a_long_path_breaks_after_a_slash_and_loses_nothing() -> None:
    path = "/tmp/cosmictui-demo-bo_9uhyz/relay-storage"
    lines = wrap_path(path, 36)
    assert lines == ["/tmp/cosmictui-demo-bo_9uhyz/", "relay-storage"]
    assert "".join(lines) == path


def test_a_directory_name_longer_than_the_field_is_cut_at_the_width() -> None:
    path = "/srv/" + "x" * 50 + "/relay"
    lines = wrap_path(path, 20)
    assert "".join(lines) == path and all(len(line) <= 20 for line in lines)
