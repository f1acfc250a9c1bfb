"""scripts/gpu_pass.sh on the CPU: stages run in the order named, a stage past its limit is
stopped and the pass goes on, an unknown stage fails the pass without stopping it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stage_order_limits_and_unknown_stages(tmp_path: Path):
    slow = tmp_path / "slow.sh"
    slow.write_text("echo started\nsleep 60\necho finished\n")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "ELMAN_RUN_DIR": str(run_dir), "OUT": str(out), "DEV_CHECKS": str(slow),
           "LIMIT_dev": "3", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_pass.sh"), "pack", "bogus", "dev"],
                          env=env, capture_output=True, text=True, timeout=60)
    log = (out / "gpu_pass.log").read_text()
    assert proc.returncode != 0
    stages = [line.split("stage ", 1)[1].split(":")[0] for line in log.splitlines() if ": " in line
              and "] stage " in line]
    assert stages == ["pack", "dev"], log
    assert "unknown stage bogus" in log and "stage dev FAILED" in log and "stage pack ok" in log
    assert (run_dir / "slow.log").read_text().split() == ["started"]
    assert "failed stages: bogus dev" in log
