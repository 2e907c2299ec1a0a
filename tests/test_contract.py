"""The contract: generated code matches protos/, and buf's STANDARD lint passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from gen_protos import DEFAULT_OUT, generate  # noqa: E402


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in DEFAULT_OUT.iterdir() if p.is_file()}
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"antwort_grpc/pb is stale, run `make protos`: {stale}"


def test_buf_lint_standard_passes() -> None:
    buf = Path(sys.executable).parent / "buf"
    result = subprocess.run([str(buf), "lint"], cwd=ROOT / "protos", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
