"""``ktrain bench --peer torchtitan`` is refused with one line that says why (its release needs a PyTorch nightly)."""

from __future__ import annotations

from ktrain.cli import main


def test_peer_torchtitan_is_refused_with_one_line(capsys) -> None:
    assert main(["bench", "no-such-config.yaml", "--peer", "torchtitan"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ktrain: --peer torchtitan: not timed: torchtitan 0.3.0")
    assert "\n" not in err and "Traceback" not in err
