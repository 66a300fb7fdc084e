"""Paths of this repository that its tests read (the test helpers themselves are ``ktrain.testing``'s)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart"
