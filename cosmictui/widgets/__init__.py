"""Widgets shared by the wizard and the monitor (monitor-owned modules carry a `monitor_` prefix)."""
