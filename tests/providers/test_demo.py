"""`make demo` keeps working: the script runs the fake backend, the gateway process and the conversation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parents[2] / "scripts" / "demo.py"


def test_the_demo_holds_a_conversation_with_a_tool_call() -> None:
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[tool call] get_weather(" in out and "-> requires_action" in out
    assert "client runs the tool" in out
    assert out.count("-> completed") == 2
    assert "It is 18 °C and sunny in Paris" in out and "No umbrella needed" in out
