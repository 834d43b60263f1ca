"""Copy the trainer's memory plan and presets into the control plane's package, which the Lambda bundle carries,
and the control plane's instance-type catalogue to both copies of the plan, which read it.

    .venv/bin/python scripts/refresh_trainer_plan.py

trainer/lustrain_trainer/{plan,presets,prepare_estimate,layout}.py are the source (the trainer ships without the control plane, and the
Lambda bundle without the trainer); functions/lustrain_core/trainer/ holds byte-for-byte copies.
functions/lustrain_core/data/instance_types.json is the catalogue's source; trainer/lustrain_trainer/ and
functions/lustrain_core/trainer/ hold copies beside plan.py. tests/unit/test_memory_plan.py keeps all equal.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "trainer" / "lustrain_trainer"
TARGET = ROOT / "functions" / "lustrain_core" / "trainer"
FILES = ("plan.py", "presets.py", "prepare_estimate.py", "layout.py")
CATALOGUE = ROOT / "functions" / "lustrain_core" / "data" / "instance_types.json"


def main() -> int:
    TARGET.mkdir(exist_ok=True)
    for name in FILES:
        shutil.copyfile(SOURCE / name, TARGET / name)
        print(f"copied {name}")
    for target in (SOURCE, TARGET):
        shutil.copyfile(CATALOGUE, target / CATALOGUE.name)
    print(f"copied {CATALOGUE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
