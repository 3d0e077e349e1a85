"""Helpers that several test modules share (test-specific; the general harness is
``zrl.testing``). A test module imports helpers from here, never from another test module."""
